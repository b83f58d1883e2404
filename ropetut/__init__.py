"""ropetut: Rotary Position Embedding kernels in Triton, and the book that builds them.

``runtime`` is imported first: with no CUDA device it sets TRITON_INTERPRET=1
before any kernel module is imported, so the same kernels run on CPU tensors
through Triton's interpreter.
"""

from .runtime import DEVICE, on_gpu, pick, runtime_mode  # noqa: I001  (must come first)
from .autograd import apply_rope
from .angles import apply_rope_angles
from .packed import apply_rope_thd, packed_positions
from .kernels import IMPLS, OPTIONAL_IMPLS
from .modules import RoPEAttention, RotaryEmbedding
from .qk_norm import QKNormRotary, apply_qk_norm_rope
from .reference import LlmRotary, rope_reference, rope_rotate_half
from .tables import half_truncated, partial, rope_tables, standard

__all__ = [
    "DEVICE",
    "IMPLS",
    "OPTIONAL_IMPLS",
    "LlmRotary",
    "QKNormRotary",
    "RoPEAttention",
    "RotaryEmbedding",
    "apply_qk_norm_rope",
    "apply_rope",
    "apply_rope_angles",
    "apply_rope_thd",
    "half_truncated",
    "on_gpu",
    "packed_positions",
    "partial",
    "pick",
    "rope_reference",
    "rope_rotate_half",
    "rope_tables",
    "runtime_mode",
    "standard",
]
