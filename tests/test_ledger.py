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
CLAIM_ID = re.compile(r"""["'](00[0-4]-[\w.-]+)["']""")      # a claim id as a string literal


def chapter_sources():
    """{chapter stem: the code of all its cells}."""
    return {p.stem: "\n".join(c.source for c in nbformat.read(p, as_version=4).cells if c.cell_type == "code")
            for p in sorted(CHAPTERS.glob("*.ipynb"))}


def test_claims_name_a_seed_and_a_chapter_or_an_issue():
    data = ledger.load_claims()
    ids = [row["id"] for row in data["claims"]]
    assert len(ids) == len(set(ids)), "duplicate claim ids"
    for row in data["claims"]:
        assert row["seed"] in SEEDS, row
        assert row["id"].startswith(row["seed"] + "-"), row
        assert row["section"].strip() and row["claim"].strip(), row
        assert bool(row["chapter"]) != bool(row["issue"]), f"{row['id']}: name a chapter or an issue, not both"


def test_every_seed_has_claims():
    assert {row["seed"] for row in ledger.load_claims()["claims"]} == SEEDS


def test_named_chapters_and_issues_exist():
    data = ledger.load_claims()
    stems = {p.stem for p in CHAPTERS.glob("*.ipynb")}
    for row in data["claims"]:
        if row["chapter"]:
            assert row["chapter"] in stems, f"{row['id']}: no chapters/{row['chapter']}.ipynb"
        else:
            assert str(row["issue"]) in data["issues"], f"{row['id']}: issue {row['issue']} is not in 'issues'"


def test_cutedsl_claims_are_measured_by_the_appendix():
    rows = [row for row in ledger.load_claims()["claims"] if "CuTeDSL" in row["claim"]]
    assert rows
    for row in rows:
        assert row["chapter"] == "10_two_dsls" and row["issue"] is None, row["id"]


def test_record_calls_in_chapters_name_claims_of_that_chapter():
    claims = ledger.claims()
    prefixes = {cid.rsplit("-", 1)[0] for cid in claims}
    found = 0
    for stem, code in chapter_sources().items():
        for cid in RECORD_CALL.findall(code):
            found += 1
            if "{" in cid:                                   # an f-string id: check its fixed prefix
                prefix = cid.split("{")[0].rstrip("-")
                matches = [c for c in claims if c.startswith(prefix + "-")]
                assert matches and prefix in prefixes, f"{stem}: no claim id starts with {prefix!r}"
                assert all(claims[c]["chapter"] == stem for c in matches), f"{stem}: {prefix}-* belong elsewhere"
            else:
                assert cid in claims, f"{stem}: records unknown claim {cid!r}"
                assert claims[cid]["chapter"] == stem, f"{stem} records {cid!r}, which names {claims[cid]['chapter']}"
    assert found >= 20


def test_claim_ids_quoted_in_chapters_are_claims_of_that_chapter():
    """Ids passed through a variable (for claim_id in (...)) are string literals somewhere."""
    claims = ledger.claims()
    recorded = set()
    for stem, code in chapter_sources().items():
        for cid in CLAIM_ID.findall(code):
            assert cid in claims, f"{stem}: unknown claim id {cid!r}"
            assert claims[cid]["chapter"] == stem, f"{stem} names {cid!r}, which belongs to {claims[cid]['chapter']}"
            recorded.add(cid)
    assert len(recorded) >= 30


def test_record_writes_to_the_given_directory(tmp_path, capsys):
    ledger.record("003-norm", ours="max |R^T R - I| = 1e-16", agree=True, cause="orthogonal", out_dir=tmp_path)
    ledger.record("001-table-2048", ours="V4 1913 GB/s", agree=False, cause="a faster GPU", out_dir=tmp_path,
                  show=False)
    out = capsys.readouterr().out
    assert out.startswith("✅ agree  seed 003") and "max |R^T R - I| = 1e-16" in out
    assert out.count("\n") == 1                                # show=False printed nothing
    written = json.loads((tmp_path / "05_autograd_and_fusion.json").read_text(encoding="utf-8"))
    assert written["003-norm"]["agree"] is True and written["003-norm"]["cause"] == "orthogonal"
    assert {"device", "ropetut commit"} <= written["003-norm"].keys()
    assert json.loads((tmp_path / "04_triton_v2_v3_v4.json").read_text())["001-table-2048"]["agree"] is False


