"""A tiny GPT in the shape of the seed's ``MinimalLLM``, with a pluggable RoPE.

The shape (seed 002's ``llm.py``): token embedding scaled by sqrt(d_model), pre-norm
blocks with RMSNorm, causal attention, a SiLU feed-forward, a final RMSNorm and
an output layer tied to the embedding; weights drawn from N(0, 0.02), no biases.
Its defaults are d_model 384, 8 heads, 6 layers, FFN 1536, sequences of 512, and a
vocabulary of 256 byte tokens.

The rotary embedding is whatever ``GPTConfig.rope`` names:

- ``"none"``: no positional encoding at all (NoPE);
- ``"torch"``: the seed's baseline, ``ropetut.LlmRotary`` (its own half-truncated
  spectrum, turned by -theta, computed in ``rope_dtype``);
- ``"v1"``..``"v4"``, ``"final"``: a Triton kernel through ``apply_rope``, with tables
  from any frequency preset and base, stored in ``rope_dtype``, turned by -theta if
  ``negative_angle``.

and two switches reproduce two of the seed's three confounds (the third, the data split,
is ``TrainConfig.overlapping_split``). Both are off by default:

- ``rotate_by_head_index``: call the rope on (B, H, T, D) tensors as the seed's
  model did; the rope then turns every token by its *head's* index, which carries no
  position (chapter 7).
- ``detach_rope``: no gradient through the rotation, as the seed's Triton path, whose
  output was a fresh tensor with no grad: W_q and W_k then learn nothing through the
  attention scores.

``qk_norm`` (issue 18) puts Qwen3's RMSNorm over each head of q and k before the rope,
with weights w_q and w_k of size head_dim in each attention block:

- ``"none"`` (default): no norm, the model as it always was;
- ``"fused"``: norm and rotation in one kernel, ``ropetut.QKNormRotary``
  (``rope="final"`` only);
- ``"unfused"``: ``ropetut.qk_norm.QKNormThenRope``, a plain norm, then the usual rope.
"""

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import IMPLS, KERNELS
from ..modules import RoPEAttention, RotaryEmbedding
from ..qk_norm import QKNormRotary, QKNormThenRope
from ..reference import LlmRotary
from ..tables import PRESETS

