"""Probe (H100): the fused QK-RMSNorm + RoPE, first version against the rewrite.

    python scripts/probe_qk_norm.py       # about 2-3 minutes on an H100

For each shape of ``ropetut.bench.qk_norm.SHAPES`` (bf16):
  (a) relative errors against the float64 reference (q_out, k_out, dq, dk, dw_q, dw_k)
      of ``kernels/qk_norm_rope_v1.py`` and of ``kernels/qk_norm_rope.py`` in every
      config of CONFIGS;
  (b) ms, eager and from a CUDA graph (``bench.time_ms``, ``bench.graph_ms``, medians),
      of fwd and fwd+bwd: v1, the rewrite in each config, the rewrite through
      ``apply_qk_norm_rope`` (autograd, as users call it), Liger's RMSNorm + RoPE pair,
      and the copy floor. % of floor: fwd against a copy of q and k (2U), fwd+bwd
      against 2.5 of those copies (5U: 2U forward, 3U backward; U = bytes of q and k);
  (c) the registers and spills of each compiled kernel (sm_90).

The kernels are launched straight (forward, then backward, as the autograd Function
does), outputs allocated in the call as the library does. Each config and provider is
tried on its own: a failure prints and the probe goes on. Without a GPU (Triton's
interpreter) it checks (a) on tiny fp32 shapes and times nothing.
"""

# ruff: noqa: I001
import time
import traceback
from functools import partial

# ropetut first: on a machine without a GPU it switches Triton to its interpreter
import ropetut
import torch
import triton
from ropetut import bench
from ropetut.bench import qk_norm as bench_qk_norm
from ropetut.kernels import qk_norm_rope, qk_norm_rope_v1
from ropetut.reference import qk_norm_rope_reference
from ropetut.tables import rope_tables, standard

GPU = ropetut.on_gpu()
EPS = bench_qk_norm.EPS
# The rewrite's sweep: overrides of FORWARD and BACKWARD (the same for both).
CONFIGS = [
    {},  # the module's FORWARD / BACKWARD
    {"pairs_per_tile": 1024, "num_warps": 4, "programs_per_sm": 2},
    {"pairs_per_tile": 1024, "num_warps": 4, "programs_per_sm": 4},
    {"pairs_per_tile": 1024, "num_warps": 4, "programs_per_sm": 5},
    {"pairs_per_tile": 1024, "num_warps": 4, "programs_per_sm": 6},
    {"pairs_per_tile": 1024, "num_warps": 4, "programs_per_sm": 7},
    {"pairs_per_tile": 512, "num_warps": 4, "programs_per_sm": 6},
    {"pairs_per_tile": 512, "num_warps": 4, "programs_per_sm": 9},
    {"pairs_per_tile": 512, "num_warps": 2, "programs_per_sm": 8},
    {"pairs_per_tile": 512, "num_warps": 2, "programs_per_sm": 14},
    {"pairs_per_tile": 2048, "num_warps": 8, "programs_per_sm": 2},
    {"pairs_per_tile": 2048, "num_warps": 4, "programs_per_sm": 2},
    {"pairs_per_tile": 2048, "num_warps": 4, "programs_per_sm": 4},
]
# With a tile's table rows loaded once the old ones are used for the last time
# (registers a thread, sm_90, Triton 3.6, on the H200 at a0d4c91d0f; programs of them
# an SM): fwd p512 w2 72 (14), p512 w4 56 (9), p1024 w4 72 (7), p2048 w4 128 (4); bwd
# p512 w4 80 (6), p512 w2 152 (6), p1024 w4 128 (4), p2048 w4 247 (2). A config over
# what fits runs a second wave: read its fwd rows for the forward, fwd+bwd only where
# it fits the backward.
if GPU:
    SHAPES = bench_qk_norm.SHAPES
else:  # the interpreter: tiny, fp32 (it has no bf16)
    SHAPES = [
        bench.Shape(2, 9, 4, 2, 16, dtype=torch.float32),
        bench.Shape(3, 1, 4, 2, 16, dtype=torch.float32, positions=True),
    ]


def config_name(config):
    """p: pairs per tile, w: warps, s: programs per SM."""
    if not config:
        return "default"
    return "p{pairs_per_tile} w{num_warps} s{programs_per_sm}".format(**config)


class Recorder:
    """Stands in for a ``@triton.jit`` kernel in its module: launches it and keeps the
    compiled kernel the launch returns (None under the interpreter)."""

    def __init__(self, kernel):
        self.kernel, self.last = kernel, None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.last = self.kernel[grid](*args, **kwargs)
            return self.last

        return launch


