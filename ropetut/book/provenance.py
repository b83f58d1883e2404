"""Where a result came from: the ropetut commit and the machine, torch and
triton it ran on.

Every stored output names its provenance: chapters print it first, ``train`` and
``bench`` write it into their JSON, and the seed ledger records it with each verdict.
"""

import os
import platform
import subprocess
from pathlib import Path

import torch
import triton

from ..runtime import on_gpu, runtime_mode

REPO = Path(__file__).resolve().parents[2]


def commit() -> str:
    """The ropetut commit: $ROPETUT_COMMIT if set (copies without .git), else git's,
    '+dirty' if ropetut/ has uncommitted changes."""
    if os.environ.get("ROPETUT_COMMIT"):
        return os.environ["ROPETUT_COMMIT"]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=10", "HEAD"],
            cwd=REPO,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "ropetut"],
            cwd=REPO,
            text=True,
            capture_output=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def environment() -> dict:
    device = (
        torch.cuda.get_device_name()
        if on_gpu()
        else f"CPU ({platform.processor() or platform.machine()})"
    )
    return {
        "device": device,
        "mode": runtime_mode(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "ropetut commit": commit(),
    }
