"""report.html_table: the HTML a notebook shows and the text a console (and nbval) sees."""

from ropetut.book import report

ROWS = [
    {"name": "final", "ms": 0.12345, "pct": 98.6, "note": None, "extra": "x"},
    {
        "name": "<b>liger</b> & co",
        "ms": 1.5,
        "pct": None,
        "note": "a " * 80,
        "extra": "y",
    },
]


def test_columns_headers_and_formats():
    table = report.html_table(
        ROWS,
        ["name", ("ms", "time ms"), ("pct", "% floor")],
        formats={"ms": ".3f", "pct": ".0f"},
    )
    html = table._repr_html_()
    assert html.startswith(f'<table class="{report.CSS_CLASS}">')
    assert "<th>name</th>" in html and '<th class="num">time ms</th>' in html
    assert '<td class="num">0.123</td>' in html and '<td class="num">99</td>' in html
    assert "note" not in html and "extra" not in html
    lines = repr(table).splitlines()
    assert lines[0].split() == ["name", "time", "ms", "%", "floor"]
    assert lines[2].split() == ["final", "0.123", "99"]


def test_missing_and_none_show_a_dash():
    table = report.html_table(ROWS, ["name", "pct", "absent"])
    assert table._repr_html_().count(f"<td>{report.MISSING}</td>") == 2  # absent, twice
    assert f'<td class="num">{report.MISSING}</td>' in table._repr_html_()  # pct None
    assert repr(table).splitlines()[2].endswith(report.MISSING)


def test_callable_formats_and_numbers_right_aligned():
    table = report.html_table(
        ROWS, ["name", "ms"], formats={"ms": lambda v: f"{v * 1e3:.0f} us"}
    )
    text = repr(table).splitlines()
    assert text[2].endswith("123 us") and text[3].endswith("1500 us")
    assert len(text[2]) == len(text[3])  # right-aligned: both end at the column's edge


def test_values_are_escaped_and_markup_is_not():
    link = report.Markup("chapter 05", '<a href="05.html#x">chapter 05</a>')
    table = report.html_table([*ROWS, {"name": link}], ["name"], caption="a < b")
    html = table._repr_html_()
    assert "&lt;b&gt;liger&lt;/b&gt; &amp; co" in html and "<b>" not in html
    assert '<a href="05.html#x">chapter 05</a>' in html
    assert "<caption>a &lt; b</caption>" in html
    assert "<a " not in repr(table) and "chapter 05" in repr(table)
    assert repr(table).splitlines()[0] == "a < b"


def test_full_table_is_folded_below():
    table = report.html_table(ROWS, ["name"], full=["name", "ms", "note", "extra"])
    html = table._repr_html_()
    compact, folded = html.split("<details")
    assert "extra" not in compact
    assert folded.startswith(
        ' class="ropetut-all"><summary>all columns</summary><table'
    )
    assert "<th>extra</th>" in folded and folded.endswith("</table></details>")
    assert "extra" not in repr(table)  # the text form stays compact
    assert "<details" not in report.html_table(ROWS, ["name"])._repr_html_()


def test_text_form_fits_88_columns():
    table = report.html_table(
        ROWS, ["name", "note", "ms", "extra"], caption="word " * 40
    )
    lines = repr(table).splitlines()
    assert max(map(len, lines)) <= report.TEXT_WIDTH
    assert " ".join(lines).split().count("a") == 80  # wrapped, nothing cut
    assert str(table) == repr(table)


def test_stack():
    one, two = report.html_table(ROWS, ["name"]), report.html_table(ROWS, ["ms"])
    both = report.stack(one, two)
    assert both._repr_html_().count("<table") == 2
    assert repr(both) == repr(one) + "\n\n" + repr(two)


def test_show_prints_the_text_outside_a_notebook(capsys):
    report.show(report.html_table(ROWS, ["name"]))
    assert capsys.readouterr().out.splitlines()[0] == "name"
