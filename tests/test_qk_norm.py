"""Fused QK-RMSNorm + RoPE (issue 18): the kernels against the fp64 reference,
gradients, the checks, in place, the operators under torch.compile, and the module."""

import pytest
import torch
from conftest import assert_compiles_like_eager, gpu_only, randn, tables

import ropetut
from ropetut import bench
from ropetut.bench import qk_norm as bench_qk_norm
from ropetut.check import GRAD_TOLERANCE, TOLERANCE, relative_error
from ropetut.kernels import launch, qk_norm_rope, qk_norm_rope_v1
from ropetut.kernels.qk_norm_rope import _fp32_pair, qk_norm_rope_forward
from ropetut.qk_norm_op import check_qk_norm_args
from ropetut.reference import qk_norm_rope_reference, rms_norm_reference, rope_reference

B, T, HQ, HK, D = 2, 5, 4, 2, 16
CASES = {
    "default": {},
    "odd shape D=96, H=3, T=17": dict(T=17, HQ=3, HK=3, D=96),
    "GQA 6/2": dict(HQ=6, HK=2),
    "bhtd views": dict(layout="bhtd"),
    "partial rotary": dict(rotary_dim=8),
    "partial, odd pass dims": dict(D=20, rotary_dim=6),
    "interleaved": dict(interleaved=True),
    "positions (B, T)": dict(positions="bt"),
    "positions (T,)": dict(positions="t"),
    "weight_offset (Gemma)": dict(weight_offset=1.0),
    "eps 1e-2": dict(eps=1e-2),
}
DTYPES = [torch.float32, torch.float16, torch.float64]


def make_case(case, dtype=torch.float32, w_dtype=None, *, b=B, t=None):
    """(q, k, w_q, w_k, cos, sin, options) in the caller's layout, for one of CASES."""
    opts = dict(CASES[case])
    t = t or opts.pop("T", T)
    opts.pop("T", None)
    hq, hk, d = opts.pop("HQ", HQ), opts.pop("HK", HK), opts.pop("D", D)
    n_positions = 2 * t + 3
    cos, sin = tables(d, n_positions, rotary_dim=opts.get("rotary_dim"))
    if opts.get("positions") == "bt":
        opts["positions"] = torch.randint(0, n_positions, (b, t), device=ropetut.DEVICE)
    elif opts.get("positions") == "t":
        opts["positions"] = torch.randperm(n_positions, device=ropetut.DEVICE)[:t]
    bhtd = opts.get("layout") == "bhtd"

    def shape(h):
        return (b, h, t, d) if bhtd else (b, t, h, d)

    q, k = randn(*shape(hq), dtype=dtype), randn(*shape(hk), dtype=dtype)
    w_q = (1 + 0.5 * randn(d)).to(w_dtype or dtype)
    w_k = (1 + 0.5 * randn(d)).to(w_dtype or dtype)
    return q, k, w_q, w_k, cos, sin, opts


def reference(x, w, cos, sin, opts):
    return qk_norm_rope_reference(x, w, cos, sin, **opts)


def run_poisoned(q, k, w_q, w_k, cos, sin, opts):
    """The forward launcher into NaN-filled outputs: a forgotten element stays NaN."""
    q4, k4, options = check_qk_norm_args(q, k, w_q, w_k, cos, sin, **opts)
    q_out, k_out = torch.full_like(q4, float("nan")), torch.full_like(k4, float("nan"))
    rope = options.rope
    qk_norm_rope_forward(
        q4,
        k4,
        w_q,
        w_k,
        rope.cos,
        rope.sin,
        q_out,
        k_out,
        positions=rope.positions,
        eps=options.eps,
        interleaved=rope.interleaved,
        rotary_dim=rope.rotary_dim,
        weight_offset=options.weight_offset,
    )
    if opts.get("layout") == "bhtd":
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    return q_out, k_out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES)
def test_forward_matches_reference(case, dtype):
    q, k, w_q, w_k, cos, sin, opts = make_case(case, dtype)
    q_out, k_out = run_poisoned(q, k, w_q, w_k, cos, sin, opts)
    assert relative_error(q_out, reference(q, w_q, cos, sin, opts)) <= TOLERANCE[dtype]
    assert relative_error(k_out, reference(k, w_k, cos, sin, opts)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("x", [1e-6, 1e-2, 0.1, 1.0, 0.0, 1 / 3])
def test_scalars_reach_fp64_kernels_to_48_bits(x):
    """Triton hands a compiled kernel a Python float as fp32 (the interpreter keeps it
    fp64, so only the GPU's fp64 'eps 1e-2' case sees the rounding): eps and
    weight_offset travel as an fp32 pair hi + lo, and fp64 kernels add both."""
    hi, lo = _fp32_pair(x)
    assert torch.tensor(hi, dtype=torch.float32).item() == hi  # hi is an fp32 value
    lo32 = torch.tensor(lo, dtype=torch.float32).item()  # lo travels as fp32 too
    assert abs((hi + lo32) - x) <= 2**-48 * x
    assert (lo == 0) == (hi == x)


def test_fp32_weights_with_fp16_activations():
    """Mixed precision: fp16 q and k, fp32 weights."""
    q, k, w_q, w_k, cos, sin, opts = make_case("default", torch.float16, torch.float32)
    q_out, _ = ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin)
    assert q_out.dtype == torch.float16
    assert (
        relative_error(q_out, reference(q, w_q, cos, sin, opts))
        <= TOLERANCE[torch.float16]
    )


