"""The one gate in front of every kernel: argument checks, and torch's rules for in
place.

``check_rope_args`` raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (wrong
shape, value or device, or something the chosen kernel can't do) naming the argument.
Every check runs before anything is written, so a refused call leaves q and k as they
were. It hands back (B, T, H, D) views of q and k, whatever the caller's layout, and a
``RopeOptions``.

It never reads a tensor's values, so it never waits for the GPU: a call can be captured
in a CUDA graph and traced by ``torch.compile``. The one check that needs values,
positions inside the table, is ``check_positions_in_range``: opt-in
(``check_positions=True``), because it syncs. Without it the kernel keeps every read
inside the table and writes NaN for a token whose position is out of range.

In place, the rules are torch's own: no element of q or k may share memory with another
element that is written (``check_no_overlap``), and autograd must be able to record the
write (``check_autograd_allows_inplace``); both are checked here, before the kernel
writes.

What each kernel can do is read from the registry below (``ropetut.kernels``): its
``Supports``.
"""

from functools import lru_cache

import torch
from torch._subclasses.fake_tensor import is_fake

from .kernels import (
    FLOAT_DTYPES,
    RopeOptions,
    get_kernel,
    rows_fit_vectors,
    unavailable,
)
from .kernels.final import _last_offset  # furthest element indexing a tensor reaches
from .runtime import DEVICE, INTERPRETED

LAYOUTS = ("bthd", "bhtd")


def check_rope_args(
    q,
    k,
    cos,
    sin,
    positions=None,
    *,
    kernel,
    rotary_dim=None,
    interleaved=False,
    inplace=False,
    layout="bthd",
    check_positions=False,
    wants_grad=False,
):
    """Validate everything; returns (q, k, options) with q, k as (B, T, H, D) views.

    kernel: a registry entry (``ropetut.kernels.KERNELS[impl]``) or its name, ``impl``.
    wants_grad: autograd will record this call (in place, its refusals are checked
       here).

    A plain call (dense torch tensors, out of place, no positions, eager) is checked in
    full once per ``_plain_key``: every check it passes is a function of that key, so a
    call with the same key passes them all again, and skips to the result (host time,
    chapter 6)."""
    if isinstance(kernel, str):
        kernel = get_kernel(kernel)
    key = _plain_key(
        q,
        k,
        cos,
        sin,
        positions,
        kernel,
        rotary_dim,
        interleaved,
        inplace,
        layout,
        check_positions,
    )
    rotary_dim_passed = None if key is None else _PASSED.get(key)
    if rotary_dim_passed is not None:
        return (
            _as_bthd(q, layout),
            None if k is None else _as_bthd(k, layout),
            RopeOptions(
                cos.contiguous(),
                sin.contiguous(),
                None,
                interleaved,
                rotary_dim_passed,
                False,
                kernel,
            ),
        )
    if (
        kernel.why_unavailable
        and not torch.compiler.is_compiling()
        and unavailable(kernel.name)
    ):
        raise RuntimeError(unavailable(kernel.name))
    q4, k4, rotary_dim = check_qk(
        q,
        k,
        layout=layout,
        rotary_dim=rotary_dim,
        flags=(
            ("interleaved", interleaved),
            ("inplace", inplace),
            ("check_positions", check_positions),
        ),
    )
    B, T = q4.shape[:2]
    for name, table in (("cos", cos), ("sin", sin)):
        if not isinstance(table, torch.Tensor):
            raise TypeError(
                f"{name}: must be a torch.Tensor, got {type(table).__name__}"
            )
        if table.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name}: dtype {table.dtype} is not a floating type")
        if table.dim() != 2 or table.shape[1] != rotary_dim // 2:
            raise ValueError(
                f"{name}: must be (n_positions, rotary_dim/2 = {rotary_dim // 2}), "
                f"got {tuple(table.shape)}"
            )
        if table.requires_grad and torch.is_grad_enabled():
            raise ValueError(
                f"{name}: requires grad, but ropetut computes no gradient for the "
                f"tables; pass {name}.detach(), or compute the tables inside "
                f"torch.no_grad()"
            )
    if sin.shape != cos.shape:
        raise ValueError(
            f"sin: shape {tuple(sin.shape)} differs from cos's {tuple(cos.shape)}"
        )
    if sin.dtype != cos.dtype:
        raise TypeError(f"sin: dtype {sin.dtype} differs from cos's {cos.dtype}")
    n_positions = cos.shape[0]
    if positions is None:
        if n_positions < T:
            raise ValueError(f"cos: has {n_positions} positions, too short for T={T}")
    else:
        check_positions_arg(positions, B, T)
    check_device(q, (("k", k), ("cos", cos), ("sin", sin), ("positions", positions)))
    cos, sin = cos.contiguous(), sin.contiguous()
    if inplace:
        check_inplace_writes(
            q,
            k,
            q4,
            k4,
            (("cos", cos), ("sin", sin), ("positions", positions)),
            wants_grad=wants_grad,
        )
    check_supports(
        kernel,
        q4,
        k4,
        cos,
        sin,
        positions,
        interleaved=interleaved,
        rotary_dim=rotary_dim,
        inplace=inplace,
    )
    if check_positions and positions is not None and _has_memory(positions):
        check_positions_in_range(positions, n_positions)  # last: it waits for the GPU
    options = RopeOptions(
        cos,
        sin,
        None if positions is None else positions.expand(B, T),
        interleaved,
        rotary_dim,
        inplace,
        kernel,
        check_positions,
    )
    if key is not None:
        # a bound on memory for callers that never repeat a shape
        if len(_PASSED) >= 1024:
            _PASSED.clear()
        _PASSED[key] = rotary_dim
    return q4, k4, options


