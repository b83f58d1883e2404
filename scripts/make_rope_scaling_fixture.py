"""Write tests/fixtures/rope_scaling_hf.json: Hugging Face transformers' RoPE
frequencies (``ROPE_INIT_FUNCTIONS``, and
``LlamaRotaryEmbedding.compute_default_rope_parameters`` for the default) for a few
configurations of each variant, with the transformers version.

tests/test_scaling.py checks ``ropetut.scaling`` against them. Needs transformers, which
ropetut does not install; run it in a throwaway environment, e.g.

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install transformers
    PYTHONPATH=<a site-packages with torch> /tmp/hfvenv/bin/python \
        scripts/make_rope_scaling_fixture.py

Each case is (variant, the keyword arguments of ``ropetut.scaling.<variant>``); the
config transformers reads is made from the same arguments below.
"""

import json
import pathlib
import platform

import torch
import transformers
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

OUT = (
    pathlib.Path(__file__).resolve().parent.parent
    / "tests/fixtures/rope_scaling_hf.json"
)
SHORT = [1.0 + 0.05 * i for i in range(32)]  # LongRoPE factors for head_dim 64
LONG = [1.0 + 0.75 * i for i in range(32)]

CASES = [
    ("default", dict(head_dim=128, base=10000.0)),
    ("default", dict(head_dim=96, base=1000000.0)),
    ("linear", dict(head_dim=128, factor=4.0, base=10000.0)),
    (
        "dynamic",
        dict(
            head_dim=128,
            factor=2.0,
            max_position_embeddings=4096,
            seq_len=1000,
            base=10000.0,
        ),
    ),
    (
        "dynamic",
        dict(
            head_dim=128,
            factor=2.0,
            max_position_embeddings=4096,
            seq_len=32768,
            base=10000.0,
        ),
    ),
    (
        "yarn",
        dict(
            head_dim=128,
            factor=4.0,
            original_max_position_embeddings=32768,
            base=1000000.0,
        ),
    ),
    (
        "yarn",
        dict(
            head_dim=64,
            factor=40.0,
            original_max_position_embeddings=4096,
            base=10000.0,
            mscale=1.0,
            mscale_all_dim=0.707,
        ),
    ),
    (
        "yarn",
        dict(
            head_dim=128,
            factor=8.0,
            original_max_position_embeddings=2048,
            base=10000.0,
            beta_fast=16.0,
            beta_slow=2.0,
            truncate=False,
        ),
    ),
    (
        "longrope",
        dict(
            head_dim=64,
            short_factor=SHORT,
            long_factor=LONG,
            original_max_position_embeddings=4096,
            seq_len=1000,
            max_position_embeddings=131072,
            base=10000.0,
        ),
    ),
    (
        "longrope",
        dict(
            head_dim=64,
            short_factor=SHORT,
            long_factor=LONG,
            original_max_position_embeddings=4096,
            seq_len=8192,
            max_position_embeddings=131072,
            base=10000.0,
        ),
    ),
    (
        "llama3",
        dict(
            head_dim=128,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
            base=500000.0,
        ),
    ),
    (
        "llama3",
        dict(
            head_dim=64,
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
            base=500000.0,
        ),
    ),
]

HF_KEYS = (
    "factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "truncate",
    "short_factor",
    "long_factor",
    "low_freq_factor",
    "high_freq_factor",
)


def context(kw):
    """The extended context a config with these arguments describes (transformers warns
    when its ratio to the original context disagrees with ``factor``)."""
    return int(kw.get("original_max_position_embeddings", 4096) * kw.get("factor", 1))


def hf_frequencies(variant, kw):
    params = {"rope_type": variant, "rope_theta": kw["base"]}
    params.update({key: kw[key] for key in HF_KEYS if key in kw})
    config = LlamaConfig(
        hidden_size=kw["head_dim"] * 2,
        num_attention_heads=2,
        head_dim=kw["head_dim"],
        max_position_embeddings=kw.get("max_position_embeddings") or context(kw),
        rope_parameters=params,
    )
    if variant == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[variant](config, seq_len=kw.get("seq_len"))


def main():
    cases = []
    for variant, kw in CASES:
        inv_freq, attention_factor = hf_frequencies(variant, kw)
        assert inv_freq.dtype == torch.float32, inv_freq.dtype
        cases.append(
            dict(
                variant=variant,
                kwargs=kw,
                inv_freq=inv_freq.tolist(),
                attention_factor=float(attention_factor),
            )
        )
    fixture = dict(
        made_by="scripts/make_rope_scaling_fixture.py",
        transformers=transformers.__version__,
        torch=torch.__version__,
        python=platform.python_version(),
        dtype="float32",
        cases=cases,
    )
    OUT.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {OUT}: {len(cases)} cases, transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