def test_statistics_in_fp32_for_fp16():
    """Rows whose squares overflow fp16 (|x| ~ 1000, x**2 ~ 1e6 > 65504) normalise."""
    q, k, w_q, w_k, cos, sin, opts = make_case("default", torch.float16)
    q, k = q * 1000, k * 1000
    q_out, k_out = ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin)
    assert (
        relative_error(q_out, reference(q, w_q, cos, sin, opts))
        <= TOLERANCE[torch.float16]
    )


def _grads_of(fn, inputs, grads_out):
    return torch.autograd.grad(fn(*inputs), inputs, grads_out)


def _reference_grads(inputs, grads_out, cos, sin, opts):
    """(dq, dk, dw_q, dw_k) of the fp64 reference at inputs (q, k, w_q, w_k), for
    output gradients grads_out."""
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    return _grads_of(
        lambda q, k, w_q, w_k: (
            reference(q, w_q, cos, sin, opts),
            reference(k, w_k, cos, sin, opts),
        ),
        ref_inputs,
        tuple(g.double() for g in grads_out),
    )


@pytest.mark.parametrize("case", CASES)
def test_backward_matches_reference(case):
    """dq, dk, dw_q, dw_k in fp32 against autograd through the fp64 reference."""
    q, k, w_q, w_k, cos, sin, opts = make_case(case)
    inputs = [t.requires_grad_() for t in (q, k, w_q, w_k)]
    dq_out, dk_out = randn(*q.shape), randn(*k.shape)
    got = _grads_of(
        lambda q, k, w_q, w_k: ropetut.apply_qk_norm_rope(
            q, k, w_q, w_k, cos, sin, **opts
        ),
        inputs,
        (dq_out, dk_out),
    )
    expected = _reference_grads(inputs, (dq_out, dk_out), cos, sin, opts)
    for name, g, e in zip(("dq", "dk", "dw_q", "dw_k"), got, expected):
        assert g.dtype == torch.float32, name
        assert relative_error(g, e) <= GRAD_TOLERANCE[g.dtype], name


def test_strided_weights_forward_and_backward():
    """Weights that are views with stride 2 (a slice of a larger parameter) are read
    right, and their gradients come back: the kernels read a weight with unit stride, so
    the host hands them contiguous ones."""
    q, k, _, _, cos, sin, _ = make_case("default")
    D = q.shape[-1]
    big_q, big_k = randn(2 * D), randn(2 * D)
    dq_out, dk_out = randn(*q.shape), randn(*k.shape)

    def grads(q, k, big_q, big_k, fused):
        inputs = [t.requires_grad_() for t in (q, k, big_q, big_k)]
        w_q, w_k = big_q[::2], big_k[::2]
        if fused:
            out = ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin)
        else:
            out = reference(q, w_q, cos, sin, {}), reference(k, w_k, cos, sin, {})
        return out[0], torch.autograd.grad(out, inputs, (dq_out, dk_out))

    out, got = grads(q, k, big_q, big_k, fused=True)
    doubles = [t.detach().double() for t in (q, k, big_q, big_k)]
    dq_out, dk_out = dq_out.double(), dk_out.double()
    ref, expected = grads(*doubles, fused=False)
    assert relative_error(out, ref) <= TOLERANCE[torch.float32]
    for name, g, e in zip(("dq", "dk", "dw_q", "dw_k"), got, expected):
        assert relative_error(g, e) <= GRAD_TOLERANCE[g.dtype], name


@pytest.mark.parametrize(
    "case",
    [
        "default",
        "bhtd views",
        "partial, odd pass dims",
        "interleaved",
        "positions (B, T)",
        "weight_offset (Gemma)",
    ],
)
def test_gradcheck_fp64(case):
    q, k, w_q, w_k, cos, sin, opts = make_case(case, torch.float64, b=1, t=3)
    inputs = [t.requires_grad_() for t in (q, k, w_q, w_k)]
    assert torch.autograd.gradcheck(
        lambda q, k, w_q, w_k: ropetut.apply_qk_norm_rope(
            q, k, w_q, w_k, cos, sin, **opts
        ),
        inputs,
        fast_mode=True,
    )


def test_weight_gradients_are_deterministic():
    q, k, w_q, w_k, cos, sin, _ = make_case("odd shape D=96, H=3, T=17")
    inputs = [t.requires_grad_() for t in (q, k, w_q, w_k)]
    grads_out = (randn(*q.shape), randn(*k.shape))
    runs = [
        _grads_of(
            lambda *x: ropetut.apply_qk_norm_rope(*x, cos, sin), inputs, grads_out
        )
        for _ in range(2)
    ]
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def launch_straight(kernels, case, **tuning):
    """A kernel file's forward and backward launchers called directly (no autograd) on
    one of CASES in fp32: (q_out, k_out, dq, dk, dw_q, dw_k), and the same from the fp64
    reference. tuning: the launchers' overrides (the current file's only)."""
    q, k, w_q, w_k, cos, sin, opts = make_case(case)
    dq_out, dk_out = randn(*q.shape), randn(*k.shape)
    q4, k4, options = check_qk_norm_args(q, k, w_q, w_k, cos, sin, **opts)
    rope = options.rope
    args = (w_q, w_k, rope.cos, rope.sin)
    kwargs = dict(
        positions=rope.positions,
        eps=options.eps,
        interleaved=rope.interleaved,
        rotary_dim=rope.rotary_dim,
        weight_offset=options.weight_offset,
        **tuning,
    )
    outs = (torch.full_like(q4, float("nan")), torch.full_like(k4, float("nan")))
    got = kernels.qk_norm_rope_forward(q4, k4, *args, *outs, **kwargs)
    got += kernels.qk_norm_rope_backward(q4, k4, *args, dq_out, dk_out, **kwargs)
    inputs = [t.double().requires_grad_() for t in (q, k, w_q, w_k)]
    outputs = (
        reference(inputs[0], inputs[2], cos, sin, opts),
        reference(inputs[1], inputs[3], cos, sin, opts),
    )
    grads = torch.autograd.grad(outputs, inputs, (dq_out.double(), dk_out.double()))
    return got, (*outputs, *grads)


