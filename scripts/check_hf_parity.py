"""Check ropetut.hf.apply_rotary_pos_emb against transformers' own function, and the
copy of HF's formula and tables in tests/test_hf.py against transformers', on tiny
Llama configs (default and YaRN), outputs and gradients, on CPU in fp32. Prints one
line per config; exits 1 on a mismatch.

Needs transformers, which ropetut does not install (CI tests the copy instead):

    PYTHONPATH=.:<a site-packages with torch and triton> TRITON_INTERPRET=1 \
        /tmp/hfvenv/bin/python scripts/check_hf_parity.py
"""

import pathlib
import sys

import torch
import transformers
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply

from ropetut.check import TOLERANCE, relative_error
from ropetut.hf import apply_rotary_pos_emb

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from test_hf import hf_apply_rotary_pos_emb, hf_cos_sin  # noqa: E402

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
        "rope_theta": 10000.0}  # fmt: skip
B, T, HQ, HK, D = 3, 17, 4, 2, 64


def main():
    torch.manual_seed(0)
    ok = True
    for name, parameters in (("default", None), ("yarn", YARN)):
        config = dict(hidden_size=HQ * D, num_attention_heads=HQ,
                      num_key_value_heads=HK, head_dim=D)  # fmt: skip
        if parameters:
            config["rope_parameters"] = parameters
        rotary = LlamaRotaryEmbedding(LlamaConfig(**config))
        position_ids = torch.randint(0, 5000, (B, T))
        cos, sin = rotary(torch.randn(B, T, HQ * D), position_ids)
        q = torch.randn(B, HQ, T, D, requires_grad=True)
        k = torch.randn(B, HK, T, D, requires_grad=True)
        theirs = hf_apply(q, k, cos, sin)
        ours = apply_rotary_pos_emb(q, k, cos, sin)
        grads = [torch.randn_like(t) for t in theirs]
        errors = [relative_error(a, b) for a, b in zip(ours, theirs)]
        errors += [
            relative_error(a, b)
            for a, b in zip(torch.autograd.grad(ours, (q, k), grads),
                            torch.autograd.grad(theirs, (q, k), grads))
        ]  # fmt: skip
        copy = hf_apply_rotary_pos_emb(q, k, cos, sin)
        tables = hf_cos_sin(rotary.inv_freq, position_ids, rotary.attention_scaling)
        copy_same = all(torch.equal(a, b) for a, b in zip(copy, theirs))
        tables_same = all(torch.equal(a, b) for a, b in zip(tables, (cos, sin)))
        ok &= max(errors) <= TOLERANCE[torch.float32] and copy_same and tables_same
        print(f"transformers {transformers.__version__} {name}: q, k, dq, dk relative "
              f"errors {[f'{e:.1e}' for e in errors]}; test copy of the formula "
              f"identical: {copy_same}, of the tables: {tables_same}")  # fmt: skip
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
