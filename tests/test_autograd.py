"""apply_rope's backward: gradcheck and gradgradcheck in float64, agreement with autograd through
the reference, and torch's rules for in place (version counters, refusals before any write)."""
import pytest
import torch
from conftest import gpu_only, randn, tables

import ropetut
from ropetut.check import relative_error
from ropetut.kernels.final import rope_final
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


@pytest.mark.parametrize("option", OPTIONS)
def test_gradgradcheck_float64(option):
    """The backward is a turn by -theta through the same Function, so it is differentiable: the
    second derivative (a turn by +theta) is checked against finite differences."""
    q, k = _inputs(OPTIONS[option].get("layout", "bthd"))
    assert torch.autograd.gradgradcheck(_rope_fn(OPTIONS[option]), (q, k))


def test_second_derivative_of_a_rotation():
    """d/dq of <w, d/dq <g, R q>> = d/dq <w, R^T g>: zero in q, so the double backward's gradient
    with respect to the output gradient g is R w, not the 1s of a non-differentiable backward."""
    q = randn(1, 2, 1, 4, dtype=torch.float64).requires_grad_()
    g = randn(1, 2, 1, 4, dtype=torch.float64).requires_grad_()
    w = randn(1, 2, 1, 4, dtype=torch.float64)
    cos, sin = tables(4, 2, dtype=torch.float64)
    (dq,) = torch.autograd.grad(ropetut.apply_rope(q, cos=cos, sin=sin), q, g, create_graph=True)
    assert dq.requires_grad
    (dg,) = torch.autograd.grad((dq * w).sum(), g)
    assert relative_error(dg, rope_reference(w, cos, sin)) <= 1e-12


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
    torch.autograd.backward(outs, (gq.double(), gk.double()))
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
    """sum(ref * w), on the reference's device (it computes in float64 on its input's)."""
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


@pytest.mark.parametrize("early", [True, False], ids=["early-grads", "grads-later"])
def test_in_place_on_a_tensor_with_gaps_prepares_the_gaps_too(early, monkeypatch):
    """In place on a q with gaps between its rows (not a view: its own storage), with a
    gradient of the same gaps, the backward takes the launch prepared in the forward,
    whose key names the gaps: its input gradients must have them too, whether the
    forward made their memory (small tensors) or the backward does (``empty_like``
    made them contiguous, and on a GPU the kernel wrote past their end). The
    gradient keeps the gaps, and a direct launch of the same layouts after it, under
    the same key, writes the same numbers."""
    if not early:
        monkeypatch.setattr(ropetut.autograd, "EARLY_GRADS_BYTES", 0)
    shape, gaps = (2, 3, 4, 16), (576, 192, 16, 1)  # every third row of 64 used

    def with_gaps(x):
        return torch.empty_strided(shape, gaps, device=ropetut.DEVICE).copy_(x)

    cos, sin = tables(16, 3)
    x, g = randn(*shape).requires_grad_(), with_gaps(randn(*shape))
    out = ropetut.apply_rope(with_gaps(x), None, cos, sin, inplace=True)
    (grad,) = torch.autograd.grad(out, x, g)
    assert grad.stride() == gaps
    want = rope_reference(g.double(), cos.double(), sin.double(), inverse=True)
    assert relative_error(grad, want) <= 2e-6
    back = with_gaps(torch.zeros(shape))
    rope_final(g, None, cos, sin, back, None, backward=True)
    assert relative_error(back, want) <= 2e-6


def test_in_place_without_grad_bumps_the_version_counter():
    """A graph that saved q before an in-place rotation must refuse to use it, as torch does for
    its own in-place ops (the issue's example: w.grad would silently be the rotated q)."""
    q = randn(1, 4, 2, 8)
    cos, sin = tables(8, 4)
    w = torch.ones_like(q, requires_grad=True)
    y = (w * q).sum()                           # saves q for w's gradient
    version = q._version
    ropetut.apply_rope(q, None, cos, sin, inplace=True)
    assert q._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_in_place_with_grad_marks_q_and_k_dirty():
    """After an in-place call with a gradient, the caller's own q and k are the rotated tensors in
    autograd's eyes (``mark_dirty``): their grad_fn is RoPE's, gradients through them are the
    rotation's, and a graph that saved them before the write refuses to run."""
    x = randn(1, 4, 3, 8).requires_grad_()
    cos, sin = tables(8, 4)
    q, k = x[:, :, :2] * 1.0, x[:, :, 2:] * 1.0
    saved = q.sin() + k.sin()                   # saves q and k
    ropetut.apply_rope(q, k, cos, sin, inplace=True)
    assert all(type(t.grad_fn).__name__ == "RopeFunctionBackward" for t in (q, k))
    w = randn(1, 4, 3, 8)
    (dx,) = torch.autograd.grad((torch.cat([q, k], 2) * w).sum(), x)    # the caller's q and k
    expected = torch.cat([rope_reference(w[:, :, :2], cos, sin, inverse=True),
                          rope_reference(w[:, :, 2:], cos, sin, inverse=True)], 2)
    assert relative_error(dx, expected) <= 2e-6
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.sum().backward()


