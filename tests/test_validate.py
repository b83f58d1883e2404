"""Bad inputs raise a clear error naming the argument, and leave every input untouched; in place
refuses memory it would write twice; empty tensors give empty outputs."""
import pytest
import torch
from conftest import randn, tables

import ropetut
from ropetut.check import relative_error
from ropetut.reference import rope_reference

B, T, H, D = 2, 5, 4, 16


def _good():
    cos, sin = tables(D, T)
    return dict(q=randn(B, T, H, D), k=randn(B, T, 2, D), cos=cos, sin=sin)


CASES = {
    # name: (change to the good arguments, error type, argument named in the message)
    "odd head dim": (lambda a: a.update(q=randn(B, T, H, 15), k=randn(B, T, 2, 15)), ValueError, "q"),
    "k batch differs": (lambda a: a.update(k=randn(B + 1, T, 2, D)), ValueError, "k"),
    "k length differs": (lambda a: a.update(k=randn(B, T + 1, 2, D)), ValueError, "k"),
    "k head dim differs": (lambda a: a.update(k=randn(B, T, 2, D + 2)), ValueError, "k"),
    "Hq not a multiple of Hkv": (lambda a: a.update(k=randn(B, T, 3, D)), ValueError, "k"),
    "cos too short for T": (lambda a: a.update(cos=a["cos"][:T - 1], sin=a["sin"][:T - 1]), ValueError, "cos"),
    # positions' values are read on the host only when asked (it waits for the GPU)
    "cos too short for positions": (
        lambda a: a.update(positions=torch.tensor([0, 1, 2, 3, T]), check_positions=True),
        ValueError, "positions"),
    "negative position": (lambda a: a.update(positions=torch.tensor([0, 1, -1, 3, 4]), check_positions=True),
                          ValueError, "positions"),
    "check_positions not a bool": (lambda a: a.update(check_positions=1), TypeError, "check_positions"),
    "positions wrong shape": (lambda a: a.update(positions=torch.zeros(B, T + 1, dtype=torch.long)),
                              ValueError, "positions"),
    "positions not integer": (lambda a: a.update(positions=torch.zeros(T)), TypeError, "positions"),
    "integer q": (lambda a: a.update(q=torch.ones(B, T, H, D, dtype=torch.int32)), TypeError, "q"),
    "k dtype differs": (lambda a: a.update(k=a["k"].double()), TypeError, "k"),
    "q not a tensor": (lambda a: a.update(q=[[1.0]]), TypeError, "q"),
    "q 3-D": (lambda a: a.update(q=randn(B, T, D)), ValueError, "q"),
    "sin shape differs": (lambda a: a.update(sin=a["sin"][:-1]), ValueError, "sin"),
    "cos width wrong": (lambda a: a.update(cos=a["cos"][:, :-1], sin=a["sin"][:, :-1]), ValueError, "cos"),
    "cos integer": (lambda a: a.update(cos=a["cos"].long()), TypeError, "cos"),
    "rotary_dim odd": (lambda a: a.update(rotary_dim=7), ValueError, "rotary_dim"),
    "rotary_dim above D": (lambda a: a.update(rotary_dim=D + 2), ValueError, "rotary_dim"),
    "rotary_dim not int": (lambda a: a.update(rotary_dim=8.0), TypeError, "rotary_dim"),
    "bad layout": (lambda a: a.update(layout="bsd"), ValueError, "layout"),
    "bad impl": (lambda a: a.update(impl="v9"), ValueError, "impl"),
    "v2 asked for positions": (lambda a: a.update(impl="v2", positions=torch.arange(T)), ValueError, "positions"),
    "v1 asked for half-split": (lambda a: a.update(impl="v1"), ValueError, "interleaved"),
    "v4 asked for interleaved": (lambda a: a.update(impl="v4", interleaved=True), ValueError, "interleaved"),
    "in place with q is k": (lambda a: a.update(k=a["q"]), ValueError, "k"),
    "tables missing": (lambda a: a.update(cos=None), TypeError, "cos"),
}


# "meta" tensors stand in for a second device on a machine that has only one.
CASES["tables on another device"] = (lambda a: a.update(cos=a["cos"].to("meta")), ValueError, "cos")
CASES["positions on another device"] = (
    lambda a: a.update(positions=torch.arange(T, device="meta")), ValueError, "positions")
