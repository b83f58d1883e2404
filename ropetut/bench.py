"""The benchmark harness: every version and every peer against the copy floor, on the seeds' shapes.

``python -m ropetut bench [--quick]`` prints the table; chapters call ``run``, ``print_table`` and
``plot``. Times are ``triton.testing.do_bench`` medians; each input set is fresh random data, and
small problems rotate among enough sets to overflow L2, so no timing reads a warm cache.
Without a GPU nothing is timed: ``run`` prints ``NO_GPU`` and returns None.
"""
import argparse
import itertools
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from tqdm.auto import tqdm
from triton.testing import do_bench

from . import notebook
from .autograd import apply_rope
from .reference import LlmRotary, rope_rotate_half
from .runtime import DEVICE, on_gpu
from .tables import rope_tables, standard

MODES = ("fwd", "fwd+bwd")
COPY = "copy (floor)"
PEERS = ("torch eager", "torch.compile", "HF rotate_half", "liger")
VERSIONS = ("v1", "v2", "v3", "v4", "final", "final (in place)")
PROVIDERS = (COPY, *PEERS, *VERSIONS)


@dataclass(frozen=True)
class Shape:
    """q is (B, T, HQ, D), k is (B, T, HK, D): the seed's layout, stored contiguous."""
    B: int
    T: int
    HQ: int
    HK: int
    D: int
    dtype: torch.dtype = torch.bfloat16

    @property
    def label(self) -> str:
        return f"{self.B}x{self.T}x{self.HQ}/{self.HK}x{self.D} {str(self.dtype).removeprefix('torch.')}"

    @property
    def tokens(self) -> int:
        return self.B * self.T


def _bhtd(B, H, T, D):
    """The seeds write their configs B x H x T x D."""
    return Shape(B, T, H, H, D)


SHAPES = {
    "seed000": [_bhtd(1, 8, 128, 64), _bhtd(2, 8, 256, 64), _bhtd(4, 12, 512, 64),
                _bhtd(8, 16, 1024, 64), _bhtd(1, 8, 2048, 128), _bhtd(2, 16, 512, 128)],
    # Seed 001 swept N rows of D=128; we read them as N tokens of one sequence (B=1) with
    # 16 q and 16 k heads, so the sweep moves the same bytes per token as a 16-head model.
    "seed001": [Shape(1, n, 16, 16, 128) for n in range(2048, 63488 + 1, 4096)],
    "seed002": [_bhtd(4, 16, 4096, 256)],
    "seed004": [_bhtd(4, 8, 2048, 128), _bhtd(32, 32, 4096, 128)],
    "llama3_8b": [Shape(8, 4096, 32, 8, 128)],
}
QUICK = SHAPES["seed002"] + SHAPES["seed004"][:1] + SHAPES["llama3_8b"] + SHAPES["seed001"][::5]


def bytes_moved(shape: Shape, mode: str) -> int:
    """The fewest bytes RoPE must move: q and k read once and written once (tables ignored).
    fwd+bwd moves it twice: the backward reads the output gradients and writes the input ones."""
    elements = shape.B * shape.T * (shape.HQ + shape.HK) * shape.D
    return 2 * elements * shape.dtype.itemsize * (2 if mode == "fwd+bwd" else 1)


def make_inputs(shape: Shape, mode: str) -> tuple:
    """One fresh random input set on the GPU: (q, k), or for fwd+bwd (q, k, gq, gk) with q and k
    leaves that require grad and gq, gk the gradients of the outputs."""
    def randn(H):
        return torch.randn(shape.B, shape.T, H, shape.D, device=DEVICE, dtype=shape.dtype)
    if mode == "fwd":
        return randn(shape.HQ), randn(shape.HK)
    return (randn(shape.HQ).requires_grad_(), randn(shape.HK).requires_grad_(),
            randn(shape.HQ), randn(shape.HK))


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(DEVICE)
    return getattr(props, "L2_cache_size", 0) or 50 * 2**20   # 50 MB: an H100's


