"""The RoPE scaling family as data: each variant is one function returning
``(inv_freq, attention_factor)``.

``inv_freq`` has one frequency per rotated pair, ``rotary_dim/2`` of them, usable in
table mode (``ropetut.rope_tables(inv_freq, n)``) and in table-free mode
(``ropetut.angles.apply_rope_angles(q, k, inv_freq, ...)``). ``attention_factor``
multiplies cos and sin (YaRN's and LongRoPE's "mscale"); it is 1.0 for the others.

Each function follows the operations of Hugging Face transformers'
``ROPE_INIT_FUNCTIONS`` (the default:
``LlamaRotaryEmbedding.compute_default_rope_parameters``) in the same order, in
``dtype``. In float32 that reproduces transformers' vectors
(tests/fixtures/rope_scaling_hf.json, made by scripts/make_rope_scaling_fixture.py); in
float64, the default, it is the same formula with float32's roundings gone.

Dynamic NTK and LongRoPE depend on the current sequence length. ``seq_len`` may be a
Python int (the host knows the length: a batch's T, flash-attn's ``max_seqlen``) or a
0-d integer tensor on the device (a length only the device knows, e.g.
``cu_seqlens[-1]``): then every operation stays on the device, the vector is rebuilt per
length without a host sync (LongRoPE's factors given as device tensors), and the
table-free kernel reads it like any other ``inv_freq``. Only rotary_dim/2 numbers are
rebuilt, not a table."""

import math

import torch

from . import tables


def default(head_dim: int, base: float = 10000.0, *, dtype=torch.float64, device=None):
    """RoFormer's spectrum ``1 / base ** (2i / head_dim)``."""
    return _inv_freq(head_dim, base, dtype, device), 1.0


def linear(
    head_dim: int,
    factor: float,
    base: float = 10000.0,
    *,
    dtype=torch.float64,
    device=None,
):
    """Position interpolation: every frequency divided by ``factor``."""
    return _inv_freq(head_dim, base, dtype, device) / factor, 1.0


def dynamic_ntk(
    head_dim: int,
    factor: float,
    max_position_embeddings: int,
    seq_len,
    base: float = 10000.0,
    *,
    dtype=torch.float64,
    device=None,
):
    """NTK-aware scaling that grows with the length: the base is raised once ``seq_len``
    passes ``max_position_embeddings``. ``seq_len``: int, or a 0-d tensor on the device
    (no host sync: see the module's docstring)."""
    if isinstance(seq_len, torch.Tensor):
        device = seq_len.device if device is None else device
        seq_len = seq_len.to(dtype).clamp(min=max_position_embeddings)
    else:
        seq_len = max(seq_len, max_position_embeddings)
    ramp = factor * seq_len / max_position_embeddings - (factor - 1)
    base = base * ramp ** (head_dim / (head_dim - 2))
    return _inv_freq(head_dim, base, dtype, device), 1.0


