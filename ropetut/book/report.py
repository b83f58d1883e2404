"""Tables sized for the book's 784 px column: HTML in a notebook, compact text
elsewhere.

``html_table(rows, columns)`` returns a ``Report``: Jupyter shows its HTML (a table of
class ``ropetut-table``, styled in ``book/_static/ropetut.css``); a console, and nbval
on CPU, see its text, wrapped to ``TEXT_WIDTH`` columns. ``stack`` puts reports one
under the other; ``show`` displays one from inside a function. A cell value that is a
``Markup`` shows as its text in the text form and as its own HTML (a link, a styled
word) in the table.
"""

import html
import itertools
import numbers
import textwrap

TEXT_WIDTH = 88
CSS_CLASS = "ropetut-table"
MISSING = "—"
GAP = "  "  # between text columns


class Report:
    """HTML for a notebook (``_repr_html_``), text for everything else (``repr``)."""

    def __init__(self, html: str, text: str):
        self.html, self.text = html, text

    def _repr_html_(self) -> str:
        return self.html

    def __repr__(self) -> str:
        return self.text


class Markup(str):
    """A cell value: ``text`` in the text form, ``markup`` (trusted HTML) in
    the table."""

    def __new__(cls, text: str, markup: str):
        value = super().__new__(cls, text)
        value.markup = markup
        return value

    def __html__(self) -> str:
        return self.markup


def html_table(rows, columns, *, formats=None, caption=None, full=None) -> Report:
    """A table of ``rows`` (dicts), one column per key of ``columns`` (a key, or a
    (key, header) pair). formats: {key: format spec or callable}; a missing or None
    value shows as "—". full: columns of a complete table, folded below this one under
    "all columns" (HTML only)."""
    headers, cells, numeric = _cells(rows, columns, formats or {})
    report = Report(
        _html(headers, cells, numeric, caption), _text(headers, cells, numeric, caption)
    )
    if full:
        folded = _html(*_cells(rows, full, formats or {}), None)
        report.html += (
            '<details class="ropetut-all"><summary>all columns</summary>'
            f"{folded}</details>"
        )
    return report


def stack(*reports) -> Report:
    """Reports one under the other, a blank line between their text forms."""
    return Report(
        "\n".join(r.html for r in reports), "\n\n".join(r.text for r in reports)
    )


def show(report) -> None:
    """Display report in a notebook; print its text anywhere else."""
    try:
        from IPython.display import display
    except ImportError:
        print(report)
    else:
        display(report)  # prints the text when no IPython shell is running


def _cells(rows, columns, formats):
    """(headers, rows of formatted cell strings, whether each column holds numbers)."""
    pairs = [(c, c) if isinstance(c, str) else tuple(c) for c in columns]
    cells = [[_format(r.get(key), formats.get(key)) for key, _ in pairs] for r in rows]
    numeric = []
    for key, _ in pairs:
        values = [r[key] for r in rows if r.get(key) is not None]
        numeric.append(bool(values) and all(map(_is_number, values)))
    return [str(header) for _, header in pairs], cells, numeric


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _format(value, how) -> str:
    if value is None:
        return MISSING
    if how is None:
        return value if isinstance(value, str) else str(value)
    return how(value) if callable(how) else format(value, how)


def _escape(text) -> str:
    return text.__html__() if hasattr(text, "__html__") else html.escape(str(text))


def _html(headers, cells, numeric, caption) -> str:
    def row(tag, texts):
        right = ' class="num"'
        return "".join(
            f"<{tag}{right if num else ''}>{_escape(t)}</{tag}>"
            for t, num in zip(texts, numeric)
        )

    caption = f"<caption>{_escape(caption)}</caption>" if caption else ""
    body = "\n".join(f"<tr>{row('td', r)}</tr>" for r in cells)
    return (
        f'<table class="{CSS_CLASS}">{caption}\n'
        f"<thead><tr>{row('th', headers)}</tr></thead>\n"
        f"<tbody>\n{body}\n</tbody></table>"
    )


def _text(headers, cells, numeric, caption) -> str:
    """Columns as wide as their widest cell; while a line is wider than TEXT_WIDTH the
    widest column narrows, wrapping its header first, then its cells at spaces, then
    anywhere. Numbers right-aligned."""
    columns = list(zip(headers, *cells))  # (header, cell, cell, ...)
    widths = [max(map(len, col)) for col in columns]
    # how narrow each column may get: header wrapped, cells wrapped, anything
    floors = (
        [max(map(len, [*col[0].split(), *col[1:]]), default=1) for col in columns],
        [max(map(len, " ".join(col).split()), default=1) for col in columns],
        [1] * len(columns),
    )
    room = TEXT_WIDTH - len(GAP) * (len(columns) - 1)
    for floor in floors:
        while sum(widths) > room:
            above = [i for i, w in enumerate(widths) if w > floor[i]]
            if not above:
                break
            widths[max(above, key=widths.__getitem__)] -= 1
    lines = textwrap.wrap(caption, TEXT_WIDTH) if caption else []
    for texts in [headers, ["-" * w for w in widths], *cells]:
        wrapped = [textwrap.wrap(str(t), w) or [""] for t, w in zip(texts, widths)]
        for parts in itertools.zip_longest(*wrapped, fillvalue=""):
            lines.append(
                GAP.join(
                    p.rjust(w) if num else p.ljust(w)
                    for p, w, num in zip(parts, widths, numeric)
                ).rstrip()
            )
    return "\n".join(lines)