NAMES = ("q_out", "k_out", "dq", "dk", "dw_q", "dw_k")


def bound(name, tensor):
    """The tolerance for one of NAMES: TOLERANCE for the outputs, GRAD_TOLERANCE for
    the gradients, each by the tensor's own dtype."""
    return (TOLERANCE if name.endswith("_out") else GRAD_TOLERANCE)[tensor.dtype]


STRAIGHT_CASES = [
    "default",
    "odd shape D=96, H=3, T=17",
    "GQA 6/2",
    "partial, odd pass dims",
    "interleaved",
    "positions (B, T)",
    "weight_offset (Gemma)",
]


@pytest.mark.parametrize("case", STRAIGHT_CASES)
def test_first_version_matches_reference(case):
    """qk_norm_rope_v1.py, kept for the chapter, still computes the same thing."""
    got, expected = launch_straight(qk_norm_rope_v1, case)
    for name, g, e in zip(NAMES, got, expected):
        assert relative_error(g, e) <= bound(name, g), name


# Tunings that give units of several tokens and one head (prefill), of one token and
# several heads, with heads masked past HQ or HK (decode), and more programs than units.
TUNINGS = {
    "tokens": dict(pairs_per_tile=32, programs_per_sm=3),
    "heads": dict(pairs_per_tile=16, programs_per_sm=5),
    "one pair a tile": dict(pairs_per_tile=1, programs_per_sm=2),
    "programs > units": dict(pairs_per_tile=4096, programs_per_sm=64),
}


@pytest.mark.parametrize("tuning", TUNINGS)
@pytest.mark.parametrize(
    "case", ["odd shape D=96, H=3, T=17", "GQA 6/2", "partial, odd pass dims"]
)
def test_tunings_match_reference(case, tuning):
    """The launchers' overrides change the tiles and the grid, not the result."""
    got, expected = launch_straight(qk_norm_rope, case, **TUNINGS[tuning])
    for name, g, e in zip(NAMES, got, expected):
        assert relative_error(g, e) <= bound(name, g), name


def test_tiles_take_tokens_then_heads_of_each_tensor():
    assert qk_norm_rope._tiles(4096, 32, 8, 64, 1024) == (16, 1, 1, 64)  # prefill
    assert qk_norm_rope._tiles(1, 32, 8, 64, 1024) == (1, 16, 8, 64)  # decode
    assert qk_norm_rope._tiles(3, 6, 2, 8, 64) == (4, 2, 2, 8)


def test_programs_split_by_heads_and_never_outnumber_units(monkeypatch):
    monkeypatch.setattr(qk_norm_rope, "_sm_count", lambda device: 1)  # as on the CPU
    q, k, _, _, cos, _, _ = make_case("GQA 6/2")  # 2 x 5 tokens, 6 and 2 heads
    args = (q, k, (q, k), cos, None, D, False, 1e-6, 0.0)
    tuning = qk_norm_rope.Tuning(pairs_per_tile=8, num_warps=4, programs_per_sm=8)
    plan = qk_norm_rope._plan(*args, tuning)
    assert plan.programs == (6, 2) and plan.grid == (8, 1, 1)  # 6:2 like the heads
    tuning = tuning._replace(programs_per_sm=1000)  # units: 2 * 5 tokens x heads
    assert qk_norm_rope._plan(*args, tuning).programs == (60, 20)


def test_weight_gradients_over_many_programs_are_deterministic(monkeypatch):
    """dw summed per program over uneven runs of units (102 units of q over 8
    programs, on every device: one SM counted), then over programs: the same bits on
    every run (on the GPU; the interpreter is deterministic anyway)."""
    monkeypatch.setattr(qk_norm_rope, "_sm_count", lambda device: 1)
    tuning = dict(pairs_per_tile=64, programs_per_sm=16)
    runs = [launch_straight(qk_norm_rope, "odd shape D=96, H=3, T=17", **tuning)]
    torch.manual_seed(0)  # the same inputs again
    runs.append(launch_straight(qk_norm_rope, "odd shape D=96, H=3, T=17", **tuning))
    (got, expected), (again, _) = runs
    for name, g, e, a in zip(NAMES, got, expected, again):
        assert relative_error(g, e) <= bound(name, g), name
        assert torch.equal(g, a), name


def test_gradient_of_q_alone():
    """k_out unused: autograd hands the backward zeros for it, and dk is zero."""
    q, k, w_q, w_k, cos, sin, _ = make_case("default")
    q.requires_grad_(), k.requires_grad_()
    q_out, _ = ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin)
    q_out.sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k)) and q.grad.isfinite().all()


def _bad(**changes):
    return changes