def yarn(
    head_dim: int,
    factor: float,
    original_max_position_embeddings: int,
    base: float = 10000.0,
    *,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attention_factor: float | None = None,
    truncate: bool = True,
    dtype=torch.float64,
    device=None,
):
    """YaRN: high frequencies kept, low ones interpolated by ``factor``, a linear ramp
    between (by the number of turns over ``original_max_position_embeddings``), and an
    attention factor ``0.1 ln(factor) + 1`` (or DeepSeek's mscale ratio)."""
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(
                factor, mscale_all_dim
            )
        else:
            attention_factor = _yarn_mscale(factor)
    low = _turns_to_dim(beta_fast, head_dim, base, original_max_position_embeddings)
    high = _turns_to_dim(beta_slow, head_dim, base, original_max_position_embeddings)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # (as transformers: no division by zero)
    pair = torch.arange(head_dim // 2, dtype=dtype, device=device)
    ramp = ((pair - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp  # 1: keep the frequency, 0: interpolate it
    pos_freqs = base ** (_exponents(head_dim, dtype, device))
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (
        1.0 / pos_freqs
    ) * extrapolation
    return inv_freq, float(attention_factor)


def longrope(
    head_dim: int,
    short_factor,
    long_factor,
    original_max_position_embeddings: int,
    seq_len=None,
    base: float = 10000.0,
    *,
    factor: float | None = None,
    max_position_embeddings: int | None = None,
    attention_factor: float | None = None,
    dtype=torch.float64,
    device=None,
):
    """LongRoPE (Phi-3): per-pair divisors, ``long_factor`` once ``seq_len`` passes
    ``original_max_position_embeddings``, ``short_factor`` before. ``factor`` defaults
    to ``max_position_embeddings / original_max_position_embeddings``; the attention
    factor to ``sqrt(1 + ln(factor) / ln(original))``. ``seq_len``: None, int, or a 0-d
    device tensor (then the vector is built on its device, with no host sync if the
    factors are tensors there too: lists are copied from the host)."""
    if factor is None:
        if max_position_embeddings is None:
            raise ValueError("factor: give it, or max_position_embeddings to derive it")
        factor = max_position_embeddings / original_max_position_embeddings
    if attention_factor is None:
        attention_factor = (
            1.0
            if factor <= 1.0
            else math.sqrt(
                1 + math.log(factor) / math.log(original_max_position_embeddings)
            )
        )
    for name, given in (("short_factor", short_factor), ("long_factor", long_factor)):
        if len(given) != head_dim // 2:
            raise ValueError(
                f"{name}: needs head_dim/2 = {head_dim // 2} entries, got {len(given)}"
            )
    if device is None:  # the device of the length or the factors, if one is a tensor
        given = (seq_len, short_factor, long_factor)
        device = next((t.device for t in given if isinstance(t, torch.Tensor)), None)
    # transformers makes the factors float32 tensors whatever the dtype. Factors given
    # as tensors on the device are used there; lists are copied from the host, which
    # waits for the GPU: make them tensors once to rebuild per length without a sync.
    short = torch.as_tensor(short_factor, dtype=torch.float32, device=device).to(dtype)
    long = torch.as_tensor(long_factor, dtype=torch.float32, device=device).to(dtype)
    if isinstance(seq_len, torch.Tensor):
        ext_factors = torch.where(
            seq_len > original_max_position_embeddings, long, short
        )
    else:
        ext_factors = (
            long if seq_len and seq_len > original_max_position_embeddings else short
        )
    inv_freq = 1.0 / (ext_factors * base ** _exponents(head_dim, dtype, device))
    return inv_freq, float(attention_factor)


def llama3(
    head_dim: int,
    factor: float = 8.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
    original_max_position_embeddings: int = 8192,
    base: float = 500000.0,
    *,
    dtype=torch.float64,
    device=None,
):
    """Llama-3.1: wavelengths above ``original / low_freq_factor`` divided by
    ``factor``, below ``original / high_freq_factor`` kept, a smooth blend between."""
    inv_freq = _inv_freq(head_dim, base, dtype, device)
    low_freq_wavelen = original_max_position_embeddings / low_freq_factor
    high_freq_wavelen = original_max_position_embeddings / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled), 1.0


def half_truncated(
    head_dim: int, base: float = 10000.0, *, dtype=torch.float64, device=None
):
    """The seed's preset (``ropetut.tables.half_truncated``): the last head_dim/4 pairs
    never rotate."""
    return tables.half_truncated(head_dim, base).to(dtype=dtype, device=device), 1.0


def partial(
    rotary_dim: int, base: float = 10000.0, *, dtype=torch.float64, device=None
):
    """NeoX's ``rotary_pct`` (``ropetut.tables.partial``): the standard spectrum over
    the first ``rotary_dim`` dims; pass ``rotary_dim`` to the apply call too."""
    return tables.partial(rotary_dim, base).to(dtype=dtype, device=device), 1.0


VARIANTS = {
    "default": default,
    "linear": linear,
    "dynamic": dynamic_ntk,
    "yarn": yarn,
    "longrope": longrope,
    "llama3": llama3,
    "half_truncated": half_truncated,
    "partial": partial,
}


def _exponents(head_dim, dtype, device):
    """2i / head_dim for i < head_dim/2."""
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim: must be a positive even number, got {head_dim}")
    return torch.arange(0, head_dim, 2, dtype=dtype, device=device) / head_dim


def _inv_freq(head_dim, base, dtype, device):
    return 1.0 / (base ** _exponents(head_dim, dtype, device))


def _yarn_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _turns_to_dim(turns, head_dim, base, original_max_position_embeddings):
    """The (fractional) dim whose wavelength fits ``turns`` times in the original
    context."""
    return (
        head_dim * math.log(original_max_position_embeddings / (turns * 2 * math.pi))
    ) / (2 * math.log(base))
