"""TinyGPT's ``qk_norm`` switch and the QK-norm benchmark's command (issue 18, items 5
and 4).

The equivalence test is ``test_train_equivalence``'s: one model trained twice in fp32
from the same initial weights on the same batches, once with the fused kernel
(``QKNormRotary``) and once with the unfused pair (a plain RMSNorm, then the final
kernel's RoPE). At step 0 the logits, the loss and every parameter's gradient, the
norms' w_q and w_k among them, agree within 1e-5 relative; then each of 50 optimizer
steps' losses within 1e-4.
"""

import importlib.util
import json
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import gpu_only
from test_train_equivalence import batches, trains_alike, twin_models

import ropetut
from ropetut import bench
from ropetut.bench import qk_norm as bench_qk_norm
from ropetut.training.model import GPTConfig, TinyGPT
from ropetut.qk_norm import QKNormRotary, QKNormThenRope
from ropetut.runtime import NO_GPU

CPU_SIZES = dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, max_seq_len=16)
GPU_SIZES = dict(d_model=384, n_heads=8, n_layers=6, d_ff=1536, max_seq_len=512)
STORED_RUNS = sorted(
    (Path(__file__).parents[1] / "results" / "training_h100").glob("*.json")
)


def fused_and_unfused(sizes: dict, **changes):
    """The unfused model and the fused one, with identical initial weights; the norms'
    weights drawn away from ones (at ones, a swapped w_q and w_k would not show)."""
    models = twin_models(
        GPTConfig(qk_norm="unfused", **sizes, **changes),
        GPTConfig(qk_norm="fused", **sizes, **changes),
    )
    for model in models:
        draw = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name.endswith(("w_q", "w_k")):
                    weights = 1 + 0.2 * torch.randn(parameter.shape, generator=draw)
                    parameter.copy_(weights)
    return models


def test_without_qk_norm_the_config_is_stored_as_before():
    config = GPTConfig()
    assert config.qk_norm == "none"
    assert "qk_norm" not in config.to_dict()
    assert GPTConfig(**config.to_dict()) == config
    for qk_norm in ("fused", "unfused"):
        stored = config.replace(qk_norm=qk_norm).to_dict()
        assert stored["qk_norm"] == qk_norm
        assert GPTConfig(**stored) == config.replace(qk_norm=qk_norm)


@pytest.mark.skipif(not STORED_RUNS, reason="no stored runs in results/training_h100")
def test_stored_runs_configs_are_unchanged():
    """The runs chapter 09 loads: each stored model config reads back as itself, so
    its hash (and the file it is found by) stays the same."""
    for path in STORED_RUNS:
        stored = json.loads(path.read_text())["model"]
        assert GPTConfig(**stored).to_dict() == stored, path.name


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(qk_norm="rms"), "qk_norm: must be one of"),
        (dict(qk_norm="fused", rope="torch"), "qk_norm: 'fused' .* rope='final'"),
        (dict(qk_norm="fused", rope="v2"), "qk_norm: 'fused' .* rope='final'"),
    ],
)
def test_config_refuses_a_qk_norm_it_cannot_build(changes, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**CPU_SIZES, **changes)


@pytest.mark.parametrize(
    "qk_norm, module", [("fused", QKNormRotary), ("unfused", QKNormThenRope)]
)
def test_norm_weights_are_parameters_of_each_attention_block(qk_norm, module):
    model = TinyGPT(GPTConfig(qk_norm=qk_norm, **CPU_SIZES))
    head_dim = model.config.head_dim
    for block in model.blocks:
        assert isinstance(block.attn.rope.rope, module)
        parameters = dict(block.attn.named_parameters())
        for name in ("rope.rope.w_q", "rope.rope.w_k"):
            assert parameters[name].shape == (head_dim,)
    n_norm_weights = 2 * head_dim * CPU_SIZES["n_layers"]
    plain = TinyGPT(GPTConfig(**CPU_SIZES))
    assert model.n_params() == plain.n_params() + n_norm_weights


