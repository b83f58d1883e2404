"""The benchmark harness: every version and every peer against the copy floor, on the
seeds' shapes.

The benchmarks are kept beside the library and are not part of its API: this package is
the harness, and ``qk_norm`` holds issue 18's fused QK-norm + RoPE rows.

``python -m ropetut bench [--quick]`` prints the tables; chapters call ``run``,
``host_rows``, ``show_table`` and ``show_host_table`` (tables for the book's column) and
``plot``. Every row is timed twice, because a call costs host time and GPU time and a
slow host hides a fast kernel:

- eager: ``triton.testing.do_bench`` medians of plain calls, host and GPU together
  (do_bench clears L2 with a kernel before each call, which gives the host a head start:
  a call whose host time is shorter than that shows its GPU time only); two rows whose
  ratio matters can be timed in turn, call by call (``interleaved_ms``);
- graphed: the same calls captured in one CUDA graph and replayed, the GPU alone.

Each input set is fresh random data, and small problems rotate among enough sets to fill
four times L2, so no timing reads a warm cache. ``host_rows`` measures the host's own
cost per call, on tensors so tiny that the GPU waits for the host. Without a GPU nothing
is timed: ``run`` prints ``NO_GPU`` and returns None.

Before a provider is timed, ``check_untouched`` runs it once: a provider that writes
into an input or gradient buffer it does not declare in ``MUTATES`` gets an error, not
a time.
"""

import argparse
import itertools
import json
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import triton
import triton.language as tl
from tqdm.auto import tqdm
from triton.testing import do_bench

from ..autograd import apply_rope
from ..book import provenance, report
from ..kernels import KERNELS, unavailable
from ..reference import LlmRotary, rope_rotate_half
from ..runtime import DEVICE, NO_GPU, on_gpu
from ..tables import rope_tables, standard

MODES = ("fwd", "fwd+bwd")
COPY = "copy (floor)"
PEERS = ("torch eager", "torch.compile", "HF rotate_half", "liger")
VERSIONS = (
    "v1",
    "v2",
    "v3",
    "v4",
    "final",
    "final (in place)",
    "final (partial, in place)",
    "final (interleaved)",  # pairs (x[2i], x[2i+1]); the bytes "final" moves
)
CUTE = "cute"  # the CuTeDSL kernel (appendix): timed where nvidia-cutlass-dsl imports
PROVIDERS = (COPY, *PEERS, *VERSIONS, CUTE)
# the CLI's --plot: the peers a reader compares with, and the book's kernel
PLOTTED = ("torch eager", "torch.compile", "liger", "final")
# host_rows: what an empty autograd.Function costs
AUTOGRAD_FLOOR = "autograd.Function floor"
# autograd refuses in place on a leaf
FWD_ONLY = ("final (in place)", "final (partial, in place)")
# What a provider writes into, of the buffers the harness hands it (q, k; gq, gk in
# fwd+bwd): check_untouched lets it change these and nothing else. Liger's forward
# rotates q and k in place; its backward writes dq, dk into gq, gk.
MUTATES = {
    "final (in place)": ("q", "k"),
    "final (partial, in place)": ("q", "k"),
    "liger": ("q", "k", "gq", "gk"),
}
# gather rows at positions
PEERS_AT_POSITIONS = (COPY, "torch eager", "torch.compile", "liger")
# The providers that run a registry kernel on the shape's positions: whether they can
# is the kernel's ``Supports``. ("final (partial, in place)" is chapter 7's, without
# positions.)
IMPL_OF = {
    "v1": "v1",
    "v2": "v2",
    "v3": "v3",
    "v4": "v4",
    "final": "final",
    "final (in place)": "final",
    "final (interleaved)": "final",
    CUTE: "cute",
}


@dataclass(frozen=True)
class Shape:
    """q is (B, T, HQ, D), k is (B, T, HK, D): the seed's layout, stored contiguous."""

    B: int
    T: int
    HQ: int
    HK: int
    D: int
    dtype: torch.dtype = torch.bfloat16
    # decode: each token at a random position of a 4096-row table
    positions: bool = False

    @property
    def label(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.B}x{self.T}x{self.HQ}/{self.HK}x{self.D} {dtype}" + (
            " positions" if self.positions else ""
        )

    @property
    def tokens(self) -> int:
        return self.B * self.T


