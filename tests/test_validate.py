"""Bad inputs raise a clear error naming the argument, and leave every input untouched."""
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
