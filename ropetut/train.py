"""Training the tiny GPT: one run, or a named study of many, each written as JSON.

    python -m ropetut train --rope final --steps 200 --out results/runs
    python -m ropetut train --study plot_twist --out results/training_h100 --max-minutes 8

A run trains ``TinyGPT`` with AdamW (lr 1e-3, linear warm-up, cosine decay), bf16 autocast on a
GPU, and evaluates on validation windows the model never trained on (unless the seed's
``overlapping_split`` is switched on). Its JSON holds the configs, the loss curves, the final
validation loss, accuracy and perplexity, the training time, tokens/s, peak memory, the corpus'
sha256 and the environment.

A study is a list of named configurations times seeds. Each (configuration, seed) is one JSON
file in the output folder, written when the run ends; a study run again skips the files that
exist, so it can be run in parts (``--max-minutes`` stops before starting a run that would not
fit) and resumed.
"""
import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .data import load_corpus, make_split, train_batches, windows
from .model import GPTConfig, TinyGPT, loss_fn
from .provenance import environment
from .runtime import DEVICE, on_gpu


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 400
    batch_size: int = 16
    lr: float = 1e-3
    warmup_steps: int = 20
    min_lr_fraction: float = 0.1     # cosine decay ends at this fraction of lr
    weight_decay: float = 0.1
    seed: int = 0                    # model initialisation and batch order
    overlapping_split: bool = False  # confound 3: the seed's random split of overlapping windows
    eval_every: int = 25
    eval_windows: int = 16           # validation windows for the curve's points
    final_eval_windows: int = 128    # and for the final numbers


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr_fraction * lr`` at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.lr * (config.min_lr_fraction + (1 - config.min_lr_fraction) * cosine)


@torch.no_grad()
def evaluate(model, tokens, starts, seq_len, batch_size) -> dict:
    """Mean loss, next-token accuracy and perplexity over the windows at ``starts``."""
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for i in range(0, len(starts), batch_size):
        x, y = windows(tokens, starts[i:i + batch_size], seq_len)
        with _autocast():
            logits = model(x)
        total_loss += loss_fn(logits, y).item() * y.numel()
        correct += (logits.argmax(-1) == y).sum().item()
        count += y.numel()
    model.train()
    loss = total_loss / count
    return {"loss": loss, "accuracy": correct / count, "perplexity": math.exp(loss)}


def _autocast():
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=on_gpu())


