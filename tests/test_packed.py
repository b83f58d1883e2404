"""Packed sequences (ropetut.packed): positions from cu_seqlens on the device, each
sequence checked against the float64 reference on its own."""

import pytest
import torch
from conftest import gpu_only, randn, tables

import ropetut
from ropetut.check import TOLERANCE, relative_error, run_poisoned
from ropetut.packed import apply_rope_thd, packed_positions

DEV = ropetut.DEVICE


def cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=DEV)


def test_positions_restart_per_sequence():
    cu_seqlens = cu([3, 0, 2, 4])
    got = packed_positions(cu_seqlens, 9)
    assert got.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    # on cu_seqlens' device (an indexed one, cuda:0, where DEV is the index-less cuda)
    assert got.dtype == torch.int64 and got.device == cu_seqlens.device


def test_offsets_for_decode_with_a_kv_cache():
    offsets = torch.tensor([10, 0, 7], device=DEV)
    assert packed_positions(cu([1, 1, 2]), 4, offsets).tolist() == [10, 0, 7, 8]
    assert packed_positions(cu([2, 1]), 3, 5).tolist() == [5, 6, 5]


def test_padding_past_the_last_sequence_passes_through():
    """A token past cu_seqlens[-1] gets position 0, a turn by 0: padding (to a static
    length, for CUDA graphs) comes out unchanged, and its gradient too, so a padded batch
    leaves the weights' gradients finite."""
    assert packed_positions(cu([2]), 4).tolist() == [0, 1, 0, 0]
    cos, sin = tables(16, 4)
    x = randn(4, 8)
    w = randn(8, 2 * 16).requires_grad_()
    q = (x @ w).view(4, 2, 16)
    out = apply_rope_thd(q, cos=cos, sin=sin, cu_seqlens=cu([2]))
    assert torch.equal(out[2:], q[2:])
    out[:2].sum().backward()
    assert w.grad.isfinite().all()


def check_packed(
    lengths,
    offsets,
    *,
    H,
    HK,
    D,
    dtype=torch.float32,
    rotary_dim=None,
    interleaved=False,
    seed=0,
):
    """Every sequence of a packed (total, H, D) tensor against the reference of that
    sequence alone, rotated from its offset; outputs poisoned with NaN first."""
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    R = rotary_dim or D
    n_pos = max(o + n for o, n in zip(offsets, lengths)) + 1
    freqs = ropetut.standard(D) if R == D else ropetut.partial(R)
    cos, sin = ropetut.rope_tables(freqs, n_pos, device=DEV)
    q = torch.randn(total, H, D, generator=g).to(DEV, dtype)
    k = torch.randn(total, HK, D, generator=g).to(DEV, dtype)
    positions = packed_positions(cu(lengths), total, torch.tensor(offsets, device=DEV))
    q_out, k_out = run_poisoned(
        "final",
        q[None],
        k[None],
        cos,
        sin,
        positions=positions,
        interleaved=interleaved,
        rotary_dim=rotary_dim,
    )
    start = 0
    for offset, n in zip(offsets, lengths):
        where = slice(start, start + n)
        pos = torch.arange(offset, offset + n)
        for x, out in ((q, q_out), (k, k_out)):
            ref = ropetut.rope_reference(
                x[None, where],
                cos,
                sin,
                positions=pos,
                interleaved=interleaved,
                rotary_dim=rotary_dim,
            )
            if n:
                assert relative_error(out[:, where], ref) <= TOLERANCE[dtype]
        start += n


@pytest.mark.parametrize("seed", range(12))
def test_random_packs_against_the_reference_per_sequence(seed):
    g = torch.Generator().manual_seed(seed)
    n_seqs = int(torch.randint(1, 6, (1,), generator=g))
    lengths = torch.randint(0, 9, (n_seqs,), generator=g).tolist()
    lengths[0] += 1  # at least one token
    offsets = torch.randint(0, 20, (n_seqs,), generator=g).tolist()
    check_packed(
        lengths,
        offsets,
        H=4,
        HK=2,
        D=32,
        seed=seed,
        interleaved=bool(seed % 2),
        rotary_dim=16 if seed % 3 == 0 else None,
    )


def test_odd_shape_and_half_precision():
    check_packed([17, 5], [0, 3], H=3, HK=3, D=96)
    check_packed([6, 11], [2, 0], H=4, HK=1, D=32, dtype=torch.float16)


