"""Issue 26's benchmark (ropetut.bench.angles): its providers compute the same RoPE,
its medians and ratios, and its run on a GPU; and the copy floor it shares."""

import pytest
import torch
from conftest import gpu_only

import ropetut
from ropetut import bench
from ropetut.bench import angles as bench_angles
from ropetut.book.notebook import NO_GPU

TINY = bench.Shape(B=2, T=5, HQ=2, HK=1, D=8, dtype=torch.float32)


@pytest.mark.parametrize("positions", [False, True])
def test_table_free_and_table_rotate_alike(positions):
    """Both providers rotate the same tokens the same way: at 0..T-1, and in decode at
    positions past 2**20, where the table has 2**20 + 4096 rows."""
    shape = bench.Shape(B=2, T=1 if positions else 5, HQ=2, HK=1, D=8,
                        dtype=torch.float32, positions=positions)  # fmt: skip
    torch.manual_seed(0)
    table = bench_angles.make_provider(bench_angles.TABLE, shape)
    torch.manual_seed(0)  # the same positions
    table_free = bench_angles.make_provider(bench_angles.TABLE_FREE, shape)
    q, k = bench.make_inputs(shape, "fwd")
    for ours, theirs in zip(table_free(q, k), table(q, k)):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-6)
    assert not torch.equal(table(q, k)[0], q)  # it turned something


def test_make_provider_refuses_unknown_names():
    with pytest.raises(ValueError, match="name: must be one of"):
        bench_angles.make_provider("liger", TINY)


@pytest.mark.parametrize("mode", bench.MODES)
def test_paired_eager_ms(monkeypatch, mode):
    """The table and table-free providers go to interleaved_ms together, in that order,
    as training steps for fwd+bwd; if the pair raises, measure is left to time each."""
    seen = []

    def interleaved(fns, *, make_inputs):
        inputs = make_inputs()
        seen.append([fn(*inputs) for fn in fns])
        return [1.0, 2.0]

    monkeypatch.setattr(bench, "interleaved_ms", interleaved)
    assert bench_angles.paired_eager_ms(TINY, mode) == {
        bench_angles.TABLE: 1.0, bench_angles.TABLE_FREE: 2.0
    }  # fmt: skip
    [(table, free)] = seen
    assert len(table) == 2 and all(
        t.shape == (TINY.B, TINY.T, H, TINY.D) for t, H in zip(table, (2, 1))
    )
    for ours, theirs in zip(free, table):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-6)

    def boom(fns, *, make_inputs):
        raise RuntimeError("boom")

    monkeypatch.setattr(bench, "interleaved_ms", boom)
    assert bench_angles.paired_eager_ms(TINY, mode) == {}


def _row(provider, mode, ms, graph_ms, shape="s"):
    return {"shape": shape, "tokens": 1, "provider": provider, "mode": mode, "ms": ms,
            "gbps": 10.0 / ms, "graph_ms": graph_ms, "peak_mem_mb": 0.0,
            "error": None}  # fmt: skip


def test_median_rows():
    """Medians over passes, each pass's times kept, % of floor from the medians, the
    ratio to the table as the median of each pass's ratio (not the medians' ratio),
    and an error in any pass wins over times."""
    passes = [
        [_row(bench.COPY, "fwd", 1.0, 1.0), _row(bench_angles.TABLE, "fwd", 2.0, 1.0),
         _row(bench_angles.TABLE_FREE, "fwd", 4.0, 1.2)],
        [_row(bench.COPY, "fwd", 1.2, 1.0), _row(bench_angles.TABLE, "fwd", 2.2, 1.1),
         _row(bench_angles.TABLE_FREE, "fwd", 2.2, 1.1)],
        [_row(bench.COPY, "fwd", 0.8, 1.0), _row(bench_angles.TABLE, "fwd", 1.0, 1.2),
         _row(bench_angles.TABLE_FREE, "fwd", 3.0, 1.0)],
    ]  # fmt: skip
    copy, table, free = bench_angles.median_rows(passes)
    assert (copy["ms"], table["ms"], free["ms"]) == (1.0, 2.0, 3.0)
    assert free["runs_ms"] == [4.0, 2.2, 3.0] and free["graph_ms"] == 1.1
    assert table["pct_floor"] == pytest.approx(50) and copy["pct_floor"] == 100
    # passes' ratios: 2.0, 1.0, 3.0 eager; 1.2, 1.0, 0.833 graphed
    assert free["ratio_runs"] == pytest.approx([2.0, 1.0, 3.0])
    assert free["ratio"] == pytest.approx(2.0) and table["ratio"] is None
    assert free["graph_ratio"] == pytest.approx(1.0)
    assert free["gbps"] == pytest.approx(10.0 / 3.0)
    passes[1][2] = dict(passes[1][2], error="RuntimeError: boom", ms=None)
    *_, free = bench_angles.median_rows(passes)
    assert free["error"] == "RuntimeError: boom" and free["ms"] is None
    assert free["ratio"] is None and free["pct_floor"] is None and free["gbps"] is None
    passes[0][1] = dict(passes[0][1], error="RuntimeError: table", ms=None)
    passes[2][0] = dict(passes[2][0], error="RuntimeError: copy", ms=None)
    copy, table, free = bench_angles.median_rows(passes)  # errors end nothing
    assert table["error"] == "RuntimeError: table" and table["pct_floor"] is None
    assert free["graph_ratio"] is None and free["graph_pct_floor"] is None
    assert bench_angles.format_ratios([copy, table, free]).splitlines()[1].split() == [
        "s",
        "fwd",
        "-",
        "-",
    ]


def test_format_ratios():
    rows = bench_angles.median_rows([[
        _row(bench.COPY, "fwd", 1.0, 1.0, "4x4096"),
        _row(bench_angles.TABLE, "fwd", 2.0, 1.0, "4x4096"),
        _row(bench_angles.TABLE_FREE, "fwd", 2.04, 0.99, "4x4096"),
    ]])  # fmt: skip
    lines = bench_angles.format_ratios(rows).splitlines()
    assert lines[1].split() == ["4x4096", "fwd", "1.020", "0.990"]


def test_copy_floor_copies_contiguous_tensors():
    x = torch.randn(3, 5, 7, device=ropetut.DEVICE)
    (y,) = bench.copy(x)
    assert torch.equal(x, y) and y.data_ptr() != x.data_ptr()
    with pytest.raises(ValueError, match="copy: the floor copies contiguous"):
        bench.copy(x.transpose(0, 1))


@pytest.mark.skipif(ropetut.on_gpu(), reason="the CPU path")
def test_run_without_gpu_prints_no_gpu(capsys):
    assert bench_angles.run() is None
    assert capsys.readouterr().out.strip() == NO_GPU


@gpu_only
def test_run_on_gpu():
    shapes = [bench.Shape(2, 256, 4, 2, 64),
              bench.Shape(4, 1, 4, 2, 64, positions=True)]  # fmt: skip
    rows = bench_angles.run(shapes, runs=2)
    assert len(rows) == 2 * len(bench.MODES) * len(bench_angles.PROVIDERS)
    assert all(r["error"] is None for r in rows), rows
    for r in rows:
        assert len(r["runs_ms"]) == len(r["graph_runs_ms"]) == 2
        assert r["ms"] > 0 and r["graph_ms"] > 0 and r["pct_floor"] > 0
        assert (r["ratio"] is None) == (r["provider"] != bench_angles.TABLE_FREE)
