"""The benchmark harness: its arithmetic, table and figure everywhere; its timings on a GPU only."""

import subprocess
import sys

import pytest
import torch
from conftest import gpu_only, randn, tables

import ropetut
from ropetut import bench
from ropetut.book.notebook import NO_GPU
from ropetut.reference import rope_reference


def test_shape_label_and_tokens():
    shape = bench.Shape(B=4, T=4096, HQ=32, HK=8, D=128)
    assert shape.label == "4x4096x32/8x128 bfloat16"
    assert shape.tokens == 4 * 4096
    assert (
        bench.SHAPES["seed002"][0].label == "4x4096x16/16x256 bfloat16"
    )  # the seeds write BxHxTxD


def test_shape_groups():
    sweep = bench.SHAPES["seed001"]
    assert [s.T for s in sweep] == list(range(2048, 63488 + 1, 4096))
    assert all(
        s.dtype == torch.bfloat16 for group in bench.SHAPES.values() for s in group
    )
    assert set(bench.QUICK) <= {s for group in bench.SHAPES.values() for s in group}


def test_bytes_moved():
    shape = bench.Shape(B=2, T=3, HQ=4, HK=2, D=8)
    elements = 2 * 3 * (4 + 2) * 8
    assert bench.bytes_moved(shape, "fwd") == elements * 2 * 2  # bf16, read + write
    assert bench.bytes_moved(shape, "fwd+bwd") == 2 * bench.bytes_moved(shape, "fwd")
    f32 = bench.Shape(B=2, T=3, HQ=4, HK=2, D=8, dtype=torch.float32)
    assert bench.bytes_moved(f32, "fwd") == 2 * bench.bytes_moved(shape, "fwd")


@pytest.mark.parametrize(
    "name",
    [
        "HF rotate_half",
        "liger",
        "v1",
        "v2",
        "v3",
        "v4",
        "final",
        "final (in place)",
        "final (torch.ops)",
        "final (interleaved)",
    ],
)
def test_providers_compute_rope(name):
    """Each provider's wrapper (layouts, tables, in place) computes standard RoPE, on any device."""
    if name == "liger" and bench.liger_rope() is None:
        pytest.skip("liger_kernel is not installed")
    shape = bench.Shape(B=2, T=9, HQ=4, HK=2, D=16, dtype=torch.float32)
    cos, sin = tables(shape.D, shape.T)
    q, k = randn(2, 9, 4, 16), randn(2, 9, 2, 16)
    interleaved = name in ("v1", "final (interleaved)")
    expected = [rope_reference(x, cos, sin, interleaved=interleaved) for x in (q, k)]
    for out, ref in zip(bench.make_provider(name, shape)(q, k), expected):
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["torch eager", "liger", "final", "final (in place)"])
def test_providers_at_positions_compute_rope(name):
    """Decode shapes: each provider rotates every token by its own row of the table."""
    if name == "liger" and bench.liger_rope() is None:
        pytest.skip("liger_kernel is not installed")
    shape = bench.Shape(B=3, T=1, HQ=4, HK=2, D=16, dtype=torch.float32, positions=True)
    torch.manual_seed(1)
    fn = bench.make_provider(name, shape)  # draws the positions
    torch.manual_seed(1)
    cos, sin = tables(shape.D, bench.N_POSITIONS)
    pos = torch.randint(0, bench.N_POSITIONS, (shape.B, shape.T), device=ropetut.DEVICE)
    q, k = randn(3, 1, 4, 16), randn(3, 1, 2, 16)
    expected = [rope_reference(x, cos, sin, positions=pos) for x in (q, k)]
    for out, ref in zip(fn(q, k), expected):
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_partial_in_place_rotates_half_the_dims():
    shape = bench.Shape(B=2, T=9, HQ=4, HK=2, D=16, dtype=torch.float32)
    cos, sin = ropetut.rope_tables(ropetut.standard(8), 9, device=ropetut.DEVICE)
    q, k = randn(2, 9, 4, 16), randn(2, 9, 2, 16)
    expected = [rope_reference(x, cos, sin, rotary_dim=8) for x in (q, k)]
    for out, ref in zip(
        bench.make_provider("final (partial, in place)", shape)(q, k), expected
    ):
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