# _plain_key -> the resolved rotary_dim of a plain call that passed every check
_PASSED = {}


def _plain_key(
    q,
    k,
    cos,
    sin,
    positions,
    kernel,
    rotary_dim,
    interleaved,
    inplace,
    layout,
    check_positions,
):
    """What every check of a plain call reads: types, shapes, strides, dtypes, devices
    and the options, whether the tables require grad where autograd would record it, and
    which kernel (one that reads pointers, ``Supports.vector_bytes``, is not plain).
    None for any other call: in place (addresses, version counters), positions, a tensor
    subclass, tracing, an optional kernel (whether it can run is asked each time)."""
    tensor = torch.Tensor
    if (
        inplace is not False
        or check_positions is not False
        or positions is not None
        or not (interleaved is True or interleaved is False)
        or type(layout) is not str
        or type(q) is not tensor
        or type(cos) is not tensor
        or type(sin) is not tensor
        or not (k is None or type(k) is tensor)
        or type(rotary_dim) not in (int, type(None))
        or torch.compiler.is_compiling()
        or kernel.supports.vector_bytes
        or kernel.why_unavailable is not None
    ):
        return None
    return (
        kernel,
        layout,
        rotary_dim,
        interleaved,
        q.shape,
        q.stride(),
        q.dtype,
        q.device,
        None if k is None else (k.shape, k.stride(), k.dtype, k.device),
        cos.shape,
        cos.stride(),
        cos.dtype,
        cos.device,
        sin.shape,
        sin.stride(),
        sin.dtype,
        sin.device,
        (cos.requires_grad or sin.requires_grad) and torch.is_grad_enabled(),
    )


