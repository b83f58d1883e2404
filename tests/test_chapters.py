"""The chapters as files: their install cell (Colab) and the freshness of their stored outputs.
Mirrors scripts/sync_install_cell.py and scripts/check_fresh_outputs.py."""
import json
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


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_first_cell_is_the_install_cell_with_the_configured_url(path):
    assert first_code_source(path) == install.install_cell(install.repository_url())


def test_install_cell_clones_the_configured_url_when_ropetut_does_not_import(monkeypatch, tmp_path):
    calls = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "ropetut", None)        # import ropetut raises ImportError
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: calls.append(cmd))
    monkeypatch.setattr(sys, "path", list(sys.path))
    url = "https://example.org/fork/ropetut"
    with pytest.raises(ImportError):                          # the stub cloned nothing to import
        exec(install.install_cell(url), {})
    assert calls == [["git", "clone", "--depth", "1", url, install.CLONE]]
    assert sys.path[0] == str(tmp_path / install.CLONE)


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
    path.write_text(_notebook(["print(1)", "prose"], commit=ran + "+dirty"))
    assert "uncommitted" in fresh.why_stale(path, tmp_path)
    path.write_text(_notebook(["print(1)", "prose"]))
    assert "no ropetut commit" in fresh.why_stale(path, tmp_path)
    path.write_text(_notebook(["print(1)", "prose"], commit="0123456789"))
    assert "git has no" in fresh.why_stale(path, tmp_path)


@pytest.mark.skipif(not HAS_HISTORY, reason="needs the repository's git history (a clone, not a copy)")
@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_stored_outputs_are_fresh(path):
    """Stale outputs can't land: a chapter edited after its GPU run fails here until re-executed."""
    assert fresh.why_stale(path) is None
