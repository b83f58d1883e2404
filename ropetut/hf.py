"""Hugging Face's ``apply_rotary_pos_emb``, on ropetut's kernel: a drop-in.

transformers' Llama-style attention rotates with ``q * cos + rotate_half(q) * sin``,
where cos and sin are full width, (B, T, D): the rotary embedding builds them as
``cat((freqs, freqs), -1)``, cos'd or sin'd, times the variant's attention factor. The
two halves are the same, so this reads the first: half-split pairs (x[i], x[i + D/2]),
``apply_rope``'s default, with each (batch, token)'s row of cos and sin as a table row.
Nothing is read on the host: no wait for the GPU.

``patch(model)`` swaps it into Llama- and Qwen3-style attention as Liger's
``apply_liger_kernel_to_llama`` does: transformers 5.x's attention ``forward`` calls its
modeling module's ``apply_rotary_pos_emb`` by name at call time, so rebinding that one
module attribute is enough; ``unpatch(model)`` binds the original back.
"""

import sys

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


# Modeling modules whose attention calls a module-level apply_rotary_pos_emb with
# HF's signature and full-width cos and sin (checked against transformers 5.23.0).
PATCHABLE = (
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen3.modeling_qwen3",
)
_original = {}  # modeling module's name -> its own apply_rotary_pos_emb


def _modeling_modules(model):
    """The patchable modeling modules that model's submodules come from."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: must be a torch.nn.Module, got {type(model).__name__}")
    names = {type(m).__module__ for m in model.modules()} & set(PATCHABLE)
    if not names:
        raise ValueError(
            f"model: no Llama- or Qwen3-style attention in {type(model).__name__} "
            f"(patchable modeling modules: {', '.join(PATCHABLE)})"
        )
    return [sys.modules[name] for name in sorted(names)]


def patch(model):
    """Make model's attention rotate q and k with ropetut's kernel; returns model.

    Rebinds ``apply_rotary_pos_emb`` in the modeling module (llama's, qwen3's) that
    model's classes come from: every model of that family uses the kernel until
    ``unpatch``, as with Liger. Patching twice is harmless."""
    for module in _modeling_modules(model):
        _original.setdefault(module.__name__, module.apply_rotary_pos_emb)
        module.apply_rotary_pos_emb = apply_rotary_pos_emb
    return model


def unpatch(model):
    """Undo ``patch``: transformers' own apply_rotary_pos_emb again; returns model."""
    for module in _modeling_modules(model):
        if module.__name__ in _original:
            module.apply_rotary_pos_emb = _original.pop(module.__name__)
    return model
