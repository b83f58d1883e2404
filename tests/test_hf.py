"""ropetut.hf.apply_rotary_pos_emb against Hugging Face's own formula, copied here (CI
does not install transformers): outputs and gradients, both layouts, GQA, odd shapes,
per-batch positions, an attention factor, and refusals naming the argument."""

import pytest
import torch
from conftest import randn

import ropetut
from ropetut import scaling
from ropetut.check import TOLERANCE, relative_error
from ropetut.hf import apply_rotary_pos_emb, patch, unpatch

DEV = ropetut.DEVICE


def hf_rotate_half(x):
    """transformers 5.23.0, models/llama/modeling_llama.py, ``rotate_half``."""
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def hf_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """transformers 5.23.0, models/llama/modeling_llama.py, ``apply_rotary_pos_emb``
    (4.x's took a position_ids it did not use)."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    q_embed = (q * cos) + (hf_rotate_half(q) * sin)
    k_embed = (k * cos) + (hf_rotate_half(k) * sin)
    return q_embed, k_embed


def hf_cos_sin(inv_freq, position_ids, attention_factor=1.0, dtype=torch.float32):
    """(B, T, D) cos and sin as transformers 5.23.0's ``LlamaRotaryEmbedding.forward``
    builds them: in fp32, both halves equal, times the attention factor, cast to the
    activations' dtype."""
    B = position_ids.shape[0]
    inv_freq_expanded = inv_freq[None, :, None].float().expand(B, -1, 1)
    position_ids_expanded = position_ids[:, None, :].float()
    freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * attention_factor, emb.sin() * attention_factor
    return cos.to(dtype), sin.to(dtype)


CASES = {
    "default": dict(B=2, HQ=4, HK=2, T=9, D=32),
    "odd shape": dict(B=1, HQ=3, HK=3, T=17, D=96),
    "GQA, one k head": dict(B=2, HQ=4, HK=1, T=5, D=16),
    "per-batch positions": dict(B=3, HQ=2, HK=2, T=7, D=32, per_batch=True),
    "(B, T, H, D)": dict(B=2, HQ=4, HK=2, T=9, D=32, unsqueeze_dim=2),
    "yarn factor": dict(B=2, HQ=2, HK=1, T=9, D=64, variant="yarn"),
}


def make_case(case, dtype=torch.float32):
    """q, k, cos, sin and unsqueeze_dim as a Llama-style model hands them over."""
    c = CASES[case]
    B, HQ, HK, T, D = (c[key] for key in ("B", "HQ", "HK", "T", "D"))
    dim = c.get("unsqueeze_dim", 1)
    shape = (lambda H: (B, H, T, D)) if dim == 1 else (lambda H: (B, T, H, D))
    q, k = randn(*shape(HQ), dtype=dtype), randn(*shape(HK), dtype=dtype)
    if c.get("variant") == "yarn":
        inv_freq, factor = scaling.yarn(D, 4.0, 32, device=DEV)
    else:
        inv_freq, factor = scaling.default(D, device=DEV)
    if c.get("per_batch"):
        position_ids = torch.randint(0, 5000, (B, T), device=DEV)
    else:
        position_ids = torch.arange(T, device=DEV)[None]
    cos, sin = hf_cos_sin(inv_freq, position_ids, factor, dtype)
    return q, k, cos, sin, dim


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_matches_hf_formula(case, dtype):
    """Against HF's formula in fp64 on the same tables (HF's own fp32 run is no closer
    to it than ropetut's)."""
    q, k, cos, sin, dim = make_case(case, dtype)
    q_out, k_out = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=dim)
    double = (t.double() for t in (q, k, cos, sin))
    q_ref, k_ref = hf_apply_rotary_pos_emb(*double, unsqueeze_dim=dim)
    for out, ref in ((q_out, q_ref), (k_out, k_ref)):
        assert out.shape == ref.shape and out.dtype == dtype
        assert relative_error(out, ref) <= TOLERANCE[dtype]


def test_fp32_close_to_hf_fp32():
    """Parity with HF's own fp32 arithmetic, the drop-in's promise."""
    q, k, cos, sin, dim = make_case("per-batch positions")
    ours = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=dim)
    theirs = hf_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=dim)
    for out, ref in zip(ours, theirs):
        assert relative_error(out, ref) <= TOLERANCE[torch.float32]


