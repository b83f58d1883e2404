"""apply_rope's backward: gradcheck in float64, and agreement with autograd through the reference."""
import pytest
import torch
from conftest import gpu_only, randn, tables

import ropetut
from ropetut.check import relative_error
from ropetut.reference import rope_reference

B, T, HQ, HK, D = 1, 3, 2, 1, 8
OPTIONS = {
    "default": {},
    "interleaved": dict(interleaved=True),
    "rotary_dim": dict(rotary_dim=4),
    "positions": dict(positions=[2, 0, 5]),
    "bhtd": dict(layout="bhtd"),
    "inplace": dict(inplace=True),
}


def _rope_fn(opts, with_k=True):
    opts = dict(opts)
    R = opts.get("rotary_dim", D)
    cos, sin = tables(D, 8, rotary_dim=R, dtype=torch.float64)
    if "positions" in opts:
        opts["positions"] = torch.tensor(opts["positions"], device=ropetut.DEVICE)

    def fn(q, k=None):
        if opts.get("inplace"):               # in place needs non-leaf inputs
            q, k = q.clone(), None if k is None else k.clone()
        return ropetut.apply_rope(q, k, cos, sin, **opts)
    return fn


def _inputs(layout="bthd", dtype=torch.float64):
    def shape(H):
        return (B, T, H, D) if layout == "bthd" else (B, H, T, D)
    return (randn(*shape(HQ), dtype=dtype).requires_grad_(),
            randn(*shape(HK), dtype=dtype).requires_grad_())


@pytest.mark.parametrize("option", OPTIONS)
def test_gradcheck_float64(option):
    q, k = _inputs(OPTIONS[option].get("layout", "bthd"))
    assert torch.autograd.gradcheck(_rope_fn(OPTIONS[option]), (q, k))


def test_gradcheck_q_only():
    q, _ = _inputs()
    assert torch.autograd.gradcheck(_rope_fn({}), (q,))


@pytest.mark.parametrize("impl", ropetut.IMPLS)
def test_backward_matches_autograd_through_reference(impl):
    interleaved = impl == "v1"
    q, k = randn(2, 5, 4, 16).requires_grad_(), randn(2, 5, 2, 16).requires_grad_()
    cos, sin = tables(16, 5)
    gq, gk = randn(2, 5, 4, 16), randn(2, 5, 2, 16)
    q_out, k_out = ropetut.apply_rope(q, k, cos, sin, interleaved=interleaved, impl=impl)
    torch.autograd.backward((q_out, k_out), (gq, gk))
    q_ref, k_ref = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    outs = [rope_reference(x, cos, sin, interleaved=interleaved) for x in (q_ref, k_ref)]
    torch.autograd.backward(outs, (gq.double().cpu(), gk.double().cpu()))   # the reference runs on the CPU
    assert relative_error(q.grad, q_ref.grad) <= 2e-6
    assert relative_error(k.grad, k_ref.grad) <= 2e-6


def test_forward_only_kernel_cuts_the_graph():
    """The seed's Triton path had no autograd: q and k got no gradient. Ours does."""
    from ropetut.op import run_kernel
    q = randn(1, 4, 2, 8).requires_grad_()
    cos, sin = tables(8, 4)
    out = torch.empty_like(q)
    run_kernel("v2", q.detach(), None, cos, sin, out, None)   # a bare launch: not differentiable
    assert not out.requires_grad
    assert ropetut.apply_rope(q, cos=cos, sin=sin).requires_grad


@gpu_only
def test_gradcheck_float64_on_gpu_large_heads():
    q = torch.randn(1, 4, 4, 16, device="cuda", dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 4, 2, 16, device="cuda", dtype=torch.float64, requires_grad=True)
    cos, sin = tables(16, 4, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: ropetut.apply_rope(a, b, cos, sin), (q, k))
