"""The optional CuTeDSL kernel (ropetut/kernels/cute.py), through ``apply_rope(impl="cute")``.

Its refusals are checked everywhere (they are plain PyTorch). The kernel itself needs a GPU and
nvidia-cutlass-dsl; without them those tests skip, saying which is missing.
"""
import pytest
import torch
from conftest import randn, tables

import ropetut
from ropetut import apply_rope
from ropetut.check import TOLERANCE, check_case, relative_error
from ropetut.kernels import KERNELS, unavailable
from ropetut.validate import check_rope_args, check_supports
from ropetut.reference import rope_reference

needs_cute = pytest.mark.skipif(unavailable("cute") is not None, reason=str(unavailable("cute")))
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def refusal(q, k=None, *, dtype_tables=torch.float32, rotary_dim=None, interleaved=False, n=8):
    D = q.shape[-1]
    cos, sin = tables(D, n, rotary_dim=rotary_dim, dtype=dtype_tables)
    q4, k4, o = check_rope_args(q, k, cos, sin, rotary_dim=rotary_dim, interleaved=interleaved,
                                kernel="final")     # what every kernel needs; then cute's record:
    check_supports(KERNELS["cute"], q4, k4, o.cos, o.sin, None, interleaved=interleaved,
                   rotary_dim=o.rotary_dim, inplace=False)


@pytest.mark.parametrize("case, error, names", [
    (dict(interleaved=True), ValueError, "interleaved"),
    (dict(rotary_dim=16), ValueError, "rotary_dim"),
    (dict(dtype=torch.float64), TypeError, "q:"),
    (dict(dtype_tables=torch.float64), TypeError, "cos:"),
    (dict(D=20), ValueError, "D/2 must be a multiple"),     # fp32 reads 4 at a time: D/2=10
    (dict(strided_k=True), ValueError, "k: impl='cute' needs unit stride"),
])
def test_refuses_what_the_kernel_cannot_do_naming_the_argument(case, error, names):
    D, dtype = case.get("D", 32), case.get("dtype", torch.float32)
    q, k = randn(2, 4, 2, D, dtype=dtype), randn(2, 4, 2, 2 * D, dtype=dtype)
    k = k[..., ::2] if case.get("strided_k") else k[..., :D]
    before = q.clone(), k.clone()
    with pytest.raises(error, match=names):
        refusal(q, k, dtype_tables=case.get("dtype_tables", torch.float32),
                rotary_dim=case.get("rotary_dim"), interleaved=case.get("interleaved", False))
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])


def test_accepts_what_the_kernel_can_do():
    q, k = randn(2, 4, 4, 32), randn(2, 4, 2, 32)
    refusal(q, k)                                   # GQA, half-split, whole head dim: no error
    refusal(q.transpose(1, 2).contiguous().transpose(1, 2), k)   # BHTD memory, BTHD view


@pytest.mark.skipif(unavailable("cute") is None, reason="CuTeDSL and a GPU are here: impl='cute' runs")
def test_without_cutedsl_or_a_gpu_the_error_says_what_is_missing():
    q = randn(1, 4, 2, 32)
    before = q.clone()
    cos, sin = tables(32, 4)
    with pytest.raises(RuntimeError, match="impl='cute' needs"):
        apply_rope(q, None, cos, sin, impl="cute")
    assert torch.equal(q, before)


@needs_cute
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", [
    dict(B=2, T=17, HQ=3, HK=3, D=96),                 # odd shape
    dict(B=3, T=33, HQ=8, HK=2, D=128),                # GQA
    dict(B=2, T=9, HQ=4, HK=4, D=64, layout="bhtd"),
    dict(B=2, T=20, HQ=4, HK=1, D=128, positions=True),
])
def test_matches_reference_into_poisoned_outputs(dtype, case):
    err = check_case("cute", dtype=dtype, **case)
    assert err <= TOLERANCE[dtype], err


@needs_cute
def test_out_of_range_positions_give_nan_for_those_tokens_only():
    B, T, H, D = 1, 6, 2, 64
    cos, sin = tables(D, 10)
    q, k = randn(B, T, H, D), randn(B, T, H, D)
    pos = torch.tensor([[0, 9, 10, -1, 3, 2**20]], device=q.device)
    q_out, k_out = apply_rope(q, k, cos, sin, positions=pos, impl="cute")
    bad = torch.tensor([False, False, True, True, False, True])
    assert torch.isnan(q_out[0, bad.to(q.device)]).all() and torch.isnan(k_out[0, bad.to(q.device)]).all()
    good = (~bad).to(q.device)
    ref = rope_reference(q, cos, sin, positions=pos.clamp(0, 9)).to(q.device)
    assert relative_error(q_out[:, good], ref[:, good]) <= 2e-6


