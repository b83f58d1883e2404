"""The Hugging Face drop-in timed on a model's shape (issue 26, item 3).

Random-weight stacks from transformers' own classes, Llama-3.1-8B-like and Qwen3-8B-like
(their shapes and RoPE settings, --layers layers), bf16, attn_implementation="sdpa",
batch 1, --seq tokens. For each model and provider:
  unpatched  transformers as it is;
  ropetut    ropetut.hf.patch(model);
  liger      apply_liger_kernel_to_{llama,qwen3}(rope=True, all else off, model=model).
It checks, on one fixed input, that the provider's function is what attention calls
(calls of the modeling module's apply_rotary_pos_emb are counted: one per layer and
forward), and that the logits and the gradients of loss = HF's cross-entropy on
labels = input_ids (all as one vector, and the worst single parameter) match: each
||a - b|| / ||b|| against unpatched bf16 <= 1e-2 (2.5 times bf16's spacing 2^-8), or,
against the same weights run unpatched in fp32, within 1.25 times unpatched bf16's own
error (the "floor"): two bf16 roundings of one result may differ by more than either
differs from the exact one. The unpatched row against itself is run-to-run noise.
It then times one step, taking turns between providers, as the median of --repeats
(10 on a GPU) runs of ropetut.bench.time_ms (do_bench, eager, fresh random input_ids):
forward under no_grad (logits for every token), and forward+backward (zero_grad,
loss, backward). Both patches rebind the modeling module's function, so they act on
every model of that family until undone; each is undone before the next provider.

On the H100 (transformers from .hf-wheels, Liger from .whl: scripts/hf-wheels.sh):
    STEPS=hf bash scripts/gpu-validate.sh      # -> results/hf_dropin_h100.json (h200 there)
On a CPU, a tiny fp32 stack through Triton's interpreter (timings only indicative):
    PYTHONPATH=.:<site with transformers> python scripts/hf_step_time.py --tiny
Exits 1 when unpatched or ropetut fails to run or to match; Liger's failures and
verdict are reported only (every provider runs on its own).
"""

import argparse
import copy
import json
import operator
import statistics
import time
import traceback
from functools import partial
from pathlib import Path

import ropetut  # first: on a CPU it sets TRITON_INTERPRET before triton is imported

# isort: split
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.llama import modeling_llama
from transformers.models.qwen3 import modeling_qwen3

import ropetut.hf
from ropetut.bench import liger_version, time_ms
from ropetut.book.provenance import environment
from ropetut.runtime import DEVICE, on_gpu, pick

TOLERANCE, SLACK = 1e-2, 1.25
SHAPE = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
             head_dim=128, tie_word_embeddings=False, use_cache=False)  # fmt: skip
