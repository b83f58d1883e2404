"""Rotary frequencies and their cos/sin tables.

A *frequency* vector has one entry per rotated pair: pair i turns by angle
``p * freqs[i]`` at position p. A *table* is ``cos`` and ``sin`` of those angles for
positions 0..n-1, shape ``(n_positions, n_pairs)``. Angles are computed in float64
and rounded once to the table dtype (float32 by default), so a table's only error is
that one rounding.
"""

import torch


def standard(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """RoFormer's spectrum: ``base ** (-2i / head_dim)`` for i < head_dim/2. Every
    pair rotates."""
    _check_even(head_dim, "head_dim")
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def half_truncated(head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """The seed's (modded-nanogpt's) spectrum:
    ``(1/base) ** linspace(0, 1, head_dim/4)`` then ``head_dim/4`` zeros. A zero
    frequency never rotates, so half of the dims carry no position."""
    if head_dim % 4:
        raise ValueError(
            "head_dim: the half-truncated spectrum needs a multiple of 4, "
            f"got {head_dim}"
        )
    # Computed in float32, exactly as the seed's llm.py does, then widened.
    live = (1 / base) ** torch.linspace(0, 1, steps=head_dim // 4, dtype=torch.float32)
    return torch.cat([live, live.new_zeros(head_dim // 4)]).double()


def partial(rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    """NeoX's ``rotary_pct``: the standard spectrum over the first ``rotary_dim``
    dims only. Pass ``rotary_dim`` to ``apply_rope`` too; the other dims pass
    through unchanged."""
    return standard(rotary_dim, base)


PRESETS = {"standard": standard, "half_truncated": half_truncated, "partial": partial}


def rope_tables(
    freqs: torch.Tensor,
    n_positions: int,
    *,
    dtype: torch.dtype = torch.float32,
    device=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``p * freqs`` for p in [0, n_positions), each
    ``(n_positions, len(freqs))``, computed on freqs' device, then moved to ``device``
    (default: stay there)."""
    p = torch.arange(n_positions, dtype=torch.float64, device=freqs.device)
    angles = p[:, None] * freqs.double()[None, :]
    cos, sin = angles.cos(), angles.sin()
    return cos.to(dtype=dtype, device=device), sin.to(dtype=dtype, device=device)


def _check_even(n: int, name: str) -> None:
    if n <= 0 or n % 2:
        raise ValueError(f"{name}: must be a positive even number, got {n}")
