"""Table-free RoPE's operators (ropetut.angles_op): torch.compile(fullgraph=True) with
every option against eager apply_rope_angles, opcheck, gradgradcheck, and direct calls
with bad arguments, which raise before anything is written."""

import pytest
import torch
from conftest import assert_compiles_like_eager, gpu_only, randn

import ropetut
from ropetut import scaling
from ropetut.angles import apply_rope_angles
from ropetut.check import relative_error

B, T, HQ, HK, D = 2, 6, 4, 2, 16
DEV = ropetut.DEVICE
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
    """A model's use: projections viewed as heads (GQA), then table-free RoPE. In place,
    it writes into those intermediates."""
    opts = dict(OPTIONS[option])
    q_only = opts.pop("q_only", False)
    inv_freq, _ = scaling.default(opts.get("rotary_dim", D), device=DEV)
    if "positions" in opts:
        opts["positions"] = torch.tensor(opts["positions"], device=DEV)
    bhtd = opts.get("layout") == "bhtd"

    def block(x, w):
        q = (x @ w[:, : HQ * D]).view(B, T, HQ, D)
        k = (x @ w[:, HQ * D :]).view(B, T, HK, D)
        if bhtd:
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        if q_only:
            return apply_rope_angles(q, None, inv_freq, **opts) * 1.0
        q, k = apply_rope_angles(q, k, inv_freq, **opts)
        return torch.cat([q.flatten(), k.flatten()])

    x = randn(B, T, D)
    w = (randn(D, (HQ + HK) * D) / D**0.5).requires_grad_()
    return block, x, w


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize("option", OPTIONS)
def test_compile_fullgraph_matches_eager(option, mode):
    block, x, w = _case(option)
    assert_compiles_like_eager(block, (x, w), [w], mode)


def test_compile_calls_the_operators():
    """The compiled graph holds the operators (not an inlined autograd.Function or a
    graph of their own making): rope_angles out of place, rope_angles_ in place."""
    inv_freq, _ = scaling.default(D, device=DEV)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(node.target) for node in gm.graph.nodes)
        return gm

    for inplace, op in ((False, "ropetut.rope_angles.default"),
                        (True, "ropetut.rope_angles_.default")):  # fmt: skip
        seen.clear()
        torch._dynamo.reset()
        f = torch.compile(
            lambda q: apply_rope_angles(q, None, inv_freq, inplace=inplace),
            backend=backend, fullgraph=True,
        )  # fmt: skip
        f(randn(B, T, HQ, D))
        assert op in seen


def test_in_place_on_a_graph_input_under_compile():
    """In place on tensors the compiled function receives: the operator declares the
    write (mutates_args), so the caller's q and k hold the result afterwards."""
    inv_freq, _ = scaling.default(D, device=DEV)
    q, k = randn(B, T, HQ, D), randn(B, T, HK, D)
    expected = apply_rope_angles(q, k, inv_freq)

    def rotate_in_place(q, k):
        apply_rope_angles(q, k, inv_freq, inplace=True)

    torch._dynamo.reset()
    torch.compile(rotate_in_place, fullgraph=True)(q, k)
    assert relative_error(q, expected[0]) <= 1e-6
    assert relative_error(k, expected[1]) <= 1e-6


@pytest.mark.parametrize("op", ["rope_angles", "rope_angles_"])
@pytest.mark.parametrize("case", ["positions (B, T), GQA", "q only, partial, pairs"])
def test_opcheck(op, case):
    """torch.library.opcheck: the schema, the fake implementation and the autograd
    registration agree with what the operator really does."""
    q, k = randn(B, T, HQ, D), randn(B, T, HK, D)
    if case == "positions (B, T), GQA":
        positions = torch.tensor([5, 1, 2, 0, 7, 3], device=DEV).expand(B, T)
        args = (k, scaling.default(D, device=DEV)[0], positions, False, D)
    else:
        args = (None, scaling.default(8, device=DEV)[0], None, True, 8)
    if op == "rope_angles":
        k_arg = None if args[0] is None else args[0].requires_grad_()
        args = (q.requires_grad_(), k_arg, *args[1:])
        torch.library.opcheck(torch.ops.ropetut.rope_angles.default, (*args, False))
    else:
        torch.library.opcheck(torch.ops.ropetut.rope_angles_.default, (q, *args))


