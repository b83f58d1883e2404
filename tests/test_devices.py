"""The pure-PyTorch parts (tables, references, scaling, packed positions, the test and
bench harnesses) on a device that is not the kernels': PyTorch's ``meta`` device.

On a CPU machine every tensor is on the CPU, so a function that builds a tensor on the
default device where it should use its input's passes every other CPU test and fails on
a GPU ("expected all tensors to be on the same device"): ``rope_tables`` did. A meta
tensor mixed with a CPU one raises the same error, so here such a mix-up fails in CI.
Meta tensors carry shapes and dtypes, no values: these tests check devices and shapes;
the values are checked everywhere else."""

import pytest
import torch
from test_angles import reference as angles_reference
from test_qk_norm import dw_reference

from ropetut import bench, reference, scaling, tables
from ropetut.packed import packed_positions

META = torch.device("meta")


def meta_randn(*shape, dtype=torch.float64):
    return torch.empty(*shape, dtype=dtype, device=META)


def test_tables_are_built_on_the_frequencies_device():
    freqs = tables.standard(16).to(META)
    cos, sin = tables.rope_tables(freqs, 9)
    assert cos.device == sin.device == META and cos.shape == (9, 8)
    cos, _ = tables.rope_tables(freqs, 9, dtype=torch.bfloat16)
    assert cos.dtype == torch.bfloat16 and cos.device == META


@pytest.mark.parametrize("positions", [None, "t", "bt"])
@pytest.mark.parametrize("layout", ["bthd", "bhtd"])
def test_references_follow_their_input(positions, layout):
    """Tables and positions may live elsewhere (the CPU here): the reference computes
    on x's device and returns there."""
    cos, sin = tables.rope_tables(tables.partial(8), 12)
    pos = {None: None, "t": torch.arange(5), "bt": torch.zeros(2, 5, dtype=torch.long)}
    shape = (2, 3, 5, 16) if layout == "bhtd" else (2, 5, 3, 16)
    x, w = meta_randn(*shape), meta_randn(16)
    options = dict(positions=pos[positions], rotary_dim=8, layout=layout)
    out = reference.rope_reference(x, cos, sin, **options)
    assert out.device == META and out.shape == shape
    normed = reference.qk_norm_rope_reference(x, w, cos, sin, **options)
    assert normed.device == META and normed.shape == shape
    assert reference.rms_norm_reference(x, w).device == META


@pytest.mark.parametrize("variant", sorted(scaling.VARIANTS))
def test_every_scaling_variant_builds_on_the_device_asked_for(variant):
    head_dim = 16
    args = {
        "dynamic": dict(factor=2.0, max_position_embeddings=64, seq_len=100),
        "linear": dict(factor=2.0),
        "yarn": dict(factor=4.0, original_max_position_embeddings=64),
        "longrope": dict(
            short_factor=[1.0] * 8,
            long_factor=[2.0] * 8,
            original_max_position_embeddings=64,
            factor=2.0,
            seq_len=100,
        ),
        "half_truncated": {},
        "partial": {},
        "llama3": {},
        "default": {},
    }[variant]
    inv_freq, _ = scaling.VARIANTS[variant](head_dim, **args, device=META)
    assert inv_freq.device == META and inv_freq.shape == (head_dim // 2,)


@pytest.mark.parametrize("variant", ["dynamic_ntk", "longrope"])
def test_a_device_length_keeps_the_vector_on_its_device(variant):
    length = torch.empty((), dtype=torch.long, device=META)
    if variant == "dynamic_ntk":
        inv_freq, _ = scaling.dynamic_ntk(16, 2.0, 64, seq_len=length)
    else:
        factors = torch.ones(8, device=META)
        inv_freq, _ = scaling.longrope(16, factors, factors, 64, length, factor=2.0)
    assert inv_freq.device == META


@pytest.mark.parametrize("seq_len", [None, 100])
def test_longrope_factors_on_a_device_keep_the_vector_there(seq_len):
    """Device factors with a host length (or none): the vector is built beside them."""
    factors = torch.ones(8, device=META)
    inv_freq, _ = scaling.longrope(16, factors, factors, 64, seq_len, factor=2.0)
    assert inv_freq.device == META


def test_packed_positions_stay_on_cu_seqlens_device():
    cu_seqlens = torch.empty(4, dtype=torch.int32, device=META)
    positions = packed_positions(cu_seqlens, 9, torch.empty(3, device=META).long())
    assert positions.device == META and positions.shape == (9,)


def test_harnesses_follow_their_inputs():
    """The tests' own fp64 helpers, and the bench's copies of a provider's inputs."""
    cos, sin = tables.rope_tables(tables.standard(16), 6)
    x = meta_randn(1, 6, 2, 16)
    assert dw_reference(x, meta_randn(1, 6, 2, 16), cos, sin).device == META
    inv_freq = tables.standard(16)
    positions = torch.tensor([0, 5, 2**20])
    out = angles_reference(meta_randn(1, 3, 2, 16), positions, inv_freq)
    assert out.device == META
    leaf = meta_randn(1, 6, 2, 16).requires_grad_()
    copies = bench.clones((x, leaf))
    assert all(c.device == META for c in copies)
    assert not copies[0].requires_grad and copies[1].requires_grad