@pytest.mark.parametrize(
    "changes",
    [
        dict(preset="half_truncated", negative_angle=True),
        dict(rope_dtype="float16"),
        dict(rotate_by_head_index=True),
    ],
    ids=["seed maths", "fp16 tables", "rotate by head index"],
)
def test_fused_and_unfused_agree_at_step_0(changes):
    unfused, fused = fused_and_unfused(CPU_SIZES, **changes)
    trains_alike(unfused, fused, batches(CPU_SIZES["max_seq_len"], 2, 1))


def test_fused_qk_norm_trains_as_the_unfused_pair_does_cpu():
    unfused, fused = fused_and_unfused(CPU_SIZES)
    last = trains_alike(unfused, fused, batches(CPU_SIZES["max_seq_len"], 2, 50))
    assert last < 5.0  # it trained: the first loss is about ln 256 = 5.55


@gpu_only
def test_fused_qk_norm_trains_as_the_unfused_pair_does_gpu():
    # fp32 throughout: no autocast, and no TF32 in the matmuls
    matmul, cudnn = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        unfused, fused = fused_and_unfused(GPU_SIZES)
        stream = batches(GPU_SIZES["max_seq_len"], 8, 50)
        last = trains_alike(unfused, fused, stream)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = (
            matmul,
            cudnn,
        )
    assert last < 5.0


