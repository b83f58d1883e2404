"""Training the tiny GPT: one run, or a named study of many, each written as JSON.

    python -m ropetut train --rope final --steps 200 --out results/runs
    python -m ropetut train --study plot_twist --out results/study --max-minutes 8
    python -m ropetut train --study plot_twist --out results/study --max-minutes 8 \\
        --checkpoint-every 50

A run trains ``TinyGPT`` with AdamW (lr 1e-3, linear warm-up, cosine decay), bf16
autocast on a GPU, and evaluates on validation windows the model never trained on
(unless the seed's ``overlapping_split`` is switched on). Its JSON holds the configs,
the loss curves, the final validation loss, accuracy and perplexity, the training time
(``train_seconds``, without evaluations and checkpoint writes; ``timed_seconds`` over
``timed_steps``, the same after each call's first ``WARM_STEPS`` steps, which compile
kernels), tokens/s, peak memory, the corpus' sha256 and the environment.

A study is a list of named configurations times seeds (``STUDIES``: chapter 09's
``plot_twist``; issue 27's ``seed_regime``, ``confounds`` and ``budget``), run seed by
seed, each seed's configurations in a shuffled order. Each (configuration, seed) is one
JSON file in the output folder, ``<name>__seed<seed>__<hash>.json``, where the hash is
that of the run's full configuration (also stored in the file as ``config_hash``). The
runner trusts nothing it did not write:

- a study run again skips a run only if its file reads back as a run of exactly that
  configuration (so it can be run in parts, ``--max-minutes`` stopping before a run that
  would not fit, and resumed); a file of the same name and seed with another
  configuration, or one that does not read back, is named and the run is trained anew;
- files are written whole or not at all: a temporary file, then a rename;
- with ``--checkpoint-every N``, a run checkpoints every N steps to ``<file>.ckpt``
  and a runner resumes it from there, exactly: a study spreads over calls and sessions
  however short (``--max-minutes`` then pauses the run in progress); the checkpoint
  carries the configuration hash, and one that does not load or holds another
  configuration is named and the run starts over;
- a runner claims a run (a lock on ``<file>.claim``) before training it, so two runners
  on one folder never train the same run; the lock dies with its process;
- the arguments are checked before anything trains.

Files written before the hash (``<name>__seed<seed>.json``) still load, and are trusted
by a study when the configuration they record is the one asked for.

``--regime seed`` (issue 17, item 3) trains one configuration, or every run of a study,
the way the seed author's ``llm.py`` does: torch's own Muon on the blocks' 2-D weights
(lr 1e-2, no weight decay) and AdamW on the rest (the embedding, which is also the head,
and the norms: lr 1e-3, torch's betas, weight decay 0.1 on all of it); fp16 autocast
with a GradScaler; dropout 0.1; 4 batches of 24 windows per step, for 1,250 steps (the
seed's 5,000 count batches), on its schedule; one overlapping split for every seed
(its generator's seed, 42). ``--optimizer``, ``--autocast-dtype``,
``--grad-accumulation``, ``--schedule-steps``, ``--split-seed`` and ``--dropout`` change
one of these. At their defaults they are left out of a run's stored config, so the runs
stored before them keep their hashes. The optimizers' and the scaler's states are in the
checkpoint, so a run in this regime resumes exactly too. On a CPU it trains in fp32, and
the scaler scales and unscales by powers of two, exactly: the fp16 path is the GPU's.

What still differs from the seed's regime, and why:

- the corpus and the tokenizer (bytes of the Jargon File, not 500k SmolLM tokens of
  cosmopedia): losses per byte and per token do not compare, so the chapter compares
  unit-free quantities;
- the attention is the library's ``RoPEAttention``: W_q and W_kv are two matrices where
  the seed has one fused qkv, so Muon orthogonalises them apart (and scales their lr by
  1 and sqrt(2), not sqrt(3)), and it has no dropout on the attention weights (the
  seed's SDPA drops 0.1 of them);
- batches are drawn at random with replacement, so that one generator's state is the
  stream's place in a checkpoint; the seed's DataLoader shuffles epochs;
- the warm-up's first step has lr / 250, the seed's lr 0 (its LambdaLR starts at 0);
- Muon is torch's, the seed's a copy of Keller Jordan's: the same update (momentum by
  lerp, Nesterov, 5 Newton-Schulz steps in bf16, lr times sqrt(max(1, rows/cols))) but
  for where eps enters the norm;
- evaluation uses the study's windows (16 per point of the curve, 128 at the end), not
  100 batches of 24; each step's training loss is the mean of its batches, where the
  seed logs one batch.
"""