BAD_INPUTS = {
    "w_q not a tensor": (_bad(w_q=1.0), TypeError, "w_q"),
    "w_k wrong shape": (_bad(w_k="short"), ValueError, "w_k"),
    "w_q integer": (_bad(w_q="int"), TypeError, "w_q"),
    "w_k 2-D": (_bad(w_k="2d"), ValueError, "w_k"),
    "eps zero": (_bad(eps=0.0), ValueError, "eps"),
    "eps negative": (_bad(eps=-1e-6), ValueError, "eps"),
    "eps nan": (_bad(eps=float("nan")), ValueError, "eps"),
    "eps a tensor": (_bad(eps=torch.tensor(1e-6)), TypeError, "eps"),
    "eps bool": (_bad(eps=True), TypeError, "eps"),
    "weight_offset inf": (
        _bad(weight_offset=float("inf")),
        ValueError,
        "weight_offset",
    ),
    "k None": (_bad(k=None), TypeError, "k"),
    "k wrong head dim": (_bad(k="d8"), ValueError, "k"),
    "k heads not a divisor": (_bad(k="h3"), ValueError, "k"),
    "odd rotary_dim": (_bad(rotary_dim=7), ValueError, "rotary_dim"),
    "cos wrong width": (_bad(cos="narrow"), ValueError, "cos"),
    "positions float": (_bad(positions="float"), TypeError, "positions"),
    "layout": (_bad(layout="thd"), ValueError, "layout"),
}


def _bad_call(changes, q, k, w_q, w_k, cos, sin, **kwargs):
    """The arguments and keywords of a call with one of BAD_INPUTS' changes made."""
    args = dict(q=q, k=k, w_q=w_q, w_k=w_k, cos=cos, sin=sin)
    special = {
        "short": w_k[:-2],
        "int": w_q.long(),
        "2d": w_k[None],
        "d8": k[..., :8],
        "h3": randn(B, T, 3, D),
        "narrow": cos[:, :-1],
        "float": torch.zeros(T, device=ropetut.DEVICE),
    }
    for key, value in changes.items():
        value = special.get(value, value) if isinstance(value, str) else value
        (args if key in args else kwargs)[key] = value
    return args.values(), kwargs


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_raise_naming_the_argument_before_any_write(case):
    changes, error, name = BAD_INPUTS[case]
    q, k, w_q, w_k, cos, sin, _ = make_case("default")
    args, kwargs = _bad_call(changes, q, k, w_q, w_k, cos, sin, inplace=True)
    q_before, k_before = q.clone(), k.clone()
    with pytest.raises(error, match=name):
        ropetut.apply_qk_norm_rope(*args, **kwargs)
    assert torch.equal(q, q_before) and torch.equal(k, k_before)


@pytest.mark.parametrize(
    "case",
    [
        "default",
        "bhtd views",
        "partial rotary",
        "positions (B, T)",
        "weight_offset (Gemma)",
    ],
)
def test_in_place_matches_out_of_place(case):
    q, k, w_q, w_k, cos, sin, opts = make_case(case)
    expected = ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin, **opts)
    versions = q._version, k._version
    q_out, k_out = ropetut.apply_qk_norm_rope(
        q, k, w_q, w_k, cos, sin, inplace=True, **opts
    )
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()
    assert torch.equal(q, expected[0]) and torch.equal(k, expected[1])
    assert q._version > versions[0] and k._version > versions[1]


def test_in_place_on_views_of_one_projection():
    """q and k side by side in each row of one fused projection: no element shared."""
    qk = randn(B, T, HQ + HK, D)
    q, k = qk[:, :, :HQ], qk[:, :, HQ:]
    _, _, w_q, w_k, cos, sin, _ = make_case("default")
    expected = ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin)
    ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin, inplace=True)
    assert torch.equal(q, expected[0]) and torch.equal(k, expected[1])


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_are_refused_after_a_good_call_of_the_same_shapes(case):
    """A plain call is checked in full once per key (host time): out of place, right
    after a good call of the same shapes, every refusal still holds."""
    changes, error, name = BAD_INPUTS[case]
    q, k, w_q, w_k, cos, sin, _ = make_case("default")
    ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin)
    args, kwargs = _bad_call(changes, q, k, w_q, w_k, cos, sin)
    with pytest.raises(error, match=name):
        ropetut.apply_qk_norm_rope(*args, **kwargs)


def test_a_repeated_plain_call_skips_the_checks_and_keys_it_passed(monkeypatch):
    """Host time: the second plain call of the same key checks nothing again and
    computes no launch key (both are made to raise, and the call still gives the same
    result, gradients too); a call of another key checks again."""
    from ropetut import qk_norm_op

    monkeypatch.setattr(qk_norm_op, "_PASSED", {})  # (earlier tests passed other keys)
    q, k, w_q, w_k, cos, sin, _ = make_case("GQA 6/2")
    inputs = [t.requires_grad_() for t in (q, k, w_q, w_k)]
    grads_out = (randn(*q.shape), randn(*k.shape))

    def step():
        out = ropetut.apply_qk_norm_rope(*inputs, cos, sin)
        return (*out, *torch.autograd.grad(out, inputs, grads_out))

    first = step()
    monkeypatch.setattr(qk_norm_op, "check_rope_args", lambda *a, **kw: 1 / 0)
    monkeypatch.setattr(qk_norm_rope, "launch_key", lambda *a, **kw: 1 / 0)
    for a, b in zip(first, step()):
        assert torch.equal(a, b)
    with pytest.raises(ZeroDivisionError):  # another key: interleaved pairs
        ropetut.apply_qk_norm_rope(*inputs, cos, sin, interleaved=True)