def check_qk(q, k, *, layout, rotary_dim, flags=()):
    """q and k (any strides), their layout, rotary_dim and the bool ``flags`` ((name,
    value) pairs), for every RoPE entry point: returns (q4, k4, rotary_dim), q and k as
    (B, T, H, D) views and rotary_dim resolved (None: D)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: must be one of {LAYOUTS}, got {layout!r}")
    for name, flag in flags:
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: must be a bool, got {type(flag).__name__}")
    _check_tensor(q, "q", layout)
    q4 = _as_bthd(q, layout)
    B, T, Hq, D = q4.shape
    if D % 2:
        raise ValueError(f"q: head dim must be even to form pairs, got D={D}")
    k4 = None
    if k is not None:
        _check_tensor(k, "k", layout)
        if k.dtype != q.dtype:
            raise TypeError(f"k: dtype {k.dtype} differs from q's {q.dtype}")
        k4 = _as_bthd(k, layout)
        Bk, Tk, Hk, Dk = k4.shape
        if (Bk, Tk, Dk) != (B, T, D):
            raise ValueError(
                f"k: (batch, seq, head_dim) = {(Bk, Tk, Dk)} must match q's {(B, T, D)}"
            )
        if Hk and Hq % Hk:
            raise ValueError(
                f"k: q's {Hq} heads are not a multiple of k's {Hk} heads "
                "(GQA needs Hq % Hkv == 0)"
            )
    if rotary_dim is None:
        rotary_dim = D
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise TypeError(f"rotary_dim: must be an int, got {type(rotary_dim).__name__}")
    if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > D:
        raise ValueError(
            f"rotary_dim: must be even and in [2, D={D}], got {rotary_dim}"
        )
    return q4, k4, rotary_dim


def check_positions_arg(positions, B, T):
    """positions given as a tensor: integers, (T,) or (B, T). (Their values: see
    ``check_positions_in_range``.)"""
    if not isinstance(positions, torch.Tensor):
        raise TypeError(
            f"positions: must be a torch.Tensor, got {type(positions).__name__}"
        )
    if positions.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"positions: dtype must be int32 or int64, got {positions.dtype}"
        )
    if tuple(positions.shape) not in ((T,), (B, T)):
        raise ValueError(
            f"positions: shape must be (T,) = {(T,)} or (B, T) = {(B, T)}, "
            f"got {tuple(positions.shape)}"
        )


def check_device(q, others):
    """Every tensor of ``others`` ((name, tensor or None) pairs) on q's device, and that
    the device this runtime runs on."""
    device = q.device
    for name, t in others:
        if t is not None and t.device != device:
            raise ValueError(f"{name}: on {t.device}, but q is on {device}")
    if device.type != DEVICE.type:
        mode = (
            "Triton's interpreter (no CUDA device)"
            if INTERPRETED
            else "compiled GPU kernels"
        )
        raise ValueError(
            f"q: ropetut runs {mode} and needs {DEVICE.type} tensors, got {device}"
        )


def check_inplace_writes(q, k, q4, k4, read_only, *, wants_grad):
    """In place, before anything is written: no overlap (q, k, and the ``read_only``
    (name, tensor) pairs), no inference tensor outside inference mode, and, when
    autograd records the call, none of autograd's in-place refusals."""
    check_no_overlap(q4, k4, read_only)
    for name, t in (("q", q), ("k", k)):  # (a traced graph has no inference tensors)
        if (
            t is not None
            and _has_memory(t)
            and t.is_inference()
            and not torch.is_inference_mode_enabled()
        ):
            raise ValueError(
                f"{name}: in place on an inference tensor outside "
                f"torch.inference_mode(); torch forbids it: pass inplace=False"
            )
    if wants_grad and _has_memory(q):  # (traced: the graph's copy_ checks instead)
        for name, t in (("q", q), ("k", k)):
            if t is not None and t.requires_grad:
                check_autograd_allows_inplace(t, name)


def check_supports(
    kernel, q, k, cos, sin, positions, *, interleaved, rotary_dim, inplace
):
    """What the kernel can't do, refused by argument: reads its ``Supports`` record."""
    # (traced once)
    refuse = _refusal.__wrapped__ if torch.compiler.is_compiling() else _refusal
    refusal = refuse(
        kernel,
        interleaved,
        positions is not None,
        inplace,
        rotary_dim != q.shape[-1],
        q.dtype,
        cos.dtype,
    )
    if refusal is not None:
        error, message = refusal
        raise error(message)
    can, impl = kernel.supports, kernel.name
    # 32-bit offsets: the furthest element reached counts
    if can.max_elements is not None:
        for name, t in (("q", q), ("k", k)):
            if t is not None and _last_offset(t) + 1 >= can.max_elements:
                raise ValueError(
                    f"{name}: impl={impl!r} indexes with 32-bit integers, and {name} "
                    f"reaches {_last_offset(t) + 1} elements; use impl='final'"
                )
    if can.vector_bytes:
        _check_vector_rows(impl, can.vector_bytes, q, k, cos, sin)