import argparse
import fcntl
import hashlib
import json
import math
import os
import random
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..book.provenance import environment
from ..runtime import DEVICE, on_gpu
from .checkpoint import Paused, read_checkpoint, replace_atomically, write_checkpoint
from .data import VAL_BLOCKS, load_corpus, make_split, train_batches, windows
from .model import ROPES, GPTConfig, TinyGPT, loss_fn


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 400  # optimizer steps
    batch_size: int = 16  # windows per batch
    lr: float = 1e-3
    warmup_steps: int = 20
    min_lr_fraction: float = 0.1  # cosine decay ends at this fraction of lr
    weight_decay: float = 0.1
    seed: int = 0  # model initialisation and batch order
    # confound 3: the seed's random split of overlapping windows
    overlapping_split: bool = False
    eval_every: int = 25
    eval_windows: int = 16  # validation windows for the curve's points
    final_eval_windows: int = 128  # and for the final numbers
    # The seed's regime (REGIMES["seed"]). Stored only where they are not at these
    # defaults, so that the runs stored before them keep their hashes (to_dict).
    optimizer: str = "adamw"  # "muon": torch's Muon on the blocks' matrices
    autocast_dtype: str = "bfloat16"  # on a GPU; "float16" comes with a GradScaler
    grad_accumulation: int = 1  # batches per optimizer step
    schedule_steps: int | None = None  # the cosine's horizon; None: steps
    split_seed: int | None = None  # the overlapping split's draw; None: seed
    # Issue 27's confound: the disjoint split's validation block, at the file's "end"
    # (harder text) or in its "middle". Stored only where not "end", like those above.
    val_block: str = "end"

    def __post_init__(self):
        for name in (
            "steps",
            "batch_size",
            "eval_every",
            "eval_windows",
            "final_eval_windows",
            "grad_accumulation",
        ):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"{name}: must be at least 1, got {getattr(self, name)}"
                )
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr: must be finite and positive, got {self.lr}")
        if self.warmup_steps < 0 or self.seed < 0:
            raise ValueError(
                f"warmup_steps, seed: must not be negative, got "
                f"{self.warmup_steps}, {self.seed}"
            )
        for name, allowed in (
            ("optimizer", OPTIMIZERS),
            ("autocast_dtype", tuple(AUTOCAST_DTYPES)),
            ("val_block", VAL_BLOCKS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name}: must be one of {allowed}, got {getattr(self, name)!r}"
                )
        if self.schedule_steps is not None and self.schedule_steps < 1:
            raise ValueError(
                f"schedule_steps: must be at least 1, got {self.schedule_steps}"
            )
        if self.split_seed is not None and self.split_seed < 0:
            raise ValueError(f"split_seed: must not be negative, got {self.split_seed}")
        if self.overlapping_split and self.val_block != "end":
            raise ValueError(
                "val_block: places the disjoint split's validation block, so does "
                "nothing with overlapping_split"
            )

    def to_dict(self) -> dict:
        """The config as stored with a run and hashed: the options added after the
        stored runs (the seed regime's, ``val_block``) only where they are not at their
        defaults, and ``split_seed`` only where a split is drawn (the disjoint split
        draws nothing)."""
        defaults = {f.name: f.default for f in fields(self)}
        values = asdict(self)
        if not self.overlapping_split:
            values["split_seed"] = None
        return {
            key: value
            for key, value in values.items()
            if key not in LATER_OPTIONS or value != defaults[key]
        }


OPTIMIZERS = ("adamw", "muon")
AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
LATER_OPTIONS = (  # added after the stored runs: stored only where not at defaults
    "optimizer",
    "autocast_dtype",
    "grad_accumulation",
    "schedule_steps",
    "split_seed",
    "val_block",
)
WARM_STEPS = 10  # steps of each call left out of a run's timed seconds
MUON_LR_RATIO = 10  # the seed's: Muon at muon_lr 0.01, AdamW at muon_lr * 0.1


def windows_trained(config: TrainConfig) -> int:
    """The windows a run trains on: its steps times the batches of each, times their
    windows."""
    return config.steps * config.grad_accumulation * config.batch_size


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr_fraction * lr`` at the
    last step (at ``schedule_steps`` if given, then flat)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    horizon = config.schedule_steps or config.steps
    progress = (step - config.warmup_steps) / max(1, horizon - config.warmup_steps)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.lr * (config.min_lr_fraction + (1 - config.min_lr_fraction) * cosine)


@torch.no_grad()
def evaluate(
    model, tokens, starts, seq_len, batch_size, autocast_dtype="bfloat16"
) -> dict:
    """Mean loss, next-token accuracy and perplexity over the windows at ``starts``."""
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for i in range(0, len(starts), batch_size):
        x, y = windows(tokens, starts[i : i + batch_size], seq_len)
        with _autocast(autocast_dtype):
            logits = model(x)
        total_loss += loss_fn(logits, y).item() * y.numel()
        correct += (logits.argmax(-1) == y).sum().item()
        count += y.numel()
    model.train()
    loss = total_loss / count
    return {"loss": loss, "accuracy": correct / count, "perplexity": math.exp(loss)}


def _autocast(dtype="bfloat16"):
    return torch.autocast("cuda", dtype=AUTOCAST_DTYPES[dtype], enabled=on_gpu())


def make_optimizers(model: TinyGPT, config: TrainConfig) -> list:
    """``(optimizer, lr multiplier)`` pairs. "adamw": AdamW, weight decay on the
    matrices only. "muon": the seed's pair, torch's Muon (no weight decay, at
    ``MUON_LR_RATIO * lr``) on the 2-D weights of the blocks (attention's and the
    feed-forward's), then AdamW with torch's betas and weight decay on all the rest
    (the embedding, which is also the head, and the norms' weights)."""
    fused = on_gpu()
    if config.optimizer == "adamw":
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return [(torch.optim.AdamW(groups, config.lr, (0.9, 0.95), fused=fused), 1)]
    matrices = [p for p in model.blocks.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if all(p is not m for m in matrices)]
    muon = torch.optim.Muon(
        matrices,
        lr=MUON_LR_RATIO * config.lr,
        weight_decay=0.0,
        momentum=0.95,
        nesterov=True,
        ns_steps=5,
    )
    adamw = torch.optim.AdamW(
        rest, lr=config.lr, weight_decay=config.weight_decay, fused=fused
    )
    return [(muon, MUON_LR_RATIO), (adamw, 1)]