def test_megatron_5243_context_parallel_positions():
    """NVIDIA/Megatron-LM#5243: packed THD under context parallelism,
    cu_seqlens=[0,4,8], cp_size=2: each sequence is cut into 2*cp chunks and rank 0
    holds chunks 0 and 3, so its tokens are not contiguous within a sequence. As runs of
    cu_seqlens, each run starting at its own offset, rank 0's tokens get [0, 3, 0, 3]
    per sequence; in the packed buffer's numbering (the positions the bug report
    expects) [0, 3, 4, 7]."""
    D, H = 16, 2
    cos, sin = tables(D, 8)
    full = randn(8, H, D)  # the whole packed buffer: two sequences of 4
    rank0 = [0, 3, 4, 7]
    runs = cu([1, 1, 1, 1])
    local = full[rank0]
    global_positions = packed_positions(runs, 4, torch.tensor(rank0, device=DEV))
    assert global_positions.tolist() == [0, 3, 4, 7]
    out = apply_rope_thd(
        local,
        cos=cos,
        sin=sin,
        cu_seqlens=runs,
        seqlen_offsets=torch.tensor(rank0, device=DEV),
    )
    ref = ropetut.rope_reference(full[None], cos, sin)[0, rank0]
    assert relative_error(out, ref) <= TOLERANCE[torch.float32]
    buggy = ropetut.rope_reference(
        local[None], cos, sin, positions=torch.tensor([0, 3, 0, 3])
    )[0]
    assert relative_error(out, buggy) > 0.1
    # per sequence (positions restart): chunks 0 and 3 of each are positions 0 and 3
    per_sequence = torch.tensor([0, 3, 0, 3], device=DEV)
    out = apply_rope_thd(
        local, cos=cos, sin=sin, cu_seqlens=runs, seqlen_offsets=per_sequence
    )
    for s in (0, 1):
        ref = ropetut.rope_reference(full[None, 4 * s : 4 * s + 4], cos, sin)[0, [0, 3]]
        assert relative_error(out[2 * s : 2 * s + 2], ref) <= TOLERANCE[torch.float32]


def test_gradcheck_fp64():
    cos, sin = tables(8, 10)
    q = randn(7, 2, 8, dtype=torch.float64).requires_grad_()
    k = randn(7, 1, 8, dtype=torch.float64).requires_grad_()
    offsets = torch.tensor([2, 0], device=DEV)

    def f(q, k):
        return apply_rope_thd(
            q, k, cos, sin, cu_seqlens=cu([3, 4]), seqlen_offsets=offsets
        )

    assert torch.autograd.gradcheck(f, (q, k))


def test_bad_arguments_name_themselves():
    cos, sin = tables(8, 10)
    q = randn(4, 2, 8)
    with pytest.raises(TypeError, match="cu_seqlens"):
        apply_rope_thd(q, cos=cos, sin=sin, cu_seqlens=[0, 4])
    with pytest.raises(TypeError, match="cu_seqlens"):
        apply_rope_thd(q, cos=cos, sin=sin, cu_seqlens=cu([4]).float())
    with pytest.raises(ValueError, match="cu_seqlens"):
        apply_rope_thd(
            q, cos=cos, sin=sin, cu_seqlens=torch.zeros(1, dtype=torch.int64)
        )
    with pytest.raises(ValueError, match="seqlen_offsets"):
        apply_rope_thd(
            q,
            cos=cos,
            sin=sin,
            cu_seqlens=cu([2, 2]),
            seqlen_offsets=torch.tensor([1], device=DEV),
        )
    with pytest.raises(TypeError, match="seqlen_offsets"):
        apply_rope_thd(q, cos=cos, sin=sin, cu_seqlens=cu([4]), seqlen_offsets=1.5)
    with pytest.raises(ValueError, match="q"):
        apply_rope_thd(q[None], cos=cos, sin=sin, cu_seqlens=cu([4]))


@gpu_only
def test_500_random_packs_on_the_gpu():
    """The issue's target: >= 500 random cases against the reference per sequence."""
    for seed in range(500):
        g = torch.Generator().manual_seed(1000 + seed)
        n_seqs = int(torch.randint(1, 9, (1,), generator=g))
        lengths = torch.randint(0, 200, (n_seqs,), generator=g).tolist()
        lengths[0] += 1
        offsets = torch.randint(0, 4000, (n_seqs,), generator=g).tolist()
        check_packed(
            lengths,
            offsets,
            H=8,
            HK=2,
            D=128,
            seed=seed,
            interleaved=bool(seed % 2),
            rotary_dim=64 if seed % 3 == 0 else None,
        )
