"""Refuse stale stored outputs: a chapter whose sources changed after the GPU run that made its outputs.

    python scripts/check_fresh_outputs.py [chapters/03_triton_v1.ipynb ...]

Every chapter's first cell prints ``ropetut commit  <sha>``: the commit its outputs ran at. The
outputs are fresh if the chapter's cell sources (code and markdown, not outputs) at that commit
equal the sources now; committing the outputs afterwards changes only outputs, so it does not
count, and neither does the repository URL in the first cell (a fork points it elsewhere; where
ropetut imports, the cell prints the same). A run from a tree with uncommitted library changes
(``<sha>+dirty``) is fresh only if the chapter's sources now equal those at ``<sha>``: any edit
since, committed or not, makes it stale. A commit that git does not know, or no commit at all,
counts as stale: nothing says which sources ran (in a shallow clone, fetch the history first:
``git fetch --unshallow``). Exits 1 and names each stale chapter; ``scripts/gpu-validate.sh``
ends with it, and the test suite runs it.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

from sync_install_cell import install_cell   # scripts/, beside this file

REPO = Path(__file__).resolve().parent.parent
COMMIT_LINE = re.compile(r"ropetut commit\s+(\S+)")


def stored_commit(nb: dict) -> str | None:
    """The commit the notebook's stored outputs name, from the first output that names one."""
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain", "")
            match = COMMIT_LINE.search("".join(text) if isinstance(text, list) else text)
            if match:
                return match.group(1)
    return None


# The install cell with any repository URL (scripts/sync_install_cell.py writes it): pointing the
# URL at a fork changes no output where ropetut imports, so the comparison ignores the URL alone.
INSTALL_CELL = re.compile(re.escape(install_cell("\0")).replace(re.escape("\0"), '[^"]*'))


def cell_sources(nb: dict) -> list:
    sources = [(c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"])
               for c in nb["cells"]]
    return [(kind, install_cell("<url>") if kind == "code" and INSTALL_CELL.fullmatch(src) else src)
            for kind, src in sources]


def why_stale(path: Path, repo: Path = REPO) -> str | None:
    """None if the stored outputs came from the chapter's current sources, else the reason."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    ran = stored_commit(nb)
    if ran is None:
        return "its outputs name no ropetut commit"
    sha, dirty = ran.removesuffix("+dirty"), ran.endswith("+dirty")
    rel = path.resolve().relative_to(repo.resolve()).as_posix()
    old = subprocess.run(["git", "show", f"{sha}:{rel}"], cwd=repo, capture_output=True, text=True)
    if old.returncode:
        return f"git has no {rel} at {sha}, the commit its outputs name"
    if cell_sources(json.loads(old.stdout)) != cell_sources(nb):
        if dirty:
            return (f"it ran from a tree with uncommitted changes ({ran}) and its sources differ from "
                    f"{sha}'s: re-execute it on the GPU")
        return f"its sources changed after {sha}, the commit its outputs ran at: re-execute it on the GPU"
    return None


def is_shallow(repo: Path = REPO) -> bool:
    """A shallow clone (CI's checkouts often are) lacks the commits older outputs name."""
    out = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=repo,
                         capture_output=True, text=True)
    return out.stdout.strip() == "true"


def main(argv) -> int:
    paths = [Path(p) for p in argv] or sorted((REPO / "chapters").glob("*.ipynb"))
    stale = [(p, why) for p in paths if (why := why_stale(p))]
    for path, why in stale:
        print(f"stale: {path.name}: {why}")
    print(f"{len(paths) - len(stale)} of {len(paths)} chapters have fresh outputs")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