@contextmanager
def deterministic_on_gpu():
    """Within it, a GPU run gives the same losses every time, bit for bit: torch's
    deterministic algorithms (SDPA's backward among them: it otherwise sums dq with
    atomics). Torch asks for CUBLAS_WORKSPACE_CONFIG with them; cuBLAS reads it when it
    first runs, so set here it only satisfies torch's check, and on one stream cuBLAS
    is deterministic anyway. Memory from torch.empty is not filled (deterministic mode
    would, at a cost in every step): nothing here reads it before writing. The previous
    settings come back on exit."""
    if not on_gpu():
        yield
        return
    fill = torch.utils.deterministic
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        fill.fill_uninitialized_memory,
    )
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    fill.fill_uninitialized_memory = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        fill.fill_uninitialized_memory = before[2]
        if workspace is None:
            del os.environ["CUBLAS_WORKSPACE_CONFIG"]


@deterministic_on_gpu()
def train(
    model_config: GPTConfig,
    train_config: TrainConfig,
    *,
    corpus=None,
    progress=True,
    name: str = "run",
    checkpoint: Path | None = None,
    checkpoint_every: int | None = None,
    stop_after: float | None = None,
    log=print,
) -> dict:
    """Train one model; returns the run's record (what ``write_run`` stores as JSON).

    checkpoint: a file to resume from if it holds this configuration's checkpoint (one
        that does not is named through ``log`` and the run starts over), and to write
        the checkpoints to. A run resumed gives the record it would have given had it
        never stopped, but for its timings (``train_seconds``, ``timed_seconds``,
        ``timed_steps``, ``tokens_per_s``; its ``peak_mem_mb`` is that of the last
        part). ``timed_seconds`` over ``timed_steps`` is the time a step takes once
        kernels are compiled: each call's first ``WARM_STEPS`` steps are left out.
    checkpoint_every: write the checkpoint after every this many steps.
    stop_after: seconds from this call's start; once past them, write the checkpoint
        after the current step and raise ``Paused`` (not after the last step: the final
        evaluation follows it).
    """
    if checkpoint is None and (checkpoint_every, stop_after) != (None, None):
        raise ValueError("checkpoint: needed by checkpoint_every and stop_after")
    if checkpoint_every is not None and checkpoint_every < 1:
        raise ValueError(
            f"checkpoint_every: must be at least 1, got {checkpoint_every}"
        )
    if stop_after is not None and not stop_after >= 0:
        raise ValueError(f"stop_after: must not be negative, got {stop_after}")
    called = time.perf_counter()
    digest = config_hash(
        model_config.to_dict(), train_config.to_dict(), regime(train_config)
    )
    resumed = None
    if checkpoint is not None and Path(checkpoint).exists():
        try:
            resumed = read_checkpoint(Path(checkpoint), digest)
        except ValueError as error:
            log(f"not trusted, so {name} starts over: {error}")
    corpus = corpus or load_corpus()
    torch.manual_seed(train_config.seed)
    model = TinyGPT(model_config).to(DEVICE)
    tokens = corpus.tokens.to(DEVICE)
    seq_len = model_config.max_seq_len
    split_seed = train_config.split_seed
    split = make_split(
        len(corpus.tokens),
        seq_len,
        overlapping=train_config.overlapping_split,
        seed=train_config.seed if split_seed is None else split_seed,
        val_block=train_config.val_block,
    )
    optimizers = make_optimizers(model, train_config)
    # fp16's: on a CPU (fp32) it scales and unscales by powers of two, exactly
    scaler = torch.amp.GradScaler(
        DEVICE.type, enabled=train_config.autocast_dtype == "float16"
    )
    order = torch.Generator().manual_seed(train_config.seed)
    batches = train_batches(
        corpus.tokens, split, train_config.batch_size, train_config.seed, order
    )
    eval_starts = split.val_starts[: train_config.eval_windows]
    curve, val_curve, first_step, seconds_before = [], [], 0, 0.0
    timed_before = (0.0, 0)  # seconds and steps timed in earlier calls
    if resumed is not None:
        model.load_state_dict(resumed["model"])
        for (optimizer, _), state in zip(optimizers, resumed["optimizers"]):
            optimizer.load_state_dict(state)
        scaler.load_state_dict(resumed["grad_scaler"])
        torch.set_rng_state(resumed["torch_rng"])
        if on_gpu():
            torch.cuda.set_rng_state_all(resumed["cuda_rng"])
        order.set_state(resumed["batch_rng"])
        curve = [loss.to(DEVICE) for loss in resumed["train_loss"]]
        val_curve = resumed["val_curve"]
        first_step, seconds_before = resumed["step"], resumed["train_seconds"]
        timed_before = (resumed["timed_seconds"], resumed["timed_steps"])
        log(f"{name} resumes at step {first_step} of {train_config.steps}")

    # This call's first WARM_STEPS steps compile and tune kernels: the timed seconds
    # start after them, in every call of a run spread over several.
    warm_until = first_step + WARM_STEPS
    mark = None  # (time, untimed seconds) when this call's warm-up steps were done

    def timed(steps_done: int) -> tuple[float, int]:
        """Seconds and steps trained after each call's warm-up, so far."""
        if mark is None:
            return timed_before
        seconds = time.perf_counter() - mark[0] - (untimed - mark[1])
        return timed_before[0] + seconds, timed_before[1] + steps_done - warm_until

    def save(steps_done: int) -> None:
        if on_gpu():
            torch.cuda.synchronize()
        timed_seconds, timed_steps = timed(steps_done)
        write_checkpoint(
            Path(checkpoint),
            {
                "config_hash": digest,
                "step": steps_done,
                "model": model.state_dict(),
                "optimizers": [optimizer.state_dict() for optimizer, _ in optimizers],
                "grad_scaler": scaler.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if on_gpu() else [],
                "batch_rng": order.get_state(),
                "train_loss": torch.stack(curve).cpu(),
                "val_curve": val_curve,
                "train_seconds": seconds_before
                + time.perf_counter()
                - start
                - untimed,
                "timed_seconds": timed_seconds,
                "timed_steps": timed_steps,
            },
        )

    if on_gpu():
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    start = time.perf_counter()
    untimed = 0.0  # seconds spent evaluating and writing checkpoints
    for step in tqdm(
        range(first_step, train_config.steps),
        desc=name,
        disable=not progress,
        leave=False,
    ):
        if step == warm_until:
            if on_gpu():
                torch.cuda.synchronize()
            mark = (time.perf_counter(), untimed)
        step_loss = 0.0
        for optimizer, lr_multiplier in optimizers:
            optimizer.zero_grad(set_to_none=True)
            for group in optimizer.param_groups:
                group["lr"] = lr_multiplier * lr_at(step, train_config)
        for _ in range(train_config.grad_accumulation):
            x, y = (t.to(DEVICE) for t in next(batches))
            with _autocast(train_config.autocast_dtype):
                loss = loss_fn(model(x), y) / train_config.grad_accumulation
            scaler.scale(loss).backward()
            step_loss = step_loss + loss.detach()
        for optimizer, _ in optimizers:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for optimizer, _ in optimizers:
            scaler.step(optimizer)
        scaler.update()
        curve.append(step_loss)
        if (step + 1) % train_config.eval_every == 0 or step + 1 == train_config.steps:
            t0 = time.perf_counter()
            val_curve.append(
                {
                    "step": step + 1,
                    **evaluate(
                        model,
                        tokens,
                        eval_starts,
                        seq_len,
                        train_config.batch_size,
                        train_config.autocast_dtype,
                    ),
                }
            )
            untimed += time.perf_counter() - t0
        saved = False
        if checkpoint_every is not None and (step + 1) % checkpoint_every == 0:
            t0 = time.perf_counter()
            save(step + 1)
            untimed += time.perf_counter() - t0
            saved = True
        out_of_time = (
            stop_after is not None and time.perf_counter() - called > stop_after
        )
        if out_of_time and step + 1 < train_config.steps:
            if not saved:
                save(step + 1)
            raise Paused(Path(checkpoint), step + 1, train_config.steps)
    if on_gpu():
        torch.cuda.synchronize()
    train_seconds = seconds_before + time.perf_counter() - start - untimed
    timed_seconds, timed_steps = timed(train_config.steps)
    final = evaluate(
        model,
        tokens,
        split.val_starts[: train_config.final_eval_windows],
        seq_len,
        train_config.batch_size,
        train_config.autocast_dtype,
    )
    trained_tokens = windows_trained(train_config) * seq_len
    return {
        "name": name,
        "model": model_config.to_dict(),
        "train": train_config.to_dict(),
        "n_params": model.n_params(),
        "corpus": corpus.describe(),
        "split": {
            "mode": split.mode,
            "train_windows": len(split.train_starts),
            "val_windows": len(split.val_starts),
            "val_seen_fraction": split.val_seen_fraction(
                train_config.final_eval_windows
            ),
        },
        "train_loss": [float(v) for v in torch.stack(curve).float().cpu()],
        "val_curve": val_curve,
        "final": final,
        "train_seconds": train_seconds,
        "timed_seconds": timed_seconds,
        "timed_steps": timed_steps,
        "tokens_per_s": trained_tokens / train_seconds,
        "peak_mem_mb": torch.cuda.max_memory_allocated() / 2**20 if on_gpu() else None,
        "environment": environment(),
    }


