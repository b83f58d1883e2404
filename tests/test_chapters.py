"""The chapters as files: their install cell (Colab), the freshness of their stored outputs
(mirrors scripts/sync_install_cell.py and scripts/check_fresh_outputs.py), and that what the
reader sees fits the book's column with no harness machinery in it."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import check_fresh_outputs as fresh  # noqa: E402
import sync_install_cell as install  # noqa: E402

CHAPTERS = sorted((REPO / "chapters").glob("*.ipynb"))
HAS_HISTORY = (REPO / ".git").exists() and shutil.which("git") is not None


def first_code_source(path):
    cell = next(c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
    return "".join(cell["source"])


def test_repository_url_is_read_from_the_config():
    assert install.repository_url().startswith("https://")


def test_launch_buttons_open_the_configured_repository_on_colab():
    """The Colab button and the install cell point at the same repository, and Colab can open it."""
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((REPO / "_config.yml").read_text())
    repository = config["repository"]
    assert repository["url"] == install.repository_url()
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", repository["url"])  # Colab opens GitHub
    assert repository.get("path_to_book", "").strip("/") == ""   # the book is the repository's root
    assert repository["branch"]
    assert config["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert config["html"]["use_repository_button"]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_first_cell_is_the_install_cell_with_the_configured_url(path):
    assert first_code_source(path) == install.install_cell(install.repository_url())


def test_install_cell_clones_the_configured_url_when_ropetut_does_not_import(monkeypatch, tmp_path):
    calls = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "ropetut", None)        # import ropetut raises ImportError,
    monkeypatch.setitem(sys.modules, "ropetut.book.notebook", None)   # and the last line's
    monkeypatch.setattr(subprocess, "run",
                        lambda cmd, **kw: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    monkeypatch.setattr(sys, "path", list(sys.path))
    url = "https://example.org/fork/ropetut"
    with pytest.raises(ImportError):                          # the stub cloned nothing to import
        exec(install.install_cell(url), {})
    assert calls == [["git", "clone", "--depth", "1", url, install.CLONE]]
    assert sys.path[0] == str(tmp_path / install.CLONE)


def test_install_cell_says_what_to_set_when_the_clone_fails(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "ropetut", None)
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 128))
    url = "https://example.org/no/such/repo"
    with pytest.raises(SystemExit) as info:
        exec(install.install_cell(url), {})
    assert str(info.value) == f"could not clone {url}: set url to ropetut's address"


def test_install_cell_does_nothing_when_ropetut_imports(monkeypatch, capsys):
    calls, real_run = [], subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda cmd, *a, **kw: calls.append(cmd) or real_run(cmd, *a, **kw))
    exec(install.install_cell("https://example.org/unused"), {})
    assert not [cmd for cmd in calls if "clone" in cmd]
    assert "ropetut commit" in capsys.readouterr().out


def _git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _notebook(sources, commit=None):
    out = [{"output_type": "stream", "name": "stdout", "text": [f"ropetut commit  {commit}\n"]}] if commit else []
    cells = [{"cell_type": "code", "source": sources[0], "outputs": out, "metadata": {}, "execution_count": 1}]
    cells += [{"cell_type": "markdown", "source": s, "metadata": {}} for s in sources[1:]]
    return json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_freshness_compares_sources_at_the_commit_that_ran(tmp_path):
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "root")
    path = tmp_path / "chapters" / "ch.ipynb"
    path.parent.mkdir()
    path.write_text(_notebook(["print(1)", "prose"]))
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "chapter")
    ran = _git(tmp_path, "rev-parse", "--short=10", "HEAD")

    path.write_text(_notebook(["print(1)", "prose"], commit=ran))      # executed: outputs only
    assert fresh.why_stale(path, tmp_path) is None
    path.write_text(_notebook(["print(1)", "new prose"], commit=ran))  # then edited
    assert "changed after" in fresh.why_stale(path, tmp_path)
    # from a tree with uncommitted changes: fresh only while its sources equal those at the commit
    path.write_text(_notebook(["print(1)", "prose"], commit=ran + "+dirty"))
    assert fresh.why_stale(path, tmp_path) is None
    path.write_text(_notebook(["print(1)", "new prose"], commit=ran + "+dirty"))
    assert "uncommitted" in fresh.why_stale(path, tmp_path)
    path.write_text(_notebook(["print(2)", "prose"], commit=ran))       # a code cell edited
    assert "changed after" in fresh.why_stale(path, tmp_path)
    path.write_text(_notebook(["print(1)", "prose"]))
    assert "no ropetut commit" in fresh.why_stale(path, tmp_path)
    path.write_text(_notebook(["print(1)", "prose"], commit="0123456789"))
    assert "git has no" in fresh.why_stale(path, tmp_path)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_freshness_covers_library_source_the_chapter_prints(tmp_path, monkeypatch):
    """A chapter that shows a function or a method (its class, whole) is stale once that
    source changes after its run, though its cells did not; one it cannot name is stale."""
    ident = ["-c", "user.name=t", "-c", "user.email=t@t"]
    lib = tmp_path / "lib"
    lib.mkdir()
    source = "class C:\n    def method(self):\n        return 1\n\n\ndef f():\n    return 1\n"
    (lib / "shown_by_ch.py").write_text(source)
    monkeypatch.syspath_prepend(str(lib))
    cell = "from shown_by_ch import C, f\nshow_source(f)\nshow_source(C.method)"
    path = tmp_path / "chapters" / "ch.ipynb"
    path.parent.mkdir()
    path.write_text(_notebook([cell]))
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, *ident, "commit", "-q", "-m", "chapter")
    ran = _git(tmp_path, "rev-parse", "--short=10", "HEAD")
    path.write_text(_notebook([cell], commit=ran))
    assert fresh.why_stale(path, tmp_path) is None
    (lib / "shown_by_ch.py").write_text(source.replace("    return 1\n", "    return 2\n"))
    assert "prints lib/shown_by_ch.py's f, which changed" in fresh.why_stale(path, tmp_path)
    (lib / "shown_by_ch.py").write_text(source.replace("        return 1", "        return 2"))
    assert "prints lib/shown_by_ch.py's C.method" in fresh.why_stale(path, tmp_path)
    bad = cell.replace("show_source(f)", "show_source(g)")   # no such name
    path.write_text(_notebook([bad]))
    _git(tmp_path, *ident, "commit", "-q", "-am", "a cell that shows g")
    ran = _git(tmp_path, "rev-parse", "--short=10", "HEAD")
    path.write_text(_notebook([bad], commit=ran))
    assert "cannot name" in fresh.why_stale(path, tmp_path)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_freshness_follows_printed_source_that_moved(tmp_path, monkeypatch):
    """A module moved by git mv after the run (committed or only staged) is compared with its
    text at its old path: fresh while the definition is unchanged, stale once it changes."""
    ident = ["-c", "user.name=t", "-c", "user.email=t@t"]
    (tmp_path / "lib").mkdir()
    source = "def f():\n    return 1\n"
    (tmp_path / "lib" / "moved_by_ch.py").write_text(source)
    cell = "from moved_by_ch import f\nshow_source(f)"
    path = tmp_path / "chapters" / "ch.ipynb"
    path.parent.mkdir()
    path.write_text(_notebook([cell]))
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, *ident, "commit", "-q", "-m", "chapter")
    ran = _git(tmp_path, "rev-parse", "--short=10", "HEAD")
    path.write_text(_notebook([cell], commit=ran))
    (tmp_path / "lib" / "moved").mkdir()
    _git(tmp_path, "mv", "lib/moved_by_ch.py", "lib/moved/moved_by_ch.py")
    monkeypatch.syspath_prepend(str(tmp_path / "lib" / "moved"))
    assert fresh.why_stale(path, tmp_path) is None
    _git(tmp_path, *ident, "commit", "-q", "-m", "moved")
    assert fresh.why_stale(path, tmp_path) is None
    (tmp_path / "lib" / "moved" / "moved_by_ch.py").write_text(source.replace("1", "2"))
    assert "prints lib/moved/moved_by_ch.py's f, which changed" in fresh.why_stale(path, tmp_path)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_freshness_ignores_the_install_cells_url_alone(tmp_path):
    """A fork points the install cell at its own URL: its stored outputs stay fresh. Any other
    edit of that cell still counts."""
    _git(tmp_path, "init", "-q")
    path = tmp_path / "chapters" / "ch.ipynb"
    path.parent.mkdir()
    path.write_text(_notebook([install.install_cell("https://github.com/ropetut/ropetut"), "prose"]))
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "chapter")
    ran = _git(tmp_path, "rev-parse", "--short=10", "HEAD")
    fork = install.install_cell("https://github.com/someone/ropetut-fork")
    path.write_text(_notebook([fork, "prose"], commit=ran))
    assert fresh.why_stale(path, tmp_path) is None
    path.write_text(_notebook([fork + "\nprint()", "prose"], commit=ran))
    assert "changed after" in fresh.why_stale(path, tmp_path)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_a_shallow_clone_lacks_the_commit_that_ran(tmp_path):
    """CI's shallow checkouts cannot tell: the test of the stored outputs skips there, naming why."""
    src, ident = tmp_path / "src", ["-c", "user.name=t", "-c", "user.email=t@t"]
    path = src / "chapters" / "ch.ipynb"
    path.parent.mkdir(parents=True)
    _git(src, "init", "-q")
    path.write_text(_notebook(["print(1)"]))
    _git(src, "add", ".")
    _git(src, *ident, "commit", "-q", "-m", "chapter")
    ran = _git(src, "rev-parse", "--short=10", "HEAD")
    path.write_text(_notebook(["print(1)"], commit=ran))                 # its outputs, committed after
    _git(src, *ident, "commit", "-q", "-am", "outputs")
    assert fresh.why_stale(path, src) is None and not fresh.is_shallow(src)
    _git(tmp_path, "clone", "-q", "--depth", "1", src.as_uri(), "shallow")
    shallow = tmp_path / "shallow"
    assert fresh.is_shallow(shallow)
    assert fresh.why_stale(shallow / "chapters" / "ch.ipynb", shallow).startswith("git has no")


