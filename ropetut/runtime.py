"""Which way ropetut runs its kernels: compiled on a CUDA GPU, or through Triton's
interpreter on the CPU.

This module must be imported before any module that defines a ``@triton.jit`` kernel:
``triton.jit`` decides at decoration time whether to compile or to interpret, from the
``TRITON_INTERPRET`` environment variable. ``ropetut/__init__.py`` imports it first.
"""

import os
import sys

import torch

TRUE = ("1", "true", "yes", "on", "y")  # what Triton reads as a true TRITON_INTERPRET

if not torch.cuda.is_available():
    interpreting = os.environ.get("TRITON_INTERPRET", "").lower() in TRUE
    if "triton" in sys.modules and not interpreting:
        # triton's own @jit helpers (tl.sum, tl.max, ...) were decorated to compile:
        # the interpreter would refuse them inside ropetut's kernels, much later
        raise ImportError(
            "triton was imported before ropetut, on a machine without a CUDA GPU "
            "(by you, or by torch.compile, torch._dynamo or Liger-Kernel): ropetut "
            "runs its kernels in Triton's interpreter here, and triton chooses at "
            "import. Import ropetut first, or set TRITON_INTERPRET=1 before anything"
        )
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRETED = os.environ.get("TRITON_INTERPRET", "").lower() in TRUE
DEVICE = torch.device("cpu") if INTERPRETED else torch.device("cuda")


def runtime_mode() -> str:
    """'gpu' when kernels compile for CUDA, 'interpreter' when Triton interprets
    them on the CPU."""
    return "interpreter" if INTERPRETED else "gpu"


def on_gpu() -> bool:
    return not INTERPRETED


def pick(*, gpu, cpu):
    """The GPU value on a GPU, the CPU value under the interpreter
    (sizes, repeat counts, ...)."""
    return gpu if on_gpu() else cpu


NO_GPU = "no GPU: timings skipped"  # what a timing prints under the interpreter
