"""Every path the library documents as never waiting for the GPU, checked on the GPU.

The promises: ``apply_rope`` (ropetut/autograd.py, README.md; its validation in
ropetut/validate.py), with positions or without, in place, and with ``impl="cute"``
where CuTeDSL runs, ``apply_rope_angles`` (ropetut/angles.py, angles_op.py,
kernels/angles.py), ``apply_qk_norm_rope`` (ropetut/qk_norm.py, qk_norm_op.py),
``packed_positions`` and ``apply_rope_thd`` (ropetut/packed.py),
``hf.apply_rotary_pos_emb`` (ropetut/hf.py), and dynamic NTK and LongRoPE with the
length a device tensor, feeding the table-free kernel (ropetut/scaling.py). The three
entry points are checked under ``torch.compile`` too: "neither path", eager or the
registered operators, waits (autograd.py, qk_norm.py; angles.py: "the paths are
``apply_rope``'s").

Each path, forward and (where differentiable) forward+backward, fp32 and bf16, with
positions and lengths as device tensors, is
1. warmed up (compiling may sync), then run under ``set_sync_debug_mode("error")``: a
   device-to-host sync anywhere, backward included, raises;
2. captured in a ``torch.cuda.CUDAGraph`` and replayed on fresh inputs copied into the
   captured buffers: each replay gives what an eager call on those inputs gives.
"""

from collections import namedtuple

import pytest
import torch
from conftest import gpu_only, randn, tables

import ropetut
from ropetut import hf, scaling
from ropetut.check import relative_error
from ropetut.kernels import unavailable

B, T, HQ, HK, D = 2, 64, 4, 2, 64
N = 256  # table rows; positions are drawn in [0, N)
TOTAL, SEQS = B * T, 4  # packed: tokens, sequences (each at most T/2 long, padded)
TRAINED = 4096  # the scaling variants' trained length
LENGTHS = (100, 40000, 2000)  # make(i)'s length: below TRAINED, above, below
DEV = ropetut.DEVICE

# make(i): a fresh list of inputs (i = 0: the captured buffers; 1, 2: the replays');
# call(*inputs): the path; grad: which inputs fwd+bwd differentiates.
Case = namedtuple("Case", "make call grad")


def _qk(dtype, bhtd=False):
    """q and k, (B, T, H, D), or (B, H, T, D) for bhtd."""
    return [randn(B, H, T, D, dtype=dtype) if bhtd else randn(B, T, H, D, dtype=dtype)
            for H in (HQ, HK)]  # fmt: skip


def _positions():
    return torch.randint(0, N, (B, T), device=DEV)


def _qk_positions(dtype):
    return lambda i: [*_qk(dtype), _positions()]


