"""ropetut.hf.patch end to end: tiny random-weight Llama and Qwen3 models from
transformers, in fp32, run once with transformers' own RoPE and once patched. The
logits, the loss and every parameter's gradient agree within 1e-5 relative (the bar of
test_train_equivalence's step 0; on the CPU they come out identical), and so do the
logits of a few greedy decoding steps through the KV cache.

CI does not install transformers, so this file skips there. To run it here:

    PYTHONPATH=.:<a site-packages with torch and triton> TRITON_INTERPRET=1 \\
        <a python with transformers> -m pytest -q -p no:cacheprovider \\
        tests/test_hf_models.py
"""

import sys

import pytest
import torch
from conftest import gpu_only

import ropetut
from ropetut import hf
from ropetut.check import relative_error

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (CI does not install it)"
)

END_TO_END = 1e-5  # relative, per tensor: logits, loss, each parameter's gradient

FAMILIES = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
}
YARN = {
    "rope_type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 32,
    "rope_theta": 10000.0,
}
CPU_SIZES = dict(
    hidden_size=48,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=3,
    num_key_value_heads=1,
    head_dim=96,
)
GPU_SIZES = dict(
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=128,
)
VOCAB = 64


def tiny_model(family, sizes, device, rope_parameters=None):
    """A random-weight causal LM in fp32 with eager attention (deterministic on CUDA,
    where SDPA's fp32 backward may not be)."""
    config_class, model_class = FAMILIES[family]
    config = config_class(vocab_size=VOCAB, max_position_embeddings=128, **sizes)
    if rope_parameters:
        config.rope_parameters = rope_parameters
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return model_class(config).to(device)


@pytest.fixture
def counted_calls(monkeypatch):
    """How many times ropetut.hf.apply_rotary_pos_emb reached ropetut's kernel."""
    calls = []

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return apply_rope(*args, **kwargs)

    apply_rope = hf.apply_rope
    monkeypatch.setattr(hf, "apply_rope", counting)
    return calls


def step(model, input_ids, position_ids):
    """One forward and backward: (logits, loss, {name: gradient})."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=input_ids, position_ids=position_ids, labels=input_ids)
    out.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return out.logits.detach(), out.loss.detach(), grads


def patched_step_matches(model, input_ids, position_ids=None):
    """Step once unpatched and once patched; assert they agree."""
    logits, loss, grads = step(model, input_ids, position_ids)
    hf.patch(model)
    try:
        patched = step(model, input_ids, position_ids)
    finally:
        hf.unpatch(model)
    assert relative_error(patched[0], logits) <= END_TO_END
    assert relative_error(patched[1], loss) <= END_TO_END
    assert patched[2].keys() == grads.keys()
    for name, grad in grads.items():
        assert relative_error(patched[2][name], grad) <= END_TO_END, name


CASES = {
    "positions 0..T-1": dict(),
    "packed position_ids": dict(packed=True),
    "yarn, packed position_ids": dict(packed=True, rope_parameters=YARN),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("family", FAMILIES)
def test_patched_model_matches_transformers(family, case, counted_calls):
    c = CASES[case]
    dev = ropetut.DEVICE
    model = tiny_model(family, CPU_SIZES, dev, c.get("rope_parameters"))
    B, T = 2, 17
    input_ids = torch.randint(0, VOCAB, (B, T), device=dev)
    position_ids = None
    if c.get("packed"):  # sequence 1 holds two documents: its positions restart
        # (an offset alone would not do: attention sees only position differences)
        restart = torch.cat([torch.arange(9), torch.arange(T - 9)])
        position_ids = torch.stack([torch.arange(T), restart]).to(dev)
    patched_step_matches(model, input_ids, position_ids)
    n_layers = CPU_SIZES["num_hidden_layers"]
    assert len(counted_calls) == n_layers  # the kernel ran in every layer


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_decoding_with_cache_matches(family, counted_calls):
    """Prefill, then one token at a time through the KV cache (T = 1 per step)."""
    dev = ropetut.DEVICE
    model = tiny_model(family, CPU_SIZES, dev)
    prompt = torch.randint(0, VOCAB, (2, 9), device=dev)
    settings = dict(
        max_new_tokens=3,
        do_sample=False,
        pad_token_id=0,
        return_dict_in_generate=True,
        output_logits=True,
    )
    theirs = model.generate(prompt, **settings)
    hf.patch(model)
    try:
        ours = model.generate(prompt, **settings)
    finally:
        hf.unpatch(model)
    assert torch.equal(ours.sequences, theirs.sequences)
    for a, b in zip(ours.logits, theirs.logits, strict=True):
        assert relative_error(a, b) <= END_TO_END
    n_layers = CPU_SIZES["num_hidden_layers"]
    assert len(counted_calls) == 3 * n_layers
    assert [shape[2] for shape in counted_calls[n_layers:]] == [1] * 2 * n_layers


@pytest.mark.parametrize("family", FAMILIES)
def test_unpatch_restores_transformers_function(family):
    model = tiny_model(family, CPU_SIZES, "cpu")
    modeling = sys.modules[type(model).__module__]
    original = modeling.apply_rotary_pos_emb
    hf.patch(hf.patch(model))  # twice: still one original to restore
    assert modeling.apply_rotary_pos_emb is hf.apply_rotary_pos_emb
    assert hf.unpatch(model) is model
    assert modeling.apply_rotary_pos_emb is original


def test_patch_refuses_other_transformers_models():
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="^model: no Llama- or Qwen3-style"):
        hf.patch(transformers.GPT2LMHeadModel(config))


@gpu_only
@pytest.mark.parametrize("family", FAMILIES)
def test_patched_model_matches_transformers_gpu(family, counted_calls):
    """Larger, on CUDA, TF32 off; nothing timed."""
    matmul = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        model = tiny_model(family, GPU_SIZES, "cuda", YARN)
        input_ids = torch.randint(0, VOCAB, (4, 256), device="cuda")
        position_ids = torch.randint(0, 4096, (4, 256), device="cuda")
        patched_step_matches(model, input_ids, position_ids)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
    assert len(counted_calls) == GPU_SIZES["num_hidden_layers"]
