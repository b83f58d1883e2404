"""What every chapter's first cells need: where it ran, and kernel source shown from
the library."""

import inspect
import re
from pathlib import Path

from ..runtime import NO_GPU  # noqa: F401  (chapters print it where a timing would be)
from .provenance import REPO, environment  # noqa: F401  (chapter 09 reads REPO)


def print_environment() -> None:
    """The first code cell of every chapter: every stored output says where it came
    from."""
    for key, value in environment().items():
        print(f"{key:15} {value}")


# The formatter's pragma: it says how ruff lays a line out, nothing about the code
FORMATTER_PRAGMA = re.compile(r"[ \t]+# fmt: skip$", re.MULTILINE)


def _as_shown(source):
    """Source as the book shows it: highlighted, the formatter's pragmas left out."""
    from IPython.display import Markdown

    return Markdown(f"```python\n{FORMATTER_PRAGMA.sub('', source.rstrip())}\n```")


def show_source(obj):
    """Display a function's or module's source, highlighted: the library is the only
    copy."""
    # a @triton.jit kernel wraps the Python function in .fn
    return _as_shown(inspect.getsource(getattr(obj, "fn", obj)))


def _definitions(path, names):
    """The source of the top-level functions ``names`` in the file at path, decorators
    included, read without importing it (the file may need a package this machine
    lacks)."""
    import ast

    text = Path(path).read_text()
    lines = text.splitlines()
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            found[node.name] = "\n".join(lines[start - 1 : node.end_lineno])
    missing = [n for n in names if n not in found]
    if missing:
        raise KeyError(f"{path}: no top-level {missing}")
    return [found[n] for n in names]


def show_definitions(path, *names):
    """Display functions from a source file, highlighted, without importing it: the
    CuTeDSL kernel's file imports a package that a CPU machine usually lacks."""
    return _as_shown("\n\n\n".join(_definitions(path, names)))


def code_lines(path, *names) -> int:
    """Lines of code in those functions: blank lines, comments and docstrings not
    counted."""
    import ast
    import io
    import tokenize

    count = 0
    for source in _definitions(path, names):
        code = set()
        docstrings = set()
        for node in ast.walk(ast.parse(source)):
            body = getattr(node, "body", None)
            if (
                isinstance(body, list)
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type not in (
                tokenize.COMMENT,
                tokenize.NL,
                tokenize.NEWLINE,
                tokenize.INDENT,
                tokenize.DEDENT,
                tokenize.ENDMARKER,
            ):
                code.update(range(tok.start[0], tok.end[0] + 1))
        count += len(code - docstrings)
    return count
