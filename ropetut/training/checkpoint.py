"""A run's checkpoint: all that ``train`` needs to go on from a step as if it had never
stopped (issue 17, item 3: a device call lasts at most 10 minutes, a run may not).

A checkpoint is one ``torch.save`` file, ``<run file>.ckpt``, written whole or not at
all. It holds the run's configuration hash, the steps done, the model's state, the
optimizers' (AdamW's, or Muon's and AdamW's) and the GradScaler's (empty when it is
off), the RNG states (torch's CPU generator, CUDA's, and the batch order's generator),
the loss curve so far, the evaluation points, the training seconds spent, and those
seconds and steps timed after each call's warm-up.
The learning-rate schedule needs no state of its own: ``lr_at`` is a function of the
step. ``read_checkpoint`` trusts a file only if it loads, has every part, and belongs
to the configuration asked for.
"""

import os
import pickle
import zipfile
from pathlib import Path

import torch

CHECKPOINT_KEYS = (
    "config_hash",
    "step",
    "model",
    "optimizers",
    "grad_scaler",
    "torch_rng",
    "cuda_rng",
    "batch_rng",
    "train_loss",
    "val_curve",
    "train_seconds",
    "timed_seconds",
    "timed_steps",
)


class Paused(Exception):
    """``train`` ran out of its time and left its checkpoint to resume from."""

    def __init__(self, path: Path, step: int, steps: int):
        super().__init__(f"paused at step {step} of {steps}; resumes from {path}")
        self.path, self.step, self.steps = path, step, steps


def replace_atomically(path: Path, write) -> None:
    """Write ``path`` whole or not at all: ``write(handle)`` fills a temporary file
    beside it, flushed to disk, then renamed over it (a rename within a folder is
    atomic)."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def write_checkpoint(path: Path, state: dict) -> None:
    """Store ``state`` (a dict of exactly ``CHECKPOINT_KEYS``) at ``path``."""
    if set(state) != set(CHECKPOINT_KEYS):
        raise ValueError(f"state: needs exactly {CHECKPOINT_KEYS}, got {tuple(state)}")
    replace_atomically(path, lambda handle: torch.save(state, handle))


def read_checkpoint(path: Path, config_hash: str) -> dict:
    """The checkpoint at ``path``; ValueError naming the file if it does not load, lacks
    a part, or is a checkpoint of another configuration than ``config_hash``."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as e:
        raise ValueError(
            f"{path}: not a checkpoint ({type(e).__name__}: {e})"
        ) from None
    missing = (
        [k for k in CHECKPOINT_KEYS if k not in state]
        if isinstance(state, dict)
        else CHECKPOINT_KEYS
    )
    if missing:
        raise ValueError(f"{path}: not a checkpoint (no {', '.join(missing)})")
    if state["config_hash"] != config_hash:
        raise ValueError(
            f"{path}: a checkpoint of configuration {state['config_hash']}, "
            f"not of {config_hash}"
        )
    return state