def test_supports():
    decode = bench.SHAPES["decode"][0]
    assert decode.positions and decode.label == "64x1x32/8x128 bfloat16 positions"
    assert bench.supports("final", decode, "fwd") and bench.supports(
        "liger", decode, "fwd+bwd"
    )
    assert not bench.supports(
        "v4", decode, "fwd"
    )  # the teaching versions take no positions
    seed002 = bench.SHAPES["seed002"][0]
    assert bench.supports("final (in place)", seed002, "fwd")
    assert not bench.supports("final (in place)", seed002, "fwd+bwd")


def test_torch_eager_is_the_seed_module():
    shape = bench.Shape(B=1, T=5, HQ=2, HK=2, D=8, dtype=torch.float32)
    q, k = randn(1, 5, 2, 8), randn(1, 5, 2, 8)
    rotary = ropetut.LlmRotary(8, 5).to(ropetut.DEVICE)
    for out, x in zip(bench.make_provider("torch eager", shape)(q, k), (q, k)):
        torch.testing.assert_close(out, rotary(x))


@pytest.mark.skipif(ropetut.on_gpu(), reason="the CPU path")
def test_run_without_gpu_prints_no_gpu(capsys):
    assert bench.run(bench.SHAPES["seed002"]) is None
    assert capsys.readouterr().out.strip() == NO_GPU


