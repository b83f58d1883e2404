"""Random cases for ropetut's newer entry points, against float64 references.

For each of ``apply_qk_norm_rope``, ``apply_rope_angles``, ``apply_rope_thd`` (packed
sequences) and ``ropetut.hf.apply_rotary_pos_emb`` it draws random cases (dtype, BTHD or
BHTD views, q and k as slices of one projection, GQA, partial rotary, interleaved
pairs, positions none, (T,) or (B, T) and up to 2**24 - 1 for angles, odd sizes, in
place) and compares the forward and the gradients of every differentiable input (q, k,
and QK-norm's weights) with autograd through an fp64 reference, as ||out - ref|| /
||ref|| (``ropetut.check.relative_error``) against per-dtype tolerances.

An output must be written whole: the launchers are called into NaN-filled outputs;
before an entry point allocates its own, memory of their sizes is filled with NaN and
freed (best effort: torch's allocators tend to hand it out next); and a NaN anywhere
never passes. An out-of-place call must leave its inputs as they were.

On a GPU compiles dominate, so what a kernel is compiled for (dtype, sizes, head dim,
rotary_dim, pairs, positions' kind, weight dtype) comes from a few drawn kernel configs
(``--configs``, 16 per entry point on a GPU); each case draws the rest afresh (layout,
memory, values, positions, eps, weight_offset, sequence lengths and offsets, in place).

On a GPU, from the repository root (one GPU call, 100 cases per entry point):

    PYTHONPATH=. python scripts/random_cases.py
    PYTHONPATH=. python scripts/random_cases.py --cases 400 --seed 7

Under Triton's interpreter (no GPU) keep it small: ``--cases 3``. Exit status 1 if any
case is wrong; each wrong case is printed with its options.
"""

import argparse
import itertools
import math
import random
import sys
import time

import torch

import ropetut  # (before triton: on the CPU it sets Triton's interpreter up)
import ropetut.hf
from ropetut import scaling
from ropetut.angles_op import check_angle_args
from ropetut.check import TOLERANCE, relative_error, run_poisoned
from ropetut.kernels.angles import rope_angles
from ropetut.kernels.qk_norm_rope import qk_norm_rope_forward
from ropetut.packed import packed_positions
from ropetut.qk_norm_op import check_qk_norm_args
from ropetut.reference import qk_norm_rope_reference, rope_reference, rotate_half

DEV = ropetut.DEVICE
GPU = ropetut.on_gpu()
NAN = float("nan")
F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64

# What kernel configs draw from: few values, since each new one costs a compile.
DTYPES = (F32, F16, BF16) if GPU else (F32, F16, F64)  # (the interpreter has no bf16)
HEAD_DIMS = (64, 96, 128) if GPU else (8, 16)
SEQ_LENS = (17, 64, 200) if GPU else (5, 17)
BATCHES = (1, 2, 3)
HEADS = ((3, 3), (3, 1), (4, 2), (8, 2), (6, 3))  # (Hq, Hkv)
POSITIONS = ("none", "(T,)", "(B, T)", "(B, T) int32")

# Gradient tolerances, the tests': QK-norm's fp32 1e-5 (test_backward_matches_reference)
# and bf16 2e-2 (test_bf16_forward_and_backward); fp16, untested there, in between; fp64
# as its forward. A turn's gradient is the turn back, so the other entry points use the
# forward's TOLERANCE, as tests/test_hf.py and tests/test_angles.py do.
QK_NORM_GRAD_TOL = {F64: 1e-12, F32: 1e-5, F16: 5e-3, BF16: 2e-2}

ENTRY_POINTS = (
    "apply_qk_norm_rope",
    "apply_rope_angles",
    "apply_rope_thd",
    "hf.apply_rotary_pos_emb",
)


# ---- drawing cases


