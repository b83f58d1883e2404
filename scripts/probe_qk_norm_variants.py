"""Probe (GPU): variants of ``kernels/qk_norm_rope.py`` timed against each other, in turn.

    python scripts/probe_qk_norm_variants.py NAME=FILE [NAME=FILE ...] [--rounds 3]

Each FILE is a copy of ``ropetut/kernels/qk_norm_rope.py`` with one change (main's own
file is ``main=ropetut/kernels/qk_norm_rope.py``); each is loaded as a module of
``ropetut.kernels``, so its relative imports are main's. On each prefill shape of
``bench.qk_norm.SHAPES`` (bf16), per round, the variants take turns: the copy floors
(graphed), then each variant's fwd and fwd+bwd, graphed (``bench.graph_ms``), called
straight (forward, then backward, as the autograd Function does). Printed: % of the
byte floor as bench-qk-norm counts it (fwd: a copy of q and k; fwd+bwd: 1.25 of a copy
of q, k and their gradients), each round and the median of the rounds. Before timing,
each variant's outputs and gradients are compared with the first variant's, bit for
bit: a change meant to move no result must move none.
"""

# ruff: noqa: I001
import argparse
import importlib.util
import statistics
from functools import partial

# ropetut first: on a machine without a GPU it switches Triton to its interpreter
import ropetut
from ropetut import bench
from ropetut.bench import qk_norm as bench_qk_norm
from ropetut.tables import rope_tables, standard
import torch


def load(name, path):
    """The kernel file at path as module ``ropetut.kernels.qk_norm_rope_<name>``."""
    spec = importlib.util.spec_from_file_location(
        f"ropetut.kernels.qk_norm_rope_{name}", path
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def step(module, shape, tables):
    """fwd(q, k) and fwd_bwd(q, k, gq, gk) of one variant, launched straight."""
    w_q, w_k, cos, sin = tables
    options = dict(
        positions=None, eps=bench_qk_norm.EPS, interleaved=False,
        rotary_dim=shape.D, weight_offset=0.0,
    )  # fmt: skip

    def fwd(q, k):
        outs = torch.empty_like(q), torch.empty_like(k)
        return module.qk_norm_rope_forward(q, k, w_q, w_k, cos, sin, *outs, **options)

    def fwd_bwd(q, k, gq, gk):
        outs = fwd(q, k)
        grads = module.qk_norm_rope_backward(
            q, k, w_q, w_k, cos, sin, gq, gk, **options
        )
        return (*outs, *grads)

    return fwd, fwd_bwd


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("variants", nargs="+", metavar="NAME=FILE")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    modules = {}
    for spec in args.variants:
        name, path = spec.split("=", 1)
        modules[name] = load(name, path)
    shapes = [s for s in bench_qk_norm.SHAPES if not s.positions]
    for shape in shapes:
        print(f"\n== {shape.label}  (% of the byte floor, graphed)", flush=True)
        torch.manual_seed(0)
        tables = (
            *(1 + 0.1 * torch.randn(2, shape.D, device=ropetut.DEVICE)).unbind(),
            *rope_tables(standard(shape.D), shape.T, device=ropetut.DEVICE),
        )
        steps = {name: step(m, shape, tables) for name, m in modules.items()}
        inputs = [t.detach() for t in bench.make_inputs(shape, "fwd+bwd")]
        first = None
        for name, (_, fwd_bwd) in steps.items():
            got = fwd_bwd(*inputs)
            if first is None:
                first = got
                continue
            same = all(torch.equal(a, b) for a, b in zip(first, got))
            print(f"  {name}: {'bit for bit' if same else 'DIFFERS'} from the first")
        pct = {(name, mode): [] for name in steps for mode in bench.MODES}
        for r in range(args.rounds):
            floor = {
                mode: bench.copy_floor_ms(shape, mode, graphed=True)
                * bench_qk_norm.BYTE_FLOOR_OVER_COPY[mode]
                for mode in bench.MODES
            }
            order = list(steps) if r % 2 == 0 else list(steps)[::-1]
            for name in order:
                for mode, fn in zip(bench.MODES, steps[name]):
                    ms = bench.graph_ms(fn, make_inputs=partial(
                        bench.make_inputs, shape, mode
                    ))  # fmt: skip
                    pct[name, mode].append(100 * floor[mode] / ms)
        for name in steps:
            cells = []
            for mode in bench.MODES:
                runs = " ".join(f"{p:5.1f}" for p in pct[name, mode])
                median = statistics.median(pct[name, mode])
                cells.append(f"{mode:7s} {runs} | median {median:5.1f}")
            print(f"  {name:10s} " + "   ".join(cells), flush=True)


if __name__ == "__main__":
    main()