@lru_cache(maxsize=1024)
def _refusal(kernel, interleaved, has_positions, inplace, partial, dtype, table_dtype):
    """(error type, message) for what the kernel's record says it can't do, or None: a
    pure function of a few flags, so it is computed once per combination (host time)."""
    can, impl = kernel.supports, kernel.name
    use = "; use impl='final'"
    if interleaved and "interleaved" not in can.pairs:
        return ValueError, f"interleaved: impl={impl!r} only has half-split pairs{use}"
    if not interleaved and "half" not in can.pairs:
        return ValueError, f"interleaved: impl={impl!r} only has interleaved pairs{use}"
    for name, asked, supported in (
        ("positions", has_positions, can.positions),
        ("inplace", inplace, can.inplace),
        ("rotary_dim", partial, can.partial),
    ):
        if asked and not supported:
            return ValueError, f"{name}: impl={impl!r} does not support it{use}"
    for name, t_dtype in (("q", dtype), ("cos", table_dtype)):
        if t_dtype not in can.dtypes:
            return (
                TypeError,
                f"{name}: impl={impl!r} takes {can.dtypes}, got {t_dtype}{use}",
            )
    return None


def _check_vector_rows(impl, vector_bytes, q, k, cos, sin):
    # (torch.compile traces fake tensors, which have no address: the kernel's caller
    # copies a misaligned tensor at run time instead)
    check_pointer = _has_memory(q)
    for name, t in (("cos", cos), ("sin", sin)):
        if check_pointer and t.data_ptr() % vector_bytes:
            raise ValueError(
                f"{name}: impl={impl!r} needs a {vector_bytes}-byte aligned table; "
                f"pass {name}.clone()"
            )
    D = q.shape[-1]
    vec = vector_bytes // q.element_size()
    if (D // 2) % vec:
        raise ValueError(
            f"q: impl={impl!r} reads {vec} elements at a time, so D/2 must be a "
            f"multiple of {vec}, got D={D}; use impl='final'"
        )
    for name, t in (("q", q), ("k", k)):
        if t is not None and not rows_fit_vectors(
            t, vector_bytes, check_pointer=check_pointer
        ):
            raise ValueError(
                f"{name}: impl={impl!r} needs unit stride in the head dim, the other "
                f"strides multiples of {vec} elements and a {vector_bytes}-byte "
                f"aligned start, got strides {t.stride()}; pass {name}.contiguous() "
                f"or use impl='final'"
            )


def check_no_overlap(q: torch.Tensor, k: torch.Tensor | None, read_only=()) -> None:
    """In place, as torch's own in-place ops: refuse a q or k with elements that share
    memory (an ``expand()``, an overlapping ``as_strided``), a q and k that share any
    element, and a q or k that overlaps what the kernel only reads (``read_only``:
    (name, tensor) pairs, the tables and positions). Views of one fused projection (q, k
    side by side in each row) interleave without sharing an element, and pass. Memory is
    compared by address, so views of one buffer through different storages
    (``from_dlpack``, ``frombuffer``) are caught too. A layout whose elements can't be
    proved apart is refused."""
    # fake tensors (torch.compile tracing): the traced graph is functional
    if not _has_memory(q):
        return
    written = [
        (name, t, _address_range(t))
        for name, t in (("q", q), ("k", k))
        if t is not None and t.numel()
    ]
    for name, t, _ in written:
        # (dense memory never overlaps itself)
        if not t.is_contiguous() and _dims(t) is None:
            raise ValueError(
                f"{name}: in place, but some of its elements share memory (strides "
                f"{t.stride()} for shape {tuple(t.shape)}, e.g. from expand()); "
                f"pass {name}.contiguous() or inplace=False"
            )
    if len(written) == 2 and _meet(written[0][2], written[1][2]):
        delta, rem = divmod(k.data_ptr() - q.data_ptr(), q.element_size())
        if rem or _shares_an_element(_dims(q), _dims(k), delta):
            raise ValueError(
                "k: in place, q and k must not share memory (they overlap); "
                "pass inplace=False or separate tensors"
            )
    for name, t in read_only:
        if t is not None and t.numel():
            span = _address_range(t)
            if any(_meet(span, x_span) for *_, x_span in written):
                raise ValueError(
                    f"{name}: in place, q or k shares memory with {name}, which "
                    f"the kernel reads while it writes; pass inplace=False"
                )


def _has_memory(t):
    """False for the fake tensors a compiler traces with (their data pointers mean
    nothing)."""
    if type(t) is torch.Tensor and not torch.compiler.is_compiling():
        return t.device.type != "meta"
    return not (torch.compiler.is_compiling() or is_fake(t) or t.device.type == "meta")


def _address_range(t):
    """[first byte, past the last byte] of what indexing t reaches (t non-empty)."""
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + t.nbytes
    return start, start + (_last_offset(t) + 1) * t.element_size()


def _meet(a, b):
    return a[0] < b[1] and b[0] < a[1]


@lru_cache(maxsize=1024)
def _dims_of(shape, stride):
    dims = sorted((st, n) for n, st in zip(shape, stride) if n > 1)
    reach = 0
    for st, n in dims:
        if st <= reach:
            return None
        reach += (n - 1) * st
    return tuple((n, st) for st, n in dims)


def _dims(t):
    """t's (size, stride) pairs, smallest stride first, without size-1 dims; None unless
    each stride is larger than everything the smaller strides reach (which proves no two
    elements share memory)."""
    return _dims_of(tuple(t.shape), t.stride())


@lru_cache(maxsize=1024)
def _shares_an_element(q_dims, k_dims, delta):
    """Is an element of q at offset delta from an element of k? Exact: the difference of
    two offsets is sum((i_d - j_d) * stride_d), found a digit at a time from the largest
    stride. Each stride exceeds what a tensor's smaller strides reach, so few digits
    ever fit; a search that still grows past a bound answers yes (unknown, so
    refused)."""
    q_size, k_size = {st: n for n, st in q_dims}, {st: n for n, st in k_dims}
    strides = sorted(set(q_size) | set(k_size))
    dims = [(st, q_size.get(st, 1), k_size.get(st, 1)) for st in strides]
    budget = [10_000]

    def search(level, rest):
        budget[0] -= 1
        if budget[0] < 0:
            return True
        if level < 0:
            return rest == 0
        st, nq, nk = dims[level]
        # what q's smaller strides reach
        below_q = sum((n - 1) * s for s, n, _ in dims[:level])
        below_k = sum((n - 1) * s for s, _, n in dims[:level])
        # rest = c * st + (q's smaller digits) - (k's), the second part in
        # [-below_k, below_q]
        lo = max(-(nk - 1), -((below_q - rest) // st))
        hi = min(nq - 1, (rest + below_k) // st)
        return any(search(level - 1, rest - c * st) for c in range(lo, hi + 1))

    return search(len(dims) - 1, delta)


def check_autograd_allows_inplace(t: torch.Tensor, name: str) -> None:
    """The errors autograd would raise after an in-place write, raised before it: the
    kernel writes first and autograd checks after, so a refused call would have rotated
    t already."""
    if t.is_leaf:
        raise ValueError(
            f"{name}: in place on a leaf tensor that requires grad; autograd "
            f"forbids it (torch raises the same): pass inplace=False"
        )
    base = t._base
    if base is not None and base.is_leaf and base.requires_grad:
        raise ValueError(
            f"{name}: in place on a view of a leaf tensor that requires grad; "
            f"autograd forbids it: pass inplace=False"
        )
    # torch's private record
    meta = getattr(torch._C._autograd, "_get_creation_meta", None)
    if (
        base is not None
        and meta is not None
        and meta(t) != torch._C._autograd.CreationMeta.DEFAULT
    ):
        raise ValueError(
            f"{name}: in place on a view that autograd can't rewrite ({meta(t)}: a "
            f"view from unbind/split/chunk, or made under no_grad); pass "
            f"inplace=False or take views by indexing"
        )


def check_positions_in_range(positions: torch.Tensor, n_positions: int) -> None:
    """ValueError unless every position indexes a row of the table. Reads the values, so
    it waits for the GPU: ``apply_rope(..., check_positions=True)`` asks for it; nothing
    else does."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise ValueError(
            "check_positions: reading positions on the host is impossible while a "
            "CUDA graph is being captured; check before capturing"
        )
    if positions.numel():
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= n_positions:
            raise ValueError(
                f"positions: values must lie in [0, {n_positions}) (the rows of cos), "
                f"found [{lo}, {hi}]"
            )


def _check_tensor(x, name, layout):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name}: dtype {x.dtype} is not a floating type {FLOAT_DTYPES}"
        )
    if x.dim() != 4:
        dims = "(B, T, H, D)" if layout == "bthd" else "(B, H, T, D)"
        raise ValueError(
            f"{name}: must be 4-D {dims} for layout={layout!r}, got {tuple(x.shape)}"
        )


def _as_bthd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A (B, T, H, D) view of the same memory: kernels index through strides, so no
    copy."""
    return x.transpose(1, 2) if layout == "bhtd" else x