@pytest.mark.skipif(
    ropetut.on_gpu(), reason="the CPU path; on a GPU this is the real benchmark"
)
def test_cli_bench_quick_without_gpu():
    done = subprocess.run(
        [sys.executable, "-m", "ropetut", "bench", "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == NO_GPU


class _LigerLike(torch.autograd.Function):
    """A stand-in for Liger's RoPE: rotates q and k in place (here: doubles them), past
    autograd as Liger's kernel does, and writes dq, dk into the output gradients."""

    @staticmethod
    def forward(ctx, q, k):
        return q.mul_(2), k.mul_(2)

    @staticmethod
    def backward(ctx, dq, dk):
        return dq.mul_(2), dk.mul_(2)


def _out_of_place(q, k):
    return 2 * q, 2 * k


def _writes_q(q, k):
    with torch.no_grad():
        q[0, 0, 0, 0] += 1
    return 2 * q, 2 * k


class _WritesGq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k):
        return 2 * q, 2 * k

    @staticmethod
    def backward(ctx, dq, dk):
        return dq.mul_(2), 2 * dk


_writes_gq = _WritesGq.apply
_liger_like = _LigerLike.apply


TINY = bench.Shape(B=1, T=3, HQ=2, HK=1, D=4, dtype=torch.float32)


@pytest.mark.parametrize("mode", bench.MODES)
def test_check_untouched_lets_declared_writes_through(mode):
    inputs = bench.make_inputs(TINY, mode)
    step = bench.training_step(_out_of_place) if mode == "fwd+bwd" else _out_of_place
    bench.check_untouched("out of place", step, inputs)
    if mode == "fwd":  # in place by design, as "final (in place)" is
        bench.check_untouched("in place", _liger_like, inputs, mutates=("q", "k"))
        with pytest.raises(RuntimeError, match=r"'in place' wrote into q, k, which"):
            bench.check_untouched("in place", _liger_like, inputs)
    else:  # and into gq, gk, as Liger's backward does
        step = bench.training_step(_liger_like)
        bench.check_untouched("liger", step, inputs, mutates=bench.MUTATES["liger"])
        with pytest.raises(RuntimeError, match=r"'liger' wrote into gq, gk, which"):
            bench.check_untouched("liger", step, inputs, mutates=("q", "k"))


@pytest.mark.parametrize("fn, buffer", [(_writes_q, "q"), (_writes_gq, "gq")])
def test_check_untouched_catches_undeclared_writes(fn, buffer):
    inputs = bench.make_inputs(TINY, "fwd+bwd")
    with pytest.raises(RuntimeError, match=rf"'sneaky' wrote into {buffer}, which it"):
        bench.check_untouched("sneaky", bench.training_step(fn), inputs)


def test_check_untouched_sees_weights_bit_for_bit():
    w = torch.zeros(4)

    def flips_a_sign(q, k):  # -0.0 == 0.0, but not bit for bit
        w[0] = -0.0
        return q, k

    with pytest.raises(RuntimeError, match="'flips' wrote into w_q"):
        bench.check_untouched(
            "flips", flips_a_sign, bench.make_inputs(TINY, "fwd"), w_q=w
        )


def test_clones_are_fresh_leaves():
    inputs = bench.make_inputs(TINY, "fwd+bwd")
    copies = bench.clones(inputs)
    for t, c in zip(inputs, copies):
        assert torch.equal(t, c) and c.data_ptr() != t.data_ptr()
        assert c.is_leaf and c.requires_grad == t.requires_grad
    bench.training_step(_liger_like)(*copies)  # writes into copies' gq, gk
    assert not torch.equal(copies[2], inputs[2])


@pytest.mark.parametrize("mode", bench.MODES)
@pytest.mark.parametrize(
    "name",
    [
        "torch eager",
        "HF rotate_half",
        "liger",
        "final",
        "final (in place)",
        "final (partial, in place)",
        "final (interleaved)",
    ],
)
def test_providers_write_only_what_they_declare(name, mode):
    """The real providers against their MUTATES entries (Liger where it imports)."""
    if name == "liger" and bench.liger_rope() is None:
        pytest.skip("liger_kernel is not installed")
    shape = bench.Shape(B=2, T=9, HQ=4, HK=2, D=16, dtype=torch.float32)
    if not bench.supports(name, shape, mode):
        pytest.skip(f"{name} runs fwd only")
    fn = bench.make_provider(name, shape)
    fn = bench.training_step(fn) if mode == "fwd+bwd" else fn
    inputs = bench.make_inputs(shape, mode)
    bench.check_untouched(name, fn, inputs, bench.MUTATES.get(name, ()))


@pytest.mark.parametrize("name", ["fused", "liger", "torch eager"])
def test_qk_norm_providers_write_only_what_they_declare(name):
    from ropetut.bench import qk_norm as bench_qk_norm

    if name == "liger" and bench_qk_norm.liger_pair() is None:
        pytest.skip("liger_kernel is not installed")
    shape = bench.Shape(B=2, T=5, HQ=4, HK=2, D=16, dtype=torch.float32)
    fn, (w_q, w_k) = bench_qk_norm.make_provider(name, shape)
    step = bench_qk_norm.training_step(fn, (w_q, w_k))
    mutates = bench_qk_norm.MUTATES.get(name, ())
    for mode, fn in (("fwd", fn), ("fwd+bwd", step)):
        inputs = bench.make_inputs(shape, mode)
        bench.check_untouched(name, fn, inputs, mutates, w_q=w_q, w_k=w_k)


@pytest.fixture
def no_timers(monkeypatch):
    """measure() on any device: the timers answer 1 ms and 0 MB."""
    monkeypatch.setattr(bench, "time_ms", lambda fn, make_inputs: 1.0)
    monkeypatch.setattr(bench, "graph_ms", lambda fn, make_inputs: 1.0)
    monkeypatch.setattr(bench, "peak_mem_mb", lambda fn, inputs: 0.0)


@pytest.mark.parametrize("mode", bench.MODES)
def test_measure_refuses_undeclared_writes(monkeypatch, no_timers, mode):
    """The check runs inside measure, before the timers: a liger-like provider passes as
    "liger" (declared in MUTATES) and fails, named with its buffers, as "final"."""
    monkeypatch.setattr(bench, "make_provider", lambda name, shape: _liger_like)
    liger = bench.measure("liger", TINY, mode, 1.0, 1.0)
    assert liger["error"] is None and liger["ms"] == 1.0
    final = bench.measure("final", TINY, mode, 1.0, 1.0)
    written = "q, k" if mode == "fwd" else "q, k, gq, gk"
    assert final["ms"] is None and final["error"] == (
        f"RuntimeError: 'final' wrote into {written}, which it does not declare"
        " (it declares ())"
    )


def test_measure_takes_an_eager_time_measured_already(monkeypatch, no_timers):
    """eager_ms replaces time_ms (bench.angles times two rows in turn), and the provider
    is still checked for undeclared writes."""
    monkeypatch.setattr(bench, "make_provider", lambda name, shape: _liger_like)
    row = bench.measure("liger", TINY, "fwd", 1.0, 1.0, eager_ms=4.0)
    assert row["error"] is None and row["ms"] == 4.0 and row["pct_floor"] == 25
    final = bench.measure("final", TINY, "fwd", 1.0, 1.0, eager_ms=4.0)
    assert final["ms"] is None and "does not declare" in final["error"]


def test_qk_norm_measure_checks_gradients_and_weights(monkeypatch, no_timers):
    from ropetut.bench import qk_norm as bench_qk_norm

    w_q = torch.ones(4, device=ropetut.DEVICE, requires_grad=True)
    w_k = torch.ones(4, device=ropetut.DEVICE, requires_grad=True)

    def provider(name, shape):
        def fn(q, k):
            if name == "writes w_k":
                w_k.data.add_(1)
            return _liger_like(q * w_q, k * w_k)  # in place on the normed q, k

        return fn, (w_q, w_k)

    monkeypatch.setattr(bench_qk_norm, "make_provider", provider)
    rows = {
        name: bench_qk_norm.measure(name, TINY, "fwd+bwd", 1.0, 1.0)
        for name in (bench_qk_norm.LIGER, "final", "writes w_k")
    }
    assert rows["liger"]["error"] is None and rows["liger"]["ms"] == 1.0
    assert "'final' wrote into gq" in rows["final"]["error"]
    assert "'writes w_k' wrote into gq, gk, w_k, which" in rows["writes w_k"]["error"]


def synthetic_rows(labels, tokens):
    """Rows as run() returns them, with made-up times: the floor, two peers, and final."""
    rows = []
    for label, n in zip(labels, tokens):
        for mode, floor in (("fwd", 0.2), ("fwd+bwd", 0.4)):
            for name, ms in (
                (bench.COPY, floor),
                ("torch eager", 10 * floor),
                ("liger", 1.05 * floor),
                ("final", 1.01 * floor),
            ):
                graphed = ms * 0.9 if name != bench.COPY else floor * 0.95
                rows.append(
                    dict(
                        shape=label,
                        tokens=n,
                        provider=name,
                        mode=mode,
                        ms=ms,
                        gbps=1e3 / ms,
                        pct_floor=floor / ms * 100,
                        vs_liger=ms / (1.05 * floor),
                        graph_ms=graphed,
                        graph_pct_floor=floor * 0.95 / graphed * 100,
                        graph_vs_liger=graphed / (0.9 * 1.05 * floor),
                        peak_mem_mb=64.0,
                        error=None,
                    )
                )
        rows.append(
            dict(
                rows[-1],
                provider="HF rotate_half",
                ms=None,
                gbps=None,
                pct_floor=None,
                vs_liger=None,
                graph_ms=None,
                graph_pct_floor=None,
                graph_vs_liger=None,
                peak_mem_mb=None,
                error="OutOfMemoryError: CUDA out of memory",
            )
        )
    return rows


def test_format_table():
    rows = synthetic_rows(["4x4096x16/16x256 bfloat16"], [16384])
    lines = bench.format_table(rows).splitlines()
    assert lines[0].split() == [
        "impl",
        "shape",
        "mode",
        "|",
        "eager",
        "ms",
        "%floor",
        "vs",
        "liger",
        "|",
        "graph",
        "ms",
        "%floor",
        "vs",
        "liger",
        "|",
        "peak",
        "MB",
    ]
    assert len(lines) == 1 + len(rows)
    floor = next(line for line in lines if line.startswith(bench.COPY))
    assert "100%" in floor and "0.200" in floor and "0.190" in floor
    final = lines[4].split("|")
    assert final[0].startswith("final") and "99%" in final[1] and "0.96x" in final[1]
    assert "0.182" in final[2] and "105%" in final[2] and "0.96x" in final[2]
    assert (
        lines[-1].startswith("HF rotate_half")
        and "error: OutOfMemoryError" in lines[-1]
    )


HOST_ROWS = [
    {
        "provider": "liger",
        "mode": "fwd",
        "shape": "s",
        "host_us": 80.0,
        "vs_liger": 1.0,
    },
    {
        "provider": "final",
        "mode": "fwd",
        "shape": "s",
        "host_us": 30.0,
        "vs_liger": 0.375,
    },
]


def test_format_host_table():
    lines = bench.format_host_table(HOST_ROWS).splitlines()
    assert lines[0].split() == ["impl", "mode", "host", "us/call", "vs", "liger"]
    assert lines[2].split() == ["final", "fwd", "30.0", "0.38x"]


def test_show_table():
    rows = synthetic_rows(["4x4096x16/16x256 bfloat16"], [16384])
    table = bench.show_table(rows)
    text = repr(table).splitlines()
    assert max(map(len, text)) <= 88
    assert text[0].split() == [
        "shape",
        "mode",
        "impl",
        "ms",
        "%",
        "graph",
        "graph",
        "÷",
    ]  # headers wrap
    assert text[1].split() == ["floor", "ms", "%", "Liger"] and text[2].split() == [
        "floor"
    ]
    assert set(text[3]) == {"-", " "} and len(text) == 4 + len(rows)  # one line per row
    compact, full = table._repr_html_().split("<details")
    final = next(line for line in compact.splitlines() if "<td>final</td>" in line)
    ms_and_pct = '<td class="num">0.202</td><td class="num">99</td>'  # .3f, integers
    assert ms_and_pct in final
    assert final.endswith('<td class="num">0.96</td></tr>')  # ÷ Liger .2f
    assert "peak MB" not in compact and "error" not in compact
    assert "<th>peak MB</th>" not in full and '<th class="num">peak MB</th>' in full
    assert "OutOfMemoryError" in full and full.count("<tr>") == 1 + len(rows)
    compact_only = bench.show_table(rows, ["provider", "ms"], full=False)
    assert "<details" not in compact_only._repr_html_()


def test_show_host_table():
    lines = repr(bench.show_host_table(HOST_ROWS)).splitlines()
    assert lines[0] == "host time per call, on s"
    assert lines[1].split() == ["impl", "mode", "host", "µs/call", "÷", "Liger"]
    assert lines[4].split() == ["final", "fwd", "30.0", "0.38"]


def png_width(data: bytes) -> int:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big")


@pytest.mark.parametrize("kind", ["sweep", "bars"])
def test_plot_writes_png(tmp_path, kind):
    pytest.importorskip("matplotlib")
    if kind == "sweep":
        labels = [f"1x{t}x16/16x128 bfloat16" for t in (2048, 6144, 10240)]
        tokens = [2048, 6144, 10240]
    else:
        labels = ["4x4096x16/16x256 bfloat16", "8x4096x32/8x128 bfloat16"]
        tokens = [16384, 32768]
    path = tmp_path / "figure.png"
    fig = bench.plot(synthetic_rows(labels, tokens), path)
    assert png_width(path.read_bytes()) == 784
    assert [ax.get_title() for ax in fig.axes] == [
        "fwd, eager",
        "fwd, CUDA graph",
        "fwd+bwd, eager",
        "fwd+bwd, CUDA graph",
    ]
    assert fig.axes[0].get_ylabel().startswith("% of the copy floor")
    eager_only = [
        dict(r, graph_ms=None, graph_pct_floor=None)
        for r in synthetic_rows(labels, tokens)
    ]
    assert [ax.get_title() for ax in bench.plot(eager_only).axes] == ["fwd", "fwd+bwd"]


def test_plot_fits_the_column_with_one_legend():
    """784 px wide as a notebook shows it (tight bbox), text of 10 px or more, one legend."""
    import io

    import matplotlib.text

    rows = synthetic_rows(
        ["4x4096x16/16x256 bfloat16", "8x4096x32/8x128 bfloat16"], [16384, 32768]
    )
    fig = bench.plot(rows)
    shown = io.BytesIO()
    fig.savefig(shown, format="png", bbox_inches="tight")
    scale = min(1, 784 / png_width(shown.getvalue()))
    assert scale >= 0.9
    fig.canvas.draw()
    sizes = [
        t.get_fontsize()
        for t in fig.findobj(matplotlib.text.Text)
        if t.get_visible() and t.get_text()
    ]
    assert min(sizes) * fig.dpi / 72 * scale >= 10
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["copy floor", "torch eager", "liger", "final"]


def test_plot_draws_the_providers_asked_for_in_their_order():
    rows = synthetic_rows(
        ["4x4096x16/16x256 bfloat16", "8x4096x32/8x128 bfloat16"], [16384, 32768]
    )
    fig = bench.plot(rows, providers=["final", "no such provider", "liger"])
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "copy floor",
        "final",
        "liger",
    ]
    assert [p.get_label() for p in fig.axes[0].containers] == ["final", "liger"]