def _bhtd(B, H, T, D):
    """The seeds write their configs B x H x T x D."""
    return Shape(B, T, H, H, D)


SHAPES = {
    "seed000": [
        _bhtd(1, 8, 128, 64),
        _bhtd(2, 8, 256, 64),
        _bhtd(4, 12, 512, 64),
        _bhtd(8, 16, 1024, 64),
        _bhtd(1, 8, 2048, 128),
        _bhtd(2, 16, 512, 128),
    ],
    # Seed 001 swept N rows of D=128; we read them as N tokens of one sequence (B=1)
    # with 16 q and 16 k heads, so the sweep moves the same bytes per token as a
    # 16-head model.
    "seed001": [Shape(1, n, 16, 16, 128) for n in range(2048, 63488 + 1, 4096)],
    "seed002": [_bhtd(4, 16, 4096, 256)],
    "seed004": [_bhtd(4, 8, 2048, 128), _bhtd(32, 32, 4096, 128)],
    "llama3_8b": [Shape(8, 4096, 32, 8, 128)],
    # one decode step of a Llama-3-8B-like model serving 64 sequences: one token each,
    # from a KV cache
    "decode": [Shape(64, 1, 32, 8, 128, positions=True)],
    # from 16 tokens, where the host sets the pace, to 64k, where the GPU does
    "tokens": [Shape(1, 2**n, 16, 16, 128) for n in range(4, 17, 2)],
}
QUICK = (
    SHAPES["seed002"]
    + SHAPES["seed004"]
    + SHAPES["llama3_8b"]
    + SHAPES["seed001"][::5]
    + SHAPES["decode"]
)
N_POSITIONS = 4096
HOST_SHAPE = Shape(1, 16, 4, 4, 64)  # so small that the GPU always waits for the host


def bytes_moved(shape: Shape, mode: str) -> int:
    """The fewest bytes RoPE must move: q and k read once and written once (tables
    ignored). fwd+bwd moves it twice: the backward reads the output gradients and writes
    the input ones."""
    elements = shape.B * shape.T * (shape.HQ + shape.HK) * shape.D
    return 2 * elements * shape.dtype.itemsize * (2 if mode == "fwd+bwd" else 1)


def make_inputs(shape: Shape, mode: str) -> tuple:
    """One fresh random input set on the GPU: (q, k), or for fwd+bwd (q, k, gq, gk) with
    q and k leaves that require grad and gq, gk the gradients of the outputs."""

    def randn(H):
        return torch.randn(
            shape.B, shape.T, H, shape.D, device=DEVICE, dtype=shape.dtype
        )

    if mode == "fwd":
        return randn(shape.HQ), randn(shape.HK)
    return (
        randn(shape.HQ).requires_grad_(),
        randn(shape.HK).requires_grad_(),
        randn(shape.HQ),
        randn(shape.HK),
    )


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(DEVICE)
    return getattr(props, "L2_cache_size", 0) or 50 * 2**20  # 50 MB: an H100's


