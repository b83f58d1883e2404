"""The seed-claims ledger: the claims file, record(), and the ledger page's table."""

import json
import re
from pathlib import Path

import nbformat
import pytest

from ropetut.book import ledger

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = ROOT / "chapters"
SEEDS = {"000", "001", "002", "003", "004"}
RECORD_CALL = re.compile(r"""ledger\.record\(\s*f?["']([^"']+)["']""")
# a claim id as a string literal
CLAIM_ID = re.compile(r"""["'](00[0-4]-[\w.-]+)["']""")


@pytest.fixture(autouse=True)
def scratch_ledger(tmp_path, monkeypatch):
    """Every test records into its own folder: on a GPU, record() without out_dir writes
    results/ledger, and a suite run beside strict nbval changed the ledger page there."""
    monkeypatch.setenv(ledger.LEDGER_DIR_ENV, str(tmp_path / "ledger"))


def chapter_sources():
    """{chapter stem: the code of all its cells}."""
    return {
        p.stem: "\n".join(
            c.source
            for c in nbformat.read(p, as_version=4).cells
            if c.cell_type == "code"
        )
        for p in sorted(CHAPTERS.glob("*.ipynb"))
    }


def test_claims_name_a_seed_and_a_chapter_or_an_issue():
    data = ledger.load_claims()
    ids = [row["id"] for row in data["claims"]]
    assert len(ids) == len(set(ids)), "duplicate claim ids"
    for row in data["claims"]:
        assert row["seed"] in SEEDS, row
        assert row["id"].startswith(row["seed"] + "-"), row
        assert row["section"].strip() and row["claim"].strip(), row
        assert bool(row["chapter"]) != bool(row["issue"]), (
            f"{row['id']}: name a chapter or an issue, not both"
        )


def test_every_seed_has_claims():
    assert {row["seed"] for row in ledger.load_claims()["claims"]} == SEEDS


def test_named_chapters_and_issues_exist():
    data = ledger.load_claims()
    stems = {p.stem for p in CHAPTERS.glob("*.ipynb")}
    for row in data["claims"]:
        if row["chapter"]:
            assert row["chapter"] in stems, (
                f"{row['id']}: no chapters/{row['chapter']}.ipynb"
            )
        else:
            assert str(row["issue"]) in data["issues"], (
                f"{row['id']}: issue {row['issue']} is not in 'issues'"
            )


def test_cutedsl_claims_are_measured_by_the_appendix():
    rows = [row for row in ledger.load_claims()["claims"] if "CuTeDSL" in row["claim"]]
    assert rows
    for row in rows:
        assert row["chapter"] == "10_two_dsls" and row["issue"] is None, row["id"]


def test_record_calls_in_chapters_name_claims_of_that_chapter():
    claims = ledger.claims()
    found = 0
    for stem, code in chapter_sources().items():
        for cid in RECORD_CALL.findall(code):
            found += 1
            if "{" in cid:  # an f-string id: check its fixed prefix
                prefix = cid.split("{")[0]
                matches = [c for c in claims if c.startswith(prefix)]
                assert matches, f"{stem}: no claim id starts with {prefix!r}"
                assert all(claims[c]["chapter"] == stem for c in matches), (
                    f"{stem}: {prefix}-* belong elsewhere"
                )
            else:
                assert cid in claims, f"{stem}: records unknown claim {cid!r}"
                assert claims[cid]["chapter"] == stem, (
                    f"{stem} records {cid!r}, which names {claims[cid]['chapter']}"
                )
    assert found >= 20


def test_claim_ids_quoted_in_chapters_are_claims_of_that_chapter():
    """Ids passed through a variable (for claim_id in (...)) are string literals somewhere."""
    claims = ledger.claims()
    recorded = set()
    for stem, code in chapter_sources().items():
        for cid in CLAIM_ID.findall(code):
            assert cid in claims, f"{stem}: unknown claim id {cid!r}"
            assert claims[cid]["chapter"] == stem, (
                f"{stem} names {cid!r}, which belongs to {claims[cid]['chapter']}"
            )
            recorded.add(cid)
    assert len(recorded) >= 30