RECORDERS = {}
for module in (qk_norm_rope_v1, qk_norm_rope):
    for name in ("qk_norm_rope_fwd_kernel", "qk_norm_rope_bwd_kernel"):
        recorder = Recorder(getattr(module, name))
        setattr(module, name, recorder)
        RECORDERS[module, name] = recorder


def registers(module):
    """'fwd R/S bwd R/S': registers a thread and spills of the last launches."""
    words = []
    for direction in ("fwd", "bwd"):
        compiled = RECORDERS[module, f"qk_norm_rope_{direction}_kernel"].last
        if compiled is None:
            words.append(f"{direction} n/a")
        else:
            words.append(f"{direction} {compiled.n_regs}r/{compiled.n_spills}s")
    return " ".join(words)


def setup(shape):
    """Weights, tables and positions as the bench's providers draw them."""
    n_rows = bench.N_POSITIONS if shape.positions else shape.T
    cos, sin = rope_tables(standard(shape.D), n_rows, device=ropetut.DEVICE)
    positions = None
    if shape.positions:
        positions = torch.randint(0, n_rows, (shape.B, shape.T), device=ropetut.DEVICE)
    w_q, w_k = (1 + 0.1 * torch.randn(2, shape.D, device=ropetut.DEVICE)).unbind()
    return w_q, w_k, cos, sin, positions


def launchers(module, shape, w_q, w_k, cos, sin, positions, **config):
    """(fwd(q, k), fwd_bwd(q, k, gq, gk)): the module's launchers, called straight."""
    options = dict(
        positions=positions,
        eps=EPS,
        interleaved=False,
        rotary_dim=shape.D,
        weight_offset=0.0,
        **config,
    )

    def fwd(q, k):
        outs = torch.empty_like(q), torch.empty_like(k)
        return module.qk_norm_rope_forward(q, k, w_q, w_k, cos, sin, *outs, **options)

    def fwd_bwd(q, k, gq, gk):
        fwd(q, k)
        return module.qk_norm_rope_backward(q, k, w_q, w_k, cos, sin, gq, gk, **options)

    return fwd, fwd_bwd


