"""One training step of the tiny GPT with QK-norm, fused against unfused (issue 25,
item 4): the model-level number.

The model is ``ropetut.training.model.TinyGPT`` with ``qk_norm="fused"`` (one kernel
each way: ``QKNormRotary``) or ``"unfused"`` (an RMSNorm on q's and k's heads, then the
final kernel's RoPE: ``QKNormThenRope``), at a Qwen3-like head layout: head_dim 128,
4 q heads to each kv head (Qwen3-8B has 32/8; here d_model 1024, 8/2). ``GPTConfig``
has no kv-head count, so each block's attention is rebuilt here as a GQA
``RoPEAttention`` around the block's own rope module, its projections drawn as
TinyGPT draws them. 4 layers, FFN 3072 (Qwen3's 3x), bf16 autocast, batch 8 x 2048
tokens: 16k tokens a step, meant to be large enough that the GPU, not the host, sets
an eager step's pace, and small enough that both models compile and time in about a
minute on an H100 (``--layers`` fewer where they do not).

A step is zero_grad, forward, cross-entropy, backward and an AdamW step. Each variant
(fused or unfused, eager or ``torch.compile``'d) has its own model and optimizer, from
the same initial weights; the variants take turns, ``--rounds`` rounds of one
``triton.testing.do_bench`` median each (on a CPU, of a few timed steps), and a
variant's figure is its median round. The first step's losses are reported too:
fused and unfused compute the same function.

On a GPU:   python scripts/qk_norm_model_step.py --json results/qk_norm_model_h100.json
On a CPU:   python scripts/qk_norm_model_step.py --tiny --modes eager   (seconds)
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import ropetut  # first: on a CPU it sets TRITON_INTERPRET before triton is imported

# isort: split
import torch
from torch import nn
from triton.testing import do_bench

from ropetut.book.provenance import environment
from ropetut.modules import RoPEAttention
from ropetut.runtime import DEVICE, on_gpu
from ropetut.training.model import GPTConfig, TinyGPT, loss_fn

FULL = dict(
    config=dict(d_model=1024, n_heads=8, n_layers=4, d_ff=3072, max_seq_len=2048),
    n_kv_heads=2,
    batch=8,
    autocast=True,  # bf16, on a GPU
)
TINY = dict(
    config=dict(d_model=128, n_heads=4, n_layers=1, d_ff=256, max_seq_len=16),
    n_kv_heads=1,
    batch=2,
    autocast=False,  # fp32: fused and unfused losses agree to 1e-5 on any device
)
QK_NORMS = ("fused", "unfused")
MODES = ("eager", "compiled")


def build(sizes: dict, qk_norm: str) -> TinyGPT:
    """TinyGPT with ``qk_norm``, its attention GQA with ``n_kv_heads`` kv heads; the
    same weights for every qk_norm (seeded; the norms' weights start at ones)."""
    config = GPTConfig(qk_norm=qk_norm, **sizes["config"])
    torch.manual_seed(0)
    model = TinyGPT(config)
    for block in model.blocks:
        block.attn = RoPEAttention(
            config.d_model,
            config.n_heads,
            sizes["n_kv_heads"],
            max_seq_len=config.max_seq_len,
            rope=block.attn.rope,
        )
        for linear in (block.attn.wq, block.attn.wkv, block.attn.wo):
            nn.init.normal_(linear.weight, mean=0.0, std=0.02)
    return model.to(DEVICE)


def training_step(model, tokens, *, compiled: bool, autocast: bool):
    """``step()``: zero_grad, forward (with ``autocast``, bf16 autocast on a GPU),
    loss, backward and an AdamW step of model (its compiled forward with
    ``compiled``); returns the loss."""
    forward = torch.compile(model) if compiled else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE.type, torch.bfloat16, enabled=autocast):
            loss = loss_fn(forward(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss

    return step


def time_ms(step) -> float:
    """Median milliseconds of one step: do_bench over a second of steps (about 60 of
    the full model's on an H100) on a GPU, else 3 timed steps."""
    if on_gpu():
        return do_bench(step, warmup=100, rep=1000, return_mode="median")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run(sizes: dict, modes=MODES, rounds: int = 5) -> dict:
    """Every variant's step time and first loss, taking turns; with the ratio fused ÷
    unfused per mode."""
    seq = sizes["config"]["max_seq_len"]
    torch.manual_seed(1)
    tokens = torch.randint(0, 256, (sizes["batch"], seq + 1), device=DEVICE)
    steps, rows = {}, []
    for mode in modes:
        for qk_norm in QK_NORMS:
            step = training_step(
                build(sizes, qk_norm),
                tokens,
                compiled=mode == "compiled",
                autocast=sizes["autocast"] and on_gpu(),
            )
            first_loss = step().item()  # compiles, allocates AdamW's state
            steps[qk_norm, mode] = step
            rows.append(dict(qk_norm=qk_norm, mode=mode, first_loss=first_loss))
    times = {variant: [] for variant in steps}
    for _ in range(rounds):
        for variant, step in steps.items():
            times[variant].append(time_ms(step))
    for row in rows:
        row["ms"] = statistics.median(times[row["qk_norm"], row["mode"]])
    for row in rows:
        unfused = times["unfused", row["mode"]]
        row["vs_unfused"] = row["ms"] / statistics.median(unfused)
    return dict(
        sizes=sizes,
        tokens_per_step=sizes["batch"] * seq,
        autocast="bfloat16" if sizes["autocast"] and on_gpu() else None,
        rounds=rounds,
        rows=rows,
    )


def format_table(result: dict) -> str:
    lines = [f"{'qk_norm':8} {'mode':9} {'ms/step':>9} {'÷ unfused':>9} {'loss 0':>8}"]
    for r in result["rows"]:
        lines.append(
            f"{r['qk_norm']:8} {r['mode']:9} {r['ms']:9.3f} {r['vs_unfused']:9.3f} "
            f"{r['first_loss']:8.4f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny model, for CPUs")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, help="n_layers (default: 4; tiny: 1)")
    parser.add_argument("--json", metavar="PATH", help="write the result here")
    args = parser.parse_args(argv)
    sizes = TINY if args.tiny else FULL
    if args.layers is not None:
        if args.layers < 1:  # the norms are in the layers
            parser.error(f"--layers: must be at least 1, got {args.layers}")
        sizes = dict(sizes, config=dict(sizes["config"], n_layers=args.layers))
    result = run(sizes, args.modes, args.rounds)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps(dict(environment=environment(), **result), indent=1)
        )
    print(format_table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