def test_the_modules_calls_are_plain(monkeypatch):
    """``QKNormRotary``'s weights are ``nn.Parameter``s and its tables buffers: its
    second call of the same shapes checks nothing again either."""
    from ropetut import qk_norm_op

    monkeypatch.setattr(qk_norm_op, "_PASSED", {})
    rope = ropetut.QKNormRotary(D, 2 * T).to(ropetut.DEVICE)
    q, k = randn(B, T, HQ, D), randn(B, T, HK, D)
    first = rope(q, k)
    monkeypatch.setattr(qk_norm_op, "check_rope_args", lambda *a, **kw: 1 / 0)
    for a, b in zip(first, rope(q, k)):
        assert torch.equal(a, b)


def test_a_plain_calls_launches_follow_a_retuned_module(monkeypatch):
    """The plans of a plain call are kept under its token and the module's ``FORWARD``
    or ``BACKWARD`` as they are at the call: a sweep that assigns them gets plans of
    its own."""
    q, k, w_q, w_k, cos, sin, _ = make_case("GQA 6/2")
    inputs = [t.requires_grad_() for t in (q, k, w_q, w_k)]
    grads_out = (randn(*q.shape), randn(*k.shape))
    planned = []
    plan = qk_norm_rope._plan
    monkeypatch.setattr(
        qk_norm_rope, "_plan", lambda *args: planned.append(args[-1]) or plan(*args)
    )
    for tuning in (qk_norm_rope.Tuning(64, 2, 1), qk_norm_rope.Tuning(32, 1, 3)):
        monkeypatch.setattr(qk_norm_rope, "FORWARD", tuning)
        monkeypatch.setattr(qk_norm_rope, "BACKWARD", tuning._replace(num_warps=4))
        out = ropetut.apply_qk_norm_rope(*inputs, cos, sin)
        torch.autograd.grad(out, inputs, grads_out)
        assert planned[-2:] == [tuning, tuning._replace(num_warps=4)]


@pytest.mark.parametrize("needs_grad", ["q", "k", "w_q", "w_k"])
def test_in_place_is_refused_when_a_gradient_is_needed(needs_grad):
    """Forward only: the backward needs q and k, which in place overwrites."""
    q, k, w_q, w_k, cos, sin, _ = make_case("default")
    args = dict(q=q, k=k, w_q=w_q, w_k=w_k)
    args[needs_grad] = args[needs_grad].requires_grad_()
    q_before = q.detach().clone()
    with pytest.raises(ValueError, match="inplace"):
        ropetut.apply_qk_norm_rope(*args.values(), cos, sin, inplace=True)
    assert torch.equal(q.detach(), q_before)
    with torch.no_grad():  # no gradient to track: allowed
        ropetut.apply_qk_norm_rope(
            *(t.detach() for t in args.values()), cos, sin, inplace=True
        )


def test_in_place_refuses_a_weight_that_overlaps_q():
    q, k, _, w_k, cos, sin, _ = make_case("default")
    with pytest.raises(ValueError, match="w_q"):
        ropetut.apply_qk_norm_rope(q, k, q[0, 0, 0], w_k, cos, sin, inplace=True)


def test_positions_outside_the_table_give_nan_for_that_token_only():
    q, k, w_q, w_k, cos, sin, _ = make_case("default")
    positions = torch.arange(T, device=ropetut.DEVICE)
    positions[2] = cos.shape[0] + 5
    q_out, _ = ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin, positions=positions)
    assert q_out[:, 2].isnan().all()
    assert q_out[:, [0, 1, 3, 4]].isfinite().all()


def test_empty_sequence():
    q, k, w_q, w_k, cos, sin, _ = make_case("default")
    q, k = q[:, :0].requires_grad_(), k[:, :0].requires_grad_()
    q_out, k_out = ropetut.apply_qk_norm_rope(q, k, w_q.requires_grad_(), w_k, cos, sin)
    assert q_out.shape == q.shape and k_out.shape == k.shape
    (q_out.sum() + k_out.sum()).backward()
    assert torch.equal(w_q.grad, torch.zeros_like(w_q))


def _block(case):
    """A model's use: projections viewed as heads (GQA), then QK-norm + RoPE."""
    _, _, w_q, w_k, cos, sin, opts = make_case(case)
    bhtd = opts.get("layout") == "bhtd"

    def block(x, w, w_q, w_k):
        q = (x @ w[:, : HQ * D]).view(B, T, HQ, D)
        k = (x @ w[:, HQ * D :]).view(B, T, HK, D)
        if bhtd:
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        q, k = ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin, **opts)
        return torch.cat([q.flatten(), k.flatten()])

    x = randn(B, T, D)
    w = (randn(D, (HQ + HK) * D) / D**0.5).requires_grad_()
    return block, (x, w, w_q.requires_grad_(), w_k.requires_grad_())


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
@pytest.mark.parametrize(
    "case",
    [
        "default",
        "bhtd views",
        "partial rotary",
        "interleaved",
        "positions (B, T)",
        "weight_offset (Gemma)",
    ],
)
def test_compile_fullgraph_matches_eager(case, mode):
    block, inputs = _block(case)
    assert_compiles_like_eager(block, inputs, list(inputs[1:]), mode)


def test_in_place_under_compile():
    q, k, w_q, w_k, cos, sin, _ = make_case("default")
    expected = ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin)

    def norm_rotate_in_place(q, k):
        ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin, inplace=True)

    torch._dynamo.reset()
    torch.compile(norm_rotate_in_place, fullgraph=True)(q, k)
    assert torch.equal(q, expected[0]) and torch.equal(k, expected[1])