def draw_config(rng, entry):
    """What the entry point's kernels are compiled for."""
    D = rng.choice(HEAD_DIMS)
    config = {
        "dtype": rng.choice(DTYPES),
        "B": rng.choice(BATCHES),
        "T": rng.choice(SEQ_LENS),
        "heads": rng.choice(HEADS),
        "D": D,
    }
    if entry == "apply_rope_thd":
        del config["B"]  # one packed (T, H, D) tensor
    if entry != "hf.apply_rotary_pos_emb":  # HF's: full rotary, half-split pairs
        config["rotary_dim"] = rng.choice((D, rng.randrange(2, D, 2)))
        config["interleaved"] = rng.random() < 0.5
    if entry in ("apply_qk_norm_rope", "apply_rope_angles"):
        config["positions"] = rng.choice(POSITIONS)
    if entry == "apply_qk_norm_rope":
        config["w_dtype"] = rng.choice((config["dtype"], F32))
    if entry == "hf.apply_rotary_pos_emb":
        config["per_batch"] = rng.random() < 0.5  # (B, T, D) tables, else (1, T, D)
    return config


def draw_case(rng, entry, config):
    """config, and what a case draws afresh: no new compile."""
    case = dict(config, seed=rng.randrange(2**31), fused=rng.random() < 0.3)
    if entry in ("apply_qk_norm_rope", "apply_rope_angles"):
        case["layout"] = rng.choice(("bthd", "bhtd"))
    if entry != "hf.apply_rotary_pos_emb":
        case["inplace"] = rng.random() < 0.3
    if entry == "apply_qk_norm_rope":
        case["eps"] = rng.choice((1e-6, 1e-5, 1e-2))
        case["weight_offset"] = rng.choice((0.0, 1.0))
        case["scale"] = rng.choice((1.0, 1.0, 300.0))  # 300: x**2 overflows fp16
    if entry == "apply_rope_angles":
        case["max_position"] = rng.choice((2 * case["T"], 2**16, 2**24))
        case["base"] = rng.choice((10000.0, 500000.0))
        case["inv_freq_dtype"] = rng.choice((F32, F64))
    if entry == "apply_rope_thd":
        T = case["T"]
        # pad: tokens past the last sequence (position 0: they pass through)
        pad = rng.choice((0, rng.randrange(T // 3 + 1)))
        cuts = sorted(rng.randrange(T - pad + 1) for _ in range(rng.randrange(4)))
        case["lengths"] = [b - a for a, b in zip([0, *cuts], [*cuts, T - pad])]
        case["pad"] = pad
        top = rng.choice((0, 50, 4000 if GPU else 30))
        offsets = [rng.randrange(top + 1) for _ in case["lengths"]]
        case["offsets"] = offsets if rng.random() < 0.7 else offsets[0]  # or an int
        case["cu_dtype"] = rng.choice((torch.int32, torch.int64))
    if entry == "hf.apply_rotary_pos_emb":
        case["unsqueeze_dim"] = rng.choice((1, 2))
        case["attention_factor"] = rng.choice((1.0, 1.2))
    return case


# ---- inputs


def randn(g, shape, dtype=F32, scale=1.0):
    """Random values on ropetut's device (never zeros: zeros hide unwritten outputs)."""
    return (torch.randn(shape, generator=g) * scale).to(DEV, dtype)


def qk_pair(g, case, shape, head_dim):
    """q and k of case's heads and dtype, shape(H) each: two tensors, or (fused) slices
    along head_dim of one projection holding q, k and v side by side."""
    hq, hk = case["heads"]
    dtype, scale = case["dtype"], case.get("scale", 1.0)
    if not case["fused"]:
        return randn(g, shape(hq), dtype, scale), randn(g, shape(hk), dtype, scale)
    qkv = randn(g, shape(hq + 2 * hk), dtype, scale)
    return qkv.narrow(head_dim, 0, hq), qkv.narrow(head_dim, hq, hk)


def bthd_shape(case):
    """shape(H) and the heads' dim for case's layout."""
    B, T, D = case["B"], case["T"], case["D"]
    if case["layout"] == "bthd":
        return (lambda h: (B, T, h, D)), 2
    return (lambda h: (B, h, T, D)), 1


def positions_for(case, high):
    """case's positions, values in [0, high) and the first one high - 1: None, (T,) or
    (B, T) integers."""
    kind = case["positions"]
    if kind == "none":
        return None
    g = torch.Generator().manual_seed(case["seed"] + 1)
    shape = (case["T"],) if kind == "(T,)" else (case["B"], case["T"])
    positions = torch.randint(0, high, shape, generator=g)
    positions.view(-1)[0] = high - 1
    return positions.to(DEV, torch.int32 if "int32" in kind else torch.int64)


def tables(R, n_positions):
    return ropetut.rope_tables(ropetut.standard(R), n_positions, device=DEV)


def poison_freed_memory(*like):
    """Best effort for what an entry point allocates itself (outputs, gradients): free
    NaN-filled blocks of their sizes, which torch's allocators tend to hand out next."""
    junk = [torch.full((x.numel(),), NAN, dtype=x.dtype, device=x.device) for x in like]
    del junk


def unchanged(inputs, before):
    for name, x, x0 in zip(("q", "k"), inputs, before):
        if not torch.equal(x.detach(), x0):
            raise AssertionError(f"out of place, but {name} changed")


# ---- comparing


def error(out, ref, dtype):
    """||out - ref|| / ||ref||: NaN where out holds a NaN, inf where it is missing or of
    the wrong shape or dtype."""
    if out is None or tuple(out.shape) != tuple(ref.shape) or out.dtype != dtype:
        return math.inf
    return relative_error(out, ref)


def rows(label, outs, refs, dtypes, tol, names=("q", "k", "w_q", "w_k")):
    """(name, error, tolerance) for each output; gradients' names start with "d"."""
    return [
        (f"{label}{name}", error(out, ref, dtype), tol)
        for name, out, ref, dtype in zip(names, outs, refs, dtypes)
    ]


def grads_of(outs, inputs, grads_out):
    """autograd.grad, the output gradients in each output's dtype and on its device
    (fp64 for the reference). None for an input with no gradient."""
    grads_out = [g.to(out.device, out.dtype) for g, out in zip(grads_out, outs)]
    return torch.autograd.grad(outs, inputs, grads_out, allow_unused=True)


# ---- the entry points


def check_qk_norm(case):
    dtype, D, R = case["dtype"], case["D"], case["rotary_dim"]
    shape, head_dim = bthd_shape(case)
    bthd = case["layout"] == "bthd"

    def make():
        g = torch.Generator().manual_seed(case["seed"])
        q, k = qk_pair(g, case, shape, head_dim)
        w_q, w_k = ((1 + randn(g, D, scale=0.5)).to(case["w_dtype"]) for _ in "qk")
        return q, k, w_q, w_k

    q, k, w_q, w_k = make()
    n_positions = 2 * case["T"] + 3
    cos, sin = tables(R, n_positions)
    opts = {
        "positions": positions_for(case, n_positions),
        "eps": case["eps"],
        "weight_offset": case["weight_offset"],
        "interleaved": case["interleaved"],
        "rotary_dim": R,
        "layout": case["layout"],
    }
    x64 = [t.detach().double().requires_grad_() for t in (q, k, w_q, w_k)]
    refs = [qk_norm_rope_reference(x64[i], x64[i + 2], cos, sin, **opts)
            for i in (0, 1)]  # fmt: skip
    g = torch.Generator().manual_seed(case["seed"] + 2)
    grads_out = [randn(g, ref.shape, dtype) for ref in refs]
    ref_grads = grads_of(refs, x64, grads_out)
    tol, dtypes = TOLERANCE[dtype], [t.dtype for t in (q, k, w_q, w_k)]

    q4, k4, options = check_qk_norm_args(q, k, w_q, w_k, cos, sin, **opts)
    outs = [torch.full_like(t, NAN) for t in (q4, k4)]
    rope = options.rope
    qk_norm_rope_forward(q4, k4, w_q, w_k, rope.cos, rope.sin, *outs,
                         positions=rope.positions, eps=options.eps,
                         interleaved=rope.interleaved, rotary_dim=rope.rotary_dim,
                         weight_offset=options.weight_offset)  # fmt: skip
    outs = [t if bthd else t.transpose(1, 2) for t in outs]
    result = rows("launcher ", outs, refs, dtypes, tol)

    inputs = [t.requires_grad_() for t in (q, k, w_q, w_k)]
    before = [t.detach().clone() for t in (q, k)]
    poison_freed_memory(q, k, q, k)
    outs = ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin, **opts)
    poison_freed_memory(q, k, q, k)
    grads = grads_of(outs, inputs, grads_out)
    unchanged((q, k), before)
    result += rows("", outs, refs, dtypes, tol)
    gtol = QK_NORM_GRAD_TOL[dtype]
    result += rows("d", grads[:2], ref_grads[:2], dtypes, gtol)
    gtol = max(gtol, QK_NORM_GRAD_TOL[case["w_dtype"]])  # dw comes in w's dtype
    w_names = ("w_q", "w_k")
    result += rows("d", grads[2:], ref_grads[2:], dtypes[2:], gtol, names=w_names)

    if case["inplace"]:  # forward only
        q, k, w_q, w_k = make()
        with torch.no_grad():
            ropetut.apply_qk_norm_rope(q, k, w_q, w_k, cos, sin, inplace=True, **opts)
        result += rows("in place ", (q, k), refs, dtypes, tol)
    return result


def check_angles(case):
    dtype, B, T, R = case["dtype"], case["B"], case["T"], case["rotary_dim"]
    shape, head_dim = bthd_shape(case)
    bthd = case["layout"] == "bthd"

    def make():
        g = torch.Generator().manual_seed(case["seed"])
        return qk_pair(g, case, shape, head_dim)

    q, k = make()
    inv_freq, _ = scaling.default(R, case["base"], dtype=case["inv_freq_dtype"],
                                  device=DEV)  # fmt: skip
    positions = positions_for(case, case["max_position"])
    opts = {
        "positions": positions,
        "interleaved": case["interleaved"],
        "rotary_dim": R,
        "layout": case["layout"],
    }
    # fp64 tables of each token's own angles: row b * T + t for token (b, t)
    pos = torch.arange(T, device=DEV) if positions is None else positions
    angles = pos.expand(B, T).reshape(-1, 1).double() * inv_freq.double()
    cos, sin = angles.cos(), angles.sin()
    ref_opts = {**opts, "positions": torch.arange(B * T, device=DEV).view(B, T)}
    x64 = [t.detach().double().requires_grad_() for t in (q, k)]
    refs = [rope_reference(x, cos, sin, **ref_opts) for x in x64]
    g = torch.Generator().manual_seed(case["seed"] + 2)
    grads_out = [randn(g, ref.shape, dtype) for ref in refs]
    ref_grads = grads_of(refs, x64, grads_out)
    # fp64 inputs: the kernel turns by one fp64 product p * inv_freq / 2pi, good to a
    # few ulps of the angle (3.5e-10 at 2**24), far from fp64's own TOLERANCE
    tol = TOLERANCE[dtype] + angles.abs().max().item() * 2**-50
    dtypes = (dtype, dtype)

    q4, k4, options = check_angle_args(
        q, k, inv_freq, positions, interleaved=case["interleaved"], rotary_dim=R,
        inplace=False, layout=case["layout"], wants_grad=False,
    )  # fmt: skip
    outs = [torch.full_like(t, NAN) for t in (q4, k4)]
    rope_angles(q4, k4, inv_freq, *outs, positions=options[0],
                interleaved=case["interleaved"], rotary_dim=R)  # fmt: skip
    outs = [t if bthd else t.transpose(1, 2) for t in outs]
    result = rows("launcher ", outs, refs, dtypes, tol)

    def call(q, k):
        return ropetut.apply_rope_angles(q, k, inv_freq, **opts)

    result += entry_point_rows(call, q, k, grads_out, refs, ref_grads, dtypes, tol)

    if case["inplace"]:
        q, k = make()
        with torch.no_grad():
            ropetut.apply_rope_angles(q, k, inv_freq, inplace=True, **opts)
        result += rows("in place ", (q, k), refs, dtypes, tol)
    return result


def entry_point_rows(call, q, k, grads_out, refs, ref_grads, dtypes, tol):
    """``call(q, k)``: the entry point out of place, freed memory poisoned around it.
    Rows for its outputs and for q's and k's gradients; q and k must be left as they
    were."""
    inputs = [t.requires_grad_() for t in (q, k)]
    before = [t.detach().clone() for t in (q, k)]
    poison_freed_memory(q, k, q, k)
    outs = call(q, k)
    poison_freed_memory(q, k, q, k)
    grads = grads_of(outs, inputs, grads_out)
    unchanged((q, k), before)
    return rows("", outs, refs, dtypes, tol) + rows("d", grads, ref_grads, dtypes, tol)


def check_thd(case):
    dtype, T, D, R = case["dtype"], case["T"], case["D"], case["rotary_dim"]
    lengths, offsets = case["lengths"], case["offsets"]

    def make():
        g = torch.Generator().manual_seed(case["seed"])
        return qk_pair(g, case, lambda h: (T, h, D), 1)

    q, k = make()
    ends = list(itertools.accumulate(lengths))
    cu_seqlens = torch.tensor([0, *ends], dtype=case["cu_dtype"], device=DEV)
    per_seq = offsets if isinstance(offsets, list) else [offsets] * len(lengths)
    seqlen_offsets = offsets
    if isinstance(offsets, list):
        seqlen_offsets = torch.tensor(offsets, dtype=case["cu_dtype"], device=DEV)
    # each token's position, counted here: from its sequence's offset; padding at 0
    expected = [o + i for n, o in zip(lengths, per_seq) for i in range(n)]
    expected += [0] * case["pad"]
    cos, sin = tables(R, max(expected) + 1)
    opts = {"interleaved": case["interleaved"], "rotary_dim": R}
    ref_pos = torch.tensor(expected, device=DEV)
    x64 = [t.detach().double().requires_grad_() for t in (q, k)]
    refs = [rope_reference(x[None], cos, sin, positions=ref_pos, **opts)[0]
            for x in x64]  # fmt: skip
    g = torch.Generator().manual_seed(case["seed"] + 2)
    grads_out = [randn(g, ref.shape, dtype) for ref in refs]
    ref_grads = grads_of(refs, x64, grads_out)
    tol, dtypes = TOLERANCE[dtype], (dtype, dtype)

    positions = packed_positions(cu_seqlens, T, seqlen_offsets)
    outs = run_poisoned("final", q[None], k[None], cos, sin, positions=positions,
                        **opts)  # fmt: skip
    result = rows("launcher ", [t[0] for t in outs], refs, dtypes, tol)

    thd = dict(cu_seqlens=cu_seqlens, seqlen_offsets=seqlen_offsets, **opts)
    def call(q, k):
        return ropetut.apply_rope_thd(q, k, cos, sin, **thd)

    result += entry_point_rows(call, q, k, grads_out, refs, ref_grads, dtypes, tol)

    if case["inplace"]:
        q, k = make()
        with torch.no_grad():
            ropetut.apply_rope_thd(q, k, cos, sin, inplace=True, **thd)
        result += rows("in place ", (q, k), refs, dtypes, tol)
    return result


def hf_cos_sin(case):
    """(B or 1, T, D) cos and sin as transformers' Llama rotary embedding builds them
    (as tests/test_hf.py): fp32 angles, both halves equal, times the attention factor,
    in the activations' dtype."""
    B, T, D = case["B"], case["T"], case["D"]
    inv_freq, _ = scaling.default(D, device=DEV)
    if case["per_batch"]:
        g = torch.Generator().manual_seed(case["seed"] + 1)
        position_ids = torch.randint(0, 5000, (B, T), generator=g).to(DEV)
    else:
        position_ids = torch.arange(T, device=DEV)[None]
    freqs = position_ids[:, :, None].float() * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    factor, dtype = case["attention_factor"], case["dtype"]
    return (emb.cos() * factor).to(dtype), (emb.sin() * factor).to(dtype)


def check_hf(case):
    dtype, dim = case["dtype"], case["unsqueeze_dim"]
    B, T, D = case["B"], case["T"], case["D"]
    shape = (lambda h: (B, h, T, D)) if dim == 1 else (lambda h: (B, T, h, D))
    g = torch.Generator().manual_seed(case["seed"])
    q, k = qk_pair(g, case, shape, dim)  # heads at dim unsqueeze_dim
    cos, sin = hf_cos_sin(case)
    # HF's own formula, in fp64 on the same tables
    cos64, sin64 = (t.double().unsqueeze(dim) for t in (cos, sin))
    x64 = [t.detach().double().requires_grad_() for t in (q, k)]
    refs = [x * cos64 + rotate_half(x) * sin64 for x in x64]
    g = torch.Generator().manual_seed(case["seed"] + 2)
    grads_out = [randn(g, ref.shape, dtype) for ref in refs]
    ref_grads = grads_of(refs, x64, grads_out)
    tol, dtypes = TOLERANCE[dtype], (dtype, dtype)

    def call(q, k):
        return ropetut.hf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=dim)

    return entry_point_rows(call, q, k, grads_out, refs, ref_grads, dtypes, tol)


CHECKS = dict(zip(ENTRY_POINTS, (check_qk_norm, check_angles, check_thd, check_hf)))


# ---- the run


def short(value):
    if isinstance(value, torch.dtype):
        return str(value).replace("torch.", "")
    return repr(value)


def over(row):
    """How far a (name, error, tolerance) row is over its tolerance; NaN: the most."""
    _, err, tol = row
    return math.inf if math.isnan(err) else err / tol


def show(rows):
    """The row furthest over its tolerance, as its error and tolerance."""
    if not rows:
        return "-"
    _, err, tol = max(rows, key=over)
    return f"{err:.1e} (tol {tol:.0e})"


def show_row(name, err, tol):
    return name if name.startswith("raised ") else f"{name} {err:.1e} (tol {tol:.0e})"


def run_entry(entry, cases):
    """Check every case; prints the entry point's line, then each wrong case's."""
    start = time.perf_counter()
    wrong, fwd, grad = [], [], []
    for i, case in enumerate(cases):
        try:
            result = CHECKS[entry](case)
        except Exception as e:  # noqa: BLE001 (a raise: a wrong case, reported)
            result = [(f"raised {type(e).__name__}: {e}", math.nan, 1.0)]
        else:
            fwd += [row for row in result if not row[0].startswith("d")]
            grad += [row for row in result if row[0].startswith("d")]
        bad = [row for row in result if not row[1] <= row[2]]  # (NaN is never <=)
        if bad:
            wrong.append((i, case, bad))
    seconds = time.perf_counter() - start
    print(f"{entry:24} {len(cases):4d} cases {len(wrong):4d} wrong   worst fwd "
          f"{show(fwd)}  worst grad {show(grad)}   {seconds:.1f} s")  # fmt: skip
    for i, case, bad in wrong:
        options = ", ".join(f"{key}={short(value)}" for key, value in case.items())
        errors = ", ".join(show_row(*row) for row in bad)
        print(f"  wrong: {entry} case {i}: {errors}\n    {options}")
    return len(wrong)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases",
        type=int,
        default=100 if GPU else 3,
        help="cases per entry point (default 100 on a GPU, 3 on CPU)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--configs",
        type=int,
        default=None,
        help="kernel configs per entry point (default 16 on a GPU, "
        "one per case on the CPU, where nothing compiles)",
    )
    parser.add_argument("--only", nargs="+", choices=ENTRY_POINTS, default=ENTRY_POINTS,
                        help="check these entry points only")  # fmt: skip
    args = parser.parse_args(argv)
    n_configs = max(1, args.configs or (16 if GPU else args.cases))
    import triton  # (here, once ropetut has set Triton's interpreter up on the CPU)

    device = torch.cuda.get_device_name() if GPU else "CPU (Triton's interpreter)"
    print(f"random cases on {device}: torch {torch.__version__}, triton "
          f"{triton.__version__}, seed {args.seed}, {args.cases} cases per entry "
          f"point over {min(n_configs, args.cases)} kernel configs")  # fmt: skip
    wrong = 0
    for entry in args.only:
        rng = random.Random(f"{args.seed} {entry}")
        configs = [draw_config(rng, entry) for _ in range(n_configs)]
        cases = [draw_case(rng, entry, configs[i % n_configs])
                 for i in range(args.cases)]  # fmt: skip
        wrong += run_entry(entry, cases)
    print(f"random cases: {wrong} wrong")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
