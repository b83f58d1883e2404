import pytest
import torch

import ropetut

gpu_only = pytest.mark.skipif(not ropetut.on_gpu(), reason="needs a CUDA GPU: compiled kernels")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def randn(*shape, dtype=torch.float32):
    """Fresh random inputs on ropetut's device (never zeros: zeros hide unwritten outputs)."""
    return torch.randn(*shape, dtype=torch.float32).to(ropetut.DEVICE, dtype)


def tables(D, n_positions, rotary_dim=None, dtype=torch.float32):
    freqs = ropetut.standard(D) if rotary_dim in (None, D) else ropetut.partial(rotary_dim)
    return ropetut.rope_tables(freqs, n_positions, dtype=dtype, device=ropetut.DEVICE)


def assert_compiles_like_eager(block, inputs, wrt, mode):
    """``torch.compile(block, fullgraph=True)`` (a graph break raises) gives block's
    output, and with mode "fwd+bwd" its gradients with respect to ``wrt`` (a list of the
    inputs), as the eager call does: the check every operator's compile test makes."""
    from ropetut.check import relative_error

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(block, fullgraph=True)
    if mode == "fwd":
        with torch.no_grad():
            assert relative_error(compiled(*inputs), block(*inputs)) <= 1e-6
    else:
        out, ref = compiled(*inputs), block(*inputs)
        g = torch.randn_like(ref)
        got = torch.autograd.grad(out, wrt, g)
        expected = torch.autograd.grad(ref, wrt, g)
        assert relative_error(out, ref) <= 1e-6
        for a, b in zip(got, expected):
            assert relative_error(a, b) <= 1e-5
    assert not torch._dynamo.utils.counters["graph_break"]


# what a training run records that depends on the machine's speed, not on its arithmetic
TRAINING_TIMINGS = ("train_seconds", "timed_seconds", "timed_steps", "tokens_per_s",
                    "peak_mem_mb")  # fmt: skip


def untimed(record: dict) -> dict:
    """A training run's record without its timings: what two runs of one configuration
    must agree on exactly."""
    return {k: v for k, v in record.items() if k not in TRAINING_TIMINGS}
