"""A bug museum: RoPE bugs that were reported against peer libraries, and ropetut without them.

Each test is one exhibit. Its docstring names the peer's repository and issue or pull-request
number and says in one line what went wrong there; the test then builds the situation that bug
needed (one kv head, a tensor of 2**31 elements, a compiled graph, packed positions, a low
precision table, ...) and checks that ropetut gives the right answer in it. "Right" always
means against the float64 reference ``rope_reference`` or against a float64 table, never
against ropetut itself. Where the bug is easy to replay in a few lines of PyTorch, the test
replays it too, to show that the check it makes would have caught it.

Only the public API is used, so the museum keeps its promise whatever the internals become.
CPU exhibits use tiny shapes (each program instance costs milliseconds under Triton's
interpreter); the exhibits that need a real GPU say why in their skip reason.
"""
import pytest
import torch
from conftest import gpu_only, randn, tables

import ropetut
from ropetut.check import relative_error

TOL = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _as_device(values):
    return torch.tensor(values, device=ropetut.DEVICE)


def _freqs64(D, base=10000.0):
    """RoFormer's frequencies in float64, written out here rather than taken from ropetut."""
    return base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)


# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "inplace"])
@pytest.mark.parametrize("layout", ["bthd", "bhtd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_liger_342_single_kv_head_is_rotated(dtype, layout, inplace):
    """linkedin/Liger-Kernel#342: "Rope fails when num_head = 1": with GQA and one kv head
    (num_q_heads=2, num_kv_heads=1) LigerRopeFunction returned k unchanged.

    Here q has 4 heads and k one; both must match the float64 reference, and k must move."""
    B, T, HQ, D = 2, 5, 4, 16
    cos, sin = tables(D, T)

    def shape(H):
        return (B, T, H, D) if layout == "bthd" else (B, H, T, D)

    q, k = randn(*shape(HQ), dtype=dtype), randn(*shape(1), dtype=dtype)
    q_in, k_in = q.clone(), k.clone()
    q_out, k_out = ropetut.apply_rope(q, k, cos, sin, layout=layout, inplace=inplace)
    assert relative_error(q_out, ropetut.rope_reference(q_in, cos, sin, layout=layout)) < TOL[dtype]
    assert relative_error(k_out, ropetut.rope_reference(k_in, cos, sin, layout=layout)) < TOL[dtype]
    # Liger's symptom, checked directly: every token past position 0 turns, so k is not k_in.
    assert relative_error(k_out, k_in) > 0.1


# --------------------------------------------------------------------------------------------


@gpu_only
def test_liger_803_1335_offsets_past_2_31_elements():
    """linkedin/Liger-Kernel#803: "Liger-Kernel crashes on very long seqlen 2^31 / int64 indexing
    issue": 32-bit offsets overflow once a tensor holds 2**31 elements (the report shows an
    illegal memory access); as #1335 tells it, PR #804 then cast program_id to int64 in rope.py
    and rms_norm.py. linkedin/Liger-Kernel#1335: llama4_rope and qwen2vl_mrope still lack it.

    Here q (fp16, 32 heads of 128) holds 2**31 + 64 * 4096 elements, about 4.3 GB, k (8 heads)
    another 1.1 GB. Both are rotated in place; tokens on either side of element 2**31 and the
    very last one must match the float64 reference (a 32-bit offset wraps there: those rows
    would be left alone, or written elsewhere), and so must the first."""
    H, HK, D = 32, 8, 128
    first_wide = 2**31 // (H * D)          # token whose first element of q is element 2**31
    T = first_wide + 64
    need = T * (H + HK) * D * 2 + 2 * T * (D // 2) * 4 + 2**30
    free, _ = torch.cuda.mem_get_info()
    if free < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory for a 2**31-element "
                    f"tensor, {free / 2**30:.1f} GiB free")
    cos, sin = tables(D, T)
    q = torch.randn(1, T, H, D, device="cuda", dtype=torch.float16)
    k = torch.randn(1, T, HK, D, device="cuda", dtype=torch.float16)
    assert q.numel() >= 2**31 > k.numel()
    probes = [0, first_wide - 1, first_wide, T - 1]
    before = {t: (q[:, t:t + 1].clone(), k[:, t:t + 1].clone()) for t in probes}
    ropetut.apply_rope(q, k, cos, sin, inplace=True)
    torch.cuda.synchronize()
    for t, (q_t, k_t) in before.items():
        pos = torch.tensor([t])
        for name, now, was in (("q", q[:, t:t + 1], q_t), ("k", k[:, t:t + 1], k_t)):
            err = relative_error(now, ropetut.rope_reference(was, cos, sin, positions=pos))
            assert err < TOL[torch.float16], (name, t, err)
    del q, k
    torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd"])
def test_flash_attn_1680_no_graph_break_under_compile(mode):
    """Dao-AILab/flash-attention#1680: "Rotary op incompatible with torch compile": a
    ``wrap_triton`` call added to the rotary op made dynamo break the graph ("Attempted to call
    function marked as skipped").

    Here torch.compile(fullgraph=True), which raises on any graph break, compiles a function
    calling apply_rope with GQA and positions given as a tensor, out of place; forward (and the
    backward through it) match eager."""
    B, T, HQ, HK, D = 2, 6, 4, 2, 16
    cos, sin = tables(D, 8)
    positions = _as_device([[5, 1, 2, 0, 7, 3], [0, 1, 2, 3, 4, 5]])

    def rotate(q, k, positions):
        return ropetut.apply_rope(q, k, cos, sin, positions=positions, inplace=False)

    wants_grad = mode == "fwd+bwd"
    q = randn(B, T, HQ, D).requires_grad_(wants_grad)
    k = randn(B, T, HK, D).requires_grad_(wants_grad)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(rotate, fullgraph=True)
    got, want = compiled(q, k, positions), rotate(q, k, positions)
    for g, w in zip(got, want):
        assert relative_error(g, w) <= 1e-6
    if wants_grad:
        seeds = [torch.randn_like(w) for w in want]
        got_grads = torch.autograd.grad(got, (q, k), seeds)
        want_grads = torch.autograd.grad(want, (q, k), seeds)
        for g, w in zip(got_grads, want_grads):
            assert relative_error(g, w) <= 1e-6
    assert not torch._dynamo.utils.counters["graph_break"]


# --------------------------------------------------------------------------------------------


@gpu_only
def test_flashinfer_403_in_place_rope_is_captured_in_cuda_graph():
    """flashinfer-ai/flashinfer#403: "apply_rope_inplace will cause graphbreak due to mutated
    inputs": compiled with mode="reduce-overhead", the in-place RoPE op made inductor print
    "skipping cudagraphs due to mutated inputs", so nothing was captured in a CUDA graph.

    What ropetut promises, and this tests: an in-place apply_rope on tensors made inside the
    compiled region (q and k as views of projections, as in a model) is captured, with no
    skip, and a graph is recorded. (Writing in place into the compiled function's own *inputs*,
    as that issue's repro did, makes torch skip CUDA graphs whatever op writes: inductor copies
    eager inputs into the graph's memory and checks which inputs are mutated, not by what. That
    is torch's rule, not an operator's bug: ropetut there is skipped too, with a correct result,
    and it is not tested here.)"""
    B, T, HQ, HK, D = 2, 6, 4, 2, 16
    cos, sin = tables(D, 8)
    positions = _as_device([[5, 1, 2, 0, 7, 3], [0, 1, 2, 3, 4, 5]])
    w = randn(D, (HQ + HK) * D) / D**0.5

    def block(x, w, positions):
        q = (x @ w[:, :HQ * D]).view(B, T, HQ, D)
        k = (x @ w[:, HQ * D:]).view(B, T, HK, D)
        ropetut.apply_rope(q, k, cos, sin, positions=positions, inplace=True)
        return torch.cat([q.flatten(), k.flatten()])

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):                          # warm up, record, replay (on new data each time)
        x = randn(B, T, D)
        assert relative_error(compiled(x, w, positions), block(x, w, positions)) <= 1e-6
    counters = torch._dynamo.utils.counters
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert counters["inductor"]["cudagraph_recorded_non_static_inputs"] > 0   # one was recorded
    assert not counters["graph_break"]


# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", ["(T,)", "(B, T)"])
def test_megatron_5243_packed_context_parallel_positions(shape):
    """NVIDIA/Megatron-LM#5243 (PR): "Fix packed THD RoPE under CP": with sequence packing and
    context parallelism, a rank's tokens carry non-contiguous positions; for cu_seqlens=[0,4,8]
    and cp_size=2, rank 0 must use positions [0, 3, 4, 7] but got [0, 3, 0, 3].
    (See also NVIDIA-NeMo/Automodel#2377 (PR): LlamaRotaryEmbedding ignored position_ids values.)

    Here each token rotated at its given position must equal the reference rotation of the full,
    unsplit sequence at that token; with (B, T) positions, batch row 1 is rank 1's share."""
    B, H, HK, D = 2, 2, 1, 16
    cos, sin = tables(D, 8)
    q_full, k_full = randn(B, 8, H, D), randn(B, 8, HK, D)
    rows = [[0, 3, 4, 7], [0, 3, 4, 7]] if shape == "(T,)" else [[0, 3, 4, 7], [1, 2, 5, 6]]
    pick = torch.tensor(rows)
    q = torch.stack([q_full[b, pick[b]] for b in range(B)])     # this rank's tokens, packed
    k = torch.stack([k_full[b, pick[b]] for b in range(B)])
    positions = _as_device(rows[0] if shape == "(T,)" else rows)
    q_out, k_out = ropetut.apply_rope(q, k, cos, sin, positions=positions)
    for out, full in ((q_out, q_full), (k_out, k_full)):
        ref_full = ropetut.rope_reference(full, cos, sin)
        expected = torch.stack([ref_full[b, pick[b]] for b in range(B)])
        assert relative_error(out, expected) < TOL[torch.float32]
    # The bug's positions [0, 3, 0, 3] give a different answer: the check above would catch it.
    buggy = ropetut.rope_reference(q, cos, sin, positions=torch.tensor([0, 3, 0, 3]))
    assert relative_error(q_out, buggy) > 0.1


# --------------------------------------------------------------------------------------------


def test_transformers_29285_bf16_table_keeps_positions_apart():
    """huggingface/transformers#29285 (PR): "RoPE loses precision for Llama / Gemma": under
    bf16 the RoPE embeddings were computed in bfloat16, losing position precision dramatically
    at long context. (See also EleutherAI/gpt-neox#1016 (PR): in bfloat16, position 256 cannot
    be told from 257.)

    Here a bf16 table from rope_tables is each float64 cos/sin rounded once to bf16 (the angles
    never see bf16), so no two of its 1024 rows collide, where positions computed in bf16 give
    only 513 distinct rows; and apply_rope tells position 300 from 301."""
    D, N = 16, 1024
    cos, sin = ropetut.rope_tables(ropetut.standard(D), N, dtype=torch.bfloat16)
    angles = torch.arange(N, dtype=torch.float64)[:, None] * _freqs64(D)[None, :]
    assert torch.equal(cos, angles.cos().to(torch.bfloat16))
    assert torch.equal(sin, angles.sin().to(torch.bfloat16))
    # Adjacent positions differ in the fastest pair (1 radian apart), past 256 too ...
    fastest = torch.stack([cos[:, 0], sin[:, 0]], dim=1)
    assert (fastest[1:] != fastest[:-1]).any(dim=1).all()
    # ... and whole rows are pairwise distinct.
    assert torch.unique(torch.cat([cos, sin], dim=1), dim=0).shape[0] == N
    # The bug, replayed: positions and frequencies in bf16. 300 and 301 become one position.
    pos_bf16 = torch.arange(N, dtype=torch.bfloat16)
    bug = pos_bf16[:, None] * _freqs64(D).to(torch.bfloat16)[None, :]
    assert pos_bf16[300] == pos_bf16[301]
    assert torch.unique(torch.cat([bug.cos(), bug.sin()], dim=1), dim=0).shape[0] < N
    # apply_rope at positions 300 and 301 (fp32 tables): different outputs, each the reference.
    cos32, sin32 = tables(D, N)
    x = randn(1, 1, 2, D).expand(1, 2, 2, D).contiguous()      # one vector, at two positions
    positions = _as_device([300, 301])
    out = ropetut.apply_rope(x, cos=cos32, sin=sin32, positions=positions)
    ref = ropetut.rope_reference(x, cos32, sin32, positions=positions)
    assert relative_error(out, ref) < TOL[torch.float32]
    assert relative_error(out[:, 0], out[:, 1]) > 0.1


# --------------------------------------------------------------------------------------------


def test_gpt_neox_1003_fp16_table_angles_not_computed_in_fp16():
    """EleutherAI/gpt-neox#1003: "RotaryEmbedding computation is wrong for certain
    position/feature pairs in reduced precision (both fp16 and bfloat)": the angle table was
    computed in fp16, so large angles were rounded (position 1857, pair 1 of head dim 32:
    1044.27 became 1045) and the cos table was off by up to 0.78.

    Here an fp16 table from rope_tables equals the float64 cos/sin rounded once to fp16, that
    entry included, and a rotation at position 1857 with it is within fp16 table rounding."""
    D, N = 32, 2048
    cos, sin = ropetut.rope_tables(ropetut.standard(D), N, dtype=torch.float16)
    angles = torch.arange(N, dtype=torch.float64)[:, None] * _freqs64(D)[None, :]
    assert torch.equal(cos, angles.cos().half()) and torch.equal(sin, angles.sin().half())
    assert abs(cos[1857, 1].double() - angles[1857, 1].cos()) < 1e-3
    # The bug, replayed: position and frequency in fp16 make the angle 1045, whose cos is far
    # from the true one (-0.41 for 0.31).
    bug = torch.arange(N, dtype=torch.float16)[1857] * _freqs64(D).half()[1]
    assert bug == 1045 and abs(bug.double().cos() - angles[1857, 1].cos()) > 0.5
    x = randn(1, 1, 2, D)
    cos16, sin16 = cos.to(ropetut.DEVICE), sin.to(ropetut.DEVICE)
    out = ropetut.apply_rope(x, cos=cos16, sin=sin16, positions=_as_device([1857]))
    exact = ropetut.rope_reference(x, angles.cos(), angles.sin(), positions=torch.tensor([1857]))
    assert relative_error(out, exact) < 2e-3


# --------------------------------------------------------------------------------------------


def test_onnxruntime_27597_out_of_range_position_never_read():
    """microsoft/onnxruntime#27597 (PR): "Add validation of position_ids in RotaryEmbedding
    operators": a position_id at or past the cos/sin cache's length (or negative) made the
    kernel read out of bounds of the cache.

    Here the tables are rows 1..8 of a larger finite buffer, so a kernel reading row -1 or row 8
    would find finite numbers and give a finite, wrong answer. ropetut gives NaN for exactly
    those tokens and the reference rotation for the others; with check_positions=True it
    raises ValueError before writing anything."""
    B, T, H, D = 1, 4, 2, 16
    big_cos, big_sin = tables(D, 10)
    cos, sin = big_cos[1:9], big_sin[1:9]                      # 8 rows, finite memory around
    q = randn(B, T, H, D)
    positions = _as_device([0, 7, 8, -1])
    out = ropetut.apply_rope(q, cos=cos, sin=sin, positions=positions)
    assert out[:, 2:].isnan().all()
    ref = ropetut.rope_reference(q[:, :2], cos, sin, positions=torch.tensor([0, 7]))
    assert relative_error(out[:, :2], ref) < TOL[torch.float32]
    before = q.clone()
    with pytest.raises(ValueError, match="positions"):
        ropetut.apply_rope(q, cos=cos, sin=sin, positions=positions, inplace=True,
                           check_positions=True)
    assert torch.equal(q, before)


# --------------------------------------------------------------------------------------------


def test_apex_334_non_contiguous_inputs_and_expanded_gradients():
    """ROCm/apex#334 (PR): "Fix non-contiguous inputs in fused RoPE": the aiter RoPE kernels
    required a unit stride in the head dim, so transposed inputs and the broadcast gradients
    that ``.sum()`` produces made them fail ("rope_2d_bwd_impl requires all stride_d to be 1").

    Here q has a head-dim stride of H (a transposed view), and the loss is ``.sum()``, whose
    gradient has stride 0 everywhere: forward and backward match the reference, no copy asked."""
    B, T, H, D = 2, 5, 3, 16
    cos, sin = tables(D, T)
    q = randn(B, T, D, H).transpose(2, 3).requires_grad_()          # (B, T, H, D), stride(-1) = H
    assert q.stride(-1) != 1
    out = ropetut.apply_rope(q, cos=cos, sin=sin)
    assert relative_error(out, ropetut.rope_reference(q, cos, sin)) < TOL[torch.float32]
    out.sum().backward()
    ones = torch.ones(B, T, H, D, dtype=torch.float64)
    expected = ropetut.rope_reference(ones, cos, sin, inverse=True)
    assert relative_error(q.grad, expected) < TOL[torch.float32]
