"""launch: a kernel's launch plan kept per key; a launch that skips Triton's wrapper.

``kernel[grid](...)`` re-derives the kernel's specialization from every argument on
every call, which costs more host time than a small kernel's GPU time (chapter 6).
``final.rope_final`` avoids it with a cache of its own, printed in chapter 6; this file
is the same cache for the other kernels (``angles``, ``qk_norm_rope``), in two parts:

- ``kept_launch(kernel, key, make_plan)``: the launch kept under ``key``: its ``Plan``
  (grid, warps and every argument after the pointers), made by ``make_plan()`` on first
  use. The key must hold everything the plan is computed from: shapes, strides,
  dtypes, device and options (the callers' keys say which). Plans are plain Python
  values, kept on every device, the interpreter's too.
- ``launch(kernel, kept, pointers)``: the first launch of a kept launch goes through
  ``kernel[grid](...)``, which compiles; the compiled kernel is kept beside the plan,
  and the next launches hand the arguments and the current stream straight to its
  launcher: one dict lookup a call, as ``final``'s. The compiled kernel also depends on
  each pointer's 16-byte alignment, which the key does not hold: a launch with a
  misaligned pointer (rare: a view at an odd offset) goes through ``kernel[grid](...)``
  every time, and one with all pointers aligned uses only a kernel compiled for
  aligned pointers. The kept kernel is loaded on the GPU it was compiled for: a launch
  while another GPU is current (tensors on cuda:1, ``torch.cuda.current_device()`` 0)
  goes through ``kernel[grid](...)``, which launches on the current GPU as Triton
  always does.

What the direct launch skips: Triton's launch hooks (profilers such as Proton see no
cached launch). It calls Triton's private launcher interface, so it is used only where
``final.direct_launch_matches()`` finds that the installed Triton calls it the same
way; elsewhere every launch goes through ``kernel[grid](...)``. Under the interpreter
nothing compiles, so nothing but plans is kept.

Nothing kept is a tensor: a launch captured in a CUDA graph keeps no memory alive, and
sees none freed. At most ``MAX_KEPT`` keys are kept (then it starts again), a bound for
callers that never repeat a shape.
"""

from typing import NamedTuple

import torch

from .final import direct_launch_matches

MAX_KEPT = 4096
ALIGNMENT = 16  # bytes: Triton specializes a pointer on it


class Plan(NamedTuple):
    """A launch, but for its pointers."""

    grid: tuple  # (x, y, z)
    args: tuple  # every argument after the pointers, in the kernel's order
    num_warps: int
    programs: tuple = ()  # what the caller needs besides (qk_norm_rope: q's, k's)


class Kept:
    """A key's launch: its plan and, once launched with every pointer aligned, the
    compiled kernel and the GPU it was compiled for."""

    __slots__ = ("plan", "compiled", "device")

    def __init__(self, plan: Plan):
        self.plan, self.compiled, self.device = plan, None, None


_KEPT = {}  # (kernel, key) -> Kept


def kept_launch(kernel, key, make_plan) -> Kept:
    """The launch kept for kernel under key; ``make_plan()`` makes its plan on first
    use."""
    kept = _KEPT.get((kernel, key))
    if kept is None:
        if len(_KEPT) >= MAX_KEPT:
            _KEPT.clear()
        kept = _KEPT[kernel, key] = Kept(make_plan())
    return kept


def launch(kernel, kept: Kept, pointers) -> None:
    """``kernel[plan.grid](*pointers, *plan.args)``, straight to the compiled kernel
    once one is kept and every pointer is 16-byte aligned. pointers: the kernel's
    tensor arguments, in its order, before plan.args."""
    plan = kept.plan
    addresses = 0
    for t in pointers:  # (a plain loop: a generator costs a microsecond more)
        addresses |= t.data_ptr()
    aligned = addresses % ALIGNMENT == 0
    if not aligned or kept.compiled is None:
        compiled = kernel[plan.grid](*pointers, *plan.args, num_warps=plan.num_warps)
        # compiled is None: interpreted
        if aligned and compiled is not None and direct_launch_matches():
            kept.compiled, kept.device = compiled, pointers[0].get_device()
        return
    compiled, device = kept.compiled, kept.device
    if device != torch._C._cuda_getDevice():  # another GPU is current: see above
        kernel[plan.grid](*pointers, *plan.args, num_warps=plan.num_warps)
        return
    # What ``kernel[grid](...)`` does, without its Python wrapper: no launch hooks
    compiled.run(
        *plan.grid,
        torch._C._cuda_getCurrentRawStream(device),
        compiled.function,
        compiled.packed_metadata,
        None,
        None,
        None,
        *pointers,
        *plan.args,
    )