@pytest.mark.parametrize("op", ["qk_norm_rope", "qk_norm_rope_"])
def test_opcheck(op):
    """Schema, fake implementation and autograd registration agree with the operator."""
    q, k, w_q, w_k, cos, sin, opts = make_case("positions (B, T)")
    args = (w_q, w_k, cos, sin, opts["positions"], 1e-6, False, D, 0.0)
    if op == "qk_norm_rope":
        q, k, w_q, w_k = (t.requires_grad_() for t in (q, k, w_q, w_k))
        args = (q, k, w_q, w_k, *args[2:])
    else:
        args = (q, k, *args)
    torch.library.opcheck(getattr(torch.ops.ropetut, op).default, args)


def test_module_in_attention():
    """QKNormRotary fits RoPEAttention's rope hook, and matches apply_qk_norm_rope."""
    rope = ropetut.QKNormRotary(D, 32, weight_offset=1.0).to(ropetut.DEVICE)
    assert not rope.w_q.any() and not rope.w_k.any()  # zeros: (1 + w) starts at 1
    attention = ropetut.RoPEAttention(HQ * D, HQ, HK, rope=rope).to(ropetut.DEVICE)
    x = randn(B, T, HQ * D)
    attention(x).sum().backward()
    assert rope.w_q.grad is not None and rope.w_q.grad.abs().sum() > 0
    q, k = randn(B, T, HQ, D), randn(B, T, HK, D)
    expected = ropetut.apply_qk_norm_rope(
        q, k, rope.w_q, rope.w_k, rope.cos, rope.sin, weight_offset=1.0
    )
    for out, ref in zip(rope(q, k), expected):
        assert torch.equal(out, ref)


def test_reference_is_rms_norm_then_rope():
    """The reference composes a plain RMSNorm (unit rms rows) with rope_reference."""
    x, w = randn(2, 3, 2, 8, dtype=torch.float64), torch.ones(8, dtype=torch.float64)
    normed = rms_norm_reference(x, w, eps=0.0)
    torch.testing.assert_close(
        normed.pow(2).mean(-1), torch.ones_like(normed[..., 0])
    )
    cos, sin = tables(8, 3)
    torch.testing.assert_close(
        qk_norm_rope_reference(x, w, cos, sin, eps=0.0),
        rope_reference(normed, cos, sin),
    )


def dw_reference(x, dy, cos, sin, eps=1e-6):
    """dw alone in fp64 (token t at row t of cos, sin): the sum over rows of the
    gradient of the normed x (dy turned back by -theta) times the normed x."""
    x = x.double()
    g = rope_reference(dy, cos, sin, inverse=True)
    return (g * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).sum((0, 1, 2))


def test_dw_reference_matches_autograd():
    q, _, w_q, _, cos, sin, opts = make_case("default", torch.float64)
    w_q = torch.ones_like(w_q).requires_grad_()
    dy = randn(*q.shape, dtype=torch.float64)
    (expected,) = torch.autograd.grad(reference(q, w_q, cos, sin, opts), w_q, dy)
    torch.testing.assert_close(dw_reference(q, dy, cos, sin), expected)


@gpu_only
def test_weight_gradient_over_a_million_rows():
    """B*T*H >= 2**20 rows of D = 128: dw_q summed in fp32 per program, then over
    programs, against fp64. The reference goes through T a slice at a time (its memory),
    each slice with its own rows of the tables."""
    b, t, h, d = 4, 65536, 4, 128
    cos, sin = tables(d, t)
    q = randn(b, t, h, d, dtype=torch.bfloat16).requires_grad_()
    k = randn(b, t, 1, d, dtype=torch.bfloat16)
    w_q = torch.ones(d, device=ropetut.DEVICE, requires_grad=True)
    dq_out = randn(b, t, h, d, dtype=torch.bfloat16)
    q_out, _ = ropetut.apply_qk_norm_rope(q, k, w_q, torch.ones_like(w_q), cos, sin)
    (dw_q,) = torch.autograd.grad(q_out, w_q, dq_out)
    expected = torch.zeros(d, dtype=torch.float64, device=q.device)
    for start in range(0, t, 4096):
        rows = slice(start, start + 4096)
        expected += dw_reference(
            q[:, rows].detach(), dq_out[:, rows], cos[rows], sin[rows]
        )
    assert relative_error(dw_q, expected) <= GRAD_TOLERANCE[dw_q.dtype]


@gpu_only
@pytest.mark.parametrize("case", CASES)
def test_bf16_forward_and_backward(case):
    q, k, w_q, w_k, cos, sin, opts = make_case(case, torch.bfloat16, torch.float32)
    q_out, k_out = run_poisoned(q, k, w_q, w_k, cos, sin, opts)
    assert (
        relative_error(q_out, reference(q, w_q, cos, sin, opts))
        <= TOLERANCE[torch.bfloat16]
    )
    assert (
        relative_error(k_out, reference(k, w_k, cos, sin, opts))
        <= TOLERANCE[torch.bfloat16]
    )
    inputs = [t.requires_grad_() for t in (q, k, w_q, w_k)]
    grads_out = (
        randn(*q.shape, dtype=torch.bfloat16),
        randn(*k.shape, dtype=torch.bfloat16),
    )
    got = _grads_of(
        lambda *x: ropetut.apply_qk_norm_rope(*x, cos, sin, **opts), inputs, grads_out
    )
    expected = _reference_grads(inputs, grads_out, cos, sin, opts)
    for g, e in zip(got, expected):  # dq, dk in bf16; dw_q, dw_k in fp32
        assert relative_error(g, e) <= GRAD_TOLERANCE[g.dtype]