def _packed():
    """cu_seqlens (int32, padding after the last sequence) and seqlen_offsets."""
    lengths = torch.randint(0, T // 2 + 1, (SEQS,), device=DEV)
    cu_seqlens = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).int()
    return [cu_seqlens, torch.randint(0, N - T // 2, (SEQS,), device=DEV)]


def _compiled(call, compiled):
    return torch.compile(call, fullgraph=True) if compiled else call


def rope(dtype, compiled=False, inplace=False, impl="final", positions=True):
    cos, sin = tables(D, N)

    def call(q, k, positions=None):
        if inplace:  # on copies: the buffers stay the replay's inputs
            q, k = q.clone(), k.clone()
        return ropetut.apply_rope(
            q, k, cos, sin, positions=positions, inplace=inplace, impl=impl
        )

    make = _qk_positions(dtype) if positions else lambda i: _qk(dtype)
    return Case(make, _compiled(call, compiled), (0, 1))


def angles(dtype, compiled=False):
    inv_freq = scaling.default(D, device=DEV)[0]

    def call(q, k, positions):
        return ropetut.apply_rope_angles(q, k, inv_freq, positions=positions)

    return Case(_qk_positions(dtype), _compiled(call, compiled), (0, 1))


def qk_norm(dtype, compiled=False):
    cos, sin = tables(D, N)

    def make(i):
        return [*_qk(dtype), 1 + randn(D) / 10, 1 + randn(D) / 10, _positions()]

    def call(q, k, w_q, w_k, positions):
        return ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin, positions=positions)

    return Case(make, _compiled(call, compiled), (0, 1, 2, 3))


def packed_positions(dtype):
    def call(cu_seqlens, offsets):
        return ropetut.packed_positions(cu_seqlens, TOTAL, offsets)

    return Case(lambda i: _packed(), call, ())


def thd(dtype):
    cos, sin = tables(D, N)

    def make(i):
        q, k = (randn(TOTAL, H, D, dtype=dtype) for H in (HQ, HK))
        return [q, k, *_packed()]

    def call(q, k, cu_seqlens, offsets):
        return ropetut.apply_rope_thd(
            q, k, cos, sin, cu_seqlens=cu_seqlens, seqlen_offsets=offsets
        )

    return Case(make, call, (0, 1))


def hf_rotary(dtype):
    """HF's full-width (B, T, D) cos and sin, in q's dtype as HF's rotary makes them."""
    cos, sin = tables(D, N)

    def make(i):
        rows = _positions()
        full = [torch.cat([t[rows]] * 2, -1).to(dtype) for t in (cos, sin)]
        return [*_qk(dtype, bhtd=True), *full]

    return Case(make, hf.apply_rotary_pos_emb, (0, 1))


def _scaled(dtype, variant, **kwargs):
    """A variant's inv_freq for a length on the device, into the table-free kernel."""

    def make(i):
        return [*_qk(dtype), _positions(), torch.tensor(LENGTHS[i], device=DEV)]

    def call(q, k, positions, length):
        inv_freq, _ = variant(D, seq_len=length, device=length.device, **kwargs)
        q_out, k_out = ropetut.apply_rope_angles(q, k, inv_freq, positions=positions)
        return q_out, k_out, inv_freq

    return Case(make, call, (0, 1))


def dynamic_ntk(dtype):
    return _scaled(
        dtype, scaling.dynamic_ntk, factor=2.0, max_position_embeddings=TRAINED
    )


def longrope(dtype):
    """The per-pair factors as device tensors made once (lists, as a Hugging Face
    config gives them, are copied from the host: the docstring says so)."""
    pair = torch.arange(D // 2, device=DEV)
    short, long = 1 + pair / 64, 1 + pair / 4
    return _scaled(
        dtype,
        scaling.longrope,
        short_factor=short,
        long_factor=long,
        original_max_position_embeddings=TRAINED,
        max_position_embeddings=4 * TRAINED,
    )


FLOATS = {"fp32": torch.float32, "bf16": torch.bfloat16}
BOTH = ("fwd", "fwd+bwd")
PATHS = {  # name: (builder, modes, dtypes)
    "apply_rope": (rope, BOTH, FLOATS),
    "apply_rope_no_positions": (lambda dt: rope(dt, positions=False), BOTH, FLOATS),
    "apply_rope_cute": (lambda dt: rope(dt, impl="cute"), BOTH, FLOATS),
    "apply_rope_inplace": (lambda dt: rope(dt, inplace=True), BOTH, FLOATS),
    "apply_rope_compiled": (lambda dt: rope(dt, compiled=True), BOTH, FLOATS),
    "apply_rope_angles": (angles, BOTH, FLOATS),
    "apply_rope_angles_compiled": (lambda dt: angles(dt, True), BOTH, FLOATS),
    "apply_qk_norm_rope": (qk_norm, BOTH, FLOATS),
    "apply_qk_norm_rope_compiled": (lambda dt: qk_norm(dt, True), BOTH, FLOATS),
    "packed_positions": (packed_positions, ("fwd",), {"int": None}),
    "apply_rope_thd": (thd, BOTH, FLOATS),
    "hf_apply_rotary_pos_emb": (hf_rotary, BOTH, FLOATS),
    "scaling_dynamic_ntk": (dynamic_ntk, BOTH, FLOATS),
    "scaling_longrope": (longrope, BOTH, FLOATS),
}
MARKS = {  # the optional CuTeDSL kernel: skipped, saying why, where it can't run
    "apply_rope_cute": pytest.mark.skipif(
        unavailable("cute") is not None, reason=str(unavailable("cute"))
    )
}
PARAMS = [
    pytest.param(
        name, mode, dtype, id=f"{name}-{mode}-{dtype_name}", marks=MARKS.get(name, ())
    )
    for name, (_, modes, dtypes) in PATHS.items()
    for mode in modes
    for dtype_name, dtype in dtypes.items()
]


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def stepper(name, mode, dtype):
    """(case, inputs, step): the path, its captured buffers, and one call of it on
    them returning its outputs (and, for fwd+bwd, its inputs' gradients). The first
    call, made here, compiles: it may sync."""
    case = PATHS[name][0](dtype)
    inputs = case.make(0)
    wrt = [inputs[i].requires_grad_() for i in case.grad] if mode == "fwd+bwd" else []
    first = _as_tuple(case.call(*inputs))
    seeds = [torch.randn_like(o) for o in first if o.requires_grad]

    def step():
        outs = _as_tuple(case.call(*inputs))
        if not wrt:
            return outs
        rotated = [o for o in outs if o.requires_grad]
        return (*outs, *torch.autograd.grad(rotated, wrt, seeds))

    return case, inputs, step


@gpu_only
@pytest.mark.parametrize("name, mode, dtype", PARAMS)
def test_never_waits_for_the_gpu(name, mode, dtype):
    torch._dynamo.reset()
    case, inputs, step = stepper(name, mode, dtype)
    side = torch.cuda.Stream()  # warm up off the capture stream, as torch's docs do
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)

    old = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")  # a sync raises
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode(old)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for i in (1, 2):
        with torch.no_grad():
            for buffer, fresh in zip(inputs, case.make(i), strict=True):
                buffer.copy_(fresh)
        graph.replay()
        for got, want in zip(captured, step(), strict=True):
            assert torch.equal(got, want) or relative_error(got, want) <= 1e-6
