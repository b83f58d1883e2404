"""The registered operators: torch.compile(fullgraph=True) with every option, CUDA graphs, and
the fast eager launch path, each against eager apply_rope."""
import pytest
import torch
from conftest import assert_compiles_like_eager, gpu_only, randn, tables

import ropetut
from ropetut.check import relative_error

B, T, HQ, HK, D = 2, 6, 4, 2, 16
OPTIONS = {
    "default": {},
    "positions (T,)": dict(positions=[5, 1, 2, 0, 7, 3]),
    "positions (B, T)": dict(positions=[[5, 1, 2, 0, 7, 3], [0, 1, 2, 3, 4, 5]]),
    "interleaved": dict(interleaved=True),
    "partial": dict(rotary_dim=8),
    "bhtd": dict(layout="bhtd"),
    "inplace": dict(inplace=True),
    "q only": dict(q_only=True),
}


def _case(option):
    opts = dict(OPTIONS[option])
    q_only = opts.pop("q_only", False)
    cos, sin = tables(D, 8, rotary_dim=opts.get("rotary_dim"))
    if "positions" in opts:
        opts["positions"] = torch.tensor(opts["positions"], device=ropetut.DEVICE)
    bhtd = opts.get("layout") == "bhtd"

    def shape(H):
        return (B, H, T, D) if bhtd else (B, T, H, D)

    def block(x, w):
        """A model's use: projections viewed as heads (GQA: fewer k heads), then RoPE. In place,
        RoPE writes into those intermediates. (Not views from one ``split``: autograd forbids
        writing in place into any output of a function that returns several views.)"""
        q = (x @ w[:, :HQ * D]).view(B, T, HQ, D)
        k = (x @ w[:, HQ * D:]).view(B, T, HK, D)
        if bhtd:
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        if q_only:
            return ropetut.apply_rope(q, cos=cos, sin=sin, **opts) * 1.0
        q, k = ropetut.apply_rope(q, k, cos, sin, **opts)
        return torch.cat([q.flatten(), k.flatten()])

    x = randn(B, T, D)
    w = (randn(D, (HQ + HK) * D) / D**0.5).requires_grad_()
    return block, x, w, shape


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("option", OPTIONS)
def test_compile_fullgraph_matches_eager(option, mode):
    block, x, w, _ = _case(option)
    assert_compiles_like_eager(block, (x, w), [w], mode)


def test_in_place_on_a_graph_input_under_compile():
    """In place on tensors the compiled function receives: the operator declares the write
    (mutates_args), so the caller's q and k hold the result afterwards, as eagerly."""
    cos, sin = tables(D, T)
    q, k = randn(B, T, HQ, D), randn(B, T, HK, D)
    expected = ropetut.apply_rope(q, k, cos, sin)

    def rotate_in_place(q, k):
        ropetut.apply_rope(q, k, cos, sin, inplace=True)

    torch._dynamo.reset()
    torch.compile(rotate_in_place, fullgraph=True)(q, k)
    assert relative_error(q, expected[0]) <= 1e-6 and relative_error(k, expected[1]) <= 1e-6


@pytest.mark.parametrize("op", ["rope", "rope_"])
def test_opcheck(op):
    """torch.library.opcheck: the schema, the fake implementation and the autograd registration
    agree with what the operator really does."""
    cos, sin = tables(D, 8)
    q, k = randn(B, T, HQ, D), randn(B, T, HK, D)
    positions = torch.tensor([5, 1, 2, 0, 7, 3], device=ropetut.DEVICE).expand(B, T)
    if op == "rope":
        args = (q.requires_grad_(), k.requires_grad_(), cos, sin, positions, False, D, False, "final", False)
        torch.library.opcheck(torch.ops.ropetut.rope.default, args)
    else:
        args = (q, k, cos, sin, positions, False, D, "final", False)
        torch.library.opcheck(torch.ops.ropetut.rope_.default, args)


def test_eager_operator_matches_apply_rope():
    cos, sin = tables(D, T)
    q, k = randn(B, T, HQ, D), randn(B, T, HK, D)
    q_op, k_op = torch.ops.ropetut.rope(q, k, cos, sin, None, False, D, False, "final", False)
    q_ref, k_ref = ropetut.apply_rope(q, k, cos, sin)
    assert torch.equal(q_op, q_ref) and torch.equal(k_op, k_ref)


@gpu_only
@pytest.mark.parametrize("inplace", [False, True])
def test_reduce_overhead_no_graph_break_no_cudagraph_skip(inplace):
    """mode="reduce-overhead" replays the compiled block from a CUDA graph. RoPE in place on the
    block's own intermediates mutates no graph input, so nothing makes inductor skip the graph."""
    block, x, w, _ = _case("inplace" if inplace else "positions (B, T)")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(3):                   # record, then replay
            out = compiled(x, w)
        assert relative_error(out, block(x, w)) <= 1e-6
    assert not torch._dynamo.utils.counters["graph_break"]
    assert not torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]


@gpu_only
@pytest.mark.parametrize("positions", [False, True])
@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_cuda_graph_capture_and_replay(mode, positions):
    """torch.cuda.graph captures apply_rope (nothing waits for the GPU), and each replay on new
    data gives what eager gives."""
    Bd, Td, Hq, Hk, Dd = 4, 3, 8, 2, 64            # a decode step: few tokens, many heads
    cos, sin = tables(Dd, 64)
    static = [torch.randn(Bd, Td, H, Dd, device="cuda") for H in (Hq, Hk)]
    pos = torch.randint(0, 64, (Bd, Td), device="cuda") if positions else None
    if mode == "fwd+bwd":
        static = [t.requires_grad_() for t in static]
        grads = [torch.randn(Bd, Td, H, Dd, device="cuda") for H in (Hq, Hk)]

    def step():
        q_out, k_out = ropetut.apply_rope(*static, cos, sin, positions=pos)
        if mode == "fwd":
            return q_out, k_out
        return torch.autograd.grad((q_out, k_out), static, grads)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                  # warm up (compiles) outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = step()
    for _ in range(2):
        with torch.no_grad():
            for t in static:
                t.copy_(torch.randn_like(t))
            if positions:
                pos.copy_(torch.randint(0, 64, pos.shape, device="cuda"))
        graph.replay()
        for got, want in zip(outs, step()):
            assert torch.equal(got, want)


