"""The table-free kernel's turn words, as it computes them, for the tests and chapter
08b to check: ``turn_words_kernel`` runs ``ropetut.kernels.angles``'s own split
(``_turns_per_position`` and ``_turn_words``, imported, not copied) and stores it."""

import torch
import triton
import triton.language as tl

from ..kernels.angles import _turn_words, _turns_per_position


@triton.jit
def turn_words_kernel(inv_freq_ptr, c_ptr, words_ptr, N, stride, BLOCK: tl.constexpr):
    """c = inv_freq / 2pi and its six words, stored: c (N,) and words (6, N)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < N
    inv_freq = tl.load(inv_freq_ptr + offsets * stride, mask=mask, other=0.0)
    c = _turns_per_position(inv_freq)
    tl.store(c_ptr + offsets, c, mask=mask)
    c0, c1, c2, c1_rest, c2_rest, c3_rest = _turn_words(c)
    tl.store(words_ptr + offsets, c0, mask=mask)
    tl.store(words_ptr + N + offsets, c1, mask=mask)
    tl.store(words_ptr + 2 * N + offsets, c2, mask=mask)
    tl.store(words_ptr + 3 * N + offsets, c1_rest, mask=mask)
    tl.store(words_ptr + 4 * N + offsets, c2_rest, mask=mask)
    tl.store(words_ptr + 5 * N + offsets, c3_rest, mask=mask)


def turn_words(inv_freq):
    """inv_freq (1-D, float32 or float64, any stride) -> (c, words) as the kernel
    computes them: c = inv_freq / 2pi, float64, and words (6, n) float32: c0, c1, c2,
    then c - c0, c - c0 - c1, c - c0 - c1 - c2 rounded to float32."""
    if inv_freq.dim() != 1:
        raise ValueError(f"inv_freq: must be 1-D, got shape {tuple(inv_freq.shape)}")
    n = inv_freq.numel()
    c = torch.empty(n, dtype=torch.float64, device=inv_freq.device)
    words = torch.empty(6, n, dtype=torch.float32, device=inv_freq.device)
    grid = (triton.cdiv(n, 64),)
    turn_words_kernel[grid](inv_freq, c, words, n, inv_freq.stride(0), BLOCK=64)
    return c, words
