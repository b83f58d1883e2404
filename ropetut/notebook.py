"""What every chapter's first cells need: where it ran, and kernel source shown from the library."""
import inspect
import os
import platform
import subprocess
from pathlib import Path

import torch
import triton

from .runtime import on_gpu, runtime_mode

REPO = Path(__file__).resolve().parent.parent
NO_GPU = "no GPU: timings skipped"


def commit() -> str:
    """The ropetut commit: $ROPETUT_COMMIT if set (copies without .git), else git's, '+dirty' if
    ropetut/ has uncommitted changes."""
    if os.environ.get("ROPETUT_COMMIT"):
        return os.environ["ROPETUT_COMMIT"]
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=REPO, text=True,
                             capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "ropetut"], cwd=REPO,
                               text=True, capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def environment() -> dict:
    device = torch.cuda.get_device_name() if on_gpu() else f"CPU ({platform.processor() or platform.machine()})"
    return {"device": device, "mode": runtime_mode(), "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version(),
            "ropetut commit": commit()}


def print_environment() -> None:
    """The first code cell of every chapter: every stored output says where it came from."""
    for key, value in environment().items():
        print(f"{key:15} {value}")


def show_source(obj):
    """Display a function's or module's source, highlighted: the library is the only copy."""
    from IPython.display import Markdown
    target = getattr(obj, "fn", obj)   # a @triton.jit kernel wraps the Python function in .fn
    return Markdown(f"```python\n{inspect.getsource(target).rstrip()}\n```")
