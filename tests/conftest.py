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
