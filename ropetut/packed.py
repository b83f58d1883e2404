"""Packed sequences ("thd"): several sequences concatenated into one (total_tokens, H,
D) tensor, delimited by ``cu_seqlens`` as in flash-attn's varlen API.

Positions restart at each sequence's start (plus its ``seqlen_offsets``, for decode with
a KV cache: the tokens already cached). ``packed_positions`` computes them on the device
with tensor operations (``searchsorted`` and ``index_select``), so nothing waits for the
GPU and the call can be captured in a CUDA graph; the result feeds the ``positions=``
argument of ``ropetut.apply_rope`` (a table per position) or
``ropetut.angles.apply_rope_angles`` (no table), for the packed tensor viewed as (1,
total_tokens, H, D).

flash-attn's ``apply_rotary(x, cos, sin, seqlen_offsets, cu_seqlens, max_seqlen)`` takes
``max_seqlen`` to size its grid; here the grid is the packed tensor's own, so there is
no ``max_seqlen`` to pass."""

import torch

from .autograd import apply_rope


def packed_positions(
    cu_seqlens: torch.Tensor, total_tokens: int, seqlen_offsets=0
) -> torch.Tensor:
    """Each packed token's position, ``(total_tokens,)`` int64 on ``cu_seqlens``'s
    device.

    cu_seqlens: (n_seqs + 1,) int32 or int64, non-decreasing, starting at 0: sequence s
       holds tokens ``cu_seqlens[s]:cu_seqlens[s+1]``. Not read on the host.
    total_tokens: the packed tensor's length (its shape, known on the host).
    seqlen_offsets: an int, or (n_seqs,) integers: sequence s starts at that position.
    A token at or past ``cu_seqlens[-1]`` (padding, e.g. to a static length for CUDA
    graphs) gets position 0, a turn by 0: it passes through unchanged, and so does its
    gradient (a NaN there would reach the weights through 0 x NaN)."""
    _check_cu_seqlens(cu_seqlens)
    if isinstance(total_tokens, bool) or not isinstance(total_tokens, int):
        raise TypeError(
            f"total_tokens: must be an int, got {type(total_tokens).__name__}"
        )
    if total_tokens < 0:
        raise ValueError(f"total_tokens: must be >= 0, got {total_tokens}")
    n_seqs = cu_seqlens.shape[0] - 1
    offsets = _offsets(seqlen_offsets, n_seqs, cu_seqlens.device)
    starts = cu_seqlens.long()
    token = torch.arange(total_tokens, device=cu_seqlens.device)
    # sequence of each token: how many sequence ends lie at or before it
    seq = torch.searchsorted(starts[1:], token, right=True).clamp_(max=n_seqs - 1)
    position = token - starts.index_select(0, seq) + offsets.index_select(0, seq)
    return torch.where(token < starts[-1], position, 0)


def apply_rope_thd(
    q,
    k=None,
    cos=None,
    sin=None,
    *,
    cu_seqlens,
    seqlen_offsets=0,
    interleaved=False,
    rotary_dim=None,
    inplace=False,
    impl="final",
):
    """``apply_rope`` for packed q (total_tokens, Hq, D) and k (total_tokens, Hkv, D):
    each sequence of ``cu_seqlens`` rotated from position ``seqlen_offsets`` (see
    ``packed_positions``). cos, sin: (n_positions, rotary_dim/2) tables covering the
    longest sequence plus its offset. Returns q_out, or (q_out, k_out), shaped like the
    inputs."""
    for name, x in (("q", q), ("k", k)):
        if isinstance(x, torch.Tensor) and x.dim() != 3:
            raise ValueError(
                f"{name}: must be 3-D (total_tokens, H, D), got {tuple(x.shape)}"
            )
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q: must be a torch.Tensor, got {type(q).__name__}")
    if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.device != q.device:
        raise ValueError(f"cu_seqlens: on {cu_seqlens.device}, but q is on {q.device}")
    positions = packed_positions(cu_seqlens, q.shape[0], seqlen_offsets)
    out = apply_rope(
        q[None],
        None if k is None else k[None],
        cos,
        sin,
        positions=positions,
        interleaved=interleaved,
        rotary_dim=rotary_dim,
        inplace=inplace,
        impl=impl,
    )
    return out[0] if k is None else (out[0][0], out[1][0])


def _check_cu_seqlens(cu_seqlens):
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(
            f"cu_seqlens: must be a torch.Tensor, got {type(cu_seqlens).__name__}"
        )
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"cu_seqlens: dtype must be int32 or int64, got {cu_seqlens.dtype}"
        )
    if cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(
            f"cu_seqlens: must be 1-D (n_seqs + 1,) with n_seqs >= 1, got "
            f"{tuple(cu_seqlens.shape)}"
        )


def _offsets(seqlen_offsets, n_seqs, device):
    """seqlen_offsets as an (n_seqs,) int64 tensor on ``device``."""
    if isinstance(seqlen_offsets, torch.Tensor):
        if seqlen_offsets.dtype not in (torch.int32, torch.int64):
            raise TypeError(
                "seqlen_offsets: dtype must be int32 or int64, got "
                f"{seqlen_offsets.dtype}"
            )
        if tuple(seqlen_offsets.shape) != (n_seqs,):
            raise ValueError(
                f"seqlen_offsets: must be (n_seqs,) = {(n_seqs,)}, got "
                f"{tuple(seqlen_offsets.shape)}"
            )
        if seqlen_offsets.device != device:
            raise ValueError(
                f"seqlen_offsets: on {seqlen_offsets.device}, but cu_seqlens is on "
                f"{device}"
            )
        return seqlen_offsets.long()
    if isinstance(seqlen_offsets, bool) or not isinstance(seqlen_offsets, int):
        raise TypeError(
            "seqlen_offsets: must be an int or a tensor, got "
            f"{type(seqlen_offsets).__name__}"
        )
    return torch.full((n_seqs,), seqlen_offsets, dtype=torch.int64, device=device)