def test_record_writes_to_the_given_directory(tmp_path, capsys):
    ledger.record(
        "003-norm",
        ours="max |R^T R - I| = 1e-16",
        agree=True,
        cause="orthogonal",
        out_dir=tmp_path,
        where="orthogonal-check",
    )
    ledger.record(
        "001-table-2048",
        ours="V4 1913 GB/s",
        agree=False,
        cause="a faster GPU",
        out_dir=tmp_path,
        show=False,
    )
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == [
        "claim",
        "seed",
        "says",
        "ours",
        "verdict",
        "why",
    ]
    assert "seed 003," in out and "agree" in out
    assert "orthogonal" in out  # the cause, under "why"
    assert "1913" not in out  # show=False: silent
    written = json.loads(
        (tmp_path / "05_autograd_and_fusion.json").read_text(encoding="utf-8")
    )
    assert (
        written["003-norm"]["agree"] is True
        and written["003-norm"]["cause"] == "orthogonal"
    )
    assert written["003-norm"]["where"] == "orthogonal-check"
    assert {"device", "ropetut commit"} <= written["003-norm"].keys()
    written = json.loads((tmp_path / "04_triton_v2_v3_v4.json").read_text())[
        "001-table-2048"
    ]
    assert written["agree"] is False and written["where"] is None


def test_shown_verdict_is_words_in_88_columns_and_nothing_random(capsys):
    long = "V4 " + "1913 GB/s, " * 20
    ledger.record("001-table-2048", ours=long, agree=False, cause="c", show=True)
    first = capsys.readouterr().out
    ledger.record("001-table-2048", ours=long, agree=False, cause="c", show=True)
    assert capsys.readouterr().out == first  # the same output every run
    assert max(map(len, first.splitlines())) <= 88 and "disagree" in first
    assert first.count("1913") == 20  # wrapped, not cut
    assert not re.search(r"[\u2600-\u27bf\U0001F300-\U0001FAFF]", first)  # no emoji
    assert (ledger.AGREE, ledger.DISAGREE) == ("agree", "disagree")


def test_verdicts_shows_several_in_one_table(monkeypatch):
    monkeypatch.setattr(ledger, "_recorded", {})
    ledger.record("004-legacy-A", ours="1.2x", agree=True, cause="a", show=False)
    ledger.record(
        "004-legacy-B", ours="0.5x & <less>", agree=False, cause="b", show=False
    )
    table = ledger.verdicts(["004-legacy-A", "004-legacy-B", "004-legacy-C"])
    html = table._repr_html_()
    assert html.count("<table") == 1 and html.count("<tr>") == 4
    assert (
        "<th>claim</th><th>seed says</th><th>ours</th><th>verdict</th><th>why</th>"
        in html
    )
    assert "<td>a</td>" in html and "<td>b</td>" in html  # the causes
    assert '<span class="verdict-agree">agree</span>' in html
    assert '<span class="verdict-disagree">disagree</span>' in html
    assert "0.5x &amp; &lt;less&gt;" in html
    assert html.count(ledger.NOT_DECIDED) == 1  # C was not recorded
    assert ledger.claims()["004-legacy-A"]["claim"] in html
    assert max(map(len, repr(table).splitlines())) <= 88
    with pytest.raises(KeyError):
        ledger.verdicts(["no-such-claim"])


def test_record_refuses_a_where_that_is_not_an_html_id(tmp_path):
    for bad in ("Ortho Check", "#ortho", "3-results", "ortho_check"):
        with pytest.raises(ValueError, match="not an HTML id"):
            ledger.record(
                "003-norm",
                ours="x",
                agree=True,
                cause="y",
                where=bad,
                out_dir=tmp_path,
                show=False,
            )
    assert list(tmp_path.iterdir()) == []