def relative_error(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def reference(shape, inputs, w_q, w_k, cos, sin, positions):
    """(q_out, k_out, dq, dk, dw_q, dw_k) in float64."""
    q, k, gq, gk = inputs
    leaves = [t.detach().double().requires_grad_() for t in (q, k, w_q, w_k)]
    opts = {"eps": EPS, "positions": positions}
    outs = (
        qk_norm_rope_reference(leaves[0], leaves[2], cos, sin, **opts),
        qk_norm_rope_reference(leaves[1], leaves[3], cos, sin, **opts),
    )
    grads = torch.autograd.grad(outs, leaves, (gq.double(), gk.double()))
    return [t.detach() for t in (*outs, *grads)]


NAMES = ("q_out", "k_out", "dq", "dk", "dw_q", "dw_k")


def check(label, module, shape, inputs, expected, tables, config):
    """Print the relative errors of one kernel file and config; returns its
    launchers and registers (fwd, fwd_bwd, regs), or None when it fails."""
    try:
        fwd, fwd_bwd = launchers(module, shape, *tables, **config)
        q, k, gq, gk = (t.detach() for t in inputs)
        got = (*fwd(q, k), *fwd_bwd(q, k, gq, gk))
        if GPU:
            torch.cuda.synchronize()
        errors = " ".join(
            f"{n} {relative_error(g, e):.1e}" for n, g, e in zip(NAMES, got, expected)
        )
        regs = registers(module)
        print(f"  {label:34s} {errors}   {regs}", flush=True)
        return fwd, fwd_bwd, regs
    except Exception as error:  # one bad config must not end the probe
        print(f"  {label:34s} FAILED: {type(error).__name__}: {error}".splitlines()[0])
        traceback.print_exc(limit=2)
        return None


def timings(fn, shape, mode):
    """(eager ms, graphed ms), or None on failure."""
    make = partial(bench.make_inputs, shape, mode)
    try:
        return bench.time_ms(fn, make_inputs=make), bench.graph_ms(fn, make_inputs=make)
    except Exception as error:
        print(f"    timing failed: {type(error).__name__}: {error}".splitlines()[0])
        return None


def apply_path(shape, w_q, w_k, cos, sin, positions):
    """The rewrite as users call it: ``apply_qk_norm_rope`` (autograd for fwd+bwd)."""
    weights = (w_q.clone().requires_grad_(), w_k.clone().requires_grad_())

    def fwd(q, k):
        return ropetut.apply_qk_norm_rope(
            q, k, *weights, cos, sin, eps=EPS, positions=positions
        )

    return fwd, bench_qk_norm.training_step(fwd, weights)


def liger_path(shape):
    if bench_qk_norm.liger_pair() is None:
        return None
    fn, weights = bench_qk_norm.make_provider(bench_qk_norm.LIGER, shape)
    return fn, bench_qk_norm.training_step(fn, weights)


def row(label, fwd_ms, step_ms, floor, liger_step, regs=""):
    """One line: fwd eager|graph (% of 2U), fwd+bwd eager|graph (% of 5U), x Liger."""

    def cell(ms, floor_ms):
        if ms is None:
            return f"{'-':>22s}"
        pct = [f / m * 100 for f, m in zip(floor_ms, ms)]
        return f"{ms[0]:6.3f}|{ms[1]:6.3f} {pct[0]:3.0f}|{pct[1]:3.0f}%"

    vs = "   -  "
    if step_ms and liger_step:
        vs = f"{step_ms[1] / liger_step[1]:5.2f}x"
    print(
        f"  {label:34s} {cell(fwd_ms, floor[0])}  {cell(step_ms, floor[1])}  {vs}"
        f"  {regs}",
        flush=True,
    )


def probe(shape):
    print(f"\n== {shape.label}", flush=True)
    torch.manual_seed(0)
    tables = setup(shape)
    inputs = bench.make_inputs(shape, "fwd+bwd")
    expected = reference(shape, inputs, *tables)
    print("  (a) relative errors against float64; (c) registers/spills a thread")
    checked = {"v1": check("v1", qk_norm_rope_v1, shape, inputs, expected, tables, {})}
    for config in CONFIGS:
        label = config_name(config)
        checked[label] = check(
            label, qk_norm_rope, shape, inputs, expected, tables, config
        )
    if not GPU:
        return
    print("  (b) ms eager|graph, % of floor eager|graph; x Liger: fwd+bwd, graphed")
    print(f"  {'':34s} {'fwd (floor 2U)':>22s}  {'fwd+bwd (floor 5U)':>22s}  x Liger")
    floor_fwd = (
        bench.copy_floor_ms(shape, "fwd"),
        bench.copy_floor_ms(shape, "fwd", graphed=True),
    )
    floor_step = tuple(2.5 * ms for ms in floor_fwd)  # 5U = 2.5 copies of q and k
    floor = (floor_fwd, floor_step)
    liger = liger_path(shape)
    liger_ms = (None, None)
    if liger is not None:
        liger_ms = timings(liger[0], shape, "fwd"), timings(liger[1], shape, "fwd+bwd")
    row("copy floor (2U | 5U)", floor_fwd, floor_step, floor, liger_ms[1])
    row("liger pair", *liger_ms, floor, liger_ms[1])
    fwd, step = apply_path(shape, *tables)
    fwd_ms, step_ms = timings(fwd, shape, "fwd"), timings(step, shape, "fwd+bwd")
    row("apply_qk_norm_rope (default)", fwd_ms, step_ms, floor, liger_ms[1])
    for label, launched in checked.items():
        if launched is not None:
            fwd, step, regs = launched
            fwd_ms, step_ms = (
                timings(fwd, shape, "fwd"),
                timings(step, shape, "fwd+bwd"),
            )
            row(label, fwd_ms, step_ms, floor, liger_ms[1], regs)


def main():
    props = torch.cuda.get_device_properties(0) if GPU else None
    print(
        f"device: {props.name if GPU else 'CPU (interpreter)'}"
        f", torch {torch.__version__}, triton {triton.__version__}, liger: "
        f"{'yes' if bench_qk_norm.liger_pair() else 'no'}"
    )
    print(
        "default: forward",
        tuple(qk_norm_rope.FORWARD),
        "backward",
        tuple(qk_norm_rope.BACKWARD),
        "(pairs per tile, warps, programs per SM)",
    )
    start = time.time()
    for shape in SHAPES:
        try:
            probe(shape)
        except Exception as error:
            print(f"  shape failed: {type(error).__name__}: {error}".splitlines()[0])
            traceback.print_exc(limit=3)
    print(f"\ndone in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