# The study. Each entry: name -> (changes to GPTConfig(), changes to TrainConfig()).
# The seed's two models, with all three confounds: its PyTorch baseline fed
# (B, H, T, D), its Triton model without a backward, both on overlapping windows
# split at random.
SEED_BASELINE = {"rope": "torch", "rotate_by_head_index": True}
SEED_TRITON = {"rope": "v2", "preset": "standard", "detach_rope": True}
SEED_MATH = {"preset": "half_truncated", "negative_angle": True}  # its "buggy" maths
OVERLAP = {"overlapping_split": True}
FULL = {"rope": "final", "preset": "standard"}
HALF = {"rope": "final", "preset": "half_truncated"}
FP16_SCALED = {"autocast_dtype": "float16"}  # fp16 autocast with a GradScaler
MIDDLE = {"val_block": "middle"}
STUDIES = {
    "plot_twist": {
        # (a) the seed's pattern
        "seed baseline (3 confounds)": (SEED_BASELINE, OVERLAP),
        "seed triton (3 confounds)": (SEED_TRITON, OVERLAP),
        # (b) one confound switched off at a time
        "seed baseline, by position": ({"rope": "torch"}, OVERLAP),
        "seed triton, with gradient": ({"rope": "v2", "preset": "standard"}, OVERLAP),
        "seed baseline, disjoint split": (SEED_BASELINE, {}),
        "seed triton, disjoint split": (SEED_TRITON, {}),
        # (c) the controlled study: correct code, disjoint split, one change at a time
        "NoPE": ({"rope": "none"}, {}),
        "RoPE base 10000": (FULL, {}),
        "half-truncated base 10000": (HALF, {}),
        "half-truncated base 1024": ({**HALF, "base": 1024.0}, {}),
        "torch baseline (seed math, fp32)": ({"rope": "torch"}, {}),
        "torch baseline (seed math, fp16)": (
            {"rope": "torch", "rope_dtype": "float16"},
            {},
        ),
        "triton final (seed math)": ({"rope": "final", **SEED_MATH}, {}),
    },
    # Issue 17, item 3, in the seed's regime (STUDY_REGIMES): its chapter-4 pair (the
    # PyTorch baseline and V2 without a backward) and its chapter-5 triple (the same
    # baseline, V2 and V4 doing the baseline's maths without a backward), on its split.
    "seed_regime": {
        "seed regime: pytorch (ch4, ch5)": (SEED_BASELINE, OVERLAP),
        "seed regime: triton v2 (ch4)": (SEED_TRITON, OVERLAP),
        "seed regime: triton v2, seed math (ch5)": (
            {**SEED_TRITON, **SEED_MATH},
            OVERLAP,
        ),
        "seed regime: triton v4, seed math (ch5)": (
            {**SEED_TRITON, **SEED_MATH, "rope": "v4"},
            OVERLAP,
        ),
    },
    # Issue 17, item 4. Underflow or precision: plot_twist's fp16-vs-fp32 rotation again
    # with fp16 autocast and a GradScaler, whose scaled gradients do not underflow.
    # Leakage or harder text: its disjoint-split runs validated on the file's middle.
    # (The third, time, needs no runs of its own: every run times its steps after a
    # warm-up, and a study's runs go in a shuffled order within each seed.)
    "confounds": {
        "torch baseline (seed math, fp32), fp16 scaled": (
            {"rope": "torch"},
            FP16_SCALED,
        ),
        "torch baseline (seed math, fp16), fp16 scaled": (
            {"rope": "torch", "rope_dtype": "float16"},
            FP16_SCALED,
        ),
        "seed baseline, middle split": (SEED_BASELINE, MIDDLE),
        "seed triton, middle split": (SEED_TRITON, MIDDLE),
    },
    # Issue 17, item 5: half-truncated against full RoPE as the budget grows. The
    # 400-step runs are plot_twist's (same names and configurations: one file each).
    "budget": {
        "RoPE base 10000": (FULL, {}),
        "half-truncated base 10000": (HALF, {}),
        "RoPE base 10000, 1,500 steps": (FULL, {"steps": 1500}),
        "half-truncated base 10000, 1,500 steps": (HALF, {"steps": 1500}),
        "RoPE base 10000, 5,000 steps": (FULL, {"steps": 5000}),
        "half-truncated base 10000, 5,000 steps": (HALF, {"steps": 5000}),
    },
}
# A study trains in the "default" regime unless named here.
STUDY_REGIMES = {"seed_regime": "seed"}
# A configuration small enough for Triton's interpreter on a CPU (CI trains it).
TINY = (
    {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "max_seq_len": 16},
    {
        "steps": 8,
        "batch_size": 4,
        "warmup_steps": 2,
        "eval_every": 4,
        "eval_windows": 4,
        "final_eval_windows": 8,
    },
)


