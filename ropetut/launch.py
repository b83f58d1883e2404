"""Host-side code every kernel shares: argument validation and tile sizes.

``check_rope_args`` is the single gate in front of every kernel. It raises ``TypeError`` (wrong
type or dtype) or ``ValueError`` (wrong shape, value or device) naming the argument, and it
never modifies its inputs. It hands back (B, T, H, D) views, whatever the caller's layout.

It never reads a tensor's values, so it never waits for the GPU: a call can be captured in a
CUDA graph and traced by ``torch.compile``. The one check that needs values, positions inside
the table, is ``check_positions_in_range``: opt-in, because it syncs. Without it the kernel
keeps every read inside the table and writes NaN for a token whose position is out of range.
"""
from dataclasses import dataclass

import torch
import triton

from .runtime import DEVICE, INTERPRETED

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
LAYOUTS = ("bthd", "bhtd")


@dataclass
class RopeArgs:
    q: torch.Tensor                 # (B, T, Hq, D) view of the caller's q
    k: torch.Tensor | None          # (B, T, Hk, D) view of the caller's k
    cos: torch.Tensor               # (n_positions, rotary_dim/2), contiguous
    sin: torch.Tensor
    positions: torch.Tensor | None  # (B, T) view (stride 0 over B when given as (T,))
    rotary_dim: int


def check_rope_args(q, k, cos, sin, positions=None, *, rotary_dim=None, interleaved=False,
                    inplace=False, layout="bthd") -> RopeArgs:
    if layout not in LAYOUTS:
        raise ValueError(f"layout: must be one of {LAYOUTS}, got {layout!r}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved: must be a bool, got {type(interleaved).__name__}")
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace: must be a bool, got {type(inplace).__name__}")
    _check_tensor(q, "q", layout)
    q4 = _as_bthd(q, layout)
    B, T, Hq, D = q4.shape
    if D % 2:
        raise ValueError(f"q: head dim must be even to form pairs, got D={D}")
    k4 = None
    if k is not None:
        _check_tensor(k, "k", layout)
        if k.dtype != q.dtype:
            raise TypeError(f"k: dtype {k.dtype} differs from q's {q.dtype}")
        k4 = _as_bthd(k, layout)
        Bk, Tk, Hk, Dk = k4.shape
        if (Bk, Tk, Dk) != (B, T, D):
            raise ValueError(f"k: (batch, seq, head_dim) = {(Bk, Tk, Dk)} must match q's {(B, T, D)}")
        if Hq % Hk:
            raise ValueError(f"k: q's {Hq} heads are not a multiple of k's {Hk} heads (GQA needs Hq % Hkv == 0)")
        # (data_ptr has no meaning while torch.compile traces; the traced graph is functional)
        if inplace and not torch.compiler.is_compiling() and k.data_ptr() == q.data_ptr():
            raise ValueError("k: in place, q and k must not be the same memory")
    if rotary_dim is None:
        rotary_dim = D
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise TypeError(f"rotary_dim: must be an int, got {type(rotary_dim).__name__}")
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > D:
        raise ValueError(f"rotary_dim: must be even and in [2, D={D}], got {rotary_dim}")
    for name, table in (("cos", cos), ("sin", sin)):
        if not isinstance(table, torch.Tensor):
            raise TypeError(f"{name}: must be a torch.Tensor, got {type(table).__name__}")
        if table.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name}: dtype {table.dtype} is not a floating type")
        if table.dim() != 2 or table.shape[1] != rotary_dim // 2:
            raise ValueError(f"{name}: must be (n_positions, rotary_dim/2 = {rotary_dim // 2}), "
                             f"got {tuple(table.shape)}")
    if sin.shape != cos.shape:
        raise ValueError(f"sin: shape {tuple(sin.shape)} differs from cos's {tuple(cos.shape)}")
    n_positions = cos.shape[0]
    if positions is None:
        if n_positions < T:
            raise ValueError(f"cos: has {n_positions} positions, too short for T={T}")
    else:
        if not isinstance(positions, torch.Tensor):
            raise TypeError(f"positions: must be a torch.Tensor, got {type(positions).__name__}")
        if positions.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"positions: dtype must be int32 or int64, got {positions.dtype}")
        if tuple(positions.shape) not in ((T,), (B, T)):
            raise ValueError(f"positions: shape must be (T,) = {(T,)} or (B, T) = {(B, T)}, "
                             f"got {tuple(positions.shape)}")
    device = q.device
    for name, t in (("k", k), ("cos", cos), ("sin", sin), ("positions", positions)):
        if t is not None and t.device != device:
            raise ValueError(f"{name}: on {t.device}, but q is on {device}")
    if device.type != DEVICE.type:
        mode = "Triton's interpreter (no CUDA device)" if INTERPRETED else "compiled GPU kernels"
        raise ValueError(f"q: ropetut runs {mode} and needs {DEVICE.type} tensors, got {device}")
    return RopeArgs(q=q4, k=k4, cos=cos.contiguous(), sin=sin.contiguous(),
                    positions=None if positions is None else positions.expand(B, T),
                    rotary_dim=rotary_dim)


def check_positions_in_range(positions: torch.Tensor, n_positions: int) -> None:
    """ValueError unless every position indexes a row of the table. Reads the values, so it waits
    for the GPU: ``apply_rope(..., check_positions=True)`` asks for it; nothing else does."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise ValueError("check_positions: reading positions on the host is impossible while a "
                         "CUDA graph is being captured; check before capturing")
    if positions.numel():
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= n_positions:
            raise ValueError(f"positions: values must lie in [0, {n_positions}) (the rows of cos), "
                             f"found [{lo}, {hi}]")


def _check_tensor(x, name, layout):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: dtype {x.dtype} is not a floating type {FLOAT_DTYPES}")
    if x.dim() != 4:
        dims = "(B, T, H, D)" if layout == "bthd" else "(B, H, T, D)"
        raise ValueError(f"{name}: must be 4-D {dims} for layout={layout!r}, got {tuple(x.shape)}")


def _as_bthd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A (B, T, H, D) view of the same memory: kernels index through strides, so no copy."""
    return x.transpose(1, 2) if layout == "bhtd" else x


def tile_sizes(T: int, H: int, half: int, pairs_per_tile: int = 2048) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_H, BLOCK_HALF) for a tile of tokens x heads x pairs.

    All heads of a token share one cos/sin row, so a tile spans as many heads as fit in
    ``pairs_per_tile`` pairs, then as many tokens as still fit.
    """
    block_half = triton.next_power_of_2(half)
    block_h = min(triton.next_power_of_2(H), max(1, pairs_per_tile // block_half))
    block_t = min(triton.next_power_of_2(T), max(1, pairs_per_tile // (block_h * block_half)))
    return block_t, block_h, block_half