def test_record_updates_an_entry_and_keeps_the_others(tmp_path):
    ledger.record(
        "002-ch4-portion",
        ours="64 of 128",
        agree=True,
        cause="a",
        out_dir=tmp_path,
        show=False,
    )
    ledger.record(
        "002-ch5-replicate",
        ours="3 of 3",
        agree=True,
        cause="b",
        out_dir=tmp_path,
        show=False,
    )
    ledger.record(
        "002-ch4-portion",
        ours="0 of 128",
        agree=False,
        cause="c",
        out_dir=tmp_path,
        show=False,
    )
    verdicts = ledger.load_verdicts(tmp_path)
    assert set(verdicts) == {"002-ch4-portion", "002-ch5-replicate"}
    assert (
        verdicts["002-ch4-portion"]["ours"] == "0 of 128"
        and verdicts["002-ch4-portion"]["agree"] is False
    )


def test_withdraw_replaces_a_verdict_by_its_why_and_keeps_the_others(
    tmp_path, monkeypatch
):
    """A claim whose runs are missing: its earlier verdict leaves the file, replaced by
    the withdrawal's why; the ledger shows it as not decided yet, with that why, and
    the chapter's other verdicts stay."""
    monkeypatch.setattr(ledger, "_recorded", {})
    monkeypatch.setattr(ledger, "_withdrawn", {})
    for claim_id in ("002-ch4-table", "002-ch5-table"):
        ledger.record(
            claim_id, ours="x", agree=False, cause="c", out_dir=tmp_path, show=False
        )
    path = tmp_path / "09_the_plot_twist.json"
    before = json.loads(path.read_text(encoding="utf-8"))
    why = "waiting for runs: seed-ch5-pair"
    ledger.withdraw("002-ch5-table", why=why, out_dir=tmp_path)
    after = json.loads(path.read_text(encoding="utf-8"))
    assert after["002-ch4-table"] == before["002-ch4-table"]
    assert after["002-ch5-table"][ledger.WITHDRAWN] == why  # persisted, not dropped
    assert not {"agree", "ours", "cause"} & after["002-ch5-table"].keys()
    assert {"device", "ropetut commit"} <= after["002-ch5-table"].keys()
    by_id = {r["id"]: r for r in ledger.rows(verdicts=ledger.load_verdicts(tmp_path))}
    assert by_id["002-ch5-table"]["verdict"] == ledger.NOT_DECIDED
    assert by_id["002-ch5-table"]["cause"] == why
    assert by_id["002-ch5-table"]["ours"] == ""
    assert by_id["002-ch4-table"]["verdict"] == ledger.DISAGREE
    html = ledger.verdicts(["002-ch4-table", "002-ch5-table"])._repr_html_()
    assert html.count(ledger.NOT_DECIDED) == 1
    assert f"<td>{why}</td>" in html
    # withdrawn again: the newer why replaces the older
    ledger.withdraw("002-ch5-table", why="inconclusive: kernel", out_dir=tmp_path)
    entry = json.loads(path.read_text(encoding="utf-8"))["002-ch5-table"]
    assert entry[ledger.WITHDRAWN] == "inconclusive: kernel"
    # recorded again: the withdrawal is gone, in the file and in the session
    ledger.record(
        "002-ch5-table", ours="y", agree=True, cause="d", out_dir=tmp_path, show=False
    )
    entry = json.loads(path.read_text(encoding="utf-8"))["002-ch5-table"]
    assert ledger.WITHDRAWN not in entry and entry["agree"] is True
    html = ledger.verdicts(["002-ch5-table"])._repr_html_()
    assert ledger.NOT_DECIDED not in html and "<td>d</td>" in html


