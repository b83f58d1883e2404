"""``ropetut/kernels/launch.py``: launches kept per key, and the direct launch. The keys
hold the kernels' tunings as they are at each call; a kept compiled kernel launches
only on the GPU it was compiled for. (Nothing compiles under the interpreter: a
stand-in kernel shows which path a launch took.)"""

import pytest
import torch
from conftest import randn, tables

import ropetut
from ropetut import scaling
from ropetut.check import TOLERANCE, relative_error
from ropetut.kernels import angles, launch, qk_norm_rope
from ropetut.reference import qk_norm_rope_reference


class StandInKernel:
    """A JIT kernel's stand-in: ``kernel[grid](...)`` records the call and returns a
    compiled kernel whose launcher records its calls."""

    function = packed_metadata = None

    def __init__(self):
        self.jit_calls, self.direct_calls = [], []

    def __getitem__(self, grid):
        def jit(*args, num_warps):
            self.jit_calls.append(args)
            return self

        return jit

    def run(self, *args):
        self.direct_calls.append(args)


@pytest.mark.parametrize("matches", [True, False])
def test_cached_launches_skip_the_jit_unless_a_pointer_is_misaligned(
    monkeypatch, matches
):
    """The second launch under a key goes straight to the compiled kernel, with the
    grid, the stream, the pointers and the plan's arguments; a view 4 bytes off 16-byte
    alignment goes through the JIT every time, and so does every launch where the
    installed Triton's launch call differs from ours. (Nothing compiles under the
    interpreter: a stand-in compiled kernel shows which path a launch took.)"""
    monkeypatch.setattr(launch, "direct_launch_matches", lambda: matches)
    monkeypatch.setattr(launch, "_KEPT", {})
    monkeypatch.setattr(
        torch._C, "_cuda_getCurrentRawStream", lambda device: 7, raising=False
    )
    x = torch.zeros(64)  # a CPU tensor: get_device() is -1, the kept "GPU"
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: -1, raising=False)
    kernel = StandInKernel()
    plan = launch.Plan((2, 1, 1), (5, True), 4)
    kept = launch.kept_launch(kernel, "key", lambda: plan)
    assert launch.kept_launch(kernel, "key", lambda: None) is kept  # one per key
    for _ in range(2):
        launch.launch(kernel, kept, (x,))
    assert len(kernel.jit_calls) == (1 if matches else 2)
    if matches:
        launched = (2, 1, 1, 7, None, None, None, None, None, x, 5, True)
        assert kernel.direct_calls == [launched]
    for _ in range(2):
        launch.launch(kernel, kept, (x[1:],))
    assert len(kernel.jit_calls) == (3 if matches else 4)
    assert len(kernel.direct_calls) == (1 if matches else 0)


def test_a_kept_kernel_launches_through_the_jit_while_another_gpu_is_current(
    monkeypatch,
):
    """A kernel kept from a launch with cuda:0 current goes straight to its launcher
    while cuda:0 is current, and through ``kernel[grid](...)`` (which launches on the
    current GPU, as Triton does) while cuda:1 is."""
    monkeypatch.setattr(launch, "direct_launch_matches", lambda: True)
    monkeypatch.setattr(launch, "_KEPT", {})
    monkeypatch.setattr(
        torch._C, "_cuda_getCurrentRawStream", lambda device: 7, raising=False
    )
    x = torch.zeros(64)  # a CPU tensor: get_device() is -1, the kept "GPU"
    current = {"device": x.get_device()}
    monkeypatch.setattr(
        torch._C, "_cuda_getDevice", lambda: current["device"], raising=False
    )
    kernel = StandInKernel()
    kept = launch.kept_launch(kernel, "key", lambda: launch.Plan((2, 1, 1), (5,), 4))
    launch.launch(kernel, kept, (x,))  # compiles (stands in), kept
    launch.launch(kernel, kept, (x,))
    assert (len(kernel.jit_calls), len(kernel.direct_calls)) == (1, 1)
    current["device"] = x.get_device() + 1
    launch.launch(kernel, kept, (x,))
    assert (len(kernel.jit_calls), len(kernel.direct_calls)) == (2, 1)


