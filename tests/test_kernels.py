"""The kernel registry, and every kernel version against the float64 reference, into NaN-poisoned
outputs."""
import pytest
import torch
from conftest import gpu_only, randn, tables

import ropetut
from ropetut.check import TOLERANCE, check_case, relative_error, run_poisoned
from ropetut.kernels import KERNELS
from ropetut.kernels.tiles import tile_sizes
from ropetut.reference import rope_reference

CPU_DTYPES = [torch.float32, torch.float16]
PAIRS = {impl: not KERNELS[impl].half_split for impl in ropetut.IMPLS}   # interleaved?


@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=str)
@pytest.mark.parametrize("impl", ropetut.IMPLS)
def test_odd_shape_matches_reference(impl, dtype):
    # D=96 (not a power of two: masked pairs), H=3, T=17 (a partial token block)
    err = check_case(impl, B=2, T=17, HQ=3, HK=3, D=96, dtype=dtype, interleaved=PAIRS[impl])
    assert err <= TOLERANCE[dtype], err


@pytest.mark.parametrize("impl", ropetut.IMPLS)
def test_bhtd_layout(impl):
    err = check_case(impl, B=2, T=9, HQ=2, HK=2, D=32, dtype=torch.float32,
                     interleaved=PAIRS[impl], layout="bhtd")
    assert err <= TOLERANCE[torch.float32], err


@pytest.mark.parametrize("impl", ["v4", "final"])
def test_gqa_fused(impl):
    err = check_case(impl, B=2, T=11, HQ=6, HK=2, D=32, dtype=torch.float16)
    assert err <= TOLERANCE[torch.float16], err


@pytest.mark.parametrize("impl", ropetut.IMPLS)
def test_strided_views_from_fused_qkv(impl):
    """q and k as views into one (B, H, T, 3, D) buffer: no dimension is contiguous but D."""
    B, H, T, D = 2, 3, 10, 32
    qkv = randn(B, H, T, 3, D)
    q, k = qkv[:, :, :, 0], qkv[:, :, :, 1]          # (B, H, T, D) views, BHTD layout
    cos, sin = tables(D, T)
    q_out, k_out = run_poisoned(impl, q, k, cos, sin, layout="bhtd", interleaved=PAIRS[impl])
    opts = dict(layout="bhtd", interleaved=PAIRS[impl])
    assert relative_error(q_out, rope_reference(q, cos, sin, **opts)) <= 2e-6
    assert relative_error(k_out, rope_reference(k, cos, sin, **opts)) <= 2e-6


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 48, 32])
def test_final_pairs_and_partial_rotary(interleaved, rotary_dim):
    err = check_case("final", B=2, T=17, HQ=3, HK=1, D=96, dtype=torch.float32,
                     interleaved=interleaved, rotary_dim=rotary_dim)
    assert err <= TOLERANCE[torch.float32], err


@pytest.mark.parametrize("shape", ["T", "BT"])
def test_final_positions(shape):
    B, T, H, D = 2, 7, 2, 16
    cos, sin = tables(D, 50)
    q, k = randn(B, T, H, D), randn(B, T, H, D)
    pos = torch.randint(0, 50, (T,) if shape == "T" else (B, T)).to(ropetut.DEVICE)
    q_out, k_out = run_poisoned("final", q, k, cos, sin, positions=pos)
    assert relative_error(q_out, rope_reference(q, cos, sin, positions=pos)) <= 2e-6
    assert relative_error(k_out, rope_reference(k, cos, sin, positions=pos)) <= 2e-6


def test_final_in_place_leaves_pass_through_dims_alone():
    B, T, H, D, R = 2, 9, 3, 64, 32
    cos, sin = tables(D, T, rotary_dim=R)
    q = randn(B, T, H, D)
    before = q.clone()
    out = ropetut.apply_rope(q, cos=cos, sin=sin, rotary_dim=R, inplace=True)
    assert out.data_ptr() == q.data_ptr()
    assert torch.equal(q[..., R:], before[..., R:])
    assert relative_error(q, rope_reference(before, cos, sin, rotary_dim=R)) <= 2e-6