@pytest.mark.skipif(ropetut.on_gpu(), reason="the CPU path; on a GPU this times rows")
def test_cli_bench_qk_norm_without_gpu():
    command = [sys.executable, "-m", "ropetut", "bench-qk-norm"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == NO_GPU
    done = subprocess.run(
        [*command, "--quick"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2
    assert "unrecognized arguments: --quick" in done.stderr


def call_once(fn, *, make_inputs=None):
    """A timer's stand-in: runs ``fn`` once on fresh inputs and says 1 ms."""
    if make_inputs is None:
        fn()
    else:
        fn(*make_inputs())
    return 1.0


def host_once(fn, inputs):
    """``bench.host_us``'s stand-in: one call, 2 us."""
    fn(*inputs)
    return 2.0


def test_cli_bench_qk_norm_builds_its_rows_on_tiny_shapes(monkeypatch, tmp_path):
    """The command's whole path, on any device: every provider is built and called
    once per row (the timers stand in), and the rows and host rows reach the JSON and
    the table. torch.compile is left out: Inductor's CPU compile takes minutes here."""
    shapes = [
        bench.Shape(2, 5, 4, 2, 16, dtype=torch.float32),
        bench.Shape(2, 1, 4, 2, 16, dtype=torch.float32, positions=True),
    ]
    providers = [p for p in bench_qk_norm.PROVIDERS if p != bench_qk_norm.COMPILED]
    monkeypatch.setattr(bench_qk_norm, "on_gpu", lambda: True)
    monkeypatch.setattr(bench, "time_ms", call_once)
    monkeypatch.setattr(bench, "graph_ms", call_once)
    monkeypatch.setattr(bench, "host_us", host_once)
    monkeypatch.setattr(bench, "copy_floor_ms", lambda *args, **kwargs: 0.5)
    monkeypatch.setattr(bench, "peak_mem_mb", lambda fn, inputs: 0.0)
    run = partial(bench_qk_norm.run, shapes, providers)
    monkeypatch.setattr(bench_qk_norm, "run", run)
    host_rows = partial(bench_qk_norm.host_rows, shape=shapes[0], rounds=1)
    monkeypatch.setattr(bench_qk_norm, "host_rows", host_rows)
    out = tmp_path / "qk_norm.json"
    from ropetut.__main__ import main

    assert main(["bench-qk-norm", "--json", str(out)]) == 0
    written = json.loads(out.read_text())
    rows = written["rows"]
    built = [p for p in providers if p != "liger" or bench_qk_norm.liger_pair()]
    assert len(rows) == len(shapes) * len(bench.MODES) * len(built)
    for row in rows:
        assert row["error"] is None, row
        assert row["provider"] in built
        assert row["pct_floor"] == (100.0 if row["provider"] == bench.COPY else 50.0)
        assert row["host_paced"] is False  # the stand-in timers: eager = graphed
        # the fused kernel's own floor: 2U fwd, 5U fwd+bwd (1.25 copies of 4U)
        byte_floor = 1.25 if row["mode"] == "fwd+bwd" else 1.0
        if row["provider"] == bench.COPY:
            assert row["pct_byte_floor"] is row["graph_pct_byte_floor"] is None
        else:
            assert row["pct_byte_floor"] == row["pct_floor"] * byte_floor
            assert row["graph_pct_byte_floor"] == row["graph_pct_floor"] * byte_floor
    host = written["host"]
    assert [(r["provider"], r["mode"]) for r in host] == [
        (p, m) for m in bench.MODES for p in bench_qk_norm.HOST_PROVIDERS
    ]
    for r in host:
        if r["provider"] == bench_qk_norm.LIGER and not bench_qk_norm.liger_pair():
            assert r["host_us"] is None and "liger_kernel" in r["error"]
        else:
            assert r["host_us"] == 2.0 and r["error"] is None


@pytest.mark.parametrize("when", ["built", "timed"])
def test_a_host_row_provider_that_raises_gets_its_error_and_the_rest_run(
    monkeypatch, when
):
    """host_rows: a provider whose step raises, when it is built or only once timed
    (after its warm-up), gets a row with the error; the one before it is timed."""
    monkeypatch.setattr(bench_qk_norm, "on_gpu", lambda: True)
    make, timed = bench_qk_norm.make_provider, []

    def make_breaking(name, shape):
        if when == "built" and name == bench_qk_norm.FUSED_OP:
            raise RuntimeError("broken")
        return make(name, shape)

    def host_breaking(fn, inputs):
        timed.append(fn)
        if when == "timed" and len(timed) == 2:  # the second provider's round
            raise RuntimeError("broken")
        return host_once(fn, inputs)

    monkeypatch.setattr(bench_qk_norm, "make_provider", make_breaking)
    monkeypatch.setattr(bench, "host_us", host_breaking)
    shape = bench.Shape(2, 5, 4, 2, 16, dtype=torch.float32)
    providers = (bench_qk_norm.FUSED, bench_qk_norm.FUSED_OP)
    rows = bench_qk_norm.host_rows(providers, ("fwd",), shape=shape, rounds=1)
    assert [(r["provider"], r["host_us"], r["error"]) for r in rows] == [
        (bench_qk_norm.FUSED, 2.0, None),
        (bench_qk_norm.FUSED_OP, None, "RuntimeError: broken"),
    ]


def test_the_fused_operator_provider_computes_what_the_eager_one_does():
    """``fused (torch.ops)`` (the host rows' operator) against ``fused``: outputs and
    all four gradients."""
    shape = bench.Shape(2, 5, 4, 2, 16, dtype=torch.float32)
    q, k, gq, gk = bench.make_inputs(shape, "fwd+bwd")
    runs = []
    for name in (bench_qk_norm.FUSED, bench_qk_norm.FUSED_OP):
        torch.manual_seed(1)
        fn, weights = bench_qk_norm.make_provider(name, shape)
        step = bench_qk_norm.training_step(fn, weights)
        runs.append((*fn(q, k), *step(q, k, gq, gk)))
    for got, expected in zip(*runs):
        assert torch.equal(got, expected)


def _model_step_script():
    path = Path(__file__).parents[1] / "scripts" / "qk_norm_model_step.py"
    spec = importlib.util.spec_from_file_location("qk_norm_model_step", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_model_step_script_refuses_zero_layers(capsys):
    """--layers 0 would time a model with no QK-norm: refused, naming the option."""
    with pytest.raises(SystemExit):
        _model_step_script().main(["--tiny", "--layers", "0"])
    assert "--layers: must be at least 1, got 0" in capsys.readouterr().err


def test_model_step_script_runs_tiny(tmp_path):
    """scripts/qk_norm_model_step.py (issue 25's model-level number) on a tiny model,
    eagerly: a time per step for fused and unfused, the same first loss (the same
    function from the same weights), the JSON written."""
    script = _model_step_script()
    out = tmp_path / "model.json"
    argv = ["--tiny", "--modes", "eager", "--rounds", "1", "--json", str(out)]
    assert script.main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["qk_norm"], r["mode"]) for r in rows] == [
        ("fused", "eager"),
        ("unfused", "eager"),
    ]
    assert all(r["ms"] > 0 for r in rows) and rows[1]["vs_unfused"] == 1.0
    fused, unfused = (r["first_loss"] for r in rows)
    assert abs(fused - unfused) <= 1e-5 * abs(unfused)
