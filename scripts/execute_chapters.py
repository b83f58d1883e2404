"""Execute chapter notebooks top to bottom, in place, storing outputs and widget state.

    python scripts/execute_chapters.py [chapters/01_rope_from_scratch.ipynb ...]

With no arguments, every notebook in chapters/. Cells tagged ``skip-execution`` are GPU-only:
they run on a GPU and are left as they are on a CPU. Prints each notebook's wall time. On a GPU, a chapter's seed-claim verdicts (results/ledger/<chapter>.json) are
deleted before it runs, so the file holds exactly the verdicts of this run.
"""
import sys
import time
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
LEDGER = ROOT / "results" / "ledger"


def execute(path: Path, timeout: int = 300) -> float:
    """Run one notebook; ``timeout`` is per cell. Prints a line per slow cell as it finishes."""
    nb = nbformat.read(path, as_version=4)
    skip_tag = "" if torch.cuda.is_available() else "skip-execution"
    # shutdown_kernel="immediate": chapter 01's kernel (widgets) once took 300 s to shut down
    # gracefully after its last cell; its outputs are all in by then.
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                            shutdown_kernel="immediate",
                            skip_cells_with_tag=skip_tag,
                            resources={"metadata": {"path": str(path.parent)}},
                            on_cell_executed=lambda cell, cell_index, **_: _log(path, cell_index))
    verdicts = LEDGER / f"{path.stem}.json"
    if torch.cuda.is_available() and verdicts.exists():
        verdicts.unlink()
    start = time.time()
    client.execute()
    nbformat.write(nb, path)
    return time.time() - start


_last = [time.time()]


def _log(path, index):
    now = time.time()
    if now - _last[0] > 5:
        print(f"  {path.name} cell {index}: {now - _last[0]:.0f} s", flush=True)
    _last[0] = now


if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:]] or sorted(CHAPTERS.glob("*.ipynb"))
    for path in paths:
        print(f"{path.name}: {execute(path):.1f} s", flush=True)
