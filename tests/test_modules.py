"""RotaryEmbedding and RoPEAttention, and torch.compile over apply_rope."""
import pytest
import torch
from conftest import gpu_only, randn

import ropetut
from ropetut.check import relative_error
from ropetut.reference import rope_reference


@pytest.mark.parametrize("preset,rotary_dim", [("standard", None), ("half_truncated", None), ("partial", 16)])
def test_rotary_embedding_presets(preset, rotary_dim):
    D, T = 32, 9
    rope = ropetut.RotaryEmbedding(D, T, preset=preset, rotary_dim=rotary_dim).to(ropetut.DEVICE)
    q, k = randn(2, T, 4, D), randn(2, T, 2, D)
    q_out, k_out = rope(q, k)
    assert relative_error(q_out, rope_reference(q, rope.cos, rope.sin, rotary_dim=rotary_dim)) <= 2e-6
    assert relative_error(k_out, rope_reference(k, rope.cos, rope.sin, rotary_dim=rotary_dim)) <= 2e-6


def test_rotary_embedding_rejects_bad_presets():
    with pytest.raises(ValueError, match="^preset"):
        ropetut.RotaryEmbedding(32, 8, preset="yarn")
    with pytest.raises(ValueError, match="^rotary_dim"):
        ropetut.RotaryEmbedding(32, 8, preset="partial")
    with pytest.raises(ValueError, match="^rotary_dim"):
        ropetut.RotaryEmbedding(32, 8, rotary_dim=16)


def test_decode_with_positions_matches_the_full_sequence():
    """KV-cache decode: rotating one new token at position p equals row p of the full rotation."""
    D, T = 32, 12
    rope = ropetut.RotaryEmbedding(D, 64).to(ropetut.DEVICE)
    q = randn(2, T, 4, D)
    full = rope(q)
    step = rope(q[:, -1:].contiguous(), positions=torch.tensor([T - 1], device=ropetut.DEVICE))
    assert torch.allclose(step, full[:, -1:], atol=1e-6)


def test_attention_is_causal_and_supports_gqa():
    torch.manual_seed(0)
    attn = ropetut.RoPEAttention(64, n_heads=4, n_kv_heads=2, max_seq_len=16).to(ropetut.DEVICE)
    x = randn(2, 10, 64)
    y = attn(x)
    x2 = x.clone()
    x2[:, 6:] = randn(2, 4, 64)                    # change only the future of token 5
    assert y.shape == x.shape
    assert torch.allclose(attn(x2)[:, :6], y[:, :6], atol=1e-5)
    assert not torch.allclose(attn(x2)[:, 6:], y[:, 6:], atol=1e-3)


def test_attention_validates_heads():
    with pytest.raises(ValueError, match="^n_kv_heads"):
        ropetut.RoPEAttention(64, n_heads=4, n_kv_heads=3)


@gpu_only
@pytest.mark.parametrize("inplace", [False, True])
def test_torch_compile_matches_eager(inplace):
    rope = ropetut.RotaryEmbedding(64, 256).cuda()

    def block(x, w):
        q, k = (x @ w).view(2, 128, 2, 8, 64).unbind(2)
        q, k = rope(q.contiguous(), k.contiguous(), inplace=inplace)
        return (q * k).sum(-1)

    x = torch.randn(2, 128, 512, device="cuda")
    w = (torch.randn(512, 1024, device="cuda") / 512**0.5).requires_grad_()
    eager = block(x, w)
    eager.sum().backward()
    grad_eager, w.grad = w.grad.clone(), None
    compiled = torch.compile(block)(x, w)
    compiled.sum().backward()
    # the same function up to fp32 rounding: compile may fuse and reorder the matmul's epilogue
    assert relative_error(compiled, eager) <= 1e-5
    assert relative_error(w.grad, grad_eager) <= 1e-5
