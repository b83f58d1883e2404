"""Which way ropetut runs its kernels (ropetut.runtime)."""

import os
import subprocess
import sys

import pytest

import ropetut


def _import(code, **env_vars):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_vars)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env
    )


@pytest.mark.skipif(ropetut.on_gpu(), reason="on a GPU, kernels compile: any order")
def test_triton_imported_first_is_refused_on_the_cpu():
    """Imported before ropetut on a CPU machine, triton sets its own @jit helpers up
    to compile, and ropetut's interpreted kernels that call tl.sum failed later with
    "Cannot call @triton.jit'd outside of the scope of a kernel"."""
    done = _import("import triton, ropetut")
    assert done.returncode == 1
    assert "Import ropetut first" in done.stderr
    assert _import("import ropetut, triton").returncode == 0
    # set as Triton reads it ('true' too), the interpreter is on from the start
    assert _import("import triton, ropetut", TRITON_INTERPRET="true").returncode == 0
