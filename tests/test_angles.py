"""Table-free RoPE (ropetut.angles): against float64 references with exact angles, at
small shapes and at huge positions, and against the naive float32 angle it replaces."""

import math
from fractions import Fraction

import mpmath
import pytest
import torch
import triton
import triton.language as tl
from conftest import gpu_only, randn

import ropetut
from ropetut import scaling
from ropetut.angles import apply_rope_angles
from ropetut.check import TOLERANCE, relative_error
from ropetut.book.angle_words import turn_words
from ropetut.kernels import angles as angle_kernel
from ropetut.kernels import launch
from ropetut.kernels.angles import PAIRS_PER_TILE, _cos_sin_of_turn, rope_angles
from ropetut.kernels.tiles import tile_sizes

DEV = ropetut.DEVICE


def exact_tables(positions, inv_freq):
    """cos and sin of ``p * inv_freq`` for each position, reduced mod 2pi in 40-digit
    arithmetic (a float64 product is off by 1e-16 of the angle): rows in positions'
    order, ``(len(positions), len(inv_freq))`` float64."""
    mpmath.mp.dps = 40
    two_pi = 2 * mpmath.pi
    angles = [
        [float(mpmath.fmod(mpmath.mpf(int(p)) * mpmath.mpf(float(f)), two_pi)) for f in
         inv_freq.double().cpu()]
        for p in positions
    ]  # fmt: skip
    angles = torch.tensor(angles, dtype=torch.float64)
    return angles.cos(), angles.sin()


def reference(x, positions, inv_freq, **options):
    """The float64 reference at the given positions ((T,) or (B, T) integers)."""
    flat = positions.reshape(-1).cpu()
    cos, sin = exact_tables(flat.tolist(), inv_freq)
    rows = torch.arange(flat.numel()).reshape(positions.shape)
    return ropetut.rope_reference(x, cos, sin, positions=rows, **options)


def near_powers_of_two(top=24):
    """Positions dense around each power of two up to 2**top, and 2**top itself."""
    around = [-3, -1, 0, 1, 2]
    return sorted({max(0, 2**e + d) for e in range(4, top + 1) for d in around})


def scale_error(out, ref):
    """max |out - ref| relative to the output's scale (max |ref|), per token."""
    out, ref = out.detach().double().cpu(), ref.double().cpu()
    return ((out - ref).abs().amax(dim=(0, 2, 3)) / ref.abs().amax()).max().item()


