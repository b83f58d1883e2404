"""Sphinx extension for book/reproducibility.md: where each chapter's stored outputs came from.

Every chapter's first code cell prints its environment (``ropetut.book.notebook.print_environment``:
one ``key  value`` line each for device, mode, torch, triton, python and ropetut commit). The
directive ``{chapter-provenance}`` reads those lines from each notebook in ``chapters/``, as
stored, and sets them out as one table: a chapter re-executed later than the others shows its
own commit, and nothing on the page is typed in by hand. A chapter whose first code cell
printed no environment stops the build: its outputs would say nothing of where they came from.
"""

import json
from pathlib import Path

from sphinx.util.docutils import SphinxDirective

COLUMNS = ("device", "torch", "triton", "ropetut commit")


def stored_environment(path: Path) -> dict:
    """The key/value lines that the notebook's first code cell printed, as stored."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    first = next(c for c in cells if c["cell_type"] == "code")
    found = {}
    for output in first.get("outputs", []):
        for line in "".join(output.get("text", "")).splitlines():
            key, _, value = line.partition("  ")
            if value.strip():
                found[key.strip()] = value.strip()
    missing = [k for k in COLUMNS if k not in found]
    if missing:
        raise ValueError(f"{path}: its first code cell printed no {', '.join(missing)}")
    return found


def provenance_table(chapters: list[Path]) -> list[str]:
    """The table as MyST Markdown lines: one row per chapter, named by its title."""
    lines = [
        "| chapter | " + " | ".join(COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for path in chapters:
        env = stored_environment(path)
        cells = [f"`{env[k]}`" if k == "ropetut commit" else env[k] for k in COLUMNS]
        link = f"{{doc}}`../chapters/{path.stem}`"  # the chapter's title
        lines.append(f"| {link} | " + " | ".join(cells) + " |")
    return lines


class ChapterProvenance(SphinxDirective):
    def run(self):
        chapters = sorted((Path(self.env.srcdir) / "chapters").glob("*.ipynb"))
        for path in chapters:
            self.env.note_dependency(str(path))
        return self.parse_text_to_nodes("\n".join(provenance_table(chapters)))


def setup(app):
    app.add_directive("chapter-provenance", ChapterProvenance)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
