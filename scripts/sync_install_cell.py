"""Write the first code cell of every chapter from one template, with the repository URL of _config.yml.

    python scripts/sync_install_cell.py          # rewrite the cells
    python scripts/sync_install_cell.py --check  # exit 1 if a chapter's first cell differs

The URL lives in one place, ``repository.url`` in ``_config.yml`` (the book's Colab and repository
buttons read it too). A fork changes it there and runs this script. The cell imports ropetut, and
where it can't (Colab, a fresh kernel) clones the repository next to the notebook and imports from
the clone: the chapters also read the repository's results/, which a package install would lack.
Only the cell's source is rewritten; its stored output stays.
"""
import re
import sys
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
CHAPTERS = REPO / "chapters"
CLONE = "ropetut-repo"
# As ``ruff format`` writes it, and within 88 columns (for a URL of up to 76 characters):
# formatting the chapters leaves the cell as this script wrote it. A clone that fails ends
# the cell with one sentence saying what to set, not git's traceback.
TEMPLATE = '''\
try:
    import ropetut
except ImportError:
    # Colab, or a kernel without ropetut: clone the repository and import from it
    import os
    import subprocess
    import sys

    url = "{url}"
    clone = "{clone}"
    if not os.path.isdir(clone):
        if subprocess.run(["git", "clone", "--depth", "1", url, clone]).returncode:
            raise SystemExit(f"could not clone {{url}}: set url to ropetut's address")
    sys.path.insert(0, os.path.abspath(clone))
from ropetut.book.notebook import print_environment

print_environment()'''


def repository_url(config: Path = REPO / "_config.yml") -> str:
    """repository.url from the book's config (a two-level YAML key, read without a YAML parser)."""
    match = re.search(r"^repository:\s*\n(?:[ \t]+.*\n)*?[ \t]+url:\s*(\S+)", config.read_text(), re.M)
    if not match:
        raise ValueError(f"{config}: no repository.url")
    return match.group(1)


def install_cell(url: str) -> str:
    return TEMPLATE.format(url=url, clone=CLONE)


def first_code_cell(nb):
    return next(cell for cell in nb.cells if cell.cell_type == "code")


def main(argv) -> int:
    want = install_cell(repository_url())
    differ = []
    for path in sorted(CHAPTERS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        cell = first_code_cell(nb)
        if cell.source != want:
            differ.append(path.name)
            if "--check" not in argv:
                cell.source = want
                nbformat.write(nb, path)
    verb = "differ" if "--check" in argv else "rewritten"
    print(f"{len(differ)} first cells {verb}" + (": " + ", ".join(differ) if differ else ""))
    return 1 if differ and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