def _leaf(x):
    return x.requires_grad_()


def _view_of_leaf(x):
    return x.requires_grad_()[:, :, :]


def _unbound(x):
    q, _ = torch.stack([x, x]).requires_grad_().clone().unbind(0)   # a multi-output view
    return q


@pytest.mark.parametrize("make", [_leaf, _view_of_leaf, _unbound])
@pytest.mark.parametrize("which", ["q", "k"])
def test_in_place_that_autograd_refuses_is_refused_before_any_write(make, which):
    """Autograd checks an in-place write after it happened; ropetut checks first. A refused call
    leaves q and k as they were, so catching the error and retrying rotates once, not twice."""
    cos, sin = tables(8, 4)
    q, k = randn(1, 4, 2, 8), randn(1, 4, 1, 8)
    q, k = (make(q), k * 1.0) if which == "q" else (q * 1.0, make(k))
    before = q.detach().clone(), k.detach().clone()
    with pytest.raises(ValueError, match=f"^{which}: in place"):
        ropetut.apply_rope(q, k, cos, sin, inplace=True)
    assert torch.equal(q.detach(), before[0]) and torch.equal(k.detach(), before[1])


def test_in_place_with_grad_matches_out_of_place():
    cos, sin = tables(8, 4)
    x = randn(1, 4, 3, 8).requires_grad_()
    w = randn(1, 4, 3, 8)
    grads = []
    for inplace in (False, True):
        q, k = x[:, :, :2] * 1.0, x[:, :, 2:] * 1.0
        q, k = ropetut.apply_rope(q, k, cos, sin, inplace=inplace)
        grads.append(torch.autograd.grad((torch.cat([q, k], 2) * w).sum(), x)[0])
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("transposed", [False, True], ids=["prepared", "ordinary"])
@pytest.mark.parametrize("written", ["cos", "positions"])
def test_tables_and_positions_are_saved_for_the_backward(written, transposed):
    """A write to cos or positions between the forward and the backward raises there,
    as for any tensor autograd saved (the backward would turn by other angles), on both
    of the backward's paths: gradients laid out like the outputs (the launch prepared
    in the forward) and otherwise."""
    q, dq = randn(1, 3, 2, 8).requires_grad_(), randn(1, 3, 2, 8)
    if transposed:  # the same values, with other strides
        dq = dq.transpose(1, 2).contiguous().transpose(1, 2)
    cos, sin = tables(8, 6)
    positions = torch.tensor([2, 0, 5], device=ropetut.DEVICE)
    out = ropetut.apply_rope(q, None, cos, sin, positions=positions)
    {"cos": cos, "positions": positions}[written].add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(dq)


def test_inference_tables_and_positions_are_kept():
    """Tables and positions made under torch.inference_mode() cannot be saved, nor
    written outside it: they are kept, and give the gradient normal tensors give. The
    others are still saved: with inference tables, a write to positions raises."""
    q, dq = randn(1, 3, 2, 8).requires_grad_(), randn(1, 3, 2, 8)
    cos, sin = tables(8, 6)
    positions = torch.tensor([2, 0, 5], device=ropetut.DEVICE)
    with torch.inference_mode():
        frozen = cos.clone(), sin.clone(), positions.clone()
    grads = [torch.autograd.grad(ropetut.apply_rope(q, None, c, s, positions=p), q,
                                 dq)[0] for c, s, p in ((cos, sin, positions), frozen)]
    assert torch.equal(grads[0], grads[1])
    out = ropetut.apply_rope(q, None, *frozen[:2], positions=positions)
    positions.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(dq)