@pytest.mark.skipif(not HAS_HISTORY, reason="needs the repository's git history (a clone, not a copy)")
@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_stored_outputs_are_fresh(path):
    """Stale outputs can't land: a chapter edited after its GPU run fails here until re-executed."""
    why = fresh.why_stale(path)
    if why and why.startswith("git has no") and fresh.is_shallow():
        pytest.skip(f"a shallow clone: {why}")
    if why and why.startswith("git has no") and _chapters_differ_from_head():
        pytest.skip(f"the chapters are not a checkout of this git history (a copy beside an older .git): {why}")
    assert why is None


def _chapters_differ_from_head() -> bool:
    """True where chapters/ differs from the .git beside it, as in a copied working tree."""
    out = subprocess.run(["git", "status", "--porcelain", "--", "chapters"], cwd=REPO,
                         capture_output=True, text=True)
    return bool(out.stdout.strip())


CODE_COLUMNS = 88  # the book's column (ruff's line-length in pyproject.toml)
OUTPUT_COLUMNS = 100  # text output lines; a cell tagged "wide-output" may exceed it
RICHER = ("text/html", "image/png", "image/svg+xml", "text/latex",
          "application/vnd.jupyter.widget-view+json")


def _shown_text(output) -> tuple[str, int]:
    """The text a page shows for one output, and its width limit: a stream, or text/plain
    when nothing richer; markdown (library source shown by show_source) as code."""
    if output.get("output_type") == "stream":
        return "".join(output.get("text", "")), OUTPUT_COLUMNS
    data = output.get("data", {})
    if "text/markdown" in data:
        return "".join(data["text/markdown"]), CODE_COLUMNS
    if any(kind in data for kind in RICHER):
        return "", OUTPUT_COLUMNS
    return "".join(data.get("text/plain", "")), OUTPUT_COLUMNS


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_the_page_fits_the_column_and_hides_the_harness(path):
    """Code lines fit 88 columns (library source shown as markdown too), text output lines
    100, and nbval's markers are cell tags, never comments a reader would see."""
    problems = []
    for n, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if "NBVAL" in source:
            problems.append(f"cell {n}: an NBVAL comment (use the nbval-* cell tags)")
        problems += [f"cell {n}: code line of {len(line)} columns"
                     for line in source.splitlines() if len(line) > CODE_COLUMNS]
        if "wide-output" in cell.get("metadata", {}).get("tags", []):
            continue
        for output in cell.get("outputs", []):
            text, limit = _shown_text(output)
            problems += [f"cell {n}: output line of {len(line)} columns"
                         for line in text.splitlines() if len(line) > limit]
    assert not problems, "\n".join(problems)


def test_shown_source_leaves_out_the_formatters_pragmas():
    """show_source and show_definitions show the library's code as it is, but for
    ``# fmt: skip``, which says how ruff lays a line out: every other line is the
    file's, in its order."""
    import inspect

    from ropetut.book.notebook import show_definitions, show_source
    from ropetut.kernels import angles

    source = inspect.getsource(angles.rope_angles_kernel.fn)
    assert "# fmt: skip" in source
    for shown in (
        show_source(angles.rope_angles_kernel).data,
        show_definitions(angles.__file__, "rope_angles_kernel").data,
    ):
        code = shown.removeprefix("```python\n").removesuffix("\n```")
        assert "fmt: skip" not in code
        lines = source.rstrip().splitlines()
        assert code.splitlines() == [
            line.removesuffix("  # fmt: skip") for line in lines
        ]