if ropetut.on_gpu():
    CASES["CPU tensors in GPU mode"] = (
        lambda a: a.update(q=a["q"].cpu(), k=a["k"].cpu(), cos=a["cos"].cpu(), sin=a["sin"].cpu()),
        ValueError, "q")


@pytest.mark.parametrize("case", CASES)
def test_bad_input_raises_and_leaves_inputs_untouched(case):
    change, error, argument = CASES[case]
    args = _good()
    change(args)
    inplace = args.get("impl", "final") == "final"   # in place: the strictest test of "untouched"
    tensors = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor) and v.device.type != "meta"}
    q, k, cos, sin = args.pop("q"), args.pop("k"), args.pop("cos"), args.pop("sin")
    with pytest.raises(error) as info:
        ropetut.apply_rope(q, k, cos, sin, inplace=inplace, **args)
    assert str(info.value).startswith(argument), str(info.value)
    now = dict(q=q, k=k, cos=cos, sin=sin, **args)
    for name, before in tensors.items():
        assert torch.equal(now[name], before), f"{name} was modified"


OUT_OF_PLACE_CASES = [name for name in CASES if name != "in place with q is k"]


@pytest.mark.parametrize("case", OUT_OF_PLACE_CASES)
def test_bad_input_is_refused_after_a_good_call_of_the_same_shapes(case):
    """A plain call is checked in full once per shape, dtype, device and option (host time);
    the same refusals hold out of place right after a good call has passed them."""
    change, error, argument = CASES[case]
    good = _good()
    ropetut.apply_rope(**good)
    args = dict(good)
    change(args)
    with pytest.raises(error) as info:
        ropetut.apply_rope(**args)
    assert str(info.value).startswith(argument), str(info.value)


@pytest.mark.parametrize(
    "change, error, argument",
    [
        (lambda a: a.update(interleaved=1), TypeError, "interleaved"),
        (lambda a: a.update(inplace=0), TypeError, "inplace"),
        (lambda a: a.update(rotary_dim=True), TypeError, "rotary_dim"),
        (lambda a: a.update(cos=a["cos"].requires_grad_()), ValueError, "cos"),
    ],
)
def test_what_a_passed_call_does_not_vouch_for_is_checked_again(change, error, argument):
    """Flags that equal a passed call's only by value (1 == True) and tables that now
    require grad are not the call that passed."""
    good = _good()
    ropetut.apply_rope(**good, interleaved=True)
    args = dict(good, interleaved=True)
    change(args)
    with pytest.raises(error) as info:
        ropetut.apply_rope(**args)
    assert str(info.value).startswith(argument), str(info.value)


def test_a_repeated_plain_call_skips_the_checks_it_passed(monkeypatch):
    """Host time: the second plain call of the same key does not check again (the checks
    are made to raise, and the call still passes); a call of another key does."""
    from ropetut import validate

    monkeypatch.setattr(validate, "_PASSED", {})  # (earlier tests passed other keys)
    a = _good()
    ropetut.apply_rope(**a)
    monkeypatch.setattr(validate, "check_qk", lambda *args, **kw: 1 / 0)
    ropetut.apply_rope(**a)
    with pytest.raises(ZeroDivisionError):  # another key: interleaved pairs
        ropetut.apply_rope(**a, interleaved=True)


def test_a_passed_call_vouches_for_its_own_kernel_only():
    """Two registry entries of one name are two kernels: the second's Supports are read."""
    import dataclasses

    from ropetut.kernels import KERNELS, Supports
    from ropetut.validate import check_rope_args

    a = _good()
    float64_only = dataclasses.replace(
        KERNELS["final"], supports=Supports(dtypes=(torch.float64,))
    )
    check_rope_args(a["q"], a["k"], a["cos"], a["sin"], kernel="final")
    with pytest.raises(TypeError, match="^q: impl='final' takes"):
        check_rope_args(a["q"], a["k"], a["cos"], a["sin"], kernel=float64_only)


def test_an_unhashable_layout_is_named():
    a = _good()
    with pytest.raises(ValueError, match="^layout"):
        ropetut.apply_rope(**a, layout=["bthd"])


