"""Why the CUDA-graph copy floor was slower than the eager one: clone() against a copy
on the SMs, eager and replayed from a CUDA graph, on three shapes (H100, bf16).

    python scripts/probe_copy_floor.py > results/copy_floor_h100.txt

clone() and empty_like().copy_() are a cudaMemcpy: eagerly as fast as a copy kernel, but
a CUDA graph captures them as a memcpy node. ``bench.copy`` (the floor since this probe)
and an elementwise ``mul(1)`` are kernels on the SMs in both modes.
"""

from functools import partial

import torch

from ropetut import bench
from ropetut.book.provenance import commit


def clone(*tensors):
    return [t.clone() for t in tensors]


def copy_into(*tensors):
    return [torch.empty_like(t).copy_(t) for t in tensors]


def times_one(*tensors):
    return [t.mul(1) for t in tensors]


COPIES = {
    "clone()": clone,
    "empty_like().copy_()": copy_into,
    "bench.copy (SM kernel)": bench.copy,
    "mul(1) (SM kernel)": times_one,
}
SHAPES = (
    bench.Shape(32, 4096, 32, 32, 128),
    bench.Shape(4, 4096, 32, 8, 128),
    bench.Shape(1, 32768, 32, 8, 128),
)

print(f"commit {commit()} | {torch.cuda.get_device_name()} | torch {torch.__version__}")
print(f"{'shape':24} {'copy':24} {'MiB':>6} {'eager ms':>9} {'graph ms':>9}")
with torch.no_grad():
    for shape in SHAPES:
        inputs = partial(bench.make_inputs, shape, "fwd")
        mib = bench.bytes_moved(shape, "fwd") / 2 / 2**20  # bytes copied, once
        for name, fn in COPIES.items():
            eager = bench.time_ms(fn, make_inputs=inputs)
            graph = bench.graph_ms(fn, make_inputs=inputs)
            label = shape.label.removesuffix(" bfloat16")
            print(f"{label:24} {name:24} {mib:6.0f} {eager:9.4f} {graph:9.4f}")