@pytest.mark.parametrize("backward", [False, True])
def test_eager_operator_matches_apply_rope_angles(backward):
    """The operator is apply_rope_angles' launch; backward=True turns by -theta, and so
    undoes the forward."""
    inv_freq, _ = scaling.default(D, device=DEV)
    q, k = randn(B, T, HQ, D), randn(B, T, HK, D)
    q_op, k_op = torch.ops.ropetut.rope_angles(q, k, inv_freq, None, False, D, False)
    q_ref, k_ref = apply_rope_angles(q, k, inv_freq)
    assert torch.equal(q_op, q_ref) and torch.equal(k_op, k_ref)
    q_back, k_back = torch.ops.ropetut.rope_angles(q_op, k_op, inv_freq, None, False,
                                                   D, True)  # fmt: skip
    assert relative_error(q_back, q) <= 1e-6 and relative_error(k_back, k) <= 1e-6


def test_in_place_operator_matches_out_of_place():
    inv_freq, _ = scaling.default(D, device=DEV)
    q, k = randn(B, T, HQ, D), randn(B, T, HK, D)
    expected = apply_rope_angles(q, k, inv_freq, interleaved=True)
    torch.ops.ropetut.rope_angles_(q, k, inv_freq, None, True, D)
    assert torch.equal(q, expected[0]) and torch.equal(k, expected[1])


def test_operator_gradcheck_and_gradgradcheck_float64():
    """The operator's backward is the operator turning the other way: differentiable
    again. Positions (B, T), GQA, partial rotary."""
    inv_freq, _ = scaling.default(4, device=DEV)
    q = randn(2, 3, 2, 8, dtype=torch.float64).requires_grad_()
    k = randn(2, 3, 1, 8, dtype=torch.float64).requires_grad_()
    positions = torch.tensor([[4, 0, 9], [1, 1, 2]], device=DEV)

    def f(q, k):
        return torch.ops.ropetut.rope_angles(q, k, inv_freq, positions, False, 4, False)

    assert torch.autograd.gradcheck(f, (q, k))
    assert torch.autograd.gradgradcheck(f, (q, k))


@pytest.mark.parametrize("op", ["rope_angles", "rope_angles_"])
@pytest.mark.parametrize(
    "bad, error, argument",
    [
        (dict(rotary_dim=2 * D), ValueError, "rotary_dim"),  # would write past each row
        (dict(rotary_dim=3), ValueError, "rotary_dim"),
        (dict(inv_freq="short"), ValueError, "inv_freq"),
        (dict(inv_freq="half"), TypeError, "inv_freq"),
        (dict(positions="short"), ValueError, "positions"),
        (dict(positions="float"), TypeError, "positions"),
        (dict(k="three heads"), ValueError, "k"),
    ],
)
def test_operators_validate_and_never_write_outside_their_tensors(
    op, bad, error, argument
):
    """Called directly, the operators check their arguments as apply_rope_angles does,
    before writing: q and k are views into one buffer, and nothing in it changes."""
    buffer = randn(B * T * (HQ + HK) * D * 2)
    q = buffer[: B * T * HQ * D].view(B, T, HQ, D)
    k = buffer[B * T * HQ * D : B * T * (HQ + HK) * D].view(B, T, HK, D)
    inv_freq, _ = scaling.default(D, device=DEV)
    positions, rotary_dim = None, bad.get("rotary_dim", D)
    if bad.get("inv_freq") == "short":
        inv_freq = inv_freq[:-1]
    if bad.get("inv_freq") == "half":
        inv_freq = inv_freq.half()
    if bad.get("positions") == "short":
        positions = torch.zeros(T - 1, dtype=torch.long, device=DEV)
    if bad.get("positions") == "float":
        positions = torch.zeros(T, device=DEV)
    if bad.get("k") == "three heads":
        k = buffer[B * T * HQ * D : B * T * (HQ + 3) * D].view(B, T, 3, D)
    before = buffer.clone()
    args = (q, k, inv_freq, positions, False, rotary_dim)
    with pytest.raises(error, match=f"^{argument}"):
        if op == "rope_angles":
            torch.ops.ropetut.rope_angles(*args, False)
        else:
            torch.ops.ropetut.rope_angles_(*args)
    assert torch.equal(buffer, before)


