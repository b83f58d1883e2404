"""The tiny GPT: every rope, and the two model-side confounds doing exactly what they claim."""
import pytest
import torch
from conftest import randn

import ropetut
from ropetut.training.model import GPTConfig, TinyGPT, make_rope

TINY = dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, max_seq_len=16)


@pytest.mark.parametrize("rope", ["none", "torch", "v2", "final"])
def test_forward_shape_for_every_rope(rope):
    model = TinyGPT(GPTConfig(rope=rope, **TINY)).to(ropetut.DEVICE)
    tokens = torch.randint(0, 256, (2, 16), device=ropetut.DEVICE)
    assert model(tokens).shape == (2, 16, 256)


def test_config_resolves_and_refuses():
    assert GPTConfig(rope="torch").preset == "half_truncated" and GPTConfig(rope="torch").negative_angle
    assert GPTConfig().preset == "standard" and not GPTConfig().negative_angle
    with pytest.raises(ValueError, match="^rope"):
        GPTConfig(rope="v9")
    with pytest.raises(ValueError, match="^rope"):
        GPTConfig(rope="torch", preset="standard")


def test_detach_rope_starves_the_query_and_key_projections():
    """The seed's Triton path: no gradient through the rotation, so W_q and W_k learn nothing."""
    grads = {}
    for detach in (False, True):
        torch.manual_seed(0)
        model = TinyGPT(GPTConfig(rope="final", detach_rope=detach, **TINY)).to(ropetut.DEVICE)
        model(torch.randint(0, 256, (2, 16), device=ropetut.DEVICE)).sum().backward()
        attn = model.blocks[0].attn
        grads[detach] = attn.wq.weight.grad, attn.wkv.weight.grad
    wq, wkv = grads[True]
    assert wq is None or not wq.any()
    assert not wkv[:32].any() and wkv[32:].any()                # keys starved, values still learn
    assert grads[False][0].abs().sum() > 0


def test_rotate_by_head_index_carries_no_position():
    """The seed's baseline fed (B, H, T, D): the same vector at every position comes out the
    same at every position (turned by its head's index), so attention sees no position."""
    q = randn(1, 1, 2, 16).expand(1, 8, 2, 16).contiguous()       # one vector, 8 positions
    for by_head, same in ((True, True), (False, False)):
        rope = make_rope(GPTConfig(rope="torch", rotate_by_head_index=by_head, **TINY)).to(ropetut.DEVICE)
        out, _ = rope(q, q)
        assert torch.allclose(out, out[:, :1].expand_as(out)) == same
