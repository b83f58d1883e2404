"""The scaling family (ropetut.scaling) against Hugging Face transformers' vectors
(tests/fixtures/rope_scaling_hf.json, made by scripts/make_rope_scaling_fixture.py) and
against the closed form."""

import json
import math
import pathlib

import pytest
import torch

import ropetut
from ropetut import scaling, tables
from ropetut.check import relative_error


FIXTURE = json.loads(
    (pathlib.Path(__file__).parent / "fixtures/rope_scaling_hf.json").read_text()
)
CASES = FIXTURE["cases"]
IDS = [f"{i}-{case['variant']}" for i, case in enumerate(CASES)]


def ulps_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance in float32 units in the last place (same-sign finite
    values)."""
    a32, b32 = a.float().contiguous(), b.float().contiguous()
    assert (a32.sign() == b32.sign()).all() and a32.isfinite().all()
    return (
        (a32.view(torch.int32).long() - b32.view(torch.int32).long()).abs().max().item()
    )


def test_fixture_records_its_maker():
    assert FIXTURE["made_by"] == "scripts/make_rope_scaling_fixture.py"
    assert FIXTURE["transformers"] and FIXTURE["dtype"] == "float32"
    assert {case["variant"] for case in CASES} == {
        "default",
        "linear",
        "dynamic",
        "yarn",
        "longrope",
        "llama3",
    }


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_float32_matches_transformers_within_one_ulp(case):
    """In float32, the same operations in the same order as transformers: measured 0 ulp
    apart for every case (transformers 5.23.0)."""
    hf = torch.tensor(case["inv_freq"], dtype=torch.float32)
    inv_freq, attention_factor = scaling.VARIANTS[case["variant"]](
        **case["kwargs"], dtype=torch.float32
    )
    assert inv_freq.dtype == torch.float32 and inv_freq.shape == hf.shape
    assert ulps_apart(inv_freq, hf) <= 1
    assert attention_factor == pytest.approx(case["attention_factor"], rel=1e-15)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_float64_rounds_near_transformers(case):
    """In float64 (the default) the formula loses float32's roundings; rounded once to
    float32 it stays within a few ulp of transformers' float32 arithmetic (measured at
    most 5: ``base ** x`` magnifies x's rounding by ln(base)). A wrong formula is far
    off."""
    hf = torch.tensor(case["inv_freq"], dtype=torch.float32)
    inv_freq, _ = scaling.VARIANTS[case["variant"]](**case["kwargs"])
    assert inv_freq.dtype == torch.float64
    assert ulps_apart(inv_freq, hf) <= 8


@pytest.mark.parametrize("head_dim, base", [(128, 10000.0), (96, 1e6), (64, 500000.0)])
def test_default_is_the_closed_form(head_dim, base):
    closed = tables.standard(head_dim, base)  # base ** (-2i / head_dim), in float64
    inv_freq, attention_factor = scaling.default(head_dim, base)
    assert attention_factor == 1.0
    assert ((inv_freq - closed).abs() / closed).max() <= 4e-16
    inv_freq32, _ = scaling.default(head_dim, base, dtype=torch.float32)
    assert ulps_apart(inv_freq32, closed) <= 8


def test_presets_are_the_seeds():
    assert torch.equal(scaling.half_truncated(64)[0], tables.half_truncated(64))
    assert torch.equal(scaling.partial(32)[0], tables.partial(32))
    assert scaling.half_truncated(64, dtype=torch.float32)[0].dtype == torch.float32


def test_linear_and_llama3_by_formula():
    """Linear divides every frequency; Llama-3.1 keeps the fast ones, divides the slow
    ones and blends between (wavelengths 2048 and 8192 for its defaults)."""
    base, _ = scaling.default(128, 500000.0)
    assert torch.allclose(
        scaling.linear(128, 4.0, 500000.0)[0], base / 4, rtol=0, atol=0
    )
    inv_freq, _ = scaling.llama3(128)
    wavelen = 2 * math.pi / base
    fast, slow = wavelen < 2048, wavelen > 8192
    assert fast.any() and slow.any() and (~fast & ~slow).any()
    assert torch.equal(inv_freq[fast], base[fast])
    assert torch.allclose(inv_freq[slow], base[slow] / 8, rtol=1e-15, atol=0)
    mid = ~fast & ~slow
    assert ((inv_freq[mid] < base[mid]) & (inv_freq[mid] > base[mid] / 8)).all()


@pytest.mark.parametrize("seq_len", [100, 4096, 20000])
def test_dynamic_ntk_length_on_the_device(seq_len):
    """A 0-d tensor length gives the int length's vector, built with tensor
    operations."""
    kw = dict(head_dim=64, factor=2.0, max_position_embeddings=4096)
    from_int, _ = scaling.dynamic_ntk(**kw, seq_len=seq_len)
    length = torch.tensor(seq_len, device=ropetut.DEVICE)
    from_tensor, _ = scaling.dynamic_ntk(**kw, seq_len=length)
    assert from_tensor.device == length.device
    assert torch.allclose(from_tensor.cpu(), from_int, rtol=4e-16, atol=0)
    if seq_len <= 4096:  # no scaling up to the trained length
        assert torch.equal(from_int, scaling.default(64)[0])


@pytest.mark.parametrize("seq_len", [100, 8192])
def test_longrope_length_on_the_device(seq_len):
    case = next(c for c in CASES if c["variant"] == "longrope")
    kw = dict(case["kwargs"], seq_len=None)
    from_int, _ = scaling.longrope(**dict(kw, seq_len=seq_len))
    length = torch.tensor(seq_len, device=ropetut.DEVICE)
    from_tensor, _ = scaling.longrope(**dict(kw, seq_len=length))
    assert from_tensor.device == length.device
    # the same operations; fp64 pow on a GPU may differ from the CPU's in the last bit
    assert torch.allclose(from_tensor.cpu(), from_int, rtol=4e-16, atol=0)


def test_usable_as_table():
    """A variant's inv_freq builds a table that apply_rope takes."""
    inv_freq, _ = scaling.yarn(32, 4.0, 64)
    cos, sin = ropetut.rope_tables(inv_freq, 20, device=ropetut.DEVICE)
    q = torch.randn(1, 17, 3, 32, device=ropetut.DEVICE)
    out = ropetut.apply_rope(q, cos=cos, sin=sin)
    ref = ropetut.rope_reference(q, cos, sin)
    assert relative_error(out, ref) <= 2e-6


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="head_dim"):
        scaling.default(7)
    with pytest.raises(ValueError, match="short_factor"):
        scaling.longrope(64, [1.0] * 3, [1.0] * 32, 4096, factor=2.0)
    with pytest.raises(ValueError, match="factor"):
        scaling.longrope(64, [1.0] * 32, [1.0] * 32, 4096)