# The seed author's training regime (issue 17, item 3; the module docstring says what
# still differs). Its 5,000 steps count batches: with 4 per optimizer step, they are
# 1,250 optimizer steps, while its cosine's horizon stays at 5,000 and its warm-up at a
# twentieth of that, so its learning rate ends at 0.9 of its peak, not at 0.1.
REGIMES = {
    "default": ({}, {}),
    "seed": (
        {"dropout": 0.1},
        {
            "optimizer": "muon",
            "autocast_dtype": "float16",
            "grad_accumulation": 4,
            "batch_size": 24,
            "steps": 1250,
            "warmup_steps": 250,
            "schedule_steps": 5000,
            "split_seed": 42,  # its random_split's generator: one split for all seeds
        },
    ),
}


def configs(
    model_changes: dict,
    train_changes: dict,
    *,
    seed: int,
    tiny: bool = False,
    regime_name: str = "default",
):
    """A run's configs: the named regime's (with TINY's sizes if ``tiny``), changed."""
    regime_model, regime_train = REGIMES[regime_name]
    model_config = GPTConfig(**regime_model, **(TINY[0] if tiny else {}))
    train_config = TrainConfig(**{**regime_train, **(TINY[1] if tiny else {})})
    return model_config.replace(**model_changes), replace(
        train_config, seed=seed, **train_changes
    )


RUN_KEYS = ("name", "model", "train", "split", "final", "train_seconds", "tokens_per_s")


def regime(train_config: TrainConfig = TrainConfig()) -> str:
    """How ``train`` runs ``train_config`` here, beyond its configs: on a GPU in its
    autocast (bf16, or fp16 with a GradScaler) with fused AdamW (Muon's partner too) and
    deterministic algorithms, on a CPU in fp32. A run's hash includes it: a CPU run is
    not a GPU run, nor one from before the GPU's runs were repeatable."""
    if not on_gpu():
        return "cpu, fp32"
    if train_config.autocast_dtype == "float16":
        autocast = "fp16 autocast with a GradScaler"
    else:
        autocast = "bf16 autocast"
    optimizer = "fused AdamW"
    if train_config.optimizer == "muon":
        optimizer = "Muon and fused AdamW"
    return f"cuda, {autocast}, {optimizer}, deterministic"