@gpu_only
def test_check_positions_refuses_inside_a_capture():
    cos, sin = tables(D, T)
    q = torch.randn(B, T, HQ, D, device="cuda")
    positions = torch.arange(T, device="cuda")
    ropetut.apply_rope(q, cos=cos, sin=sin, positions=positions, check_positions=True)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="^check_positions"):
        with torch.cuda.graph(graph):
            ropetut.apply_rope(q, cos=cos, sin=sin, positions=positions, check_positions=True)


@gpu_only
def test_fast_launch_tells_apart_what_the_kernel_is_specialized_on():
    """The eager path keeps the compiled kernel per shapes, strides, dtypes and pointer alignment.
    Calls that differ in one of them, after a first call has filled the cache, must still be
    right: a misaligned view, a transposed view, another dtype, a stride of 1."""
    cos, sin = tables(32, 64)
    base = torch.randn(2, 16, 4, 32, device="cuda")
    ropetut.apply_rope(base, cos=cos, sin=sin)                       # fills the cache
    flat = torch.randn(2 * 16 * 4 * 32 + 1, device="cuda")
    cases = {
        "misaligned": flat[1:].view(2, 16, 4, 32),
        "transposed": torch.randn(2, 4, 16, 32, device="cuda").transpose(1, 2),
        "half": base.half(),
        "one head": base[:, :, :1],
        "one token": base[:, :1],
    }
    from ropetut.reference import rope_reference
    for name, x in cases.items():
        for _ in range(2):                                              # miss, then hit
            out = ropetut.apply_rope(x, cos=cos, sin=sin)
            tol = 1e-3 if x.dtype == torch.half else 2e-6
            assert relative_error(out, rope_reference(x, cos, sin)) <= tol, name


@pytest.mark.parametrize("op", ["rope", "rope_"])
@pytest.mark.parametrize("bad, error, argument", [
    (dict(rotary_dim=2 * D), ValueError, "rotary_dim"),       # would write D elements past each row
    (dict(impl="v9"), ValueError, "impl"),
    (dict(impl="v2", interleaved=True), ValueError, "interleaved"),
    (dict(positions="short"), ValueError, "positions"),
    (dict(cos="narrow"), ValueError, "cos"),
])
def test_operators_validate_and_never_write_outside_their_tensors(op, bad, error, argument):
    """Called directly, the registered operators check their arguments as apply_rope does, before
    writing: q and k are views into one buffer, and nothing in it changes."""
    buffer = randn(B * T * (HQ + HK) * D * 2)
    q = buffer[:B * T * HQ * D].view(B, T, HQ, D)
    k = buffer[B * T * HQ * D:B * T * (HQ + HK) * D].view(B, T, HK, D)
    cos, sin = tables(D, 8)
    opts = dict(positions=None, interleaved=False, rotary_dim=D, impl="final") | bad
    if opts["positions"] == "short":
        opts["positions"] = torch.zeros(T - 1, dtype=torch.long, device=ropetut.DEVICE)
    if bad.get("cos") == "narrow":
        cos, sin = cos[:, :-1], sin[:, :-1]
        opts.pop("cos")
    before = buffer.clone()
    args = (q, k, cos, sin, opts["positions"], opts["interleaved"], opts["rotary_dim"])
    with pytest.raises(error, match=f"^{argument}"):
        if op == "rope":
            torch.ops.ropetut.rope(*args, False, opts["impl"], False)
        else:
            torch.ops.ropetut.rope_(*args, opts["impl"], False)
    assert torch.equal(buffer, before)


def test_in_place_operator_refuses_overlap():
    q = randn(B, T, 1, D).expand(B, T, HQ, D)
    cos, sin = tables(D, 8)
    with pytest.raises(ValueError, match="^q: in place"):
        torch.ops.ropetut.rope_(q, None, cos, sin, None, False, D, "final", False)


def test_operator_gradgradcheck_float64():
    """The operator's backward is the operator turning the other way: differentiable again."""
    cos, sin = tables(D, 8, dtype=torch.float64)
    q = randn(1, 3, 2, D, dtype=torch.float64).requires_grad_()
    k = randn(1, 3, 1, D, dtype=torch.float64).requires_grad_()

    def f(q, k):
        return torch.ops.ropetut.rope(q, k, cos, sin, None, False, D, False, "final", False)
    assert torch.autograd.gradgradcheck(f, (q, k))


@pytest.mark.parametrize("name", ["cos", "sin"])
def test_operator_refuses_tables_that_require_grad(name):
    """Called directly with grad-tracking tables, the operator raises as apply_rope does, naming
    the table, instead of returning no table gradient without a word."""
    tabs = dict(zip(("cos", "sin"), tables(D, 8, dtype=torch.float64)))
    tabs[name] = tabs[name].clone().requires_grad_()
    q = randn(1, 3, 2, D, dtype=torch.float64)
    with pytest.raises(ValueError, match=f"^{name}: requires grad"):
        torch.ops.ropetut.rope(q, None, tabs["cos"], tabs["sin"], None, False, D, False,
                               "final", False)