@needs_cute
def test_in_place_equals_out_of_place():
    q, k = randn(2, 16, 4, 64, dtype=torch.bfloat16), randn(2, 16, 2, 64, dtype=torch.bfloat16)
    cos, sin = tables(64, 16)
    q_ref, k_ref = apply_rope(q, k, cos, sin, impl="cute")
    q_in, k_in = apply_rope(q, k, cos, sin, impl="cute", inplace=True)
    assert q_in.data_ptr() == q.data_ptr() and torch.equal(q, q_ref) and torch.equal(k, k_ref)


@needs_cute
@pytest.mark.parametrize("layout", ["bthd", "bhtd"])
def test_gradients_equal_final_even_for_gradients_it_must_copy(layout):
    shape = (2, 12, 4, 64) if layout == "bthd" else (2, 4, 12, 64)
    cos, sin = tables(64, 12)
    grads = {}
    for impl in ("final", "cute"):
        torch.manual_seed(1)
        q, k = randn(*shape).requires_grad_(), randn(*shape).requires_grad_()
        q_out, k_out = apply_rope(q, k, cos, sin, impl=impl, layout=layout)
        # .sum() hands back an expanded gradient (every stride 0): the kernel can't read it as is
        grads[impl] = torch.autograd.grad(q_out.sum() + (k_out * k_out.detach()).sum(), (q, k))
    for g_cute, g_final in zip(grads["cute"], grads["final"]):
        assert relative_error(g_cute, g_final) <= 1e-6


@needs_cute
def test_cuda_graph_replay_equals_eager():
    q, k = randn(4, 64, 8, 128, dtype=torch.bfloat16), randn(4, 64, 2, 128, dtype=torch.bfloat16)
    cos, sin = tables(128, 100)
    pos = torch.randint(0, 100, (4, 64), device=q.device)
    eager = apply_rope(q, k, cos, sin, positions=pos, impl="cute")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = apply_rope(q, k, cos, sin, positions=pos, impl="cute")
    q.copy_(randn(*q.shape, dtype=q.dtype))
    graph.replay()
    fresh = apply_rope(q, k, cos, sin, positions=pos, impl="cute")
    assert not torch.equal(eager[0], fresh[0])
    assert torch.equal(replayed[0], fresh[0]) and torch.equal(replayed[1], fresh[1])


@needs_cute
def test_compile_fullgraph_equals_eager():
    q, k = randn(2, 32, 4, 64).requires_grad_(), randn(2, 32, 2, 64).requires_grad_()
    cos, sin = tables(64, 32)

    def f(q, k):
        q_out, k_out = apply_rope(q, k, cos, sin, impl="cute")
        return (q_out * 2).sum() + (k_out * k_out).sum()
    out = torch.compile(f, fullgraph=True)(q, k)
    grads = torch.autograd.grad(out, (q, k))
    out_ref = f(q, k)
    grads_ref = torch.autograd.grad(out_ref, (q, k))
    assert relative_error(out, out_ref) <= 1e-6
    assert all(relative_error(a, b) <= 1e-6 for a, b in zip(grads, grads_ref))


@needs_cute
@pytest.mark.parametrize("variant", [dict(vector_bytes=2), dict(vector_bytes=4), dict(static_shape=False),
                                     dict(tvm_ffi=False)])
def test_the_appendix_experiments_compute_the_same_rotation(variant):
    from ropetut.kernels.cute import rope_cute
    q, k = randn(2, 10, 4, 64, dtype=torch.bfloat16), randn(2, 10, 2, 64, dtype=torch.bfloat16)
    cos, sin = tables(64, 10)
    expected = apply_rope(q, k, cos, sin, impl="cute")
    outs = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    rope_cute(q, k, cos, sin, *outs, **variant)
    assert torch.equal(outs[0], expected[0]) and torch.equal(outs[1], expected[1])


def test_cute_is_optional_and_listed_apart():
    assert "cute" not in ropetut.IMPLS and ropetut.OPTIONAL_IMPLS == ("cute",)