def test_in_place_operator_refuses_overlap():
    inv_freq, _ = scaling.default(D, device=DEV)
    q = randn(B, T, 1, D).expand(B, T, HQ, D)
    with pytest.raises(ValueError, match="^q: in place"):
        torch.ops.ropetut.rope_angles_(q, None, inv_freq, None, False, D)


def test_operator_refuses_inv_freq_that_requires_grad():
    """As apply_rope_angles: no gradient flows to inv_freq, so one that asks for it is
    refused, naming it, instead of getting no gradient without a word."""
    inv_freq = scaling.default(D, device=DEV)[0].requires_grad_()
    q = randn(1, 3, 2, D).requires_grad_()
    with pytest.raises(ValueError, match="^inv_freq: requires grad"):
        torch.ops.ropetut.rope_angles(q, None, inv_freq, None, False, D, False)


@gpu_only
@pytest.mark.parametrize("inplace", [False, True])
def test_reduce_overhead_no_graph_break_no_cudagraph_skip(inplace):
    """mode="reduce-overhead" replays the compiled block from a CUDA graph; in place on
    the block's own intermediates mutates no graph input, so nothing makes inductor
    skip the graph."""
    block, x, w = _case("inplace" if inplace else "positions (B, T)")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(3):  # record, then replay
            out = compiled(x, w)
        assert relative_error(out, block(x, w)) <= 1e-6
    assert not torch._dynamo.utils.counters["graph_break"]
    assert not torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]


def test_a_repeated_plain_call_skips_the_checks_it_passed(monkeypatch):
    """Host time: the second plain call of the same key does not check again (the checks
    are made to raise, and the call still passes); a call of another key does, and so
    does one with positions (never plain)."""
    from ropetut import angles_op

    monkeypatch.setattr(angles_op, "_PASSED", {})  # (earlier tests passed other keys)
    inv_freq, _ = scaling.default(16, device=DEV)
    q, k = randn(1, 5, 2, 16), randn(1, 5, 1, 16)
    first = apply_rope_angles(q, k, inv_freq)
    monkeypatch.setattr(angles_op, "check_qk", lambda *args, **kw: 1 / 0)
    again = apply_rope_angles(q, k, inv_freq)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    with pytest.raises(ZeroDivisionError):  # another key: interleaved pairs
        apply_rope_angles(q, k, inv_freq, interleaved=True)
    with pytest.raises(ZeroDivisionError):
        apply_rope_angles(q, k, inv_freq, positions=torch.arange(5, device=DEV))


def test_a_passed_call_does_not_vouch_for_a_frequency_that_requires_grad():
    """Whether inv_freq requires grad (with grad enabled) is part of the key: after a
    plain call passes, the same call with such an inv_freq is still refused."""
    inv_freq, _ = scaling.default(16, device=DEV)
    q = randn(1, 5, 2, 16)
    apply_rope_angles(q, None, inv_freq)
    with pytest.raises(ValueError, match="^inv_freq: requires grad"):
        apply_rope_angles(q, None, inv_freq.clone().requires_grad_())