def config_hash(model: dict, train: dict, how: str | None = None) -> str:
    """12 hex digits of the sha256 of a run's full configuration (its model and training
    configs and its regime, as JSON with sorted keys)."""
    whole = {"model": model, "train": train}
    if how is not None:  # records from before the regime was recorded have none
        whole["regime"] = how
    text = json.dumps(whole, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def unseeded_hash(run: dict) -> str:
    """``config_hash`` of a stored run with its seed set to 0: equal for the seeds of
    one configuration."""
    return config_hash(run["model"], {**run["train"], "seed": 0}, run.get("regime"))


def run_file(
    out_dir, name: str, model_config: GPTConfig, train_config: TrainConfig
) -> Path:
    """Where the run of ``name`` with these configs is stored: its name, seed and
    configuration hash."""
    safe = "".join(ch if ch.isalnum() else "_" for ch in name).strip("_")
    digest = config_hash(
        model_config.to_dict(), train_config.to_dict(), regime(train_config)
    )
    return Path(out_dir) / f"{safe}__seed{train_config.seed}__{digest}.json"


def read_run(path) -> dict:
    """The run stored at ``path``; ValueError naming the file if it is not one
    (truncated, empty, not a run's record, or a configuration that does not hash to its
    ``config_hash``)."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    missing = (
        [k for k in RUN_KEYS if k not in record]
        if isinstance(record, dict)
        else RUN_KEYS
    )
    if missing:
        raise ValueError(f"{path}: not a run's record (no {', '.join(missing)})")
    digest = config_hash(record["model"], record["train"], record.get("regime"))
    if record.get("config_hash", digest) != digest:
        raise ValueError(
            f"{path}: its configuration hashes to {digest}, not to its "
            f"config_hash {record['config_hash']}"
        )
    return record


def differences(
    record: dict, model_config: GPTConfig, train_config: TrainConfig
) -> str:
    """What ``record``'s configuration has that these configs (and this machine's
    regime) do not, as 'key: has (wanted)', None for a key left out."""
    wanted = {"model": model_config.to_dict(), "train": train_config.to_dict()}
    found = [
        f"{part}.{key}: {record[part].get(key)!r} (wanted {wanted[part].get(key)!r})"
        for part in wanted
        for key in dict.fromkeys([*wanted[part], *record[part]])
        if record[part].get(key) != wanted[part].get(key)
    ]
    here = regime(train_config)
    if record.get("regime") != here:
        found.append(f"regime: {record.get('regime')!r} (wanted {here!r})")
    return ", ".join(found)


def find_run(path: Path, model_config, train_config, log=print) -> Path | None:
    """The verified file that holds the run ``path`` names (``path`` itself, or a legacy
    file without the hash that records the same configuration); None if there is none.
    The other files of the same name and seed that are corrupt or hold another
    configuration are named through ``log``."""
    stem, digest = path.stem.rsplit("__", 1)
    candidates = [
        path,
        path.with_name(f"{stem}.json"),
        *sorted(path.parent.glob(f"{stem}__*.json")),
    ]
    for candidate in dict.fromkeys(candidates):
        if not candidate.exists():
            continue
        try:
            record = read_run(candidate)
        except ValueError as error:
            log(f"not trusted: {error}")
            continue
        if (
            config_hash(record["model"], record["train"], record.get("regime"))
            == digest
        ):
            return candidate
        log(
            f"{candidate.name} is another configuration than {path.name} "
            f"({differences(record, model_config, train_config)})"
        )
    return None


def write_json(path: Path, record: dict) -> None:
    """Write ``record`` whole or not at all (``replace_atomically``)."""
    replace_atomically(
        path, lambda handle: handle.write(json.dumps(record, indent=1).encode())
    )


@contextmanager
def claim(path: Path):
    """Claim the run stored at ``path`` while it trains: yields True with
    ``<path>.claim`` locked, False if another runner holds that lock. The lock dies with
    its process, so a runner that crashed leaves no claim behind; whoever claims must
    still look for a finished file."""
    claim_path = path.with_name(f"{path.name}.claim")
    with open(claim_path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        # The holder deletes the file as it lets go: a lock taken on a file opened just
        # before that deletion is a lock on nothing. Only the file at the path counts.
        try:
            current = os.stat(claim_path).st_ino
        except FileNotFoundError:
            current = None
        if current != os.fstat(handle.fileno()).st_ino:
            yield False
            return
        try:
            yield True
        finally:
            claim_path.unlink(missing_ok=True)


def run_all(
    plan,
    out_dir,
    *,
    study: str | None = None,
    max_minutes: float | None = None,
    checkpoint_every: int | None = None,
    progress: bool = True,
    log=print,
) -> list[Path]:
    """Train each ``(name, model_config, train_config)`` of ``plan`` that has no
    verified file in ``out_dir`` and that no other runner has claimed; returns the files
    written.

    Without ``checkpoint_every``, stops before a run that ``max_minutes`` would not fit
    (estimated from the runs so far, in proportion to the windows each trains on).
    With it, each run checkpoints to ``<file>.ckpt`` every ``checkpoint_every`` steps
    and resumes from there; when ``max_minutes`` are up, the run in progress pauses at
    its checkpoint (the checkpoint goes once the run's file is written)."""
    seeds = [(name, train_config.seed) for name, _, train_config in plan]
    if len(set(seeds)) != len(seeds):
        raise ValueError(
            f"seeds: a configuration is planned twice with one seed ({seeds})"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = []
    for name, model_config, train_config in plan:
        path = run_file(out_dir, name, model_config, train_config)
        if find_run(path, model_config, train_config, log) is None:
            todo.append((name, model_config, train_config, path))
    corpus = load_corpus() if todo else None
    start, done, work_done = time.perf_counter(), [], 0
    for i, (name, model_config, train_config, path) in enumerate(
        tqdm(todo, desc=study, disable=not progress)
    ):
        elapsed = time.perf_counter() - start
        left = None if max_minutes is None else max_minutes * 60 - elapsed
        work = windows_trained(train_config)
        if max_minutes is not None and (
            left <= 0
            if checkpoint_every is not None
            else done and elapsed / work_done * work > left
        ):
            log(
                f"stopping with {len(todo) - i} runs left (--max-minutes {max_minutes})"
            )
            break
        with claim(path) as claimed:
            if not claimed:
                log(f"{path.name} is claimed by another runner: left to it")
                continue
            if (
                find_run(path, model_config, train_config, log=lambda _: None)
                is not None
            ):
                continue  # another runner finished it since we looked
            checkpoint = path.with_name(f"{path.name}.ckpt")
            try:
                record = train(
                    model_config,
                    train_config,
                    corpus=corpus,
                    progress=False,
                    name=name,
                    checkpoint=checkpoint if checkpoint_every is not None else None,
                    checkpoint_every=checkpoint_every,
                    stop_after=left if checkpoint_every is not None else None,
                    log=log,
                )
            except Paused as paused:
                log(f"{path.name}: {paused} (--max-minutes {max_minutes})")
                break
            record["regime"] = regime(train_config)
            record["config_hash"] = path.stem.rsplit("__", 1)[1]
            if study is not None:
                record["study"] = study
            write_json(path, record)
            checkpoint.unlink(missing_ok=True)
        done.append(path)
        work_done += work
    return done


def study_plan(
    study: str,
    *,
    seeds=(0, 1, 2),
    tiny: bool = False,
    steps: int | None = None,
    regime_name: str | None = None,
):
    """The ``(name, model_config, train_config)`` of each run of ``study`` in the named
    regime (None: the study's own, ``STUDY_REGIMES``), seed by seed, the configurations
    of each seed in an order shuffled by the seed: a run's place in the study (first
    after a start, or late in a warm machine) is then no part of any one
    configuration's times."""
    regime_name = regime_name or STUDY_REGIMES.get(study, "default")
    plan = []
    for seed in seeds:
        names = list(STUDIES[study])
        random.Random(seed).shuffle(names)
        for name in names:
            model_config, train_config = configs(
                *STUDIES[study][name], seed=seed, tiny=tiny, regime_name=regime_name
            )
            if steps is not None:
                train_config = replace(train_config, steps=steps)
            plan.append((name, model_config, train_config))
    return plan


def run_study(
    study: str,
    out_dir,
    *,
    seeds=(0, 1, 2),
    max_minutes: float | None = None,
    tiny: bool = False,
    steps: int | None = None,
    regime_name: str | None = None,
    checkpoint_every: int | None = None,
    progress: bool = True,
    log=print,
) -> list[Path]:
    """Run every (configuration, seed) of ``study`` that has no verified file in
    ``out_dir`` (``run_all`` says how ``max_minutes`` and ``checkpoint_every`` act)."""
    plan = study_plan(
        study, seeds=seeds, tiny=tiny, steps=steps, regime_name=regime_name
    )
    return run_all(
        plan,
        out_dir,
        study=study,
        max_minutes=max_minutes,
        checkpoint_every=checkpoint_every,
        progress=progress,
        log=log,
    )


def load_runs(folder) -> list[dict]:
    """Every run in ``folder``; ValueError naming the first file that is not a run."""
    return [read_run(p) for p in sorted(Path(folder).glob("*.json"))]


def summarize(runs: list[dict]) -> list[dict]:
    """One row per configuration, in the study's order: mean and standard deviation over
    seeds of the final numbers. ValueError if one name holds one seed twice, or runs of
    configurations that differ in more than their seed (their mean would mix unlike
    runs)."""
    order = list(STUDIES.get(runs[0].get("study"), {})) if runs else []
    names = sorted(
        dict.fromkeys(r["name"] for r in runs),
        key=lambda n: order.index(n) if n in order else len(order),
    )
    rows = []
    for name in names:
        mine = [r for r in runs if r["name"] == name]
        seeds = [r["train"]["seed"] for r in mine]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"runs: {name!r} holds a seed twice ({sorted(seeds)})")
        unseeded = {unseeded_hash(r) for r in mine}
        if len(unseeded) > 1:
            raise ValueError(
                f"runs: {name!r} holds runs of {len(unseeded)} configurations; "
                f"summarize one at a time"
            )
        row = {"name": name, "seeds": len(mine)}
        for key, values in (
            ("val_loss", [r["final"]["loss"] for r in mine]),
            ("accuracy", [r["final"]["accuracy"] for r in mine]),
            ("perplexity", [r["final"]["perplexity"] for r in mine]),
            ("train_seconds", [r["train_seconds"] for r in mine]),
            ("tokens_per_s", [r["tokens_per_s"] for r in mine]),
            ("val_seen_fraction", [r["split"]["val_seen_fraction"] for r in mine]),
        ):
            t = torch.tensor(values, dtype=torch.float64)
            row[key] = float(t.mean())
            row[key + "_std"] = float(t.std()) if len(values) > 1 else 0.0
        rows.append(row)
    return rows


def format_summary(rows) -> str:
    header = (
        f"{'configuration':34} {'seeds':>5} {'val loss':>15} {'accuracy':>15} "
        f"{'perplexity':>13} {'train s':>7} {'tokens/s':>9} {'val seen':>8}"
    )
    lines = [header]
    for r in rows:
        lines.append(
            f"{r['name']:34} {r['seeds']:5d} "
            f"{r['val_loss']:7.4f} ± {r['val_loss_std']:.4f} "
            f"{r['accuracy']:7.4f} ± {r['accuracy_std']:.4f} "
            f"{r['perplexity']:6.2f} ± {r['perplexity_std']:4.2f} "
            f"{r['train_seconds']:7.1f} {r['tokens_per_s']:9.0f} "
            f"{r['val_seen_fraction']:8.1%}"
        )
    return "\n".join(lines)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def seed_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"a seed must not be negative, got {value}")
    return value