@pytest.mark.parametrize("name", ["fused", "liger", "torch eager"])
@pytest.mark.parametrize("positions", [False, True], ids=["", "positions"])
def test_bench_rows_build_and_compute_qk_norm_rope(name, positions):
    """Each benchmark provider (tiny shapes, any device) computes QK-norm + RoPE, and
    its training step the gradients of q, k, w_q and w_k. Timed on a GPU only. With the
    same seed, providers draw the same weights and positions."""
    if name == "liger" and bench_qk_norm.liger_pair() is None:
        pytest.skip("liger_kernel is not installed")
    shape = bench.Shape(2, 5, 4, 2, 16, dtype=torch.float32, positions=positions)
    q, k, gq, gk = bench.make_inputs(shape, "fwd+bwd")
    runs = {}
    for provider in (name, "torch eager"):
        torch.manual_seed(1)
        fn, weights = bench_qk_norm.make_provider(provider, shape)
        # each provider gets its own copies: Liger's backwards write their results
        # into the output gradients they are handed
        mine = [t.clone() for t in (q, k, gq, gk)]
        outputs = fn(*mine[:2])
        grads = bench_qk_norm.training_step(fn, weights)(*mine)
        runs[provider] = (*outputs, *grads)
    assert len(runs[name]) == 6  # q_out, k_out, dq, dk, dw_q, dw_k
    for got, expected in zip(runs[name], runs["torch eager"]):
        assert relative_error(got, expected) <= 1e-5
    if not positions:  # the unfused module itself against the reference
        cos, sin = tables(shape.D, shape.T)
        torch.manual_seed(1)
        _, (w_q, w_k) = bench_qk_norm.make_provider("torch eager", shape)
        for out, x, w in zip(runs["torch eager"], (q, k), (w_q, w_k)):
            assert relative_error(out, qk_norm_rope_reference(x, w, cos, sin)) <= 1e-5


def test_bench_without_a_gpu_times_nothing(capsys):
    if ropetut.on_gpu():
        pytest.skip("on a GPU run() times every row: minutes")
    assert bench_qk_norm.run() is None
    assert "no GPU" in capsys.readouterr().out


def count_plans(monkeypatch):
    """A fresh plan cache, and a list that records each plan ``_plan`` makes."""
    monkeypatch.setattr(launch, "_KEPT", {})
    made = []
    make = qk_norm_rope._plan

    def spy(*args):
        made.append(args)
        return make(*args)

    monkeypatch.setattr(qk_norm_rope, "_plan", spy)
    return made


def test_a_repeated_call_reuses_its_plan_and_another_call_makes_its_own(monkeypatch):
    """The plan is kept per launch key: an identical second call makes none, and a
    call with another eps, shape or stride makes its own (a reused wrong plan would
    show as a wrong result: eps, sizes and strides are among its arguments)."""
    made = count_plans(monkeypatch)
    q, k, w_q, w_k, cos, sin, _ = make_case("odd shape D=96, H=3, T=17")
    calls = {
        "first": (q, k, {}),
        "again": (q, k, {}),
        "eps": (q, k, dict(eps=1e-1)),
        "shape": (q[:, :9], k[:, :9], {}),
        "strides": (q.transpose(1, 2).contiguous().transpose(1, 2), k, {}),
    }
    plans = []
    for q_in, k_in, opts in calls.values():
        q_out, k_out = ropetut.apply_qk_norm_rope(
            q_in, k_in, w_q, w_k, cos, sin, **opts
        )
        assert relative_error(q_out, reference(q_in, w_q, cos, sin, opts)) <= 1e-5
        assert relative_error(k_out, reference(k_in, w_k, cos, sin, opts)) <= 1e-5
        plans.append(len(made))
    assert plans == [1, 1, 2, 3, 4]


def test_gradients_laid_out_otherwise_than_the_outputs():
    """The forward prepares the backward's launch for gradients laid out like its
    outputs; transposed gradients get a launch of their own, and the right result."""
    q, k, w_q, w_k, cos, sin, opts = make_case("GQA 6/2")
    inputs = [t.requires_grad_() for t in (q, k, w_q, w_k)]
    grads_out = [randn(B, h, T, D).transpose(1, 2) for h in (6, 2)]
    got = _grads_of(
        lambda *x: ropetut.apply_qk_norm_rope(*x, cos, sin), inputs, grads_out
    )
    expected = _reference_grads(inputs, grads_out, cos, sin, opts)
    for name, g, e in zip(NAMES[2:], got, expected):
        assert relative_error(g, e) <= GRAD_TOLERANCE[g.dtype], name


@pytest.mark.parametrize("written", ["cos", "positions"])
def test_tables_and_positions_are_saved_for_the_backward(written):
    """As q, k and the weights: a write to cos or positions between the forward and
    the backward raises there, instead of a backward that turns by other angles."""
    q, k, w_q, w_k, cos, sin, opts = make_case("positions (T,)")
    q.requires_grad_()
    q_out, k_out = ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin, **opts)
    {"cos": cos, "positions": opts["positions"]}[written].add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.backward((q_out, k_out), (randn(*q.shape), randn(*k.shape)))


def test_the_backward_reads_what_saved_tensor_hooks_saved():
    """Under hooks that save copies, autograd checks no versions: a write to the
    tables after the forward must not reach the backward, which turns by the angles
    the forward saved (the same gradients as without hooks, bit for bit)."""
    q, k, w_q, w_k, cos, sin, _ = make_case("GQA 6/2")
    inputs = [t.requires_grad_() for t in (q, k, w_q, w_k)]
    grads_out = randn(*q.shape), randn(*k.shape)
    expected = _grads_of(
        lambda *x: ropetut.apply_qk_norm_rope(*x, cos, sin), inputs, grads_out
    )
    with torch.autograd.graph.saved_tensors_hooks(torch.clone, lambda t: t):
        out = ropetut.apply_qk_norm_rope(*inputs, cos, sin)
    cos.mul_(0.5), sin.mul_(-1)
    for name, g, e in zip(NAMES[2:], torch.autograd.grad(out, inputs, grads_out),
                          expected):  # fmt: skip
        assert torch.equal(g, e), name