def test_plot_refuses_more_than_five_series():
    rows = synthetic_rows(
        ["4x4096x16/16x256 bfloat16", "8x4096x32/8x128 bfloat16"], [16384, 32768]
    )
    rows += [
        dict(r, provider=name)
        for r in rows
        if r["provider"] == "final"
        for name in ("v2", "v3", "v4")
    ]
    with pytest.raises(
        ValueError, match=r"at most 5 series per panel, not 6.*providers="
    ):
        bench.plot(rows)
    assert (
        len(
            bench.plot(rows, providers=["v2", "v3", "v4", "final", "liger"])
            .legends[0]
            .get_texts()
        )
        == 6
    )
    assert bench.plot(rows, y="ms", providers=[bench.COPY, "v2", "v3", "v4", "final"])


@gpu_only
def test_run_on_gpu():
    shape = bench.Shape(B=2, T=512, HQ=8, HK=8, D=128)
    rows = bench.run(
        [shape], providers=[bench.COPY, "final"], modes=bench.MODES, progress=False
    )
    assert [(r["provider"], r["mode"]) for r in rows] == [
        (bench.COPY, "fwd"),
        ("final", "fwd"),
        (bench.COPY, "fwd+bwd"),
        ("final", "fwd+bwd"),
    ]
    assert all(r["error"] is None for r in rows), rows
    for r in rows:
        assert r["shape"] == shape.label and r["tokens"] == shape.tokens
        assert (
            r["ms"] > 0
            and r["gbps"] > 0
            and r["peak_mem_mb"] >= 0
            and r["graph_ms"] > 0
        )
        assert r["vs_liger"] is None and r["graph_vs_liger"] is None
    for floor in (rows[0], rows[2]):
        assert floor["pct_floor"] == pytest.approx(100) and floor[
            "graph_pct_floor"
        ] == pytest.approx(100)


