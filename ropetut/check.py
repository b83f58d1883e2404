"""``python -m ropetut check``: every kernel version against the float64 reference,
one table.

Each case draws fresh random inputs, fills the outputs with NaN first (so an
element the kernel forgot to write fails), and compares ||out - ref|| / ||ref||
with a per-dtype tolerance.
"""

import torch

from .kernels import get_kernel, unavailable
from .reference import rope_reference
from .runtime import DEVICE, on_gpu, pick, runtime_mode
from .tables import partial, rope_tables, standard
from .validate import check_rope_args

# ||out - ref|| / ||ref|| allowed per output dtype: a few roundings of that dtype.
TOLERANCE = {
    torch.float64: 1e-12,
    torch.float32: 2e-6,
    torch.float16: 1e-3,
    torch.bfloat16: 8e-3,
}

# ||grad - ref|| / ||ref|| allowed for the gradients of the fused QK-norm + RoPE
# (``apply_qk_norm_rope``), per dtype of the gradient. Its backward computes in fp32
# and rounds each gradient once to its own dtype: dq and dk to q's and k's, dw_q and
# dw_k to the weights' (fp32 in a model, whatever q's dtype: each weight's gradient is
# summed over every row in fp32). A bf16 gradient's error is that one rounding: the
# outputs' bound. An fp32 one's is fp32 roundings all the way, more of them than in the
# forward (dy turned back, each row's mean, dw's sum over up to 2**20 rows in the
# tests): a looser bound than the outputs', far below bf16's.
GRAD_TOLERANCE = {
    torch.float32: 1e-5,
    torch.bfloat16: TOLERANCE[torch.bfloat16],
}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere in out gives NaN (which never
    passes)."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    return ((out - ref).norm() / ref.norm()).item()


def passes(err: float, dtype: torch.dtype) -> bool:
    return err <= TOLERANCE[dtype]  # False for NaN


def run_poisoned(
    impl,
    q,
    k,
    cos,
    sin,
    *,
    positions=None,
    interleaved=False,
    rotary_dim=None,
    layout="bthd",
    backward=False,
):
    """Run one kernel into NaN-filled outputs; return (q_out, k_out) in the caller's
    layout."""
    q4, k4, options = check_rope_args(
        q,
        k,
        cos,
        sin,
        positions,
        kernel=get_kernel(impl),
        rotary_dim=rotary_dim,
        interleaved=interleaved,
        layout=layout,
    )
    q_out = torch.full_like(q4, float("nan"))
    k_out = None if k4 is None else torch.full_like(k4, float("nan"))
    options.kernel.launch(
        q4,
        k4,
        options.cos,
        options.sin,
        q_out,
        k_out,
        positions=options.positions,
        interleaved=options.interleaved,
        rotary_dim=options.rotary_dim,
        backward=backward,
    )
    if layout == "bhtd":
        q_out = q_out.transpose(1, 2)
        k_out = None if k_out is None else k_out.transpose(1, 2)
    return q_out, k_out


def check_case(
    impl,
    *,
    B,
    T,
    HQ,
    HK,
    D,
    dtype,
    interleaved=False,
    rotary_dim=None,
    positions=False,
    layout="bthd",
    seed=0,
):
    """One case: returns the worse of q's and k's relative errors."""
    g = torch.Generator().manual_seed(seed)
    R = rotary_dim or D
    n_pos = 2 * T + 3
    freqs = standard(D) if R == D else partial(R)
    cos, sin = rope_tables(freqs, n_pos, device=DEVICE)
    shape = (lambda H: (B, T, H, D)) if layout == "bthd" else (lambda H: (B, H, T, D))
    q = torch.randn(shape(HQ), generator=g).to(DEVICE, dtype)
    k = torch.randn(shape(HK), generator=g).to(DEVICE, dtype)
    pos = torch.randint(0, n_pos, (B, T), generator=g).to(DEVICE) if positions else None
    q_out, k_out = run_poisoned(
        impl,
        q,
        k,
        cos,
        sin,
        positions=pos,
        interleaved=interleaved,
        rotary_dim=rotary_dim,
        layout=layout,
    )
    opts = {
        "positions": pos,
        "interleaved": interleaved,
        "rotary_dim": rotary_dim,
        "layout": layout,
    }
    return max(
        relative_error(q_out, rope_reference(q, cos, sin, **opts)),
        relative_error(k_out, rope_reference(k, cos, sin, **opts)),
    )


def check_cases():
    """(impl, description, case kwargs) for the table: every version, then final's
    options."""
    B, T, D = pick(gpu=(4, 1000, 128), cpu=(2, 17, 32))
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if on_gpu() else [])
    base = {"B": B, "T": T, "HQ": 4, "HK": 4, "D": D}
    cases = []
    for dtype in dtypes:
        name = str(dtype).replace("torch.", "")
        cases += [
            (
                "v1",
                f"interleaved, standard table, {name}",
                dict(base, dtype=dtype, interleaved=True),
            ),
            ("v2", f"half-split, {name}", dict(base, dtype=dtype)),
            ("v3", f"half-split, {name}", dict(base, dtype=dtype)),
            ("v4", f"fused q+k, GQA 4/2, {name}", dict(base, HK=2, dtype=dtype)),
            ("final", f"fused q+k, GQA 4/2, {name}", dict(base, HK=2, dtype=dtype)),
        ]
    f32 = dict(base, dtype=torch.float32)
    cases += [
        ("final", "odd shape D=96, H=3, T=17", dict(f32, T=17, HQ=3, HK=3, D=96)),
        ("final", "interleaved pairs", dict(f32, interleaved=True)),
        ("final", "partial rotary, rotary_dim=D/2", dict(f32, rotary_dim=D // 2)),
        ("final", "positions (B, T)", dict(f32, positions=True)),
        ("final", "BHTD layout", dict(f32, layout="bhtd")),
    ]
    if not unavailable("cute"):  # the optional CuTeDSL kernel (appendix)
        for dtype in dtypes:
            name = str(dtype).replace("torch.", "")
            cases += [
                ("cute", f"fused q+k, GQA 4/2, {name}", dict(base, HK=2, dtype=dtype)),
                (
                    "cute",
                    f"odd shape D=96, H=3, T=17, {name}",
                    dict(base, T=17, HQ=3, HK=3, D=96, dtype=dtype),
                ),
                (
                    "cute",
                    f"positions (B, T), BHTD, {name}",
                    dict(base, dtype=dtype, positions=True, layout="bhtd"),
                ),
            ]
    return cases


def main() -> int:
    device = torch.cuda.get_device_name() if on_gpu() else "CPU (Triton interpreter)"
    print(f"ropetut check on {device} [{runtime_mode()}]")
    print(f"{'impl':6} {'case':38} {'rel. error':>11} {'tolerance':>10}  verdict")
    if unavailable("cute"):
        print(f"cute   skipped: {unavailable('cute')}")
    failed = 0
    for impl, what, kw in check_cases():
        err = check_case(impl, **kw)
        ok = passes(err, kw["dtype"])
        failed += not ok
        tol = TOLERANCE[kw["dtype"]]
        print(f"{impl:6} {what:38} {err:11.2e} {tol:10.0e}  {'PASS' if ok else 'FAIL'}")
    print("all PASS" if not failed else f"{failed} FAILED")
    return 1 if failed else 0