def test_a_repeated_call_gives_what_the_first_gave():
    a = _good()
    first = ropetut.apply_rope(**a, layout="bthd")
    again = ropetut.apply_rope(**a, layout="bthd")
    for x, y in zip(first, again):
        assert torch.equal(x, y)
    q_h, k_h = a["q"].transpose(1, 2), a["k"].transpose(1, 2)
    for _ in range(2):
        q_out, k_out = ropetut.apply_rope(q_h, k_h, a["cos"], a["sin"], layout="bhtd")
        assert q_out.shape == q_h.shape and torch.equal(q_out.transpose(1, 2), first[0])


@pytest.mark.parametrize("bad", [T, -1, 2**40])
def test_out_of_range_position_gives_nan_and_reads_nothing_past_the_table(bad):
    """Without check_positions nothing waits for the GPU: the kernel keeps its reads inside the
    table and writes NaN for the token whose position is outside it. The table is a view into a
    longer one, so a read past its end would find finite values, not NaN."""
    a = _good()
    cos2, sin2 = tables(D, 2 * T)
    cos, sin = cos2[:T], sin2[:T]
    positions = torch.tensor([0, 1, bad, 3, 4], device=ropetut.DEVICE)
    q_out, k_out = ropetut.apply_rope(a["q"], a["k"], cos, sin, positions=positions)
    for out, x in ((q_out, a["q"]), (k_out, a["k"])):
        assert out[:, 2].isnan().all()
        good = [0, 1, 3, 4]
        ref = rope_reference(x[:, good], cos, sin, positions=positions[good])
        assert relative_error(out[:, good], ref) <= 2e-6


def test_good_arguments_pass():
    a = _good()
    q_out, k_out = ropetut.apply_rope(a["q"], a["k"], a["cos"], a["sin"])
    assert q_out.shape == a["q"].shape and k_out.shape == a["k"].shape


def test_bhtd_outputs_keep_shape_and_strides():
    a = _good()
    q = a["q"].transpose(1, 2).contiguous()                 # a real (B, H, T, D) tensor
    out = ropetut.apply_rope(q, cos=a["cos"], sin=a["sin"], layout="bhtd")
    assert out.shape == q.shape and out.stride() == q.stride()


def _in_place_refused(q, k, argument):
    cos, sin = tables(q.shape[-1], q.shape[1])
    backing = [t._base if t._base is not None else t for t in (q, k) if t is not None]
    before = [t.clone() for t in backing]
    with pytest.raises(ValueError, match=f"^{argument}: in place"):
        ropetut.apply_rope(q, k, cos, sin, inplace=True)
    assert all(torch.equal(t, b) for t, b in zip(backing, before))