@pytest.mark.parametrize("inv_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("variant", ["default", "llama3", "yarn"])
def test_error_up_to_2_to_24_at_most_1e6(variant, inv_dtype):
    """The issue's bound: max |error| relative to the output's scale <= 1e-6 in fp32 at
    every sampled position up to 2**24 (on the CPU the kernel's polynomials run in
    numpy's float32; test_gpu_error_near_powers_of_two runs them on the device)."""
    args = {"default": (128, 500000.0), "llama3": (128,), "yarn": (128, 4.0, 8192)}
    inv_freq, _ = scaling.VARIANTS[variant](*args[variant], device=DEV)
    inv_freq = inv_freq.to(inv_dtype)
    positions = torch.tensor(near_powers_of_two(), device=DEV)
    q = randn(1, positions.numel(), 2, 128)
    out = apply_rope_angles(q, None, inv_freq, positions=positions)
    assert scale_error(out, reference(q, positions, inv_freq)) <= 1e-6


def test_naive_fp32_angles_are_what_it_removes():
    """Rounding ``p * inv_freq`` to fp32, as a table built in fp32 or a naive kernel
    does, is off by about 5e-4 of the output's scale near 2**16 and by more than 1e-1
    near 2**24 (the test asks for 1e-4 and 1e-2)."""
    inv_freq, _ = scaling.default(128, 500000.0)
    positions = torch.tensor([2**16 + 1, 2**20 - 1, 2**24 - 1])
    q = randn(1, 3, 2, 128).cpu()
    naive = positions.float()[:, None] * inv_freq.float()[None]
    rows = torch.arange(3)
    naive_out = ropetut.rope_reference(q, naive.cos(), naive.sin(), positions=rows)
    ref = reference(q, positions, inv_freq)
    exact_out = apply_rope_angles(q.to(DEV), None, inv_freq.to(DEV),
                                  positions=positions.to(DEV))  # fmt: skip
    per_token = [scale_error(naive_out[:, t : t + 1], ref[:, t : t + 1]) for t in rows]
    assert per_token[0] > 1e-4 and per_token[2] > 1e-2
    assert scale_error(exact_out, ref) < 1e-6


def test_positions_past_2_to_24():
    """Beyond 2**24 (the fp32 integers' end) to 2**30, still within 1e-6."""
    inv_freq, _ = scaling.default(64, 10000.0, device=DEV)
    positions = torch.tensor([2**24 + 1, 2**27 + 3, 2**30 - 1, 2**30 + 5], device=DEV)
    q = randn(1, 4, 1, 64)
    out = apply_rope_angles(q, None, inv_freq, positions=positions)
    assert scale_error(out, reference(q, positions, inv_freq)) <= 1e-6


def test_programs_below_2_to_24_agree_with_the_long_path():
    """A program whose positions are all below 2**24 takes the short path (one product
    and its exact error, ``_fraction_of_turns``); the same positions in a program that
    also holds one past 2**24 take the long path (12-bit parts and words). Both are
    within the bound, and within a few float32 roundings of each other."""
    inv_freq, _ = scaling.default(128, 500000.0, device=DEV)
    below = [5, 2**20 + 3, 2**23 + 1, 2**24 - 1]
    positions = torch.tensor([below + [7], below + [2**24 + 1]], device=DEV)
    block_t, _, _ = tile_sizes(5, 1, 64, PAIRS_PER_TILE)
    assert block_t >= 5  # one program a sequence
    q = randn(1, 5, 1, 128).repeat(2, 1, 1, 1)
    out = apply_rope_angles(q, None, inv_freq, positions=positions)
    ref = reference(q, positions, inv_freq)
    assert scale_error(out, ref) <= 1e-6
    short, long = out[0, :4].double(), out[1, :4].double()
    assert not torch.equal(short, long)  # two paths, not one
    assert ((short - long).abs().max() / ref.abs().max()).item() <= 1e-6


@pytest.fixture(params=["many programs", "one short wave"])
def plan(request, monkeypatch):
    """Either plan of ``angles._plan``, whatever the GPU: the SM count it compares the
    grid with set to 0 (never one short wave) or to 10**6 (always), kept plans and
    kernels cleared."""
    sms = 10**6 if request.param == "one short wave" else 0
    monkeypatch.setattr(launch, "_KEPT", {})
    monkeypatch.setattr(angle_kernel, "_sms", lambda q: sms)
    return request.param


def kept_plans():
    """(num_warps, HEAD_SPLIT, LOADS_FIRST) of every table-free plan kept so far."""
    kernel = angle_kernel.rope_angles_kernel
    plans = [kept.plan for (k, _), kept in launch._KEPT.items() if k is kernel]
    return {(p.num_warps, *p.args[-2:]) for p in plans}  # the last two constexprs


@pytest.mark.parametrize("HQ", [6, 64, 96])  # 64, 96: two, three blocks in a short wave
@pytest.mark.parametrize("inplace", [False, True], ids=["out of place", "in place"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_both_plans_give_the_same_outputs(monkeypatch, HQ, inplace, interleaved):
    """A grid of no more programs than the GPU has SMs (decode) takes the same tokens a
    program, more heads, more warps, and the first block's loads ahead of the angles
    (``angles._plan``); SMs left over take the tile's other blocks of heads. Each
    program's arithmetic is the same. Every plan against the reference, and against
    each other: the same bits through the interpreter, within the bound on the GPU
    (each compile contracts its own FMAs). With no SM to spare one program walks every
    block of the short tile's heads (the reload after LOADS_FIRST); with twice the SMs,
    two programs share two or three blocks; with many, blocks of half the short tile,
    each its own program. In place, a block written twice would be turned twice."""
    inv_freq, _ = scaling.default(96, device=DEV)
    positions = torch.tensor([[3, 2**20 + 1, 17], [2**24 + 5, 9, 1000001]], device=DEV)
    q, k = randn(2, 3, HQ, 128), randn(2, 3, 2, 128)
    block_t = tile_sizes(3, HQ, 48, PAIRS_PER_TILE)[0]
    programs = 2 * triton.cdiv(3, block_t)  # the normal plan's, tokens a program
    spare = (programs, 2 * programs, 10**6)  # SMs for one short wave, or to spare
    splits = {6: (1, 1, 1), 64: (1, 2, 4), 96: (1, 2, 6)}[HQ]  # HEAD_SPLIT of each
    short_warps = angle_kernel.SHORT_WAVE_NUM_WARPS
    outs, plans = {}, {}
    expected = {0: {(angle_kernel.NUM_WARPS, 1, False)}} | {
        sms: {(short_warps, split, True)} for sms, split in zip(spare, splits)
    }
    for sms in (0, *spare):  # never a short wave, then one
        monkeypatch.setattr(launch, "_KEPT", {})
        monkeypatch.setattr(angle_kernel, "_sms", lambda q, sms=sms: sms)
        x, y = q.clone(), k.clone()
        outs[sms] = apply_rope_angles(
            x, y, inv_freq, positions=positions, interleaved=interleaved,
            rotary_dim=96, inplace=inplace,
        )  # fmt: skip
        plans[sms] = kept_plans()
    assert plans == expected
    for x, *each in zip((q, k), *outs.values(), strict=True):
        ref = reference(x, positions, inv_freq, interleaved=interleaved, rotary_dim=96)
        assert all(scale_error(out, ref) <= 1e-6 for out in each)
        for out in each[1:]:
            if ropetut.on_gpu():
                assert scale_error(out, each[0]) <= 1e-6
            else:
                assert torch.equal(out, each[0])


def test_positions_outside_the_range_give_nan():
    inv_freq, _ = scaling.default(16, device=DEV)
    positions = torch.tensor([-1, 5, 2**36], device=DEV)
    out = apply_rope_angles(randn(1, 3, 2, 16), None, inv_freq, positions=positions)
    assert out[:, 0].isnan().all() and out[:, 1].isfinite().all()
    assert out[:, 2].isnan().all()


CASES = [
    dict(B=2, T=17, HQ=4, HK=2, D=32),  # GQA
    dict(B=1, T=17, HQ=3, HK=3, D=96),  # odd shape
    dict(B=2, T=9, HQ=4, HK=1, D=32, interleaved=True),
    dict(B=2, T=9, HQ=2, HK=2, D=32, rotary_dim=16),
    dict(B=2, T=9, HQ=4, HK=2, D=32, layout="bhtd"),
    dict(B=2, T=9, HQ=4, HK=2, D=32, positions=True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("inplace", [False, True])
def test_options_against_the_reference(case, dtype, inplace, plan):
    B, T, HQ, HK, D = (case[key] for key in ("B", "T", "HQ", "HK", "D"))
    layout = case.get("layout", "bthd")
    R = case.get("rotary_dim") or D
    options = dict(interleaved=case.get("interleaved", False), rotary_dim=R)
    shape = (lambda H: (B, T, H, D)) if layout == "bthd" else (lambda H: (B, H, T, D))
    q, k = randn(*shape(HQ), dtype=dtype), randn(*shape(HK), dtype=dtype)
    positions = (
        torch.randint(0, 5000, (B, T), device=DEV) if case.get("positions") else None
    )
    inv_freq, _ = scaling.default(R, device=DEV)
    if inplace:
        q_out, k_out = q.clone(), k.clone()
        apply_rope_angles(q_out, k_out, inv_freq, positions=positions, inplace=True,
                          layout=layout, **options)  # fmt: skip
    else:
        q_out, k_out = apply_rope_angles(q, k, inv_freq, positions=positions,
                                         layout=layout, **options)  # fmt: skip
    rows = torch.arange(T, device=DEV).expand(B, T) if positions is None else positions
    for x, out in ((q, q_out), (k, k_out)):
        ref = reference(x, rows, inv_freq, layout=layout, **options)
        assert relative_error(out, ref) <= TOLERANCE[dtype]


@pytest.mark.parametrize("rotary_dim", [96, 64])
def test_launch_writes_every_element_of_nan_outputs(rotary_dim):
    """The launcher into outputs filled with NaN: every element written (the
    pass-through dims copied too), odd shape, GQA."""
    inv_freq, _ = scaling.default(rotary_dim, device=DEV)
    q, k = randn(1, 17, 3, 96), randn(1, 17, 1, 96)
    q_out, k_out = (torch.full_like(x, float("nan")) for x in (q, k))
    rope_angles(q, k, inv_freq, q_out, k_out, rotary_dim=rotary_dim)
    rows = torch.arange(17, device=DEV)
    for x, out in ((q, q_out), (k, k_out)):
        ref = reference(x, rows, inv_freq, rotary_dim=rotary_dim)
        assert relative_error(out, ref) <= TOLERANCE[torch.float32]


def test_backward_and_gradcheck_fp64():
    inv_freq, _ = scaling.default(8, device=DEV)
    q = randn(2, 5, 2, 8, dtype=torch.float64).requires_grad_()
    k = randn(2, 5, 1, 8, dtype=torch.float64).requires_grad_()
    positions = torch.tensor([[3, 0, 7, 1, 2], [9, 8, 7, 6, 5]], device=DEV)

    def f(q, k):
        return apply_rope_angles(q, k, inv_freq, positions=positions)

    assert torch.autograd.gradcheck(f, (q, k))
    assert torch.autograd.gradgradcheck(f, (q, k))


def test_backward_matches_table_mode():
    """The same gradient as apply_rope with a table of the same angles."""
    inv_freq, _ = scaling.default(32, device=DEV)
    q = randn(1, 9, 2, 32).requires_grad_()
    dq = randn(1, 9, 2, 32)
    apply_rope_angles(q, None, inv_freq).backward(dq)
    cos, sin = ropetut.rope_tables(inv_freq, 9, device=DEV)
    q2 = q.detach().clone().requires_grad_()
    ropetut.apply_rope(q2, cos=cos, sin=sin).backward(dq)
    assert relative_error(q.grad, q2.grad) <= 2e-6


def test_bad_arguments_name_themselves():
    inv_freq, _ = scaling.default(16, device=DEV)
    q = randn(1, 4, 2, 16)
    with pytest.raises(TypeError, match="inv_freq"):
        apply_rope_angles(q, None, None)
    with pytest.raises(TypeError, match="inv_freq"):
        apply_rope_angles(q, None, inv_freq.half())
    with pytest.raises(ValueError, match="inv_freq"):
        apply_rope_angles(q, None, inv_freq[:4])
    with pytest.raises(TypeError, match="positions"):
        apply_rope_angles(q, None, inv_freq, positions=torch.zeros(4, device=DEV))
    with pytest.raises(ValueError, match="positions"):
        apply_rope_angles(q, None, inv_freq, positions=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_rope_angles(q, None, inv_freq, rotary_dim=3)
    with pytest.raises(ValueError, match="k"):
        apply_rope_angles(q, randn(1, 4, 3, 16), inv_freq)
    with pytest.raises(ValueError, match="layout"):
        apply_rope_angles(q, None, inv_freq, layout="thd")
    with pytest.raises(ValueError, match="q"):
        apply_rope_angles(q.expand(2, 4, 2, 16), None, inv_freq, inplace=True)
    with pytest.raises(ValueError, match="^q: head dim must be even"):  # as apply_rope
        apply_rope_angles(randn(1, 4, 2, 17), None, inv_freq, rotary_dim=16)


def test_refusal_writes_nothing():
    inv_freq, _ = scaling.default(16, device=DEV)
    q = randn(1, 4, 2, 16)
    before = q.clone()
    with pytest.raises(ValueError):
        apply_rope_angles(q, randn(1, 4, 3, 16), inv_freq, inplace=True)
    assert torch.equal(q, before)


def test_in_place_on_an_inference_tensor_is_refused_outside_inference_mode():
    """As apply_rope and torch: an inference tensor is written in place only inside
    torch.inference_mode(), and the refusal writes nothing."""
    inv_freq, _ = scaling.default(16, device=DEV)
    with torch.inference_mode():
        q = randn(1, 4, 2, 16)
    before = q.clone()
    with pytest.raises(ValueError, match="^q: in place on an inference tensor"):
        apply_rope_angles(q, None, inv_freq, inplace=True)
    assert torch.equal(q, before)
    with torch.inference_mode():
        apply_rope_angles(q, None, inv_freq, inplace=True)
    assert not torch.equal(q, before)


@gpu_only
def test_gpu_error_near_powers_of_two():
    """On the GPU, the polynomials run in the device's float32 (FMAs contracted by
    the compiler): the same bound must hold."""
    inv_freq, _ = scaling.llama3(128, device="cuda")
    positions = torch.tensor(near_powers_of_two(), device="cuda")
    q = randn(4, positions.numel(), 8, 128)
    out = apply_rope_angles(
        q, None, inv_freq.float(), positions=positions.expand(4, -1)
    )
    ref = reference(q, positions.expand(4, -1), inv_freq.float())
    assert scale_error(out, ref) <= 1e-6


def test_a_call_is_one_launch_and_no_torch_op_on_inv_freq(monkeypatch):
    """The kernel computes its words: apply_rope_angles, forward and backward, hands
    inv_freq itself to one launch each and runs no torch op on it (the dozen ops of a
    host-side split would run on every CUDA graph replay). The launch is recorded, not
    made, so the interpreter's own copies of its arguments are not counted."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from ropetut.kernels import angles

    launched = []
    monkeypatch.setattr(angles, "launch", lambda *args: launched.append(args[2]))
    inv_freq, _ = scaling.default(32, device=DEV)
    storage = inv_freq.untyped_storage().data_ptr()
    touched = []

    def reads_inv_freq(t):
        return isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == storage

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(reads_inv_freq(t) for t in tree_leaves((args, kwargs or {}))):
                touched.append(func)
            return func(*args, **(kwargs or {}))

    q, k = randn(1, 9, 2, 32).requires_grad_(), randn(1, 9, 1, 32)
    with Watch():
        q_out, _ = apply_rope_angles(q, k, inv_freq)
        assert len(launched) == 1
        q_out.backward(torch.ones_like(q_out))
    assert len(launched) == 2
    assert all(pointers[4].data_ptr() == inv_freq.data_ptr() for pointers in launched)
    assert touched == []


def test_inv_freq_is_saved_for_the_backward():
    """A write to inv_freq between the forward and the backward raises, as for any
    tensor autograd saved (the backward would turn by other angles). An inference
    tensor cannot be saved, nor written outside inference mode: it is kept, and gives
    the gradient a normal tensor gives."""
    inv_freq, _ = scaling.default(16, device=DEV)
    with torch.inference_mode():
        frozen = inv_freq.clone()
    q, dq = randn(1, 5, 2, 16).requires_grad_(), randn(1, 5, 2, 16)
    grads = [torch.autograd.grad(apply_rope_angles(q, None, f), q, dq)[0]
             for f in (inv_freq, frozen)]  # fmt: skip
    assert torch.equal(grads[0], grads[1])
    out = apply_rope_angles(q, None, inv_freq)
    inv_freq.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(dq)


def test_positions_are_saved_for_the_backward():
    """As inv_freq: a write to positions between the forward and the backward raises;
    positions made under inference mode are kept, and give the same gradient."""
    inv_freq, _ = scaling.default(16, device=DEV)
    positions = torch.tensor([3, 0, 7, 1, 2], device=DEV)
    with torch.inference_mode():
        frozen = positions.clone()
    q, dq = randn(1, 5, 2, 16).requires_grad_(), randn(1, 5, 2, 16)
    grads = [torch.autograd.grad(apply_rope_angles(q, None, inv_freq, positions=p), q,
                                 dq)[0] for p in (positions, frozen)]  # fmt: skip
    assert torch.equal(grads[0], grads[1])
    out = apply_rope_angles(q, None, inv_freq, positions=positions)
    positions.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward(dq)

def test_strided_and_fp64_frequencies():
    """inv_freq with a stride (every other entry of a buffer) or in fp64: the kernel
    reads it as it is, and turns as by the contiguous fp32 copy of the same values."""
    inv_freq = scaling.default(32, device=DEV)[0].float()
    q = randn(1, 9, 2, 32)
    expected = apply_rope_angles(q, None, inv_freq)
    buffer = torch.zeros(16, 2, device=DEV)
    buffer[:, 0] = inv_freq
    assert buffer[:, 0].stride() == (2,)
    assert torch.equal(apply_rope_angles(q, None, buffer[:, 0]), expected)
    # (fp32 values in fp64: the same quotients inv_freq / 2pi, so the same words)
    assert torch.equal(apply_rope_angles(q, None, inv_freq.double()), expected)


def significant_bits(x: float) -> int:
    """The bits from x's leading 1 to its last 1 (0 for 0)."""
    n = abs(x.as_integer_ratio()[0])
    return (n // (n & -n)).bit_length() if n else 0


def words_of(inv_freq):
    """The kernel's c (as Python floats) and words (fp32 values as Python floats)."""
    c, words = turn_words(inv_freq)
    return c.cpu().tolist(), words.double().cpu().T.tolist()


def frequencies():
    """Each variant's inv_freq (default at two bases, Llama-3.1, YaRN), with edges:
    0 (a masked lane's), 2pi (one turn exactly), powers of two, and random values."""
    variants = [scaling.default(128, 10000.0)[0], scaling.default(128, 500000.0)[0],
                scaling.llama3(128)[0], scaling.yarn(128, 4.0, 8192)[0]]  # fmt: skip
    edges = torch.tensor([0.0, 2 * math.pi, 1.0, 0.5, 2.0**-20, 1 / 3])
    draw = torch.Generator().manual_seed(1)
    drawn = 10 ** (-8 * torch.rand(200, generator=draw, dtype=torch.float64))
    return torch.cat([*variants, edges.double(), drawn])


def test_turn_words_reads_any_stride():
    """turn_words on every other entry of a buffer gives the contiguous copy's words;
    a 2-D inv_freq is refused by name."""
    inv_freq = scaling.default(32, device=DEV)[0]
    buffer = torch.zeros(16, 2, dtype=torch.float64, device=DEV)
    buffer[:, 0] = inv_freq
    for got, expected in zip(turn_words(buffer[:, 0]), turn_words(inv_freq)):
        assert torch.equal(got, expected)
    with pytest.raises(ValueError, match="inv_freq"):
        turn_words(buffer)


@pytest.mark.parametrize("inv_dtype", [torch.float32, torch.float64])
def test_words_split_c_exactly_in_12_bit_parts(inv_dtype):
    """The premise of the kernel's exactness, on the words it computes: c is
    ``inv_freq.double() * (1 / (2 * math.pi))`` (one fp64 product, as Python's), c0,
    c1, c2 have at most 12 significant bits each, each the nearest such value to what
    is left of c (so the remainders, and the three small products, stay small), the
    remainders c - c0 and c - c0 - c1 are rounded to fp32 once, and
    c - c0 - c1 - c2 is exact in fp32 (so the four words sum to c exactly)."""
    inv_freq = frequencies().to(inv_dtype)
    cs, words = words_of(inv_freq.to(DEV))
    for f, c, (c0, c1, c2, c1_rest, c2_rest, c3_rest) in zip(
        inv_freq.tolist(), cs, words
    ):
        assert c == f * (1 / (2 * math.pi))
        left = Fraction(c)
        for part in (c0, c1, c2):
            assert significant_bits(part) <= 12
            _, exponent = math.frexp(float(left))  # left = m 2**e, m in [1/2, 1)
            assert abs(left - Fraction(part)) <= Fraction(2) ** (exponent - 13)
            left -= Fraction(part)
        # exact in fp32, so c0 + c1 + c2 + c3_rest is c exactly
        assert Fraction(c3_rest) == left
        one_left = Fraction(c) - Fraction(c0)
        for rest, exact in ((c1_rest, one_left), (c2_rest, one_left - Fraction(c1))):
            # the exact rest is an fp64 value: rounded to fp32 once
            assert rest == torch.tensor(float(exact), dtype=torch.float64).float()


@triton.jit
def _cos_sin_kernel(turn_ptr, cos_ptr, sin_ptr, N, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    turn = tl.load(turn_ptr + offsets, mask=offsets < N)
    cos, sin = _cos_sin_of_turn(turn, tl.zeros_like(turn))
    tl.store(cos_ptr + offsets, cos, mask=offsets < N)
    tl.store(sin_ptr + offsets, sin, mask=offsets < N)


def test_cos_sin_of_a_turn_within_2e_7_of_float64():
    """The kernel's polynomials over a whole turn (every quadrant, its edges and the
    one-turn-low case of ``_fraction``): within 2e-7 of float64 cos and sin of the
    same float32 turn (truncating the series costs 3e-9; float32 evaluation the rest)."""
    edges = torch.tensor([-1.0, -0.5, -0.375, -0.25, -0.125, 0.0, 0.125, 0.25, 0.5])
    turn = torch.cat([torch.linspace(-0.5, 0.5, 4001), edges]).float().to(DEV)
    cos, sin = torch.empty_like(turn), torch.empty_like(turn)
    _cos_sin_kernel[(triton.cdiv(turn.numel(), 1024),)](
        turn, cos, sin, turn.numel(), BLOCK=1024
    )
    angle = turn.double().cpu() * 2 * math.pi
    assert (cos.double().cpu() - angle.cos()).abs().max() <= 2e-7
    assert (sin.double().cpu() - angle.sin()).abs().max() <= 2e-7


def test_a_launch_plan_is_kept_per_key_in_place_apart(monkeypatch):
    """rope_angles keeps its plan per launch key (``kernels/launch.py``): a repeated
    call makes none, and in place with partial rotary (no pass dims copied) makes its
    own, not out of place's (which copies them): both right."""
    from ropetut.kernels import angles, launch

    monkeypatch.setattr(launch, "_KEPT", {})
    made, make = [], angles._plan
    monkeypatch.setattr(angles, "_plan", lambda *a: made.append(a) or make(*a))
    inv_freq, _ = scaling.default(32, device=DEV)
    q, k = randn(1, 9, 2, 64), randn(1, 9, 1, 64)
    ref_q = reference(q, torch.arange(9), inv_freq, rotary_dim=32)
    for _ in range(2):
        q_out = torch.full_like(q, float("nan"))
        rope_angles(q, k, inv_freq, q_out, torch.empty_like(k), rotary_dim=32)
        assert relative_error(q_out, ref_q) <= TOLERANCE[torch.float32]
    assert len(made) == 1
    q_in_place, k_in_place = q.clone(), k.clone()
    rope_angles(q_in_place, k_in_place, inv_freq, q_in_place, k_in_place,
                rotary_dim=32)  # fmt: skip
    assert relative_error(q_in_place, ref_q) <= TOLERANCE[torch.float32]
    assert len(made) == 2
    # inv_freq's dtype and stride are the kernel's too: plans of their own
    strided = torch.stack([inv_freq, inv_freq], 1)[:, 0]
    for f in (inv_freq.float(), strided):
        q_out = torch.full_like(q, float("nan"))
        rope_angles(q, k, f, q_out, torch.empty_like(k), rotary_dim=32)
        assert relative_error(q_out, ref_q) <= TOLERANCE[torch.float32]
    assert len(made) == 4


@pytest.mark.parametrize("layout", ["like the outputs", "other strides"])
def test_the_backward_launch_prepared_in_the_forward(monkeypatch, layout):
    """The forward computes the backward's launch key for output gradients laid out
    like the outputs, and the backward launches with it (not through
    ``rotate_angles``); gradients with other strides take the ordinary path. Both give
    the table's gradients, and a write to inv_freq still raises on both paths."""
    import ropetut.angles as module

    ordinary = []
    rotate = module.rotate_angles
    monkeypatch.setattr(
        module, "rotate_angles", lambda *a: ordinary.append(a) or rotate(*a)
    )
    inv_freq, _ = scaling.default(16, device=DEV)
    q = randn(2, 5, 4, 16).requires_grad_()
    k = randn(2, 5, 2, 16).requires_grad_()
    dq, dk = randn(2, 5, 4, 16), randn(2, 5, 2, 16)
    if layout == "other strides":  # the same values, heads outermost
        dq = dq.transpose(1, 2).contiguous().transpose(1, 2)
    grads = torch.autograd.grad(apply_rope_angles(q, k, inv_freq), (q, k), (dq, dk))
    assert len(ordinary) == (1 if layout == "like the outputs" else 2)
    cos, sin = ropetut.rope_tables(inv_freq, 5, device=DEV)
    expected = torch.autograd.grad(ropetut.apply_rope(q, k, cos, sin), (q, k), (dq, dk))
    for got, want in zip(grads, expected):
        assert relative_error(got, want) <= 2e-6
    out = apply_rope_angles(q, k, inv_freq)
    inv_freq.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        torch.autograd.grad(out, (q, k), (dq, dk))


def test_a_prepared_backward_keeps_the_tiles_of_its_forward(monkeypatch):
    """A tile assigned between the forward and the backward (as a sweep does) does not
    reach a backward whose key was computed in the forward: the plan kept under that
    key is made with the forward's tiles, and its gradient is right."""
    from ropetut.kernels import angles

    monkeypatch.setattr(launch, "_KEPT", {})
    inv_freq, _ = scaling.default(16, device=DEV)
    q, dq = randn(1, 6, 2, 16).requires_grad_(), randn(1, 6, 2, 16)
    out = apply_rope_angles(q, None, inv_freq)
    monkeypatch.setattr(angles, "PAIRS_PER_TILE", 8)
    (grad,) = torch.autograd.grad(out, q, dq)
    forward, backward = launch._KEPT
    plans = [kept.plan for kept in launch._KEPT.values()]
    assert forward[1][-4] == backward[1][-4] == PAIRS_PER_TILE  # the keys' tiles
    assert plans[0].grid == plans[1].grid  # and the plans': the forward's
    cos, sin = ropetut.rope_tables(inv_freq, 6, device=DEV)
    (want,) = torch.autograd.grad(ropetut.apply_rope(q, None, cos, sin), q, dq)
    assert relative_error(grad, want) <= 2e-6


@pytest.mark.parametrize("early", [True, False], ids=["early-grads", "grads-later"])
def test_in_place_on_a_tensor_with_gaps_prepares_the_gaps_too(early, monkeypatch):
    """In place on a q with gaps between its rows (not a view: its own storage), the
    prepared backward writes input gradients with the outputs' strides, gaps and all,
    as its key says (``empty_like`` would be contiguous, and a plan kept for one layout
    would serve the other), whether the forward made their memory (small tensors) or
    the backward does. The gradient is right, and so is a direct launch of the same
    layouts after it, under the same key."""
    import ropetut.angles as module

    if not early:
        monkeypatch.setattr(module, "EARLY_GRADS_BYTES", 0)
    ordinary = []
    rotate = module.rotate_angles
    monkeypatch.setattr(
        module, "rotate_angles", lambda *a: ordinary.append(a) or rotate(*a)
    )
    inv_freq, _ = scaling.default(16, device=DEV)
    shape, gaps = (2, 3, 4, 16), (576, 192, 16, 1)  # every third row of 64 used

    def with_gaps(x):
        return torch.empty_strided(shape, gaps, device=DEV).copy_(x)

    x = randn(*shape).requires_grad_()
    g = with_gaps(randn(*shape))
    q = with_gaps(x)
    out = apply_rope_angles(q, None, inv_freq, inplace=True)
    (grad,) = torch.autograd.grad(out, x, g)
    assert len(ordinary) == 1 and grad.stride() == gaps  # the forward's only
    cos, sin = ropetut.rope_tables(inv_freq, 3, device=DEV)
    (want,) = torch.autograd.grad(ropetut.apply_rope(x, None, cos, sin), x, g)
    assert relative_error(grad, want) <= 2e-6
    back = with_gaps(torch.zeros(shape))
    rope_angles(g, None, inv_freq, back, None, backward=True)
    assert relative_error(back, want) <= 2e-6


def test_a_second_backward_gets_fresh_gradient_memory():
    """Small tensors get their input gradients' memory in the forward (host time); a
    second backward through the same graph must not write into the tensors the first
    one returned."""
    inv_freq, _ = scaling.default(16, device=DEV)
    q, k = randn(1, 5, 2, 16).requires_grad_(), randn(1, 5, 1, 16).requires_grad_()
    q_out, k_out = apply_rope_angles(q, k, inv_freq)
    weights = [(randn(*q.shape), randn(*k.shape)) for _ in range(2)]
    grads = [
        torch.autograd.grad(
            (q_out * w_q).sum() + (k_out * w_k).sum(), (q, k), retain_graph=True
        )
        for w_q, w_k in weights
    ]
    cos, sin = ropetut.rope_tables(inv_freq, 5, device=DEV)
    for got, (w_q, w_k) in zip(grads, weights):
        want = torch.autograd.grad(ropetut.apply_rope(q, k, cos, sin), (q, k), (w_q, w_k))
        for g, expected in zip(got, want):
            assert relative_error(g, expected) <= 2e-6