def test_a_withdrawn_claims_why_is_on_the_ledger_page(tmp_path, monkeypatch):
    """The page reads the chapter's file: a claim withdrawn in an earlier session shows
    as not decided yet, with its why under "why"."""
    monkeypatch.setattr(ledger, "_recorded", {})
    monkeypatch.setattr(ledger, "_withdrawn", {})
    why = "inconclusive: harder-text-baseline"
    ledger.withdraw("002-ch5-table", why=why, out_dir=tmp_path)  # none recorded before
    monkeypatch.setattr(ledger, "_withdrawn", {})  # a later session: only the file
    table = ledger.rows(verdicts=ledger.load_verdicts(tmp_path))
    row = next(r for r in table if r["id"] == "002-ch5-table")
    assert row["verdict"] == ledger.NOT_DECIDED and row["cause"] == why
    html = ledger.page(table)._repr_html_()
    seed002 = html.split("<caption>Seed 002</caption>")[1].split("</table>")[0]
    assert f"<td>{why}</td>" in seed002
    assert '<span class="verdict-' not in seed002  # no agree or disagree


def test_cannot_tell_is_a_verdict_of_its_own(tmp_path, monkeypatch):
    """A claim measured with all its runs in, whose intervals admit either answer: the
    file keeps the measurement and agree None, the ledger shows "cannot tell" with
    ours and why (not "not decided yet", which waits for runs), the summary counts it
    apart, and a later record or withdrawal replaces it."""
    monkeypatch.setattr(ledger, "_recorded", {})
    monkeypatch.setattr(ledger, "_withdrawn", {})
    ledger.withdraw("002-ch5-table", why="waiting for runs: x", out_dir=tmp_path)
    ledger.cannot_tell(
        "002-ch5-table", ours="+0.117 [-0.280, +0.514]", cause="either way",
        where="twist-seed-regime", out_dir=tmp_path, show=False,
    )  # fmt: skip
    path = tmp_path / "09_the_plot_twist.json"
    entry = json.loads(path.read_text(encoding="utf-8"))["002-ch5-table"]
    assert entry["agree"] is None and ledger.WITHDRAWN not in entry
    assert entry["ours"] == "+0.117 [-0.280, +0.514]" and entry["cause"] == "either way"
    table = ledger.rows(verdicts=ledger.load_verdicts(tmp_path))
    row = next(r for r in table if r["id"] == "002-ch5-table")
    assert row["verdict"] == ledger.CANNOT_TELL and row["ours"].startswith("+0.117")
    html = ledger.page(table)._repr_html_()
    summary, seed002 = html.split("<table")[1], html.split("Seed 002</caption>")[1]
    assert '<td>all</td><td class="num">' in summary
    cells = re.search(r"<tr><td>all</td>(.*?)</tr>", summary).group(1)
    counts = [int(c) for c in re.findall(r'<td class="num">(\d+)</td>', cells)]
    assert counts[ledger.STATES.index(ledger.CANNOT_TELL) + 1] == 1
    assert f"<td>{ledger.CANNOT_TELL}</td>" in seed002.split("</table>")[0]
    shown = ledger.verdicts(["002-ch5-table"])._repr_html_()
    assert ledger.CANNOT_TELL in shown and ledger.NOT_DECIDED not in shown
    ledger.record(
        "002-ch5-table", ours="y", agree=True, cause="d", out_dir=tmp_path, show=False
    )
    assert json.loads(path.read_text(encoding="utf-8"))["002-ch5-table"]["agree"]