def test_record_updates_an_entry_and_keeps_the_others(tmp_path):
    ledger.record("002-ch4-portion", ours="64 of 128", agree=True, cause="a", out_dir=tmp_path, show=False)
    ledger.record("002-ch5-replicate", ours="3 of 3", agree=True, cause="b", out_dir=tmp_path, show=False)
    ledger.record("002-ch4-portion", ours="0 of 128", agree=False, cause="c", out_dir=tmp_path, show=False)
    verdicts = ledger.load_verdicts(tmp_path)
    assert set(verdicts) == {"002-ch4-portion", "002-ch5-replicate"}
    assert verdicts["002-ch4-portion"]["ours"] == "0 of 128" and verdicts["002-ch4-portion"]["agree"] is False


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
    """The claims, plus one that no chapter tests yet (every real claim has its chapter now)."""
    data["claims"].append({"id": "004-later", "seed": "004", "section": "s", "claim": "c",
                           "chapter": None, "issue": 11})
    data["issues"]["11"] = "a later issue"
    return data


def test_record_refuses_unknown_claims_and_untested_ones(tmp_path, monkeypatch):
    with pytest.raises(KeyError, match="unknown seed claim 'no-such-claim'.*seed_claims.json"):
        ledger.record("no-such-claim", ours="x", agree=True, cause="y", out_dir=tmp_path)
    untested = {row["id"]: row for row in with_an_untested_claim(ledger.load_claims())["claims"]}
    monkeypatch.setattr(ledger, "claims", lambda path=None: untested)
    with pytest.raises(ValueError, match="issue 11"):
        ledger.record("004-later", ours="x", agree=True, cause="y", out_dir=tmp_path)
    with pytest.raises(TypeError, match="True or False"):
        ledger.record("003-norm", ours="x", agree=None, cause="y", out_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_page_table_has_a_row_for_every_claim(tmp_path):
    ledger.record("003-norm", ours="max err 1e-16", agree=True, cause="orthogonal", out_dir=tmp_path, show=False)
    ledger.record("002-ch4-beneficial", ours="+0.037", agree=False, cause="not better", out_dir=tmp_path,
                  show=False)
    data = with_an_untested_claim(ledger.load_claims())
    table = ledger.rows(data, ledger.load_verdicts(tmp_path))
    assert [r["id"] for r in table] == [c["id"] for c in data["claims"]]
    by_id = {r["id"]: r for r in table}
    assert by_id["003-norm"]["verdict"] == ledger.AGREE and by_id["003-norm"]["ours"] == "max err 1e-16"
    assert by_id["002-ch4-beneficial"]["verdict"] == ledger.DISAGREE
    assert by_id["003-relative"]["verdict"] == ledger.NOT_MEASURED
    assert by_id["004-later"]["verdict"] == "not testable yet — issue 11 (a later issue)"
    text = ledger.markdown_table(table)
    lines = text.splitlines()
    assert len(lines) == 2 + len(data["claims"])
    assert all(line.count(" | ") == 4 for line in lines[2:]), "a cell's text broke the table"
    assert "[chapter 05](05_autograd_and_fusion.ipynb)" in text and "issue 11" in text
    assert "[chapter 10](10_two_dsls.ipynb)" in text


def test_ledger_page_is_in_the_toc_and_builds_its_table_from_the_ledger():
    assert "chapters/seed_ledger" in (ROOT / "_toc.yml").read_text(encoding="utf-8")
    code = chapter_sources()["seed_ledger"]
    assert "ledger.rows()" in code and "ledger.markdown_table(" in code
    # myst-nb renders Markdown outputs as CommonMark unless told otherwise: no tables, raw .ipynb links
    cells = nbformat.read(CHAPTERS / "seed_ledger.ipynb", as_version=4).cells
    table_cell = next(c for c in cells if c.cell_type == "code" and "markdown_table(" in c.source)
    assert table_cell.metadata.get("mystnb", {}).get("markdown_format") == "myst"


def test_built_page_has_one_table_row_per_claim_and_links_chapters():
    page = ROOT / "_build" / "html" / "chapters" / "seed_ledger.html"
    if not page.exists():
        pytest.skip("book not built: run `jupyter-book build -W .` first")
    html = page.read_text(encoding="utf-8")
    body = html[html.index("<tbody>"):html.index("</tbody>")]
    assert body.count("<tr") == len(ledger.load_claims()["claims"])
    assert ".ipynb\"" not in body, "a chapter link was left as a raw .ipynb path"
    for stem in {row["chapter"] for row in ledger.load_claims()["claims"] if row["chapter"]}:
        assert f'href="{stem}.html"' in body, stem
