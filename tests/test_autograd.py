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
    from ropetut.kernels import KERNELS
    q = randn(1, 4, 2, 8).requires_grad_()
    cos, sin = tables(8, 4)
    out = torch.empty_like(q)
    KERNELS["v2"].launch(q.detach(), None, cos, sin, out, None, positions=None, interleaved=False,
                         rotary_dim=8, backward=False)   # a bare launch: not differentiable
    assert not out.requires_grad
    assert ropetut.apply_rope(q, cos=cos, sin=sin).requires_grad


@gpu_only
def test_gradcheck_float64_on_gpu_large_heads():
    q = torch.randn(1, 4, 4, 16, device="cuda", dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 4, 2, 16, device="cuda", dtype=torch.float64, requires_grad=True)
    cos, sin = tables(16, 4, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: ropetut.apply_rope(a, b, cos, sin), (q, k))


def _weighted(ref, w):
    """sum(ref * w), on the reference's device (the reference computes in float64 on the CPU)."""
    return (ref * w.to(ref.device, torch.float64)).sum()


def _grads_through_reference(q, k, cos, sin, weights):
    q, k = q.detach().double().requires_grad_(), k.detach().double().requires_grad_()
    loss = sum(_weighted(rope_reference(x, cos.double(), sin.double()), w) for x, w in zip((q, k), weights))
    return torch.autograd.grad(loss, (q, k))


def test_a_second_backward_gets_fresh_gradient_memory():
    """Small tensors get their input gradients' memory in the forward (host time); a second
    backward through the same graph must not write into the tensors the first one returned."""
    q, k = randn(1, 5, 2, 8).requires_grad_(), randn(1, 5, 1, 8).requires_grad_()
    cos, sin = tables(8, 5)
    q_out, k_out = ropetut.apply_rope(q, k, cos, sin)
    weights = [(randn(*q.shape), randn(*k.shape)) for _ in range(2)]
    first, second = (torch.autograd.grad((q_out * w_q).sum() + (k_out * w_k).sum(), (q, k),
                                         retain_graph=True) for w_q, w_k in weights)
    for got, w in zip((first, second), weights):
        for g, expected in zip(got, _grads_through_reference(q, k, cos, sin, w)):
            assert relative_error(g, expected) <= 1e-6


@pytest.mark.parametrize("layout", ["bthd", "bhtd"])
def test_output_gradients_laid_out_unlike_the_outputs(layout):
    """The backward's launch is prepared in the forward for gradients laid out like the outputs;
    gradients in another layout (here through a transpose and a copy) take the ordinary path."""
    shape = (2, 6, 3, 16) if layout == "bthd" else (2, 3, 6, 16)
    q, k = randn(*shape).requires_grad_(), randn(*shape).requires_grad_()
    cos, sin = tables(16, 6)
    q_out, k_out = ropetut.apply_rope(q, k, cos, sin, layout=layout)
    w_q, w_k = randn(*shape), randn(*shape)
    loss = ((q_out.transpose(1, 2).contiguous() * w_q.transpose(1, 2)).sum()
            + (k_out * w_k).sum())
    grads = torch.autograd.grad(loss, (q, k))
    q_ref, k_ref = (x.detach().double().requires_grad_() for x in (q, k))
    ref_loss = sum(_weighted(rope_reference(x, cos.double(), sin.double(), layout=layout), w)
                   for x, w in zip((q_ref, k_ref), (w_q, w_k)))
    for got, expected in zip(grads, torch.autograd.grad(ref_loss, (q_ref, k_ref))):
        assert relative_error(got, expected) <= 1e-6