def _qk_norm_args():
    B, T, HQ, HK, D = 1, 64, 2, 1, 16
    q, k = randn(B, T, HQ, D), randn(B, T, HK, D)
    w_q, w_k = 1 + 0.5 * randn(D), 1 + 0.5 * randn(D)
    cos, sin = tables(D, T)
    options = dict(
        positions=None, eps=1e-6, interleaved=False, rotary_dim=D, weight_offset=0.0
    )
    return (q, k, w_q, w_k, cos, sin), options


def test_qk_norm_plans_follow_the_module_tuning(monkeypatch):
    """Assigning ``qk_norm_rope.FORWARD`` (as a sweep does) gives the next launch a
    plan of the new tuning, not the one kept for the old; both are right. The
    backward's key holds the ``BACKWARD`` it was computed with."""
    monkeypatch.setattr(launch, "_KEPT", {})
    plans = []
    monkeypatch.setattr(
        qk_norm_rope, "launch", lambda kernel, kept, ptrs: plans.append(kept.plan)
    )
    (q, k, w_q, w_k, cos, sin), options = _qk_norm_args()
    forward = qk_norm_rope.FORWARD
    for tuning in (forward, forward._replace(pairs_per_tile=64)):
        monkeypatch.setattr(qk_norm_rope, "FORWARD", tuning)
        out = (torch.empty_like(q), torch.empty_like(k))
        qk_norm_rope.qk_norm_rope_forward(q, k, w_q, w_k, cos, sin, *out, **options)
    assert len(plans) == 2 and plans[0].args != plans[1].args
    # the backward: a key computed ahead keeps the BACKWARD of its time, even when
    # BACKWARD is assigned before the backward launches
    key = qk_norm_rope.backward_key(q, k, w_q, w_k, cos, sin, q, k, **options)
    monkeypatch.setattr(
        qk_norm_rope, "BACKWARD", qk_norm_rope.BACKWARD._replace(pairs_per_tile=64)
    )
    made, make = [], qk_norm_rope._plan
    monkeypatch.setattr(qk_norm_rope, "_plan", lambda *a: made.append(a) or make(*a))
    dq_out, dk_out = torch.ones_like(q), torch.ones_like(k)
    qk_norm_rope.qk_norm_rope_backward(
        q, k, w_q, w_k, cos, sin, dq_out, dk_out, key=key, **options
    )
    assert made[-1][-1] == key[-1] != qk_norm_rope.BACKWARD


def test_qk_norm_results_do_not_depend_on_the_module_tuning(monkeypatch):
    """The forward under two module tunings, launched for real: both match the
    float64 reference."""
    monkeypatch.setattr(launch, "_KEPT", {})
    (q, k, w_q, w_k, cos, sin), options = _qk_norm_args()
    forward = qk_norm_rope.FORWARD
    for tuning in (forward, forward._replace(pairs_per_tile=64)):
        monkeypatch.setattr(qk_norm_rope, "FORWARD", tuning)
        q_out = torch.full_like(q, float("nan"))
        k_out = torch.full_like(k, float("nan"))
        qk_norm_rope.qk_norm_rope_forward(
            q, k, w_q, w_k, cos, sin, q_out, k_out, **options
        )
        for out, x, w in ((q_out, q, w_q), (k_out, k, w_k)):
            ref = qk_norm_rope_reference(x, w, cos, sin)
            assert relative_error(out, ref) <= TOLERANCE[torch.float32]


def test_angles_plans_follow_the_module_tile(monkeypatch):
    """Assigning ``angles.PAIRS_PER_TILE`` gives the next launch a plan of its own."""
    monkeypatch.setattr(launch, "_KEPT", {})
    made, make = [], angles._plan
    monkeypatch.setattr(angles, "_plan", lambda *a: made.append(a) or make(*a))
    inv_freq, _ = scaling.default(16, device=ropetut.DEVICE)
    q = randn(1, 64, 2, 16)
    outs = []
    for pairs in (angles.PAIRS_PER_TILE, 64):
        monkeypatch.setattr(angles, "PAIRS_PER_TILE", pairs)
        outs.append(torch.full_like(q, float("nan")))
        angles.rope_angles(q, None, inv_freq, outs[-1], None)
    assert len(made) == 2
    assert torch.equal(outs[0], outs[1])
