"""Tile-size probe for the final kernel (GPU): forward time against the copy floor.

    python scripts/probe_tiles.py

For each shape and each ``pairs_per_tile`` it prints the median time of the kernel alone and
of ``apply_rope`` (validation and autograd included), and their share of the copy floor.
"""
import torch
from triton.testing import do_bench

import ropetut
import ropetut.kernels.final as final
from ropetut.op import run_kernel
from ropetut.launch import check_rope_args, tile_sizes

SHAPES = [(4, 4096, 16, 16, 256), (4, 2048, 8, 8, 128), (8, 4096, 32, 8, 128), (32, 4096, 32, 32, 128)]


def ms(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


for B, T, HQ, HK, D in SHAPES:
    q = torch.randn(B, T, HQ, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, T, HK, D, device="cuda", dtype=torch.bfloat16)
    cos, sin = ropetut.rope_tables(ropetut.standard(D), T, device="cuda")
    floor = ms(lambda: (q.clone(), k.clone()))
    a = check_rope_args(q, k, cos, sin)
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    print(f"{B}x{T}x{HQ}/{HK}x{D}: copy floor {floor:.3f} ms")
    for ppt in (512, 1024, 2048, 4096, 8192):
        final.tile_sizes = lambda T, H, half, ppt=ppt: tile_sizes(T, H, half, ppt)
        kern = ms(lambda: run_kernel("final", a.q, a.k, a.cos, a.sin, qo, ko))
        inpl = ms(lambda: run_kernel("final", a.q, a.k, a.cos, a.sin, a.q, a.k))
        api = ms(lambda: ropetut.apply_rope(q, k, cos, sin))
        print(f"  pairs/tile {ppt:5}: kernel {kern:.3f} ms ({floor / kern:4.0%})  in place {inpl:.3f} "
              f"({floor / inpl:4.0%})  apply_rope {api:.3f} ({floor / api:4.0%})")


def host_us(fn, n=2000):
    """Host microseconds per call on a tiny problem: launch cost, not GPU time."""
    import time
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / n * 1e6


q = torch.randn(1, 16, 4, 64, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, 16, 4, 64, device="cuda", dtype=torch.bfloat16)
cos, sin = ropetut.rope_tables(ropetut.standard(64), 16, device="cuda")
a = check_rope_args(q, k, cos, sin)
qo, ko = torch.empty_like(q), torch.empty_like(k)
qg, kg = q.clone().requires_grad_(), k.clone().requires_grad_()
print("host cost per call on a tiny shape (us):")
for impl in ("v4", "final"):
    print(f"  {impl:5}: run_kernel {host_us(lambda: run_kernel(impl, a.q, a.k, a.cos, a.sin, qo, ko)):6.1f}"
          f"  check_rope_args {host_us(lambda: check_rope_args(q, k, cos, sin)):6.1f}"
          f"  apply_rope {host_us(lambda: ropetut.apply_rope(q, k, cos, sin, impl=impl)):6.1f}"
          f"  fwd+bwd {host_us(lambda: torch.autograd.backward(ropetut.apply_rope(qg, kg, cos, sin, impl=impl), (q, k))):6.1f}")
