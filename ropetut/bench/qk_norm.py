"""Benchmark rows for issue 18: QK-RMSNorm + RoPE, fused against its unfused peers.

``python -m ropetut bench-qk-norm [--json PATH]`` times, on each of ``SHAPES``, side by
side in one run, eager and from CUDA graphs, fwd and fwd+bwd (the gradients of q, k, w_q
and w_k):

- ``fused``: ``apply_qk_norm_rope``, one kernel each way;
- ``liger``: Liger's RMSNorm on each head, then Liger's RoPE (two kernels each way);
- ``torch eager``: the unfused PyTorch module (RMSNorm in fp32, then RoPE in fp32);
- ``torch.compile``: that module compiled by Inductor;
- ``copy (floor)``: ``bench.copy`` of q and k (fwd+bwd: of the gradients too).

Two floors, with U the bytes of q and k: ``pct_floor`` is the copy's (2U fwd, 4U
fwd+bwd, as ``python -m ropetut bench`` counts RoPE's); ``pct_byte_floor`` is the fused
kernel's own: 2U fwd (q and k read and written once), 5U fwd+bwd (the backward reads x
and dy and writes dx, 3U), timed as 1.25 copies (the copy's row has none). The unfused
pair moves at least 9U fwd+bwd. ``gbps`` is the copy's bytes over the time, as
``bench`` counts it: a rate to compare providers by, not what each one moves. An eager
row with ``host_paced`` took over ``HOST_PACED`` times its graphed time: the host, not
the GPU, set its pace, and its percentages measure the host. Then host rows
(``host_rows``): host microseconds per call on ``bench.HOST_SHAPE``, where the GPU
waits for the host, for ``fused`` called eagerly, ``fused (torch.ops)`` (its registered
operator, through the dispatcher) and ``liger``.

Inputs are laid out as Hugging Face's Qwen3 makes them: the projection viewed as
(B, T, H, D), normalised there, and handed to RoPE as (B, H, T, D) views. The timers,
inputs, table and the check that a provider writes only into what it declares in
``MUTATES`` are ``ropetut.bench``'s; without a GPU nothing is timed. Liger writes its
input gradients into the output gradients' buffers: a comparison of providers hands
each one ``bench.clones`` of the inputs.
"""

import argparse
import json
from functools import partial
from pathlib import Path

import torch

from .. import bench
from ..qk_norm import apply_qk_norm_rope
from ..runtime import DEVICE, NO_GPU, on_gpu
from ..tables import rope_tables, standard

FUSED, LIGER, EAGER, COMPILED = "fused", "liger", "torch eager", "torch.compile"
FUSED_OP = "fused (torch.ops)"  # the registered operator, called eagerly
PROVIDERS = (bench.COPY, FUSED, LIGER, EAGER, COMPILED)
HOST_PROVIDERS = (FUSED, FUSED_OP, LIGER)
NO_LIGER = "liger_kernel does not import (pip install liger-kernel)"
# the fused kernel's bytes over the copy's: fwd 2U / 2U, fwd+bwd 5U / 4U
BYTE_FLOOR_OVER_COPY = {"fwd": 1.0, "fwd+bwd": 1.25}
HOST_PACED = 1.1  # eager ms over graphed ms above which the host set the pace
# What a provider writes into, of q, k, gq, gk (bench.check_untouched): the backward
# of Liger's RoPE writes dq, dk into gq, gk, and its RMSNorm's writes dx into dy,
# there too.
MUTATES = {LIGER: ("gq", "gk")}
SHAPES = [
    bench.Shape(4, 4096, 32, 8, 128),  # Qwen3-8B-like
    bench.Shape(1, 32768, 32, 8, 128),  # Qwen3-8B-like, long
    bench.Shape(1, 8192, 40, 8, 128),  # Qwen3-14B-like (axolotl #3680's shape)
    # decode: one token, from a KV cache
    bench.Shape(64, 1, 32, 8, 128, positions=True),
]
EPS = 1e-6


def liger_pair():
    """(LigerRMSNormFunction, LigerRopeFunction), or None when liger_kernel does not
    import."""
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.rope import LigerRopeFunction
    except ImportError:
        return None
    return LigerRMSNormFunction, LigerRopeFunction


