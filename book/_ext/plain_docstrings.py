"""Sphinx extension for book/api.md: read ropetut's plain docstrings as
reStructuredText.

ropetut's docstrings list arguments as ``name: what it is`` lines, continued by indented
lines, with no blank line between entries: plain text that reads well in ``help()``, but
that reStructuredText takes for broken definition lists (a warning, an error under -W).
This turns each run of such lines into a field list set off by blank lines; everything
else passes through. An entry that names arguments of the documented callable becomes
``:param name:`` (Sphinx lists it under Parameters, with its type hint; ``cos, sin:
...`` gives both names the same text); any other entry stays a plain field. An entry
goes on over indented lines and over lines that start in lower case (a sentence going
on). Docstrings in Google or NumPy style are left to napoleon, which runs first.
"""

import inspect
import re

ENTRY = re.compile(r"^([A-Za-z_]\w*(?:, [A-Za-z_]\w*)*): (\S.*)$")


def _arguments(obj) -> set[str]:
    try:
        return set(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return set()


def fields(lines: list[str], arguments=frozenset()) -> list[str]:
    out: list[str] = []
    entry: list | None = None  # [names, text lines] of the field being read

    def flush():
        names, text = entry
        if all(n in arguments for n in names):
            for n in names:
                out.append(f":param {n}: {text[0]}")
                out.extend("   " + t for t in text[1:])
        else:
            out.append(f":{', '.join(names)}: {text[0]}")
            out.extend("   " + t for t in text[1:])

    for line in lines:
        stripped = line.strip()
        match = ENTRY.match(line)
        if match:
            if entry:
                flush()
            elif out and out[-1].strip():
                out.append("")  # a field list must start after a blank line
            entry = [match.group(1).split(", "), [match.group(2)]]
        elif entry and stripped and (line[:1].isspace() or stripped[:1].islower()):
            # a continuation of the entry above: indented, or a sentence going on
            entry[1].append(stripped)
        else:
            if entry:
                flush()
                if stripped:
                    out.append("")  # and end with one
                entry = None
            out.append(line)
    if entry:
        flush()
    return out


def _process(app, what, name, obj, options, lines):
    lines[:] = fields(lines, _arguments(obj) if callable(obj) else set())


def setup(app):
    app.connect("autodoc-process-docstring", _process, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
