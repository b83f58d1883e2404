"""Hugging Face's ``apply_rotary_pos_emb``, on ropetut's kernel: a drop-in.

transformers' Llama-style attention rotates with ``q * cos + rotate_half(q) * sin``,
where cos and sin are full width, (B, T, D): the rotary embedding builds them as
``cat((freqs, freqs), -1)``, cos'd or sin'd, times the variant's attention factor. The
two halves are the same, so this reads the first: half-split pairs (x[i], x[i + D/2]),
``apply_rope``'s default, with each (batch, token)'s row of cos and sin as a table row.
Nothing is read on the host: no wait for the GPU.
"""

import torch

from .autograd import apply_rope


def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    """Rotate q and k by HF's full-width cos and sin; returns (q_embed, k_embed).

    q, k: (B, H, T, D) for unsqueeze_dim=1 (HF's attention), (B, T, H, D) for
       unsqueeze_dim=2; k may have fewer heads (GQA). Any strides.
    cos, sin: (B, T, D) or (1, T, D), as HF's rotary embedding returns them:
       both halves of the last dim equal (only the first is read); any attention
       factor already multiplied in.
    position_ids: accepted and unused, as in transformers 4.x (deprecated there,
       gone in 5.x): cos and sin already hold each token's angles.
    Differentiable in q and k; cos and sin get no gradient (``apply_rope`` refuses
    tables that require one)."""
    if isinstance(unsqueeze_dim, bool) or unsqueeze_dim not in (1, 2):
        raise ValueError(
            "unsqueeze_dim: 1 for (B, H, T, D) or 2 for (B, T, H, D), got "
            f"{unsqueeze_dim!r}"
        )
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise TypeError("q: must be a 4-dim torch.Tensor")
    B, D = q.shape[0], q.shape[3]
    if D % 2:
        raise ValueError(f"q: head dim must be even to form pairs, got D={D}")
    if k is None:
        raise TypeError("k: required, as in HF's signature")
    T = q.shape[2] if unsqueeze_dim == 1 else q.shape[1]
    for name, t in (("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3 or t.shape[0] not in (1, B) or t.shape[1:] != (T, D):
            raise ValueError(
                f"{name}: must be (B, T, D) = {(B, T, D)} or (1, T, D), got "
                f"{tuple(t.shape)}"
            )
    if sin.shape != cos.shape:
        raise ValueError(f"sin: shape {tuple(sin.shape)} differs from cos's")
    rows = cos.shape[0]
    half_cos, half_sin = (
        t[..., : D // 2].reshape(rows * T, D // 2) for t in (cos, sin)
    )
    positions = None  # token t reads row t
    if rows > 1:  # one table row per (batch, token)
        positions = torch.arange(rows * T, device=q.device).view(rows, T)
    layout = "bhtd" if unsqueeze_dim == 1 else "bthd"
    return apply_rope(q, k, half_cos, half_sin, positions=positions, layout=layout)