def test_position_ids_is_accepted_and_unused():
    """As in transformers 4.x: passed positionally, it changes nothing."""
    q, k, cos, sin, _ = make_case("per-batch positions")
    ignored = torch.zeros(q.shape[0], q.shape[2], dtype=torch.long, device=DEV)
    with_ids = apply_rotary_pos_emb(q, k, cos, sin, ignored)
    without = apply_rotary_pos_emb(q, k, cos, sin)
    assert all(torch.equal(a, b) for a, b in zip(with_ids, without))


@pytest.mark.parametrize("case", ["default", "per-batch positions", "(B, T, H, D)"])
def test_gradients_match_hf_formula(case):
    q, k, cos, sin, dim = make_case(case)
    q, k = q.requires_grad_(), k.requires_grad_()
    ours = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=dim)
    dq_out, dk_out = (torch.randn_like(t) for t in ours)
    got = torch.autograd.grad(ours, (q, k), (dq_out, dk_out))
    q64, k64 = (t.detach().double().requires_grad_() for t in (q, k))
    theirs = hf_apply_rotary_pos_emb(q64, k64, cos.double(), sin.double(), dim)
    expected = torch.autograd.grad(
        theirs, (q64, k64), (dq_out.double(), dk_out.double())
    )
    for a, b in zip(got, expected):
        assert relative_error(a, b) <= TOLERANCE[torch.float32]


def test_gradcheck_fp64():
    c = dict(B=2, HQ=2, HK=1, T=3, D=8)
    q = randn(c["B"], c["HQ"], c["T"], c["D"], dtype=torch.float64).requires_grad_()
    k = randn(c["B"], c["HK"], c["T"], c["D"], dtype=torch.float64).requires_grad_()
    position_ids = torch.tensor([[4, 0, 9], [1, 1, 2]], device=DEV)
    cos, sin = hf_cos_sin(scaling.default(8, device=DEV)[0], position_ids)
    cos, sin = cos.double(), sin.double()

    def f(q, k):
        return apply_rotary_pos_emb(q, k, cos, sin)

    assert torch.autograd.gradcheck(f, (q, k))


@pytest.mark.parametrize(
    "bad, error, argument",
    [
        (dict(unsqueeze_dim=0), ValueError, "unsqueeze_dim"),
        (dict(unsqueeze_dim=True), ValueError, "unsqueeze_dim"),
        (dict(cos="half width"), ValueError, "cos"),
        (dict(cos="three batches"), ValueError, "cos"),
        (dict(cos="(T, D)"), ValueError, "cos"),
        (dict(sin="other shape"), ValueError, "sin"),
        (dict(sin="a list"), TypeError, "sin"),
        (dict(k=None), TypeError, "k"),
        (dict(q="three dims"), TypeError, "q"),
    ],
)
def test_bad_arguments_name_themselves(bad, error, argument):
    q, k, cos, sin, _ = make_case("per-batch positions")  # B = 3
    dim = bad.get("unsqueeze_dim", 1)
    if bad.get("cos") == "half width":
        cos, sin = cos[..., :16], sin[..., :16]
    if bad.get("cos") == "three batches":
        cos, sin = cos[:2], sin[:2]
    if bad.get("cos") == "(T, D)":
        cos, sin = cos[0], sin[0]
    if bad.get("sin") == "other shape":
        sin = sin[:1]
    if bad.get("sin") == "a list":
        sin = sin.tolist()
    if "k" in bad:
        k = None
    if bad.get("q") == "three dims":
        q = q[0]
    with pytest.raises(error, match=f"^{argument}"):
        apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=dim)


@pytest.mark.parametrize(
    "model, error",
    [("a string", TypeError), (torch.nn.Linear(4, 4), ValueError)],
    ids=["not a module", "no Llama- or Qwen3-style attention"],
)
def test_patch_refuses_what_it_cannot_patch(model, error):
    """Without transformers too: tests/test_hf_models.py patches real models."""
    for function in (patch, unpatch):
        with pytest.raises(error, match="^model: "):
            function(model)