@gpu_only
def test_host_rows_on_gpu():
    rows = bench.host_rows(providers=("final", "final (torch.ops)"), modes=bench.MODES)
    assert [(r["provider"], r["mode"]) for r in rows] == [
        ("final", "fwd"),
        ("final (torch.ops)", "fwd"),
        ("final", "fwd+bwd"),
        ("final (torch.ops)", "fwd+bwd"),
    ]
    assert all(r["host_us"] > 0 and r["vs_liger"] is None for r in rows)


@gpu_only
def test_interleaved_ms_takes_turns_on_gpu():
    """One time per function; the calls alternate a, b, b, a, ..., each on the same
    inputs as its partner, and each function is called as often as the other."""
    calls = []

    def named(name, scale):
        def fn(x):
            calls.append((name, x.data_ptr()))
            return x * scale

        return fn

    times = bench.interleaved_ms(
        [named("a", 2), named("b", 3)],
        make_inputs=lambda: (torch.randn(1 << 20, device="cuda"),),
    )
    assert len(times) == 2 and all(t > 0 for t in times)
    timed = calls[-2 * (len(calls) // 2) :]
    assert [n for n, _ in timed].count("a") == [n for n, _ in timed].count("b")
    pairs = [timed[i : i + 2] for i in range(0, len(timed), 2)]
    assert {(x[0], y[0]) for x, y in pairs} == {("a", "b"), ("b", "a")}
    assert all(x[1] == y[1] for x, y in pairs)  # the same input set
    assert len({x[1] for x, _ in pairs}) > 1  # cycling through several


@gpu_only
def test_time_ms_on_gpu():
    x = torch.randn(1 << 20, device="cuda")
    assert bench.time_ms(lambda: x.clone()) > 0
    assert (
        bench.time_ms(
            torch.clone, make_inputs=lambda: (torch.randn(1 << 10, device="cuda"),)
        )
        > 0
    )
    assert (
        bench.graph_ms(
            torch.clone, make_inputs=lambda: (torch.randn(1 << 10, device="cuda"),)
        )
        > 0
    )