@pytest.mark.parametrize("impl", ["v4", "final"])
def test_backward_flag_turns_by_minus_theta(impl):
    B, T, H, D = 2, 9, 2, 32
    cos, sin = tables(D, T)
    q, k = randn(B, T, H, D), randn(B, T, H, D)
    q_out, k_out = run_poisoned(impl, q, k, cos, sin, backward=True)
    assert relative_error(q_out, rope_reference(q, cos, sin, inverse=True)) <= 2e-6
    assert relative_error(k_out, rope_reference(k, cos, sin, inverse=True)) <= 2e-6


@gpu_only
@pytest.mark.parametrize("impl", ropetut.IMPLS)
def test_bf16_on_gpu(impl):
    err = check_case(impl, B=2, T=333, HQ=8, HK=8, D=128, dtype=torch.bfloat16, interleaved=PAIRS[impl])
    assert err <= TOLERANCE[torch.bfloat16], err


@gpu_only
@pytest.mark.parametrize("impl", ropetut.IMPLS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_large_shapes_on_gpu(impl, dtype):
    err = check_case(impl, B=4, T=4096, HQ=32, HK=8 if impl in ("v4", "final") else 32, D=128,
                     dtype=dtype, interleaved=PAIRS[impl])
    assert err <= TOLERANCE[dtype], err


@gpu_only
def test_past_2_31_elements_needs_int64_offsets():
    """q holds 2**31 + 2**23 elements: offsets of its last tokens overflow int32."""
    B, H, D = 1, 32, 128
    T = (2**31 + 2**23) // (H * D)
    cos, sin = tables(D, T)
    q = torch.empty(B, T, H, D, device="cuda", dtype=torch.float16).normal_()
    tail = q[:, -4:].clone()
    ropetut.apply_rope(q, cos=cos, sin=sin, inplace=True)
    ref = rope_reference(tail, cos[-4:], sin[-4:])
    assert relative_error(q[:, -4:], ref) <= TOLERANCE[torch.float16]


def test_tile_sizes_cover_heads_then_tokens():
    assert tile_sizes(T=4096, H=32, half=64) == (1, 32, 64)
    assert tile_sizes(T=4096, H=8, half=64) == (4, 8, 64)
    assert tile_sizes(T=3, H=3, half=48) == (4, 4, 64)


def _asks(kernel, D=16):
    """One call per thing a kernel may lack: (argument, apply_rope's keywords, supported?)."""
    can = kernel.supports
    pos = torch.tensor([3, 1, 0, 2], device=ropetut.DEVICE)
    return [("interleaved", dict(interleaved=True), "interleaved" in can.pairs),
            ("interleaved", dict(interleaved=False), "half" in can.pairs),
            ("positions", dict(positions=pos), can.positions),
            ("rotary_dim", dict(rotary_dim=D // 2), can.partial),
            ("inplace", dict(inplace=True), can.inplace),
            ("q", dict(dtype=torch.float64), torch.float64 in can.dtypes)]


@pytest.mark.parametrize("impl", ropetut.IMPLS)
def test_each_kernel_does_what_its_supports_record_says_and_refuses_the_rest(impl):
    """The registry is the one place a kernel's capabilities are declared: what it claims runs and
    matches the reference; what it doesn't is refused, naming the argument, before any write."""
    kernel = KERNELS[impl]
    for argument, asked, supported in _asks(kernel):
        asked = dict(asked)
        dtype = asked.pop("dtype", torch.float32)
        if "interleaved" not in asked:
            asked["interleaved"] = not kernel.half_split
        R = asked.get("rotary_dim", 16)
        cos, sin = tables(16, 4, rotary_dim=R, dtype=dtype)
        q, k = randn(1, 4, 2, 16, dtype=dtype), randn(1, 4, 1, 16, dtype=dtype)
        before = q.clone(), k.clone()
        if not supported:
            with pytest.raises((ValueError, TypeError), match=f"^{argument}: impl='{impl}'"):
                ropetut.apply_rope(q, k, cos, sin, impl=impl, **asked)
            assert torch.equal(q, before[0]) and torch.equal(k, before[1])
            continue
        ref = [rope_reference(x, cos, sin, **{n: v for n, v in asked.items() if n != "inplace"})
               for x in before]
        q_out, k_out = ropetut.apply_rope(q, k, cos, sin, impl=impl, **asked)
        assert max(relative_error(q_out, ref[0]), relative_error(k_out, ref[1])) <= TOLERANCE[dtype]


def test_every_kernel_is_registered_with_one_signature():
    import inspect
    assert ropetut.IMPLS == ("v1", "v2", "v3", "v4", "final")   # public names, unchanged
    assert ropetut.OPTIONAL_IMPLS == ("cute",)
    for name, kernel in KERNELS.items():
        assert kernel.name == name
        params = list(inspect.signature(kernel.launch).parameters)
        assert params == ["q", "k", "cos", "sin", "q_out", "k_out", "positions", "interleaved",
                          "rotary_dim", "backward", "prepared"], name


# The Triton releases whose launcher the cached launch in kernels/final.py was checked against
# (tests on the H100 under both; see CHANGELOG.md). A new release fails here until it is checked.
TRITONS_CHECKED = ("3.6.0", "3.7.1")


def test_triton_launches_a_compiled_kernel_as_final_does():
    """final's cached launch calls Triton's private ``CompiledKernel.run`` as ``JITFunction.run``
    does. Nothing compiles under the interpreter, so this pins a proxy: the installed Triton is
    one the call was checked against, and its ``JITFunction.run`` still makes that call (read
    from triton/runtime/jit.py). Where it doesn't, final falls back to ``kernel[grid](...)``."""
    import triton

    from ropetut.kernels import final
    assert triton.__version__ in TRITONS_CHECKED, (
        f"triton {triton.__version__}: check final's cached launch on a GPU, then add it")
    assert final.direct_launch_matches()


def test_a_changed_triton_launch_call_is_detected(monkeypatch):
    from ropetut.kernels import final
    monkeypatch.setattr(final, "TRITON_LAUNCH_CALL", final.TRITON_LAUNCH_CALL.replace(
        "kernel.packed_metadata, ", ""))
    final.direct_launch_matches.cache_clear()
    try:
        assert not final.direct_launch_matches()
    finally:
        final.direct_launch_matches.cache_clear()


@pytest.mark.parametrize("matches", [True, False])
def test_only_a_matching_triton_gets_cached_launches(monkeypatch, matches):
    """Where the launch call differs, nothing is cached, so every call takes kernel[grid](...).
    (Under the interpreter nothing compiles: a stand-in compiled kernel is enough to see which.)"""
    from ropetut.kernels import final
    monkeypatch.setattr(final, "direct_launch_matches", lambda: matches)
    monkeypatch.setattr(final, "_first_launch", lambda *a: (object(), (1, 1, 1), ()))
    monkeypatch.setattr(final, "_LAUNCHES", {})
    q = randn(1, 4, 2, 16)
    cos, sin = tables(16, 4)
    final.rope_final(q, None, cos, sin, torch.empty_like(q), None)
    assert len(final._LAUNCHES) == (1 if matches else 0)


@gpu_only
def test_final_falls_back_to_the_public_launch_when_triton_changed(monkeypatch):
    from ropetut.kernels import final
    monkeypatch.setattr(final, "direct_launch_matches", lambda: False)
    final._LAUNCHES.clear()
    for _ in range(2):   # the second call would be a cached launch
        err = check_case("final", B=2, T=33, HQ=4, HK=2, D=64, dtype=torch.float32)
        assert err <= TOLERANCE[torch.float32]
    assert not final._LAUNCHES