def test_withdraw_refuses_what_record_refuses_and_writes_nothing_on_cpu(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(ledger, "_recorded", {})
    monkeypatch.setattr(ledger, "_withdrawn", {})
    with pytest.raises(KeyError, match="unknown seed claim"):
        ledger.withdraw("no-such-claim", why="w", out_dir=tmp_path)
    untested = {
        row["id"]: row for row in with_an_untested_claim(ledger.load_claims())["claims"]
    }
    monkeypatch.setattr(ledger, "claims", lambda path=None: untested)
    with pytest.raises(ValueError, match="issue 11"):
        ledger.withdraw("004-later", why="w", out_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.delenv(ledger.LEDGER_DIR_ENV, raising=False)
    monkeypatch.setattr(ledger, "on_gpu", lambda: False)
    monkeypatch.setattr(ledger, "_write", lambda *a: pytest.fail("wrote on a CPU"))
    ledger.withdraw("002-ch5-table", why="w")


def test_record_takes_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(ledger.LEDGER_DIR_ENV, str(tmp_path))
    ledger.record("003-norm", ours="x", agree=True, cause="y", show=False)
    assert (tmp_path / "05_autograd_and_fusion.json").exists()


def test_record_writes_nothing_on_cpu_by_default(monkeypatch):
    monkeypatch.delenv(ledger.LEDGER_DIR_ENV, raising=False)
    monkeypatch.setattr(ledger, "on_gpu", lambda: False)
    assert ledger.output_dir() is None
    monkeypatch.setattr(ledger, "on_gpu", lambda: True)
    assert ledger.output_dir() == ledger.LEDGER_DIR


def with_an_untested_claim(data):
    """The claims, plus one more that no chapter tests yet."""
    data["claims"].append(
        {
            "id": "004-later",
            "seed": "004",
            "section": "s",
            "claim": "c",
            "chapter": None,
            "issue": 11,
        }
    )
    data["issues"]["11"] = "a later issue"
    return data


def test_record_refuses_unknown_claims_and_untested_ones(tmp_path, monkeypatch):
    with pytest.raises(
        KeyError, match="unknown seed claim 'no-such-claim'.*seed_claims.json"
    ):
        ledger.record(
            "no-such-claim", ours="x", agree=True, cause="y", out_dir=tmp_path
        )
    untested = {
        row["id"]: row for row in with_an_untested_claim(ledger.load_claims())["claims"]
    }
    monkeypatch.setattr(ledger, "claims", lambda path=None: untested)
    with pytest.raises(ValueError, match="issue 11"):
        ledger.record("004-later", ours="x", agree=True, cause="y", out_dir=tmp_path)
    with pytest.raises(TypeError, match="True or False"):
        ledger.record("003-norm", ours="x", agree=None, cause="y", out_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def two_verdicts(tmp_path):
    """(claims, rows()) with 003-norm agreeing (measured where="orthogonal-check"),
    002-ch4-beneficial disagreeing, and an untested claim of seed 004."""
    ledger.record(
        "003-norm",
        ours="max err 1e-16",
        agree=True,
        cause="orthogonal",
        out_dir=tmp_path,
        show=False,
        where="orthogonal-check",
    )
    ledger.record(
        "002-ch4-beneficial",
        ours="+0.037",
        agree=False,
        cause="not better",
        out_dir=tmp_path,
        show=False,
    )
    data = with_an_untested_claim(ledger.load_claims())
    return data, ledger.rows(data, ledger.load_verdicts(tmp_path))


def test_rows_have_a_row_for_every_claim(tmp_path):
    data, table = two_verdicts(tmp_path)
    assert [r["id"] for r in table] == [c["id"] for c in data["claims"]]
    by_id = {r["id"]: r for r in table}
    assert (
        by_id["003-norm"]["verdict"] == ledger.AGREE
        and by_id["003-norm"]["ours"] == "max err 1e-16"
    )
    assert by_id["003-norm"]["where"] == "orthogonal-check"
    assert (
        by_id["002-ch4-beneficial"]["verdict"] == ledger.DISAGREE
        and by_id["002-ch4-beneficial"]["where"] is None
    )
    assert (
        by_id["003-relative"]["verdict"] == ledger.NOT_DECIDED
        and by_id["003-relative"]["where"] is None
    )
    assert (
        by_id["004-later"]["verdict"]
        == "not testable yet — open issue 11 of this project (a later issue)"
    )


def test_page_counts_per_seed_and_one_table_per_seed(tmp_path):
    _, table = two_verdicts(tmp_path)
    html = ledger.page(table)._repr_html_()
    tables = html.split("<table")[1:]
    assert len(tables) == 1 + 5  # the summary, then seeds 000-004
    summary = tables[0]
    assert (
        '<th class="num">agree</th><th class="num">disagree</th>'
        '<th class="num">cannot tell</th><th class="num">not testable yet</th>'
        in summary
    )
    per_seed = {seed: sum(r["seed"] == seed for r in table) for seed in SEEDS}
    untested = {
        seed: sum(r["seed"] == seed and not r["chapter"] for r in table)
        for seed in SEEDS
    }
    assert untested["004"] >= 1  # 004-later, beside any real claim an issue will test
    for seed, n in per_seed.items():
        agree = int(seed == "003")
        disagree = int(seed == "002")
        later = untested[seed]
        cells = [seed, n, agree, disagree, 0, later, n - agree - disagree - later]
        assert (
            f"<tr><td>{seed}</td>"
            + "".join(f'<td class="num">{c}</td>' for c in cells[1:])
            in summary
        )
    assert (
        f'<tr><td>all</td><td class="num">{len(table)}</td><td class="num">1</td>'
        in summary
    )
    for seed, body in zip(sorted(SEEDS), tables[1:]):
        assert f"<caption>Seed {seed}</caption>" in body
        assert (
            "<th>claim</th><th>our measurement</th><th>verdict</th><th>why</th>"
            "<th>shown in</th>" in body
        )
        assert body.count("<tr>") == 1 + per_seed[seed]
    seed003 = tables[4]
    assert '<span class="verdict-agree">agree</span>' in seed003
    assert "<td>orthogonal</td>" in seed003  # the recorded cause, under "why"
    assert (
        '<a href="../chapters/05_autograd_and_fusion.html#orthogonal-check">chapter 05</a>'
        in seed003
    )
    assert '<span class="verdict-disagree">disagree</span>' in tables[3]
    assert '<a href="../chapters/09_the_plot_twist.html">chapter 09</a>' in tables[3]
    assert (
        "not testable yet — open issue 11 of this project (a later issue)" in tables[5]
    )
    no_where = '<a href="../chapters/10_two_dsls.html">the appendix</a>'  # unnumbered
    assert no_where in tables[5]
    assert not re.search("[\u2705\u274c]", html + repr(ledger.page(table)))
    assert max(map(len, repr(ledger.page(table)).splitlines())) <= 88


def test_ledger_page_is_in_the_toc_and_builds_its_tables_from_the_ledger():
    assert "chapters/seed_ledger" in (ROOT / "_toc.yml").read_text(encoding="utf-8")
    code = chapter_sources()["seed_ledger"]
    assert "ledger.page(" in code and "markdown_table" not in code


def html_ids(stem):
    """The HTML ids a chapter's Markdown gives its places: MyST labels and headings."""
    from docutils.nodes import make_id

    ids = set()
    for cell in nbformat.read(CHAPTERS / f"{stem}.ipynb", as_version=4).cells:
        if cell.cell_type == "markdown":
            ids |= {
                make_id(label)
                for label in re.findall(
                    r"^\(([^)\s]+)\)=\s*$", cell.source, re.MULTILINE
                )
            }
            ids |= {
                make_id(re.sub(r"[`*$]", "", h))
                for h in re.findall(r"^#+\s+(.+)$", cell.source, re.MULTILINE)
            }
    return ids


def test_where_names_a_place_in_the_recording_chapter():
    for stem, code in chapter_sources().items():
        wheres = re.findall(r"""where=["']([^"']+)["']""", code)
        if wheres:
            missing = set(wheres) - html_ids(stem)
            assert not missing, (
                f"{stem}: where={sorted(missing)} is no label or heading there"
            )


def test_built_page_links_each_claim_to_its_chapter():
    page = ROOT / "_build" / "html" / "chapters" / "seed_ledger.html"
    if not page.exists():
        pytest.skip("book not built: run `jupyter-book build -W .` first")
    html = page.read_text(encoding="utf-8")
    claims = ledger.load_claims()["claims"]
    assert html.count('class="ropetut-table"') == 1 + len(
        {row["seed"] for row in claims}
    )
    # the tables, not the page: its download and launch buttons link the .ipynb itself
    tables = html[html.index('<table class="ropetut-table"') : html.rindex("</table>")]
    assert '.ipynb"' not in tables, "a chapter link was left as a raw .ipynb path"
    for stem in {row["chapter"] for row in claims if row["chapter"]}:
        assert f'href="../chapters/{stem}.html' in tables, stem