def unfused(q, k, w_q, w_k, c, s):
    """The PyTorch module: RMSNorm over D in fp32, times w, then half-split RoPE in
    fp32, cast back once. q, k: (B, T, H, D); c, s: each token's table rows,
    (B or 1, T, 1, D/2)."""

    def norm(x, w):
        x = x.float()
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.float()

    def rope(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    return rope(norm(q, w_q)).type_as(q), rope(norm(k, w_k)).type_as(k)


def make_provider(name: str, shape: bench.Shape):
    """``fn(q, k) -> (q_out, k_out)`` on (B, T, H, D) tensors, with weights (requiring
    grad) and tables built here, untimed. Returns (fn, (w_q, w_k))."""
    n_rows = bench.N_POSITIONS if shape.positions else shape.T
    cos, sin = rope_tables(standard(shape.D), n_rows, device=DEVICE)
    if shape.positions:
        pos = torch.randint(0, n_rows, (shape.B, shape.T), device=DEVICE)
    else:  # positions 0..T-1, one (1, T) row shared by the batch
        pos = torch.arange(shape.T, device=DEVICE)[None]
    w_q, w_k = (1 + 0.1 * torch.randn(2, shape.D, device=DEVICE)).unbind()
    weights = (w_q.requires_grad_(), w_k.requires_grad_())
    if name == FUSED:
        positions = pos if shape.positions else None
        fn = partial(
            apply_qk_norm_rope, w_q=w_q, w_k=w_k, cos=cos, sin=sin, positions=positions
        )
        return lambda q, k: fn(q, k), weights
    if name == FUSED_OP:
        positions = pos if shape.positions else None
        op = torch.ops.ropetut.qk_norm_rope
        args = (w_q, w_k, cos, sin, positions, EPS, False, shape.D, 0.0)
        return lambda q, k: op(q, k, *args), weights
    if name in (EAGER, COMPILED):
        c, s = cos[pos][:, :, None], sin[pos][:, :, None]
        fn = partial(unfused, w_q=w_q, w_k=w_k, c=c, s=s)
        if name == COMPILED:
            torch._dynamo.reset()  # a fresh static-shape compile per shape
            fn = torch.compile(fn, dynamic=False)
        return lambda q, k: fn(q, k), weights
    if name == LIGER:
        rms_norm, rope = liger_pair()
        # Full-width tables in the activations' dtype, (1, T, D) or rows at positions.
        cos2 = torch.cat((cos, cos), -1).to(shape.dtype)
        sin2 = torch.cat((sin, sin), -1).to(shape.dtype)
        c, s = cos2[pos], sin2[pos]

        def liger(q, k):  # HF's Qwen3: norm on (B, T, H, D), RoPE on (B, H, T, D) views
            q = rms_norm.apply(q, w_q, EPS).transpose(1, 2)
            k = rms_norm.apply(k, w_k, EPS).transpose(1, 2)
            q_out, k_out = rope.apply(q, k, c, s)
            return q_out.transpose(1, 2), k_out.transpose(1, 2)

        return liger, weights
    raise ValueError(f"name: must be one of {PROVIDERS[1:]}, got {name!r}")


def one_line(error: Exception) -> str:
    """An error as a row's ``error``: its type and first line, at most 200 chars."""
    return f"{type(error).__name__}: {error}".splitlines()[0][:200]


def training_step(fn, weights):
    """Forward, then the gradients of q, k, w_q and w_k from output gradients gq, gk."""

    def step(q, k, gq, gk):
        return torch.autograd.grad(fn(q, k), (q, k, *weights), (gq, gk))

    return step


def measure(name, shape, mode, floor_ms, graph_floor_ms):
    """One row, in ``bench.format_table``'s form; a provider that raises: its error."""
    row = dict(
        shape=shape.label,
        tokens=shape.tokens,
        provider=name,
        mode=mode,
        ms=None,
        gbps=None,
        pct_floor=None,
        vs_liger=None,
        graph_ms=None,
        graph_pct_floor=None,
        graph_vs_liger=None,
        pct_byte_floor=None,
        graph_pct_byte_floor=None,
        host_paced=None,
        peak_mem_mb=None,
        error=None,
    )
    inputs = partial(bench.make_inputs, shape, mode)
    try:
        if name == bench.COPY:
            fn, ms, graphed = bench.copy, floor_ms, graph_floor_ms
        else:
            fn, weights = make_provider(name, shape)
            fn = training_step(fn, weights) if mode == "fwd+bwd" else fn
            w_q, w_k = weights
            mutates = MUTATES.get(name, ())
            bench.check_untouched(name, fn, inputs(), mutates, w_q=w_q, w_k=w_k)
            ms = bench.time_ms(fn, make_inputs=inputs)
            graphed = bench.graph_ms(fn, make_inputs=inputs)
        row.update(
            ms=ms,
            gbps=bench.bytes_moved(shape, mode) / ms / 1e6,
            pct_floor=floor_ms / ms * 100,
            graph_ms=graphed,
            graph_pct_floor=graph_floor_ms / graphed * 100,
            host_paced=ms > HOST_PACED * graphed,
            peak_mem_mb=bench.peak_mem_mb(fn, inputs()),
        )
        if name != bench.COPY:  # the fused kernel's floor, 1.25 copies fwd+bwd
            over_copy = BYTE_FLOOR_OVER_COPY[mode]
            row.update(
                pct_byte_floor=floor_ms * over_copy / ms * 100,
                graph_pct_byte_floor=graph_floor_ms * over_copy / graphed * 100,
            )
    except Exception as e:  # one failing peer must not end the benchmark
        row["error"] = one_line(e)
    return row


def run(shapes=SHAPES, providers=PROVIDERS, modes=bench.MODES):
    """Every provider on every shape and mode, the copy floor first. Returns the rows,
    or None without a GPU."""
    if not on_gpu():
        print(NO_GPU)
        return None
    providers = [p for p in providers if p != LIGER or liger_pair() is not None]
    rows = []
    for shape in shapes:
        for mode in modes:
            floor_ms = bench.copy_floor_ms(shape, mode)
            graph_floor_ms = bench.copy_floor_ms(shape, mode, graphed=True)
            rows += [
                measure(p, shape, mode, floor_ms, graph_floor_ms) for p in providers
            ]
    for prefix in ("", "graph_"):
        liger = {
            (r["shape"], r["mode"]): r[prefix + "ms"]
            for r in rows
            if r["provider"] == LIGER and r[prefix + "ms"]
        }
        for r in rows:
            key = (r["shape"], r["mode"])
            if key in liger and r[prefix + "ms"]:
                r[prefix + "vs_liger"] = r[prefix + "ms"] / liger[key]
    return rows


def host_rows(
    providers=HOST_PROVIDERS, modes=bench.MODES, shape=bench.HOST_SHAPE, rounds=9
):
    """Host microseconds per call of each provider on a shape so small that the GPU
    waits for the host, fwd and fwd+bwd (the weights' gradients too), and the ratio to
    Liger's; as ``bench.host_rows``: providers take turns, ``rounds`` rounds of one
    timed loop each, a provider's figure its median round. A provider that does not
    import (Liger) or raises gets a row with the reason instead. Returns the rows, or
    None without a GPU."""
    if not on_gpu():
        print(NO_GPU)
        return None
    rows = []
    for mode in modes:
        steps, inputs, errors = {}, {}, {}
        for name in providers:
            if name == LIGER and liger_pair() is None:
                errors[name] = NO_LIGER
                continue
            try:
                fn, weights = make_provider(name, shape)
                step = training_step(fn, weights) if mode == "fwd+bwd" else fn
                inputs[name] = bench.make_inputs(shape, mode)  # its own: Liger writes
                w_q, w_k = weights
                mutates = MUTATES.get(name, ())
                bench.check_untouched(
                    name, step, inputs[name], mutates, w_q=w_q, w_k=w_k
                )
                for _ in range(20):  # warm up: compile, fill the launch caches
                    step(*inputs[name])
                steps[name] = step
            except Exception as e:  # one failing provider must not end the rows
                errors[name] = one_line(e)
        times = {name: [] for name in steps}
        for _ in range(rounds):
            for name, step in steps.items():
                if name in errors:  # raised in an earlier round
                    continue
                try:
                    times[name].append(bench.host_us(step, inputs[name]))
                except Exception as e:
                    errors[name] = one_line(e)
                    del times[name]
        for name in providers:
            if name in times:
                median = sorted(times[name])[rounds // 2]
                rows.append(_host_row(name, mode, shape, host_us=median))
            else:
                rows.append(_host_row(name, mode, shape, error=errors[name]))
    liger = {r["mode"]: r["host_us"] for r in rows if r["provider"] == LIGER}
    for r in rows:
        if r["host_us"] and liger.get(r["mode"]):
            r["vs_liger"] = r["host_us"] / liger[r["mode"]]
    return rows


def _host_row(name, mode, shape, host_us=None, error=None):
    """One row of ``host_rows``: a time, or the error that took its place."""
    return dict(
        provider=name,
        mode=mode,
        shape=shape.label,
        host_us=host_us,
        vs_liger=None,
        error=error,
    )


def format_byte_floor_table(rows) -> str:
    """The fused rows against the fused kernel's byte floor (2U fwd, 5U fwd+bwd)."""
    lines = [f"{'fused':37} {'mode':7} {'% byte floor':>12} {'graphed':>8}"]
    for r in rows:
        if r["provider"] == FUSED and r["pct_byte_floor"]:
            lines.append(
                f"{r['shape']:37} {r['mode']:7} {r['pct_byte_floor']:11.0f}% "
                f"{r['graph_pct_byte_floor']:7.0f}%"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ropetut bench-qk-norm", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--json", metavar="PATH", help="write {environment, rows, host} here"
    )
    parser.add_argument(
        "--no-host", action="store_true", help="skip the host-time-per-call rows"
    )
    args = parser.parse_args(argv)
    rows = run()
    if rows is None:
        return 0

    def write(host):
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            result = {"environment": bench.environment(), "rows": rows, "host": host}
            Path(args.json).write_text(json.dumps(result, indent=1))

    write(None)  # the rows are kept even if the host rows fail
    host = None if args.no_host else host_rows()
    write(host)
    bench.print_table(rows)
    print()
    print(format_byte_floor_table(rows))
    if host:
        print()
        print(bench.format_host_table([r for r in host if r["host_us"]]))
        for r in host:
            if r["error"]:
                print(f"{r['provider']} {r['mode']}: skipped: {r['error']}")
    return 1 if any(r["error"] and r["provider"] == FUSED for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