TINY = dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            intermediate_size=512, vocab_size=1000)  # fmt: skip
MODELS = {  # name: (config class, model class, modeling module, Liger's suffix, config)
    "llama3-8b": (LlamaConfig, LlamaForCausalLM, modeling_llama, "llama", dict(
        intermediate_size=14336, vocab_size=128256, rms_norm_eps=1e-5,
        max_position_embeddings=131072, rope_parameters=dict(  # Llama-3.1-8B's
            rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
            high_freq_factor=4.0, original_max_position_embeddings=8192))),
    "qwen3-8b": (Qwen3Config, Qwen3ForCausalLM, modeling_qwen3, "qwen3", dict(
        intermediate_size=12288, vocab_size=151936, rms_norm_eps=1e-6,
        max_position_embeddings=40960,  # q_norm and k_norm: Qwen3's attention has them
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
}  # fmt: skip


def patch_ropetut(model, suffix):
    ropetut.hf.patch(model)
    return ropetut.hf.apply_rotary_pos_emb


def patch_liger(model, suffix):
    import liger_kernel.transformers as liger
    from liger_kernel.transformers.rope import liger_rotary_pos_emb

    getattr(liger, f"apply_liger_kernel_to_{suffix}")(
        rope=True, cross_entropy=False, fused_linear_cross_entropy=False,
        rms_norm=False, swiglu=False, model=model)  # fmt: skip
    return liger_rotary_pos_emb


PROVIDERS = {"unpatched": None, "ropetut": patch_ropetut, "liger": patch_liger}


def step(model, ids):
    """Forward and backward of HF's loss: (logits, {name: gradient})."""
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad for n, p in model.named_parameters()}


def counted(fn, calls, *args, **kwargs):
    calls.append(1)
    return fn(*args, **kwargs)


def norms(a, b):
    return (a.float() - b.float()).norm().item(), b.float().norm().item()


def compare(out, ref):
    """||a - b|| / ||b|| of out's (logits, grads) against ref's: the logits, all the
    gradients as one vector, and the worst single parameter's gradient (named)."""
    d = {n: norms(g, ref[1][n]) for n, g in out[1].items()}
    worst = max(d, key=lambda n: d[n][0] / d[n][1])
    total = sum(e * e for e, _ in d.values()) / sum(r * r for _, r in d.values())
    return {"logits": operator.truediv(*norms(out[0], ref[0])), "grads": total**0.5,
            "grad_max": d[worst][0] / d[worst][1], "grad_worst": worst}  # fmt: skip


def within(err, err32, floor):
    """Close to unpatched bf16, or no further from fp32 than unpatched bf16 is."""
    return all(err[q] <= TOLERANCE or (err32 and err32[q] <= SLACK * floor[q])
               for q in ("logits", "grads", "grad_max"))  # fmt: skip


def timer(fn, make_inputs):
    if on_gpu():
        return time_ms(fn, make_inputs=make_inputs)
    sets = [make_inputs() for _ in range(4)]
    fn(*sets[0])  # warm-up: the interpreter's first call
    times = []
    for inputs in sets[1:]:
        start = time.perf_counter()
        fn(*inputs)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run_model(name, args, dtype):
    config_cls, model_cls, module, suffix, shape = MODELS[name]
    shape = {**shape, **SHAPE, **(TINY if args.tiny else {})}
    config = config_cls(num_hidden_layers=args.layers, **shape)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        model = model_cls._from_config(config, attn_implementation="sdpa", dtype=dtype)
    original = module.apply_rotary_pos_emb
    vocab, seq = config.vocab_size, args.seq
    ids = torch.randint(0, vocab, (1, seq), device=DEVICE)
    record = {"config": config.to_dict(), "providers": {}}
    ref = step(model, ids)
    model.zero_grad(set_to_none=True)  # ref keeps them; deepcopy copies none
    ref32 = floor = None  # in fp32 (--tiny): none
    if dtype != torch.float32:  # the same weights in fp32: bf16's own error
        ref32 = step(copy.deepcopy(model).float(), ids)
        floor = record["floor"] = compare(ref, ref32)
    functions = {}
    for provider, patch in PROVIDERS.items():
        rec = record["providers"][provider] = {}
        try:
            expected = patch(model, suffix) if patch else original
            fn = module.apply_rotary_pos_emb
            if fn is not expected:
                raise RuntimeError(f"attention would call {fn!r}, not {expected!r}")
            calls = []
            module.apply_rotary_pos_emb = partial(counted, fn, calls)
            out = step(model, ids)
            err, err32 = compare(out, ref), ref32 and compare(out, ref32)
            ok = len(calls) == args.layers and within(err, err32, floor)
            rec.update(vs_unpatched=err, vs_fp32=err32, ok=ok)
            rec["calls_per_forward"] = len(calls)
            del out
            functions[provider] = fn
            print(f"{name} {provider}: {rec}", flush=True)
        except Exception as e:  # noqa: BLE001  (each provider on its own)
            traceback.print_exc()
            rec.update(error=f"{type(e).__name__}: {e}", ok=False)
        finally:
            ropetut.hf.unpatch(model)
            module.apply_rotary_pos_emb = original
    del ref, ref32
    model.zero_grad(set_to_none=True)

    def make_inputs():
        return (torch.randint(0, vocab, (1, seq), device=DEVICE),)

    def forward(ids):
        with torch.no_grad():
            return model(input_ids=ids, use_cache=False).logits

    def forward_backward(ids):
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()

    for _ in range(args.repeats):  # taking turns: each repeat times every provider
        for provider, fn in list(functions.items()):
            module.apply_rotary_pos_emb = fn
            rec = record["providers"][provider]
            try:
                for mode, f in (("fwd", forward), ("fwdbwd", forward_backward)):
                    rec.setdefault(f"{mode}_ms_runs", []).append(timer(f, make_inputs))
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                rec.update(error=f"timing: {type(e).__name__}: {e}", ok=False)
                del functions[provider]
            finally:
                module.apply_rotary_pos_emb = original
    for rec in record["providers"].values():
        for mode in ("fwd", "fwdbwd"):
            if f"{mode}_ms_runs" in rec:
                rec[f"{mode}_ms"] = statistics.median(rec[f"{mode}_ms_runs"])
    return record


def table(results):
    row = "{:10} {:9} {:>7} {:>7} {:>6} {:>6}" + " {:>8}" * 6 + " {:>5} {}"
    qs = ("logits", "grads", "grad_max")
    print(row.format("model", "provider", "fwd ms", "fwd+bwd", "x fwd", "x f+b",
                     *qs, *(f"{q[:6]}32" for q in qs), "calls", "ok"))  # fmt: skip
    for name, record in results.items():
        base, floor = record["providers"]["unpatched"], record.get("floor")
        if floor:  # unpatched bf16 against fp32
            e32 = [f"{floor[q]:.1e}" for q in qs]
            print(row.format(name, "(floor)", *[""] * 7, *e32, "", ""))
        for provider, r in record["providers"].items():
            if "error" in r:
                print(f"{name:10} {provider:9} ERROR {r['error'][:60]}")
                continue
            ms = [f"{r[m]:.2f}" for m in ("fwd_ms", "fwdbwd_ms")]
            ratio = [f"{r[m] / base[m]:.3f}" if m in base else "-"
                     for m in ("fwd_ms", "fwdbwd_ms")]  # fmt: skip
            err = [f"{r['vs_unpatched'][q]:.1e}" for q in qs]
            e32 = [f"{r['vs_fp32'][q]:.1e}" if r["vs_fp32"] else "-" for q in qs]
            print(row.format(name, provider, *ms, *ratio, *err, *e32,
                             r["calls_per_forward"], r["ok"]))  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=None, help="4096; 32 with --tiny")
    parser.add_argument("--repeats", type=int, default=pick(gpu=10, cpu=2))
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--tiny", action="store_true", help="a tiny fp32 stack")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.seq = args.seq or (32 if args.tiny else 4096)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    results = {}
    for name in args.models:
        results[name] = run_model(name, args, dtype)
        if on_gpu():
            torch.cuda.empty_cache()  # the model is gone with run_model's frame
    env = {**environment(), "transformers": transformers.__version__,
           "liger": liger_version()}  # fmt: skip
    settings = dict(layers=args.layers, seq=args.seq, batch=1, dtype=str(dtype),
                    attn="sdpa", repeats=args.repeats, tolerance=TOLERANCE, slack=SLACK,
                    timer="time_ms" if on_gpu() else "perf_counter")  # fmt: skip
    print(" | ".join(f"{k} {v}" for k, v in env.items()))
    table(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = dict(environment=env, settings=settings, models=results)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {args.json}")
    failed = [(n, p) for n, r in results.items() for p, rec in r["providers"].items()
              if not rec["ok"] and p != "liger"]  # fmt: skip
    if failed:
        print("FAILED:", ", ".join(f"{n}/{p}" for n, p in failed))
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