def test_the_backward_follows_q_and_k_that_hooks_laid_out_anew():
    """q and k are views with gaps (one projection's columns); hooks that save them
    contiguous give the backward other strides than the forward saw: its launch plan
    must follow them (the same gradients as without hooks, bit for bit)."""
    qk = randn(B, T, HQ + HK, D)
    q, k = qk[:, :, :HQ].detach(), qk[:, :, HQ:].detach()
    _, _, w_q, w_k, cos, sin, _ = make_case("default")
    inputs = [t.requires_grad_() for t in (q, k, w_q, w_k)]
    grads_out = randn(*q.shape), randn(*k.shape)
    expected = _grads_of(
        lambda *x: ropetut.apply_qk_norm_rope(*x, cos, sin), inputs, grads_out
    )
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: t.contiguous(), lambda t: t
    ):
        got = _grads_of(
            lambda *x: ropetut.apply_qk_norm_rope(*x, cos, sin), inputs, grads_out
        )
    for name, g, e in zip(NAMES[2:], got, expected):
        assert torch.equal(g, e), name


def test_inference_tables_and_positions_are_kept():
    """Tables and positions made under torch.inference_mode() cannot be saved, nor
    written outside it: they are kept, and give the gradients normal tensors give."""
    q, k, w_q, w_k, cos, sin, opts = make_case("positions (T,)")
    inputs = [t.requires_grad_() for t in (q, k, w_q, w_k)]
    grads_out = randn(*q.shape), randn(*k.shape)
    with torch.inference_mode():
        frozen = cos.clone(), sin.clone(), opts["positions"].clone()
    got = [
        _grads_of(
            lambda *x: ropetut.apply_qk_norm_rope(*x, c, s, positions=p),
            inputs,
            grads_out,
        )
        for c, s, p in ((cos, sin, opts["positions"]), frozen)
    ]
    for name, g, e in zip(NAMES[2:], *got):
        assert torch.equal(g, e), name

def test_a_backward_key_with_tuning_overrides_is_refused():
    """A key from ``backward_key`` holds no tuning: with overrides it would launch the
    plan of another tuning, so the launcher refuses the pair before launching."""
    q, k, w_q, w_k, cos, sin, _ = make_case("GQA 6/2")
    options = dict(
        positions=None,
        eps=1e-6,
        interleaved=False,
        rotary_dim=q.shape[-1],
        weight_offset=0.0,
    )
    dq_out, dk_out = torch.ones_like(q), torch.ones_like(k)
    key = qk_norm_rope.backward_key(
        q, k, w_q, w_k, cos, sin, dq_out, dk_out, **options
    )
    with pytest.raises(ValueError, match="key"):
        qk_norm_rope.qk_norm_rope_backward(
            q, k, w_q, w_k, cos, sin, dq_out, dk_out, key=key, num_warps=2, **options
        )


def test_weight_gradients_stay_finite_when_eps_rounds_to_zero():
    """eps = 1e-50 is 0 in fp32: a masked row (zeros, past T or past the heads) then
    has rstd = inf. Its share of dw must not reach dw as 0 * inf = NaN."""
    q, k, w_q, w_k, cos, sin, _ = make_case("odd shape D=96, H=3, T=17")
    inputs = [t.requires_grad_() for t in (q, k, w_q, w_k)]
    grads_out = (randn(*q.shape), randn(*k.shape))
    got = _grads_of(
        lambda *x: ropetut.apply_qk_norm_rope(*x, cos, sin, eps=1e-50),
        inputs,
        grads_out,
    )
    for name, g in zip(NAMES[2:], got):
        assert g.isfinite().all(), name


@gpu_only
def test_repeated_launches_on_the_gpu_go_straight_to_the_compiled_kernels(
    monkeypatch,
):
    """fwd+bwd twice: one compiled kernel kept each way, the same results. Then q and
    the output gradients as views 4 bytes off 16-byte alignment: through the JIT,
    nothing more kept, the same results."""
    monkeypatch.setattr(launch, "_KEPT", {})
    q, k, w_q, w_k, cos, sin, _ = make_case("default")
    weights = [w.requires_grad_() for w in (w_q, w_k)]

    dk_out = randn(*k.shape)

    def step(q, dq_out):
        q, k_in = q.detach().requires_grad_(), k.detach().requires_grad_()
        out = ropetut.apply_qk_norm_rope(q, k_in, *weights, cos, sin)
        grads = torch.autograd.grad(out, (q, k_in, *weights), (dq_out, dk_out))
        return (*out, *grads)

    def misaligned(x):
        """x's values in a view 4 bytes past a 16-byte aligned buffer."""
        view = torch.empty(x.numel() + 1, device=x.device)[1:].view(x.shape)
        return view.copy_(x)

    dq_out = randn(*q.shape)
    first = step(q, dq_out)
    assert sum(kept.compiled is not None for kept in launch._KEPT.values()) == 2
    assert all(torch.equal(a, b) for a, b in zip(first, step(q, dq_out)))
    off = step(misaligned(q), misaligned(dq_out))
    assert all(relative_error(a, b) <= 1e-6 for a, b in zip(off, first))
    assert sum(kept.compiled is not None for kept in launch._KEPT.values()) == 2
