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

Library source that a chapter prints counts as its source too: each ``show_source(obj)`` and
``show_definitions(path, *names)`` in its code cells is resolved (the cells' imports and simple
assignments are run, nothing else) to a file and a top-level definition, or a whole module, and
that text at the run's commit must equal the text now (a file moved since, by ``git mv``, is
followed back to its path at that commit).
"""
import ast
import inspect
import json
import re
import subprocess
import sys
import types
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


def _code_cells(nb: dict):
    """Each code cell as a module AST (IPython's % and ! lines left out)."""
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            lines = [line for line in src.splitlines() if not line.lstrip().startswith(("%", "!"))]
            yield ast.parse("\n".join(lines))


def printed_sources(nb: dict) -> list:
    """(file, name) for every definition the chapter prints from the library: name None for a
    whole module. Raises ValueError naming a show_source call it cannot resolve."""
    trees = list(_code_cells(nb))
    calls = [node for tree in trees for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Name)
             and node.func.id in ("show_source", "show_definitions")]
    loops = {node.target.id: node.iter.elts   # for f in (a, b): show_source(f)
             for tree in trees for node in ast.walk(tree) if isinstance(node, ast.For)
             and isinstance(node.target, ast.Name)
             and isinstance(node.iter, (ast.Tuple, ast.List))}
    arguments = [a for call in calls for a in call.args] + [
        e for elements in loops.values() for e in elements]
    used = {n.id for a in arguments for n in ast.walk(a) if isinstance(n, ast.Name)}
    namespace: dict = {}
    for tree in trees:   # the imports, and assignments to names the calls use: nothing else
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)) or (
                    isinstance(node, ast.Assign) and {t.id for t in node.targets
                                                      if isinstance(t, ast.Name)} & used):
                try:
                    exec(compile(ast.Module([node], []), "<chapter>", "exec"), namespace)
                except Exception:   # a package this machine lacks (CuTeDSL): a call that
                    pass            # needs the name says so below
    shown = []
    for node in calls:
        args = [ast.unparse(a) for a in node.args]
        try:
            if node.func.id == "show_source":   # a loop variable: each of its values
                for expr in loops.get(args[0], node.args[:1]):
                    obj = eval(ast.unparse(expr), namespace)
                    obj = getattr(obj, "fn", obj)   # a @triton.jit kernel
                    name = None if isinstance(obj, types.ModuleType) else obj.__qualname__
                    shown.append((Path(inspect.getsourcefile(obj)), name))
            elif node.func.id == "show_definitions":
                file = Path(eval(args[0], namespace))
                shown += [(file, eval(a, namespace)) for a in args[1:]]
        except Exception as error:
            raise ValueError(f"{node.func.id}({', '.join(args)}): {error}") from error
    return shown


def definition(text: str, name: str | None) -> str | None:
    """The source of top-level ``name`` in a module's text, decorators included (the whole text
    for None; for a method, ``Class.method``, the whole class); None if there is none."""
    if name is None:
        return text
    name = name.split(".")[0]
    lines = text.splitlines()
    for node in ast.parse(text).body:
        if getattr(node, "name", None) == name:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return "\n".join(lines[start - 1:node.end_lineno])
    return None


def path_at(sha: str, rel: str, repo: Path) -> str:
    """rel's path at sha: a file moved since (committed or staged) is followed back through
    git's rename detection; rel itself where git saw no move."""
    renames = subprocess.run(["git", "diff", "--name-status", "-M", "--diff-filter=R", sha],
                             cwd=repo, capture_output=True, text=True).stdout
    for line in renames.splitlines():
        _, old, new = line.split("\t")
        if new == rel:
            return old
    return rel


def why_printed_stale(nb: dict, sha: str, repo: Path) -> str | None:
    """None if every definition the chapter prints is as it was at sha, else which one is not."""
    try:
        shown = printed_sources(nb)
    except ValueError as error:
        return f"it prints library source this check cannot name: {error}"
    for file, name in shown:
        rel = file.resolve().relative_to(repo.resolve()).as_posix()
        old = subprocess.run(["git", "show", f"{sha}:{rel}"], cwd=repo, capture_output=True,
                             text=True)
        if old.returncode:   # not there at sha: moved since?
            old = subprocess.run(["git", "show", f"{sha}:{path_at(sha, rel, repo)}"], cwd=repo,
                                 capture_output=True, text=True)
        then = definition(old.stdout, name) if old.returncode == 0 else None
        now = definition(file.read_text(encoding="utf-8"), name)
        if now is None:
            return f"it prints {name} from {rel}, which has no such top-level definition"
        if then != now:
            what = f"{rel}'s {name}" if name else rel
            return f"it prints {what}, which changed after {sha}: re-execute it on the GPU"
    return None


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
    return why_printed_stale(nb, sha, repo)


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