def input_sets(make_inputs) -> list:
    """Enough fresh input sets that together they hold four times L2 (at least two, at
    most 1024). Barely more than L2 is not enough: a replay then finds part of the last
    sets still cached, and more of them when a provider works in place (Liger) than when
    it writes new outputs."""
    first = make_inputs()
    set_bytes = sum(t.nbytes for t in first)
    return [first] + [
        make_inputs()
        for _ in range(min(1023, max(1, -(-4 * l2_bytes() // set_bytes) - 1)))
    ]


INPUT_NAMES = ("q", "k", "gq", "gk")  # make_inputs' order


def clones(inputs) -> tuple:
    """Fresh copies of an input set, leaves requiring grad where the originals did: what
    each provider gets when several are compared, so none reads another's writes."""
    return tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)


def check_untouched(name, fn, inputs, mutates=(), **others):
    """Run ``fn(*inputs)`` once; raise unless every input (named as in INPUT_NAMES) and
    every tensor in ``others`` (weights) is bit for bit what it was, save those named in
    ``mutates``: the provider's entry in MUTATES, declared beside the providers.

    A provider that writes into its inputs or output gradients (Liger) is timed as it
    is, on buffers it keeps rewriting: what it does per call does not depend on the
    values, and copying inside the timed closure would charge it for a copy. So the
    harness only has to know: an undeclared write is a bug (in the provider or in its
    wrapper here), and a declared one means a comparison must hand it ``clones``."""
    named = dict(zip(INPUT_NAMES, inputs), **others)
    before = {
        key: t for key, t in zip(named, clones(named.values())) if key not in mutates
    }
    fn(*inputs)
    written = [key for key, old in before.items() if not _same_bits(named[key], old)]
    if written:
        raise RuntimeError(
            f"{name!r} wrote into {', '.join(written)}, which it does "
            f"not declare (it declares {tuple(mutates)})"
        )


def _same_bits(a, b) -> bool:
    """Bit for bit: -0.0 is not 0.0, and a NaN equals itself."""
    return torch.equal(*(t.detach().flatten().view(torch.uint8) for t in (a, b)))


def time_ms(fn, *, make_inputs=None) -> float:
    """Median milliseconds of one eager ``fn(*inputs)`` (``fn()`` without make_inputs),
    by do_bench: 25 ms of warm-up, 100 ms of repeats, cycling through ``input_sets``.
    Host and GPU together: when the host takes longer to issue a call than the GPU to
    run it, this is the host."""
    if make_inputs is None:
        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    cycle = itertools.cycle(input_sets(make_inputs))
    return do_bench(lambda: fn(*next(cycle)), warmup=25, rep=100, return_mode="median")


def interleaved_ms(fns, *, make_inputs) -> list:
    """Median milliseconds of one eager call of each of ``fns``, timed as ``time_ms``
    times one call (events around it, L2 cleared before it, 25 ms of warm-up, about
    100 ms of repeats a function, cycling through ``input_sets``) but in turn, call by
    call, on the same inputs: a, b, then b, a. A host-paced call's time drifts from one
    moment to the next by more than two providers differ; taking turns lands each
    moment on all of them. Returns one time per function, in order."""
    sets = input_sets(make_inputs)
    for fn in fns:  # compile, allocate
        fn(*sets[0])
    torch.cuda.synchronize()
    start = time.perf_counter()
    for fn in fns:
        fn(*sets[0])
    torch.cuda.synchronize()
    round_ms = (time.perf_counter() - start) * 1e3  # one call of each
    cache = torch.empty(256 * 2**20, dtype=torch.int8, device=DEVICE)
    for _, inputs in zip(range(max(1, int(25 / round_ms))), itertools.cycle(sets)):
        for fn in fns:
            fn(*inputs)
    n = max(5, int(100 * len(fns) / round_ms))
    events = [
        [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
         for _ in range(n)]
        for _ in fns
    ]  # fmt: skip
    order = list(range(len(fns)))
    for i, inputs in zip(range(n), itertools.cycle(sets)):
        for j in order if i % 2 == 0 else order[::-1]:
            cache.zero_()
            events[j][i][0].record()
            fns[j](*inputs)
            events[j][i][1].record()
    torch.cuda.synchronize()
    return [
        torch.tensor([a.elapsed_time(b) for a, b in pairs]).median().item()
        for pairs in events
    ]


def graph_ms(fn, *, make_inputs) -> float:
    """Median milliseconds of one ``fn(*inputs)`` replayed from a CUDA graph: the GPU's
    time alone. One graph calls fn once on each of ``input_sets``; it is replayed by
    do_bench and its time divided by the number of calls."""
    sets = input_sets(make_inputs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    # compile, autotune, allocate: nothing of that in the graph
    with torch.cuda.stream(side):
        for inputs in sets:
            fn(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for inputs in sets:
            fn(*inputs)
    ms = do_bench(graph.replay, warmup=25, rep=100, return_mode="median") / len(sets)
    del graph
    return ms


def host_us(fn, inputs, calls=300) -> float:
    """Host microseconds per ``fn(*inputs)`` over one timed loop of calls, on tensors so
    small that the GPU finishes each kernel before the host has issued the next."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(*inputs)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def peak_mem_mb(fn, inputs) -> float:
    """MB that one ``fn(*inputs)`` allocates at its peak, over what was allocated
    before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(*inputs)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


COPY_BLOCK = 8192  # elements a program of copy_kernel


@triton.jit
def copy_kernel(src, dst, N, BLOCK: tl.constexpr):
    """dst[:N] = src[:N], BLOCK elements a program."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + offsets, tl.load(src + offsets, mask=offsets < N), mask=offsets < N)


def copy(*tensors):
    """The floor: a device copy of every input (q, k; for fwd+bwd also the gradients
    gq, gk), each by one launch of a copy kernel on the SMs, as RoPE's kernels run.
    Not ``clone()``: that is a cudaMemcpy, which a CUDA graph captures as a memcpy
    node, and that node was slower than an SM copy on the H100 at a shape of 1 GiB
    (``scripts/probe_copy_floor.py``, ``results/copy_floor_h100.txt``)."""
    outs = []
    for t in tensors:
        if not t.is_contiguous():
            raise ValueError("copy: the floor copies contiguous tensors")
        out = torch.empty_like(t)
        n = t.numel()
        copy_kernel[(triton.cdiv(n, COPY_BLOCK),)](
            t.detach(), out, n, BLOCK=COPY_BLOCK, num_warps=8
        )
        outs.append(out)
    return outs


def copy_floor_ms(shape: Shape, mode: str, *, graphed: bool = False) -> float:
    timer = graph_ms if graphed else time_ms
    return timer(copy, make_inputs=partial(make_inputs, shape, mode))


def liger_rope():
    """Liger-Kernel's LigerRopeFunction, or None when liger_kernel does not import."""
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except ImportError:
        return None
    return LigerRopeFunction


def liger_version():
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("liger-kernel")
    except PackageNotFoundError:
        return None


def make_provider(name: str, shape: Shape):
    """``fn(q, k) -> (q_out, k_out)`` on (B, T, H, D) tensors; tables are built here,
    untimed. With ``shape.positions`` each token is at a random row of an
    N_POSITIONS-row table, as in decode: ropetut takes the positions, the others gather
    their cos/sin rows on every call, the way a Hugging Face model computes them from
    ``position_ids``."""
    n_rows = N_POSITIONS if shape.positions else shape.T
    cos, sin = rope_tables(standard(shape.D), n_rows, device=DEVICE)
    pos = (
        torch.randint(0, n_rows, (shape.B, shape.T), device=DEVICE)
        if shape.positions
        else None
    )
    if name in ("torch eager", "torch.compile"):
        if shape.positions:

            def eager(q, k):
                return rope_at_positions(q, cos, sin, pos), rope_at_positions(
                    k, cos, sin, pos
                )
        else:
            # the seed's module: fp32 math, cast back
            rotary = LlmRotary(shape.D, shape.T).to(DEVICE)

            def eager(q, k):
                return rotary(q), rotary(k)

        if name == "torch eager":
            return eager
        # a fresh static-shape compile per shape, never the recompile limit
        torch._dynamo.reset()
        return torch.compile(eager, dynamic=False)
    if name in ("HF rotate_half", "liger"):
        # Hugging Face's convention: (B, H, T, D) views, tables in the
        # activations' dtype.
        cos, sin = cos.to(shape.dtype), sin.to(shape.dtype)
        if name == "HF rotate_half":  # widens the tables itself, on every call
            rotate = partial(rope_rotate_half, cos=cos, sin=sin)
        else:  # fused q and k, in place on the (B, T, H, D) storage
            cos2, sin2 = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)

            # (1, T, D) full-width tables, or (B, T, D) rows at positions
            def rotate(q, k):
                c, s = (
                    (cos2[pos], sin2[pos])
                    if shape.positions
                    else (cos2[None], sin2[None])
                )
                return liger_rope().apply(q, k, c, s)

        def bhtd(q, k):
            q_out, k_out = rotate(q.transpose(1, 2), k.transpose(1, 2))
            return q_out.transpose(1, 2), k_out.transpose(1, 2)

        return bhtd
    # the registered operator, called eagerly through the dispatcher
    if name == "final (torch.ops)":
        return lambda q, k: torch.ops.ropetut.rope(
            q, k, cos, sin, pos, False, shape.D, False, "final", False
        )
    # chapter 7: rotate half the dims, skip the rest
    if name == "final (partial, in place)":
        cos, sin = rope_tables(standard(shape.D // 2), n_rows, device=DEVICE)
        return partial(
            apply_rope, cos=cos, sin=sin, rotary_dim=shape.D // 2, inplace=True
        )
    impl = IMPL_OF[name]
    return partial(
        apply_rope,
        cos=cos,
        sin=sin,
        positions=pos,
        impl=impl,
        interleaved=name == "final (interleaved)" or not KERNELS[impl].half_split,
        inplace=name == "final (in place)",
    )


def rope_at_positions(x, cos, sin, positions):
    """Eager PyTorch RoPE at given positions: gather each token's rows, rotate
    half-split pairs in fp32, cast back. x: (B, T, H, D); positions: (B, T)."""
    c, s = cos[positions][:, :, None], sin[positions][:, :, None]
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).type_as(x)


def training_step(fn):
    """Forward, then backward from the given output gradients gq, gk to the inputs'
    gradients (``autograd.grad``: nothing accumulates, so eager and graphed runs do the
    same work)."""

    def step(q, k, gq, gk):
        return torch.autograd.grad(fn(q, k), (q, k), (gq, gk))

    return step


def supports(name: str, shape: Shape, mode: str) -> bool:
    at_positions = name in PEERS_AT_POSITIONS or (
        name in IMPL_OF and KERNELS[IMPL_OF[name]].supports.positions
    )
    return (mode == "fwd" or name not in FWD_ONLY) and (
        not shape.positions or at_positions
    )


def measure(
    name: str,
    shape: Shape,
    mode: str,
    floor_ms: float,
    graph_floor_ms: float | None,
    make=None,
    eager_ms=None,
) -> dict:
    """One row of the table, eager and (unless graph_floor_ms is None) graphed. A
    provider that raises gets its error recorded instead of a time. make: ``make(name,
    shape)`` builds the provider (default: ``make_provider``). eager_ms: its eager time,
    measured already (``interleaved_ms``); None: ``time_ms`` here."""
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
        peak_mem_mb=None,
        error=None,
    )
    inputs = partial(make_inputs, shape, mode)
    try:
        if name == COPY:
            fn, ms, graphed = copy, floor_ms, graph_floor_ms  # run() timed it first
        else:
            fn = (make or make_provider)(name, shape)
            fn = training_step(fn) if mode == "fwd+bwd" else fn
            check_untouched(name, fn, inputs(), MUTATES.get(name, ()))
            ms = time_ms(fn, make_inputs=inputs) if eager_ms is None else eager_ms
            graphed = (
                None if graph_floor_ms is None else graph_ms(fn, make_inputs=inputs)
            )
        row.update(
            ms=ms,
            gbps=bytes_moved(shape, mode) / ms / 1e6,
            pct_floor=floor_ms / ms * 100,
            peak_mem_mb=peak_mem_mb(fn, inputs()),
        )
        if graphed is not None:
            row.update(graph_ms=graphed, graph_pct_floor=graph_floor_ms / graphed * 100)
    except Exception as e:  # one failing peer must not end the benchmark
        row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    return row


def run(shapes, providers=None, modes=("fwd",), progress=True, graphs=True):
    """Time the providers on each shape and mode, the copy floor first, eagerly and
    (with ``graphs``) from CUDA graphs. Returns the rows, or None without a GPU."""
    if not on_gpu():
        print(NO_GPU)
        return None
    providers = list(providers or PROVIDERS)
    if "liger" in providers and liger_rope() is None:
        print("liger: liger_kernel does not import (pip install liger-kernel), skipped")
        providers.remove("liger")
    if CUTE in providers and unavailable(CUTE):
        print(f"cute: skipped: {unavailable(CUTE)}")
        providers.remove(CUTE)
    todo = [
        (shape, mode, [n for n in providers if supports(n, shape, mode)])
        for shape in shapes
        for mode in modes
    ]
    rows = []
    with tqdm(total=sum(len(names) for *_, names in todo), disable=not progress) as bar:
        for shape, mode, names in todo:
            floor_ms = copy_floor_ms(shape, mode)
            graph_floor_ms = (
                copy_floor_ms(shape, mode, graphed=True) if graphs else None
            )
            for name in names:
                bar.set_description(f"{shape.label} {mode} {name}")
                rows.append(measure(name, shape, mode, floor_ms, graph_floor_ms))
                bar.update()
    for prefix in ("", "graph_"):
        liger = {
            (r["shape"], r["mode"]): r[prefix + "ms"]
            for r in rows
            if r["provider"] == "liger" and r[prefix + "ms"]
        }
        for r in rows:
            key = (r["shape"], r["mode"])
            r[prefix + "vs_liger"] = (
                r[prefix + "ms"] / liger[key]
                if key in liger and r[prefix + "ms"]
                else None
            )
    return rows


HOST_PROVIDERS = (
    "torch eager",
    "torch.compile",
    "liger",
    "final (torch.ops)",
    "final",
    AUTOGRAD_FLOOR,
)


class _Identity(torch.autograd.Function):
    """An autograd.Function that does nothing: its fwd+bwd host time is what autograd
    itself costs any such operator, Liger's and ours included."""

    @staticmethod
    def forward(ctx, q, k):
        return q.view_as(q), k.view_as(k)

    @staticmethod
    def backward(ctx, dq, dk):
        return dq, dk


def host_rows(providers=HOST_PROVIDERS, modes=MODES, shape=HOST_SHAPE, rounds=9):
    """Host microseconds per call of each provider on a tiny shape, and the ratio to
    Liger's. The host is noisy and drifts, so providers take turns: ``rounds`` rounds of
    one timed loop each, and each provider's figure is its median round. Returns a list
    of dicts, or None without a GPU."""
    if not on_gpu():
        print(NO_GPU)
        return None
    providers = [p for p in providers if p != "liger" or liger_rope() is not None]
    rows = []
    for mode in modes:
        fns, inputs = {}, {}
        for name in providers:
            fn = (
                _Identity.apply
                if name == AUTOGRAD_FLOOR
                else make_provider(name, shape)
            )
            fns[name] = training_step(fn) if mode == "fwd+bwd" else fn
            inputs[name] = make_inputs(shape, mode)  # its own: Liger writes there
            check_untouched(name, fns[name], inputs[name], MUTATES.get(name, ()))
            for _ in range(20):  # compile, warm up
                fns[name](*inputs[name])
        times = {name: [] for name in providers}
        for _ in range(rounds):
            for name, fn in fns.items():
                times[name].append(host_us(fn, inputs[name]))
        for name in providers:
            rows.append(
                dict(
                    provider=name,
                    mode=mode,
                    shape=shape.label,
                    host_us=sorted(times[name])[rounds // 2],
                    vs_liger=None,
                )
            )
    liger = {r["mode"]: r["host_us"] for r in rows if r["provider"] == "liger"}
    for r in rows:
        r["vs_liger"] = r["host_us"] / liger[r["mode"]] if r["mode"] in liger else None
    return rows


def format_host_table(rows) -> str:
    lines = [f"{'impl':18} {'mode':7} {'host us/call':>12} {'vs liger':>8}"]
    for r in rows:
        vs = f"{r['vs_liger']:.2f}x" if r["vs_liger"] else "-"
        lines.append(f"{r['provider']:18} {r['mode']:7} {r['host_us']:12.1f} {vs:>8}")
    return "\n".join(lines)


def format_table(rows) -> str:
    lines = [
        f"{'impl':25} {'shape':37} {'mode':7} | "
        f"{'eager ms':>8} {'%floor':>6} {'vs liger':>8} | "
        f"{'graph ms':>8} {'%floor':>6} {'vs liger':>8} | {'peak MB':>7}"
    ]
    for r in rows:
        head = f"{r['provider']:25} {r['shape']:37} {r['mode']:7}"
        if r.get("error"):
            lines.append(f"{head} | error: {r['error']}")
            continue
        cells = []
        for prefix in ("", "graph_"):
            ms, vs = r.get(prefix + "ms"), r.get(prefix + "vs_liger")
            cells.append(
                f"{ms:8.3f} {r[prefix + 'pct_floor']:5.0f}% "
                f"{f'{vs:.2f}x' if vs else '-':>8}"
                if ms
                else f"{'-':>8} {'-':>6} {'-':>8}"
            )
        lines.append(f"{head} | {cells[0]} | {cells[1]} | {r['peak_mem_mb']:7.0f}")
    return "\n".join(lines)


def print_table(rows) -> None:
    print(format_table(rows))


HEADERS = {  # short headers for show_table and show_host_table
    "provider": "impl",
    "pct_floor": "% floor",
    "vs_liger": "÷ Liger",
    "graph_ms": "graph ms",
    "graph_pct_floor": "graph % floor",
    "graph_vs_liger": "graph ÷ Liger",
    "gbps": "GB/s",
    "peak_mem_mb": "peak MB",
    "host_us": "host µs/call",
}
FORMATS = {
    "ms": ".3f",
    "graph_ms": ".3f",
    "pct_floor": ".0f",
    "graph_pct_floor": ".0f",
    "vs_liger": ".2f",
    "graph_vs_liger": ".2f",
    "gbps": ".0f",
    "peak_mem_mb": ".0f",
    "host_us": ".1f",
}
DEFAULT_COLUMNS = (
    "shape",
    "mode",
    "provider",
    "ms",
    "pct_floor",
    "graph_ms",
    "graph_pct_floor",
    "vs_liger",
)


def _columns(keys):
    return [(key, HEADERS.get(key, key)) for key in keys]


def show_table(rows, columns=DEFAULT_COLUMNS, *, full=True):
    """The rows as a table for the book's column: ``columns`` (keys of the rows), and
    with ``full`` every column folded below it. In a notebook, end the cell with it."""
    every = dict.fromkeys(key for r in rows for key in r)
    return report.html_table(
        rows,
        _columns(columns),
        formats=FORMATS,
        full=_columns(every) if full else None,
    )


def show_host_table(rows):
    """``host_rows`` as a table for the book's column:
    ``format_host_table``'s columns."""
    return report.html_table(
        rows,
        _columns(("provider", "mode", "host_us", "vs_liger")),
        formats=FORMATS,
        caption=f"host time per call, on {rows[0]['shape']}" if rows else None,
    )


AXIS_LABELS = {
    "pct_floor": "% of the copy floor (higher is better)",
    "gbps": "GB/s",
    "ms": "ms (lower is better)",
    "tokens": "tokens (B x T)",
}


def _without_T(label):
    B, _T, rest = label.split("x", 2)
    return B, rest


MAX_SERIES = 5  # per panel: more colours than this are hard to tell apart
FIG_WIDTH = 7.84  # inches: 784 px at FIG_DPI, the book's column at natural size
FIG_DPI = 100
FONT, SMALL = 9, 8  # points: 12.5 and 11 px at FIG_DPI


def plot(rows, path=None, *, x="tokens", y="pct_floor", device=None, providers=None):
    """One row of panels per mode; a second column, graphed, when the rows were timed
    from CUDA graphs too. Shapes that differ only in T (a sweep): a line per provider
    over x (log axes when x spans two decades or more). Otherwise: bars, one group per
    shape, one bar per provider.

    providers: the series, in this order (default: every provider in the rows); a panel
    draws at most MAX_SERIES of them, and names without rows are skipped. Drawn 784 px
    wide, for the book's column, with one legend below the panels. Saves a PNG when path
    is given; ``device`` names the GPU in the title (default: this machine's). In a
    notebook, assign the figure (or end the line with ';') so it shows once."""
    import matplotlib.pyplot as plt

    rows = [
        r for r in rows if r["ms"] and not (y == "pct_floor" and r["provider"] == COPY)
    ]
    found = list(dict.fromkeys(r["provider"] for r in rows))
    providers = [p for p in providers if p in found] if providers else found
    rows = [r for r in rows if r["provider"] in providers]
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    most = max(len({r["provider"] for r in rows if r["mode"] == m}) for m in modes)
    if most > MAX_SERIES:
        raise ValueError(
            f"plot draws at most {MAX_SERIES} series per panel, not {most}: "
            f"choose them with providers=[...] (of {', '.join(providers)})"
        )
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    columns = [("eager", y)] + (
        [("CUDA graph", "graph_" + y)] if any(r.get("graph_" + y) for r in rows) else []
    )
    sweep = len(shapes) >= 3 and len({_without_T(s) for s in shapes}) == 1
    # one dtype: named once, in the x label, not in every tick
    dtypes = {s.split()[1] for s in shapes}
    dtype = f", {dtypes.pop()}" if len(dtypes) == 1 else ""
    ticks = [s.replace(f" {dtype[2:]}", "") if dtype else s for s in shapes]
    fig, axes = plt.subplots(
        len(modes),
        len(columns),
        squeeze=False,
        layout="constrained",
        figsize=(FIG_WIDTH, 2.6 * len(modes) + (0.9 if sweep else 1.4)),
        dpi=FIG_DPI,
        sharex=True,
        sharey="row" if y == "pct_floor" else False,
    )
    for row_axes, mode in zip(axes, modes):
        for ax, (how, key) in zip(row_axes, columns):
            for i, name in enumerate(providers):
                mine = [
                    r
                    for r in rows
                    if r["provider"] == name and r["mode"] == mode and r.get(key)
                ]
                # the same colour for a provider in every figure: black for the floor,
                # C0-C9 for the rest
                style = dict(
                    label=name, color="black" if name == COPY else _color(name)
                )
                if sweep:
                    mine.sort(key=lambda r: r[x])
                    ax.plot(
                        [r[x] for r in mine],
                        [r[key] for r in mine],
                        marker="o",
                        markersize=4,
                        linestyle="--" if name in PEERS else "-",
                        **style,
                    )
                else:
                    width = 0.8 / len(providers)
                    ax.bar(
                        [
                            shapes.index(r["shape"])
                            + (i - (len(providers) - 1) / 2) * width
                            for r in mine
                        ],
                        [r[key] for r in mine],
                        width,
                        **style,
                    )
            if sweep and max(r[x] for r in rows) >= 100 * min(r[x] for r in rows):
                ax.set_xscale("log", base=2)
                if y == "ms":
                    ax.set_yscale("log")
            if not sweep:
                ax.set_xticks(range(len(shapes)), ticks, rotation=30, ha="right")
            if y == "pct_floor":
                ax.axhline(
                    100, color="black", linestyle="--", linewidth=1, label="copy floor"
                )
            ax.set_title(mode if len(columns) == 1 else f"{mode}, {how}", fontsize=FONT)
            if ax is row_axes[0]:
                ax.set_ylabel(AXIS_LABELS[y], fontsize=FONT)
            if mode == modes[-1]:
                xlabel = (
                    AXIS_LABELS[x] if sweep else f"shape (B x T x Hq/Hkv x D{dtype})"
                )
                ax.set_xlabel(xlabel, fontsize=FONT)
            ax.tick_params(which="both", labelsize=SMALL)
            ax.grid(axis="y", alpha=0.3)
    handles = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(
        handles.values(),
        handles.keys(),
        loc="outside lower center",
        ncols=min(len(handles), 3),
        fontsize=SMALL,
        frameon=False,
    )
    device = device or (torch.cuda.get_device_name() if on_gpu() else "no GPU")
    fig.suptitle(f"RoPE on {device}: {AXIS_LABELS[y]}", fontsize=FONT + 1)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=FIG_DPI)
    return fig


def _color(name: str):
    """The same colour for a provider in every figure: C0-C9, then the lighter half
    of tab20."""
    import matplotlib.pyplot as plt

    i = PROVIDERS.index(name) - 1
    return f"C{i}" if i < 10 else plt.get_cmap("tab20").colors[2 * (i - 10) + 1]


def environment() -> dict:
    """Where the numbers come from: provenance.environment() plus liger's version
    (None if absent)."""
    return dict(provenance.environment(), liger=liger_version())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ropetut bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="seed002, seed004, llama3_8b, 4 points of seed001 and decode",
    )
    parser.add_argument(
        "--json", metavar="PATH", help="write {environment, rows, host} here"
    )
    parser.add_argument(
        "--plot",
        metavar="PATH",
        help=f"write a figure of {', '.join(PLOTTED)} here (PNG)",
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=SHAPES,
        metavar="NAME",
        help=f"shape groups, of {', '.join(SHAPES)} (default: all)",
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--no-graphs", action="store_true", help="eager timings only")
    parser.add_argument(
        "--no-host", action="store_true", help="skip the host-time-per-call table"
    )
    args = parser.parse_args(argv)
    if args.shapes:
        shapes = [s for name in args.shapes for s in SHAPES[name]]
    else:
        shapes = (
            QUICK if args.quick else [s for group in SHAPES.values() for s in group]
        )
    rows = run(shapes, modes=args.modes, graphs=not args.no_graphs)
    if rows is None:
        return 0
    host = None if args.no_host else host_rows(modes=args.modes)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(
            json.dumps(
                {"environment": environment(), "rows": rows, "host": host}, indent=1
            )
        )
    print_table(rows)
    if host:
        print()
        print(format_host_table(host))
    if args.plot:
        plot(rows, args.plot, providers=PLOTTED)
    # A peer may fail (its error is in the table); one of ropetut's own versions
    # may not.
    return 1 if any(r["error"] and r["provider"] in VERSIONS for r in rows) else 0