def train(model_config: GPTConfig, train_config: TrainConfig, *, corpus=None, progress=True,
          name: str = "run") -> dict:
    """Train one model; returns the run's record (what ``write_run`` stores as JSON)."""
    corpus = corpus or load_corpus()
    torch.manual_seed(train_config.seed)
    model = TinyGPT(model_config).to(DEVICE)
    tokens = corpus.tokens.to(DEVICE)
    seq_len = model_config.max_seq_len
    split = make_split(len(corpus.tokens), seq_len, overlapping=train_config.overlapping_split,
                       seed=train_config.seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": train_config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=train_config.lr, betas=(0.9, 0.95), fused=on_gpu())
    batches = train_batches(corpus.tokens, split, train_config.batch_size, train_config.seed)
    eval_starts = split.val_starts[:train_config.eval_windows]
    curve, val_curve = [], []
    if on_gpu():
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    start = time.perf_counter()
    eval_seconds = 0.0
    for step in tqdm(range(train_config.steps), desc=name, disable=not progress, leave=False):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, train_config)
        x, y = (t.to(DEVICE) for t in next(batches))
        with _autocast():
            loss = loss_fn(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        curve.append(loss.detach())
        if (step + 1) % train_config.eval_every == 0 or step + 1 == train_config.steps:
            t0 = time.perf_counter()
            val_curve.append({"step": step + 1, **evaluate(model, tokens, eval_starts, seq_len,
                                                             train_config.batch_size)})
            eval_seconds += time.perf_counter() - t0
    if on_gpu():
        torch.cuda.synchronize()
    train_seconds = time.perf_counter() - start - eval_seconds
    final = evaluate(model, tokens, split.val_starts[:train_config.final_eval_windows], seq_len,
                     train_config.batch_size)
    trained_tokens = train_config.steps * train_config.batch_size * seq_len
    return {
        "name": name, "model": model_config.to_dict(), "train": asdict(train_config),
        "n_params": model.n_params(), "corpus": corpus.describe(),
        "split": {"mode": split.mode, "train_windows": len(split.train_starts),
                  "val_windows": len(split.val_starts),
                  "val_seen_fraction": split.val_seen_fraction(train_config.final_eval_windows)},
        "train_loss": [float(v) for v in torch.stack(curve).float().cpu()],
        "val_curve": val_curve, "final": final,
        "train_seconds": train_seconds, "tokens_per_s": trained_tokens / train_seconds,
        "peak_mem_mb": torch.cuda.max_memory_allocated() / 2**20 if on_gpu() else None,
        "environment": environment(),
    }


# The study. Each entry: name -> (changes to GPTConfig(), changes to TrainConfig()).
# The seed's two models, with all three confounds: its PyTorch baseline fed (B, H, T, D), its
# Triton model without a backward, both on overlapping windows split at random.
SEED_BASELINE = dict(rope="torch", rotate_by_head_index=True)
SEED_TRITON = dict(rope="v2", preset="standard", detach_rope=True)
OVERLAP = dict(overlapping_split=True)
STUDIES = {
    "plot_twist": {
        # (a) the seed's pattern
        "seed baseline (3 confounds)": (SEED_BASELINE, OVERLAP),
        "seed triton (3 confounds)": (SEED_TRITON, OVERLAP),
        # (b) one confound switched off at a time
        "seed baseline, by position": (dict(rope="torch"), OVERLAP),
        "seed triton, with gradient": (dict(rope="v2", preset="standard"), OVERLAP),
        "seed baseline, disjoint split": (SEED_BASELINE, {}),
        "seed triton, disjoint split": (SEED_TRITON, {}),
        # (c) the controlled study: correct code, disjoint split, one thing changed at a time
        "NoPE": (dict(rope="none"), {}),
        "RoPE base 10000": (dict(rope="final", preset="standard"), {}),
        "half-truncated base 10000": (dict(rope="final", preset="half_truncated"), {}),
        "half-truncated base 1024": (dict(rope="final", preset="half_truncated", base=1024.0), {}),
        "torch baseline (seed math, fp32)": (dict(rope="torch"), {}),
        "torch baseline (seed math, fp16)": (dict(rope="torch", rope_dtype="float16"), {}),
        "triton final (seed math)": (dict(rope="final", preset="half_truncated", negative_angle=True), {}),
    },
}
# A configuration small enough for Triton's interpreter on a CPU (CI trains it).
TINY = (dict(d_model=32, n_heads=2, n_layers=1, d_ff=64, max_seq_len=16),
        dict(steps=8, batch_size=4, warmup_steps=2, eval_every=4, eval_windows=4, final_eval_windows=8))


def configs(model_changes: dict, train_changes: dict, *, seed: int, tiny: bool = False):
    base_model, base_train = (GPTConfig(**TINY[0]), TrainConfig(**TINY[1])) if tiny else (GPTConfig(), TrainConfig())
    return base_model.replace(**model_changes), replace(base_train, seed=seed, **train_changes)


def run_file(out_dir: Path, name: str, seed: int) -> Path:
    safe = "".join(ch if ch.isalnum() else "_" for ch in name).strip("_")
    return Path(out_dir) / f"{safe}__seed{seed}.json"


def run_study(study: str, out_dir, *, seeds=(0, 1, 2), max_minutes: float | None = None,
              tiny: bool = False, steps: int | None = None, progress: bool = True) -> list[Path]:
    """Run every (configuration, seed) of ``study`` whose JSON is not in ``out_dir`` yet.
    Stops before a run that the time budget would not fit (estimated from the runs so far)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus()
    todo = [(name, seed) for seed in seeds for name in STUDIES[study]
            if not run_file(out_dir, name, seed).exists()]
    start, done = time.perf_counter(), []
    for name, seed in tqdm(todo, desc=study, disable=not progress):
        elapsed = time.perf_counter() - start
        if max_minutes is not None and done and elapsed + elapsed / len(done) > max_minutes * 60:
            print(f"{study}: stopping with {len(todo) - len(done)} runs left (--max-minutes {max_minutes})")
            break
        model_config, train_config = configs(*STUDIES[study][name], seed=seed, tiny=tiny)
        if steps is not None:
            train_config = replace(train_config, steps=steps)
        record = train(model_config, train_config, corpus=corpus, progress=False, name=name)
        record["study"] = study
        path = run_file(out_dir, name, seed)
        path.write_text(json.dumps(record, indent=1))
        done.append(path)
    return done


def load_runs(folder) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]


def summarize(runs: list[dict]) -> list[dict]:
    """One row per configuration, in the study's order: mean and standard deviation over seeds of
    the final numbers."""
    order = list(STUDIES.get(runs[0].get("study"), {})) if runs else []
    names = sorted(dict.fromkeys(r["name"] for r in runs), key=lambda n: order.index(n) if n in order else len(order))
    rows = []
    for name in names:
        mine = [r for r in runs if r["name"] == name]
        row = {"name": name, "seeds": len(mine)}
        for key, values in (("val_loss", [r["final"]["loss"] for r in mine]),
                            ("accuracy", [r["final"]["accuracy"] for r in mine]),
                            ("perplexity", [r["final"]["perplexity"] for r in mine]),
                            ("train_seconds", [r["train_seconds"] for r in mine]),
                            ("tokens_per_s", [r["tokens_per_s"] for r in mine]),
                            ("val_seen_fraction", [r["split"]["val_seen_fraction"] for r in mine])):
            t = torch.tensor(values, dtype=torch.float64)
            row[key] = float(t.mean())
            row[key + "_std"] = float(t.std()) if len(values) > 1 else 0.0
        rows.append(row)
    return rows


def format_summary(rows) -> str:
    lines = [f"{'configuration':34} {'seeds':>5} {'val loss':>15} {'accuracy':>15} {'perplexity':>13} "
             f"{'train s':>7} {'tokens/s':>9} {'val seen':>8}"]
    for r in rows:
        lines.append(f"{r['name']:34} {r['seeds']:5d} {r['val_loss']:7.4f} ± {r['val_loss_std']:.4f} "
                     f"{r['accuracy']:7.4f} ± {r['accuracy_std']:.4f} {r['perplexity']:6.2f} ± {r['perplexity_std']:4.2f} "
                     f"{r['train_seconds']:7.1f} {r['tokens_per_s']:9.0f} {r['val_seen_fraction']:8.1%}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ropetut train", description=__doc__.split("\n")[0])
    parser.add_argument("--study", choices=STUDIES, help="run a named study instead of one configuration")
    parser.add_argument("--out", required=True, metavar="DIR", help="where each run's JSON goes")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-minutes", type=float, help="stop a study before a run that would not fit")
    parser.add_argument("--steps", type=int, help="override the number of training steps")
    parser.add_argument("--tiny", action="store_true", help="a model small enough for the CPU interpreter")
    parser.add_argument("--rope", default="final", help="one configuration: none, torch, v1..v4, final")
    parser.add_argument("--preset", choices=("standard", "half_truncated"))
    parser.add_argument("--base", type=float, default=10000.0)
    parser.add_argument("--rope-dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    parser.add_argument("--rotate-by-head-index", action="store_true")
    parser.add_argument("--detach-rope", action="store_true")
    parser.add_argument("--overlapping-split", action="store_true")
    args = parser.parse_args(argv)
    if args.study:
        run_study(args.study, args.out, seeds=args.seeds, max_minutes=args.max_minutes, tiny=args.tiny,
                  steps=args.steps)
        runs = [r for r in load_runs(args.out) if r.get("study") == args.study]
    else:
        model_changes = dict(rope=args.rope, base=args.base, rope_dtype=args.rope_dtype,
                             rotate_by_head_index=args.rotate_by_head_index, detach_rope=args.detach_rope)
        if args.preset:
            model_changes["preset"] = args.preset
        runs = []
        for seed in args.seeds:
            model_config, train_config = configs(model_changes, dict(overlapping_split=args.overlapping_split),
                                                 seed=seed, tiny=args.tiny)
            if args.steps is not None:
                train_config = replace(train_config, steps=args.steps)
            record = train(model_config, train_config, name=f"rope={args.rope}")
            path = run_file(args.out, record["name"], seed)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(record, indent=1))
            runs.append(record)
    print(format_summary(summarize(runs)))
    return 0