def test_in_place_refuses_a_q_whose_elements_share_memory():
    """torch's in-place ops refuse an expand()ed tensor: each write would land on several elements."""
    _in_place_refused(randn(B, T, 1, D).expand(B, T, H, D), None, "q")
    buffer = randn(B * T * H * D)
    overlapping = buffer.as_strided((B, T, H, D), (T * H * D, H * D, D // 2, 1))   # rows overlap
    _in_place_refused(overlapping, None, "q")


@pytest.mark.parametrize("shift", [0, 1, D // 2, H * D - 1])
def test_in_place_refuses_q_and_k_that_share_memory(shift):
    """Not only the same start: any shared element, here with k starting `shift` elements in."""
    buffer = randn(B * T * H * D + shift)
    q = buffer[:B * T * H * D].view(B, T, H, D)
    k = buffer[shift:shift + B * T * H * D].view(B, T, H, D)
    _in_place_refused(q, k, "k")


@pytest.mark.parametrize("hk", [1, 2])
@pytest.mark.parametrize("layout", ["bthd", "bhtd"])
def test_in_place_takes_views_of_one_projection(hk, layout):
    """q and k side by side in each row of a fused projection interleave in memory but share no
    element: accepted, and each rotated once."""
    cos, sin = tables(D, T)
    qkv = randn(B, T, H + 2 * hk, D)
    q, k = qkv[:, :, :H], qkv[:, :, H:H + hk]
    if layout == "bhtd":
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    expected = [rope_reference(x, cos, sin, layout=layout) for x in (q, k)]
    v_before = qkv[:, :, H + hk:].clone()
    ropetut.apply_rope(q, k, cos, sin, inplace=True, layout=layout)
    assert relative_error(q, expected[0]) <= 2e-6 and relative_error(k, expected[1]) <= 2e-6
    assert torch.equal(qkv[:, :, H + hk:], v_before)


@pytest.mark.parametrize("shape_q, shape_k", [
    ((B, 0, H, D), (B, 0, 2, D)),      # no tokens
    ((0, T, H, D), (0, T, 2, D)),      # no batch
    ((B, T, 0, D), (B, T, 0, D)),      # no heads
    ((B, T, 0, D), (B, T, 2, D)),      # no q heads (0 is a multiple of 2): k alone turns
    ((B, T, H, D), (B, T, 0, D)),      # no k heads: q alone turns
])
@pytest.mark.parametrize("inplace", [False, True])
def test_empty_tensors_give_empty_outputs(shape_q, shape_k, inplace):
    cos, sin = tables(D, T)
    positions = torch.zeros(shape_q[0], shape_q[1], dtype=torch.long, device=ropetut.DEVICE)
    for pos in (None, positions):
        q, k = randn(*shape_q), randn(*shape_k)
        expected = [rope_reference(x, cos, sin, positions=pos) for x in (q, k)]
        q_out, k_out = ropetut.apply_rope(q, k, cos, sin, positions=pos, inplace=inplace)
        assert q_out.shape == shape_q and k_out.shape == shape_k
        for out, ref in zip((q_out, k_out), expected):
            assert out.numel() == 0 or relative_error(out, ref) <= 2e-6
    if not inplace:
        q, k = randn(*shape_q).requires_grad_(), randn(*shape_k).requires_grad_()
        q_out, k_out = ropetut.apply_rope(q, k, cos, sin)
        grads = torch.autograd.grad((q_out.sum() + k_out.sum()), (q, k))
        assert grads[0].shape == shape_q and grads[1].shape == shape_k


def test_tables_that_require_grad_are_refused():
    """ropetut computes no gradient for cos and sin: it says so rather than returning none."""
    a = _good()
    cos = a["cos"].clone().requires_grad_()
    with pytest.raises(ValueError, match="^cos: requires grad"):
        ropetut.apply_rope(a["q"], a["k"], cos, a["sin"])
    with torch.no_grad():                          # nothing to differentiate: accepted
        ropetut.apply_rope(a["q"], a["k"], cos, a["sin"])


def test_in_place_refuses_q_and_k_sharing_memory_through_different_storages():
    """Views of one buffer made outside torch's view machinery (from_dlpack, frombuffer) have
    storages of their own: memory is compared by address, not by storage."""
    buffer = randn(B, T + 1, H, D)
    q = buffer[:, :-1]
    k = torch.from_dlpack(buffer[:, 1:])            # tokens 1..T-1 are in both
    assert q.untyped_storage().data_ptr() != k.untyped_storage().data_ptr()
    _in_place_refused(q, k, "k")


def test_in_place_refuses_a_q_that_overlaps_the_tables():
    """The kernel reads cos and sin while it writes q: q must not be the tables' memory."""
    _, sin = tables(D, T)
    buffer = randn(T * D)
    q = buffer.view(1, T, 1, D)
    cos = buffer[:T * D // 2].view(T, D // 2)       # contiguous, inside q's memory
    before = buffer.clone()
    with pytest.raises(ValueError, match="^cos: in place"):
        ropetut.apply_rope(q, None, cos, sin, inplace=True)
    assert torch.equal(buffer, before)


def test_in_place_refuses_an_inference_tensor_outside_inference_mode():
    cos, sin = tables(D, T)
    with torch.inference_mode():
        q = randn(B, T, H, D)
        ropetut.apply_rope(q, None, cos, sin, inplace=True)   # inside: as torch allows
    before = q.clone()
    with pytest.raises(ValueError, match="^q: in place on an inference tensor"):
        ropetut.apply_rope(q, None, cos, sin, inplace=True)
    assert torch.equal(q, before)


def test_in_place_on_an_empty_expanded_tensor_is_accepted():
    cos, sin = tables(D, T)
    q = torch.empty(1, 0, 1, D, device=ropetut.DEVICE).expand(B, 0, H, D)
    assert ropetut.apply_rope(q, None, cos, sin, inplace=True).shape == (B, 0, H, D)