ROPES = ("none", "torch", *IMPLS)
ROPE_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
QK_NORMS = ("none", "fused", "unfused")
QK_NORM_EPS = 1e-6  # Qwen3's


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    d_model: int = 384
    n_heads: int = 8
    n_layers: int = 6
    d_ff: int = 1536
    max_seq_len: int = 512
    dropout: float = 0.0
    rope: str = "final"
    # None: "half_truncated" for "torch" (its only one), else "standard"
    preset: str | None = None
    base: float = 10000.0
    # "torch": the rotation's arithmetic; kernels: the tables'
    rope_dtype: str = "float32"
    # None: True for "torch" (the seed turns by -theta), else False
    negative_angle: bool | None = None
    rotate_by_head_index: bool = False  # confound 2
    detach_rope: bool = False  # confound 1
    qk_norm: str = "none"  # "fused"/"unfused": norm q's, k's heads first

    def __post_init__(self):
        if self.rope not in ROPES:
            raise ValueError(f"rope: must be one of {ROPES}, got {self.rope!r}")
        if self.rope_dtype not in ROPE_DTYPES:
            raise ValueError(
                f"rope_dtype: must be one of {tuple(ROPE_DTYPES)}, "
                f"got {self.rope_dtype!r}"
            )
        if self.d_model % self.n_heads:
            raise ValueError(
                f"n_heads: {self.n_heads} does not divide d_model={self.d_model}"
            )
        if not (math.isfinite(self.base) and self.base > 0):
            raise ValueError(f"base: must be finite and positive, got {self.base}")
        seed_rope = self.rope == "torch"
        # Resolve the defaults, so that a stored config always says what ran.
        if self.preset is None:
            object.__setattr__(
                self, "preset", "half_truncated" if seed_rope else "standard"
            )
        if self.negative_angle is None:
            object.__setattr__(self, "negative_angle", seed_rope)
        if self.preset not in PRESETS or self.preset == "partial":
            raise ValueError(
                f"preset: must be 'standard' or 'half_truncated', got {self.preset!r}"
            )
        if seed_rope and (self.preset != "half_truncated" or not self.negative_angle):
            raise ValueError(
                "rope: 'torch' is the seed's LlmRotary, which only has preset="
                "'half_truncated' and negative_angle=True"
            )
        if self.qk_norm not in QK_NORMS:
            raise ValueError(
                f"qk_norm: must be one of {QK_NORMS}, got {self.qk_norm!r}"
            )
        if self.qk_norm == "fused" and self.rope != "final":
            raise ValueError(
                "qk_norm: 'fused' is the final kernel's rotation with the norm in "
                f"front; it needs rope='final', got rope={self.rope!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def replace(self, **changes) -> "GPTConfig":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        if "rope" in changes:  # a new rope gets its own default preset and direction
            values.update(preset=None, negative_angle=None)
        return GPTConfig(**{**values, **changes})

    def to_dict(self) -> dict:
        """The config as stored with a run. Without a QK norm, as it was before the
        switch existed: the stored runs keep their hashes."""
        values = asdict(self)
        if self.qk_norm == "none":
            del values["qk_norm"]
        return values


class NoRope(nn.Module):
    """NoPE: q and k pass through; attention sees position only through the
    causal mask."""

    def forward(self, q, k, positions=None):
        return q, k


class SeedRope(nn.Module):
    """The seed's baseline module, ``LlmRotary``, behind the (q, k) interface of
    RoPEAttention."""

    def __init__(
        self, head_dim: int, max_seq_len: int, base: float, compute_dtype: torch.dtype
    ):
        super().__init__()
        self.rotary = LlmRotary(
            head_dim, max_seq_len, base=base, compute_dtype=compute_dtype
        )

    def forward(self, q, k, positions=None):
        if positions is not None:
            raise ValueError(
                "positions: the seed's module has none; it rotates by index along dim 1"
            )
        return self.rotary(q), self.rotary(k)


class RopeCall(nn.Module):
    """How attention calls its rope: correctly, or with the seed's slips switched on."""

    def __init__(
        self,
        rope: nn.Module,
        *,
        rotate_by_head_index: bool = False,
        detach: bool = False,
    ):
        super().__init__()
        self.rope = rope
        self.rotate_by_head_index, self.detach = rotate_by_head_index, detach

    def forward(self, q, k, positions=None):  # q, k: (B, T, H, D)
        if self.rotate_by_head_index:
            # the seed's call: (B, H, T, D) tensors into a module that reads
            # dim 1 as the position
            q, k = self.rope(q.transpose(1, 2), k.transpose(1, 2))
            q, k = q.transpose(1, 2), k.transpose(1, 2)
        else:
            q, k = self.rope(q, k, positions=positions)
        if self.detach:
            return q.detach(), k.detach()
        return q, k


def make_rope(config: GPTConfig) -> nn.Module:
    """The rope module ``config`` names, its QK norm first if any, in a ``RopeCall``."""
    dtype = ROPE_DTYPES[config.rope_dtype]
    if config.rope == "none":
        rope = NoRope()
    elif config.rope == "torch":
        rope = SeedRope(config.head_dim, config.max_seq_len, config.base, dtype)
    elif config.qk_norm == "fused":
        # the final kernel's half-split rotation, the norm in front: one kernel each way
        rope = QKNormRotary(
            config.head_dim,
            config.max_seq_len,
            eps=QK_NORM_EPS,
            preset=config.preset,
            base=config.base,
            table_dtype=dtype,
        )
    else:
        # the kernel's own pairing (v1 has only interleaved pairs): for training
        # either will do
        rope = RotaryEmbedding(
            config.head_dim,
            config.max_seq_len,
            preset=config.preset,
            base=config.base,
            table_dtype=dtype,
            impl=config.rope,
            interleaved=not KERNELS[config.rope].half_split,
        )
    if config.rope in IMPLS and config.negative_angle:
        rope.sin.neg_()  # turning by -theta is turning by theta with sin negated
    if config.qk_norm == "unfused":
        rope = QKNormThenRope(config.head_dim, rope, eps=QK_NORM_EPS)
    return RopeCall(
        rope,
        rotate_by_head_index=config.rotate_by_head_index,
        detach=config.detach_rope,
    )


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.norm1 = nn.RMSNorm(config.d_model)
        self.attn = RoPEAttention(
            config.d_model,
            config.n_heads,
            max_seq_len=config.max_seq_len,
            rope=make_rope(config),
        )
        self.norm2 = nn.RMSNorm(config.d_model)
        self.ffn = nn.Sequential(
            nn.Linear(config.d_model, config.d_ff, bias=False),
            nn.SiLU(),
            nn.Dropout(config.dropout),
            nn.Linear(config.d_ff, config.d_model, bias=False),
        )
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        x = x + self.dropout(self.attn(self.norm1(x)))
        return x + self.dropout(self.ffn(self.norm2(x)))


class TinyGPT(nn.Module):
    """The seed's MinimalLLM shape.
    ``forward(tokens (B, T) int64) -> logits (B, T, vocab)``."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.RMSNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied, as in the seed
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.shape[1] > self.config.max_seq_len:
            raise ValueError(
                f"tokens: {tokens.shape[1]} positions, "
                f"the model has {self.config.max_seq_len}"
            )
        x = self.dropout(self.embed(tokens) * math.sqrt(self.config.d_model))
        for block in self.blocks:
            x = block(x)
        return self.head(self.dropout(self.norm(x)))

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, in fp32 whatever the logits' dtype."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