def time_ms(fn, *, make_inputs=None) -> float:
    """Median milliseconds of one ``fn(*inputs)`` (``fn()`` without make_inputs), by do_bench:
    25 ms of warm-up, 100 ms of repeats. Builds enough input sets that together they overflow L2,
    and cycles through them. Gradients of leaf inputs are reset before each
    timed call, so a backward never adds into an old one."""
    if make_inputs is None:
        return do_bench(fn, warmup=25, rep=100, return_mode="median")
    sets = [make_inputs()]
    set_bytes = sum(t.nbytes for t in sets[0])
    sets += [make_inputs() for _ in range(l2_bytes() // set_bytes)]
    cycle = itertools.cycle(sets)
    leaves = [t for s in sets for t in s if t.requires_grad]
    return do_bench(lambda: fn(*next(cycle)), warmup=25, rep=100,
                    grad_to_none=leaves or None, return_mode="median")


def peak_mem_mb(fn, inputs) -> float:
    """MB that one ``fn(*inputs)`` allocates at its peak, over what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn(*inputs)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def copy(*tensors):
    """The floor: a device copy of every input (q, k; for fwd+bwd also the gradients gq, gk)."""
    with torch.no_grad():
        return [t.clone() for t in tensors]


def copy_floor_ms(shape: Shape, mode: str) -> float:
    return time_ms(copy, make_inputs=partial(make_inputs, shape, mode))


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
    """``fn(q, k) -> (q_out, k_out)`` on (B, T, H, D) tensors; tables are built here, untimed."""
    cos, sin = rope_tables(standard(shape.D), shape.T, device=DEVICE)
    if name in ("torch eager", "torch.compile"):
        rotary = LlmRotary(shape.D, shape.T).to(DEVICE)     # the seed's module: fp32 math, cast back

        def eager(q, k):
            return rotary(q), rotary(k)
        if name == "torch eager":
            return eager
        torch._dynamo.reset()         # a fresh static-shape compile per shape, never the recompile limit
        return torch.compile(eager, dynamic=False)
    if name in ("HF rotate_half", "liger"):
        # Hugging Face's convention: (B, H, T, D) views, tables in the activations' dtype.
        cos, sin = cos.to(shape.dtype), sin.to(shape.dtype)
        if name == "HF rotate_half":  # widens the tables itself, on every call
            rotate = partial(rope_rotate_half, cos=cos, sin=sin)
        else:                         # fused q and k, in place on the (B, T, H, D) storage
            cos2, sin2 = torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None]

            def rotate(q, k):         # (1, T, D) full-width tables
                return liger_rope().apply(q, k, cos2, sin2)

        def bhtd(q, k):
            q_out, k_out = rotate(q.transpose(1, 2), k.transpose(1, 2))
            return q_out.transpose(1, 2), k_out.transpose(1, 2)
        return bhtd
    inplace = name == "final (in place)"
    impl = "final" if inplace else name
    return partial(apply_rope, cos=cos, sin=sin, impl=impl, interleaved=impl == "v1", inplace=inplace)


def training_step(fn):
    """Forward, then backward from the given output gradients gq, gk."""
    def step(q, k, gq, gk):
        torch.autograd.backward(fn(q, k), (gq, gk))
    return step


def measure(name: str, shape: Shape, mode: str, floor_ms: float) -> dict:
    """One row of the table. A provider that raises gets its error recorded instead of a time."""
    row = dict(shape=shape.label, tokens=shape.tokens, provider=name, mode=mode, ms=None, gbps=None,
               pct_floor=None, vs_liger=None, peak_mem_mb=None, error=None)
    inputs = partial(make_inputs, shape, mode)
    try:
        if name == COPY:
            fn, ms = copy, floor_ms   # run() timed it first
        else:
            fn = make_provider(name, shape)
            fn = training_step(fn) if mode == "fwd+bwd" else fn
            ms = time_ms(fn, make_inputs=inputs)
        row.update(ms=ms, gbps=bytes_moved(shape, mode) / ms / 1e6, pct_floor=floor_ms / ms * 100,
                   peak_mem_mb=peak_mem_mb(fn, inputs()))
    except Exception as e:            # one failing peer must not end the benchmark
        row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    return row


def run(shapes, providers=None, modes=("fwd",), progress=True):
    """Time the providers on each shape and mode, the copy floor first. Returns the rows, or
    None without a GPU."""
    if not on_gpu():
        print(notebook.NO_GPU)
        return None
    providers = list(providers or PROVIDERS)
    if "liger" in providers and liger_rope() is None:
        print("liger: liger_kernel does not import (pip install liger-kernel), skipped")
        providers.remove("liger")

    def names(mode):
        """No fwd+bwd row for "final (in place)": autograd refuses an in-place op on a leaf,
        and its backward is final's."""
        return [n for n in providers if not (mode == "fwd+bwd" and n == "final (in place)")]

    rows = []
    with tqdm(total=len(shapes) * sum(len(names(m)) for m in modes), disable=not progress) as bar:
        for shape in shapes:
            for mode in modes:
                floor_ms = copy_floor_ms(shape, mode)
                for name in names(mode):
                    bar.set_description(f"{shape.label} {mode} {name}")
                    rows.append(measure(name, shape, mode, floor_ms))
                    bar.update()
    liger = {(r["shape"], r["mode"]): r["ms"] for r in rows if r["provider"] == "liger" and r["ms"]}
    for r in rows:
        key = (r["shape"], r["mode"])
        r["vs_liger"] = r["ms"] / liger[key] if key in liger and r["ms"] else None
    return rows


def format_table(rows) -> str:
    lines = [f"{'impl':18} {'shape':27} {'mode':7} {'ms':>8} {'GB/s':>6} {'%floor':>6} "
             f"{'vs liger':>8} {'peak MB':>8}"]
    for r in rows:
        head = f"{r['provider']:18} {r['shape']:27} {r['mode']:7}"
        if r.get("error"):
            lines.append(f"{head} error: {r['error']}")
            continue
        vs = f"{r['vs_liger']:.2f}x" if r["vs_liger"] else "-"
        lines.append(f"{head} {r['ms']:8.3f} {r['gbps']:6.0f} {r['pct_floor']:5.0f}% {vs:>8} "
                     f"{r['peak_mem_mb']:8.0f}")
    return "\n".join(lines)


def print_table(rows) -> None:
    print(format_table(rows))


AXIS_LABELS = {"pct_floor": "% of the copy floor (higher is better)", "gbps": "GB/s",
               "ms": "ms (lower is better)", "tokens": "tokens (B x T)"}


def _without_T(label):
    B, _T, rest = label.split("x", 2)
    return B, rest


def plot(rows, path=None, *, x="tokens", y="pct_floor"):
    """One panel per mode. Shapes that differ only in T (a sweep): a line per provider over x.
    Otherwise: bars, one group per shape, one bar per provider. Saves a PNG when path is given.
    In a notebook, assign the figure (or end the line with ';') so it shows once."""
    import matplotlib.pyplot as plt

    rows = [r for r in rows if r["ms"] and not (y == "pct_floor" and r["provider"] == COPY)]
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    providers = list(dict.fromkeys(r["provider"] for r in rows))
    sweep = len(shapes) >= 3 and len({_without_T(s) for s in shapes}) == 1
    fig, axes = plt.subplots(len(modes), 1, figsize=(8 if sweep else 12, 4 * len(modes)),
                             squeeze=False, layout="constrained")
    for ax, mode in zip(axes[:, 0], modes):
        for i, name in enumerate(providers):
            mine = [r for r in rows if r["provider"] == name and r["mode"] == mode]
            # the same colour for a provider in every figure: black for the floor, C0-C9 for the rest
            style = dict(label=name, color="black" if name == COPY else f"C{PROVIDERS.index(name) - 1}")
            if sweep:
                mine.sort(key=lambda r: r[x])
                ax.plot([r[x] for r in mine], [r[y] for r in mine], marker="o",
                        linestyle="--" if name in PEERS else "-", **style)
            else:
                width = 0.8 / len(providers)
                ax.bar([shapes.index(r["shape"]) + (i - (len(providers) - 1) / 2) * width for r in mine],
                       [r[y] for r in mine], width, **style)
        if not sweep:
            ax.set_xticks(range(len(shapes)), shapes, rotation=20, ha="right", fontsize=8)
        if y == "pct_floor":
            ax.axhline(100, color="black", linestyle="--", linewidth=1)
        ax.set(title=mode, xlabel=AXIS_LABELS[x] if sweep else "shape (B x T x Hq/Hkv x D)",
               ylabel=AXIS_LABELS[y])
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1, 1))
    gpu = torch.cuda.get_device_name() if on_gpu() else "no GPU"
    fig.suptitle(f"RoPE on {gpu}: {AXIS_LABELS[y]}")
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    return fig


def environment() -> dict:
    """Where the numbers come from: notebook.environment() plus liger's version (None if absent)."""
    return dict(notebook.environment(), liger=liger_version())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ropetut bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="seed002, seed004's small shape, llama3_8b and 4 points of seed001")
    parser.add_argument("--json", metavar="PATH", help="write {environment, rows} here")
    parser.add_argument("--plot", metavar="PATH", help="write the figure here (PNG)")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, metavar="NAME",
                        help=f"shape groups, of {', '.join(SHAPES)} (default: all)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    args = parser.parse_args(argv)
    if args.shapes:
        shapes = [s for name in args.shapes for s in SHAPES[name]]
    else:
        shapes = QUICK if args.quick else [s for group in SHAPES.values() for s in group]
    rows = run(shapes, modes=args.modes)
    if rows is None:
        return 0
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"environment": environment(), "rows": rows}, indent=1))
    if args.plot:
        plot(rows, args.plot)
    print_table(rows)
    # A peer may fail (its error is in the table); one of ropetut's own versions may not.
    return 1 if any(r["error"] and r["provider"] in VERSIONS for r in rows) else 0