def dropout_float(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be finite and positive, got {text}")
    return value


def check_writable(parser, folder: str) -> None:
    """Refuse ``--out`` before any training if a file cannot be written there."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        parser.error(f"--out: cannot write in {folder} ({error})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ropetut train", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--study",
        choices=STUDIES,
        help="run a named study instead of one configuration",
    )
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="where each run's JSON goes"
    )
    parser.add_argument("--seeds", type=seed_int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--max-minutes",
        type=positive_float,
        help="stop a study before a run that would not fit; with --checkpoint-every, "
        "pause the run in progress when the time is up",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=positive_int,
        metavar="N",
        help="checkpoint each run every N steps to <its file>.ckpt, and resume a run "
        "from its checkpoint",
    )
    parser.add_argument(
        "--steps", type=positive_int, help="override the number of training steps"
    )
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="a model small enough for the CPU interpreter",
    )
    parser.add_argument(
        "--regime",
        choices=REGIMES,
        help="the training regime of every run (default: 'default', or the study's "
        "own): 'seed' is the seed author's (Muon, fp16 with a GradScaler, dropout 0.1, "
        "4 batches of 24 a step, 1,250 steps, its schedule, its fixed split); the "
        "options from --dropout on change it",
    )
    # one configuration's options: None (or False) when not given, so that the given
    # ones can be checked
    parser.add_argument(
        "--rope", choices=ROPES, help="one configuration's rope (default: final)"
    )
    parser.add_argument("--preset", choices=("standard", "half_truncated"))
    parser.add_argument("--base", type=positive_float, help="default: 10000")
    parser.add_argument(
        "--rope-dtype",
        choices=("float32", "float16", "bfloat16"),
        help="default: float32",
    )
    parser.add_argument("--rotate-by-head-index", action="store_true")
    parser.add_argument("--detach-rope", action="store_true")
    parser.add_argument("--overlapping-split", action="store_true")
    parser.add_argument("--dropout", type=dropout_float, help="default: the regime's")
    parser.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        help="muon: torch's Muon on the blocks' matrices, AdamW on the rest",
    )
    parser.add_argument(
        "--autocast-dtype",
        choices=AUTOCAST_DTYPES,
        help="on a GPU; float16 comes with a GradScaler (a CPU trains in fp32)",
    )
    parser.add_argument(
        "--grad-accumulation", type=positive_int, metavar="N", help="batches a step"
    )
    parser.add_argument(
        "--schedule-steps",
        type=positive_int,
        metavar="N",
        help="the cosine's horizon, in steps (default: the regime's, else --steps)",
    )
    parser.add_argument(
        "--split-seed",
        type=seed_int,
        metavar="N",
        help="draw the overlapping split with this seed, not the run's",
    )
    args = parser.parse_args(argv)
    given = {
        flag: value
        for flag, value in (
            ("rope", args.rope),
            ("preset", args.preset),
            ("base", args.base),
            ("rope-dtype", args.rope_dtype),
            ("rotate-by-head-index", args.rotate_by_head_index or None),
            ("detach-rope", args.detach_rope or None),
            ("overlapping-split", args.overlapping_split or None),
        )
        if value is not None
    }
    training = {
        flag: value
        for flag, value in (
            ("dropout", args.dropout),
            ("optimizer", args.optimizer),
            ("autocast-dtype", args.autocast_dtype),
            ("grad-accumulation", args.grad_accumulation),
            ("schedule-steps", args.schedule_steps),
            ("split-seed", args.split_seed),
        )
        if value is not None
    }
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds: {args.seeds} names a seed twice")
    if args.study and (given or training):
        parser.error(
            f"--{', --'.join([*given, *training])}: a study's configurations are "
            f"fixed, so this does nothing with --study"
        )
    if "split-seed" in training and not args.overlapping_split:
        parser.error(
            "--split-seed: the disjoint split draws nothing, so this does nothing "
            "without --overlapping-split"
        )
    if args.study in STUDY_REGIMES and args.regime is not None:
        parser.error(
            f"--regime: the study {args.study} trains in the "
            f"{STUDY_REGIMES[args.study]!r} regime, its own"
        )
    if not args.study and args.max_minutes is not None:
        parser.error(
            "--max-minutes: stops a study between runs, so does nothing without --study"
        )
    rotation = [flag for flag in given if flag not in ("rope", "overlapping-split")]
    if args.rope == "none" and rotation:
        parser.error(
            f"--{', --'.join(rotation)}: there is no rotation, so this does nothing "
            f"with --rope none"
        )
    try:
        if args.study:
            plan = study_plan(
                args.study,
                seeds=args.seeds,
                tiny=args.tiny,
                steps=args.steps,
                regime_name=args.regime,
            )
        else:
            options = {"rope": "final", **given}
            model_changes = {
                flag.replace("-", "_"): value
                for flag, value in options.items()
                if flag != "overlapping-split"
            }
            train_changes = {"overlapping_split": args.overlapping_split}
            for flag, value in training.items():
                changes = model_changes if flag == "dropout" else train_changes
                changes[flag.replace("-", "_")] = value
            regime_name = args.regime or "default"
            if regime_name != "default":
                options["regime"] = regime_name
            name = " ".join(
                flag if value is True else f"{flag}={value}"
                for flag, value in {**options, **training}.items()
            )
            plan = []
            for seed in args.seeds:
                model_config, train_config = configs(
                    model_changes,
                    train_changes,
                    seed=seed,
                    tiny=args.tiny,
                    regime_name=regime_name,
                )
                if args.steps is not None:
                    train_config = replace(train_config, steps=args.steps)
                plan.append((name, model_config, train_config))
    except ValueError as error:
        parser.error(str(error))
    check_writable(parser, args.out)
    run_all(
        plan,
        args.out,
        study=args.study,
        max_minutes=args.max_minutes,
        checkpoint_every=args.checkpoint_every,
    )
    found = [
        find_run(run_file(args.out, *run), *run[1:], log=lambda _: None) for run in plan
    ]
    runs = [read_run(path) for path in found if path is not None]
    if runs:
        print(format_summary(summarize(runs)))
    if len(runs) < len(plan):
        print(
            f"{len(plan) - len(runs)} of {len(plan)} runs are not finished yet "
            f"(stopped by --max-minutes, or claimed by another runner)"
        )
    return 0
