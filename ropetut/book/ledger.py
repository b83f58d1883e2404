"""The seed-claims ledger: every numeric or factual claim of seeds 000-004, and what the
book measured.

Two halves, kept apart on purpose:

- the **claims**, typed once, in ``seed_claims.json`` next to this file: an id, the
  seed, its section, a brief quote, and the chapter that tests the claim (or the
  issue that will);
- the **verdicts**, never typed: a chapter's cell calls
  ``ledger.record(claim_id, ours=..., agree=..., cause=...)`` with what it has
  just computed.

``record`` writes ``results/ledger/<chapter>.json`` only on a GPU, the run whose outputs
the book stores. Under the interpreter (CI, a laptop) it writes nothing, so a CPU run
never rewrites committed results. An explicit ``out_dir`` (or ``$ROPETUT_LEDGER_DIR``)
writes there on any device. ``record`` also shows the verdict (a one-row table), or
keeps it silently (``show=False``) for ``verdicts``, which shows several in one table.
A chapter whose measurement of a claim cannot be made yet (the runs it rests on are
missing) calls ``ledger.withdraw(claim_id, why=...)`` instead: any verdict recorded
earlier is replaced, in the chapter's file, by the withdrawal and its why, so the claim
shows as not decided yet, with why, until a later run records it. One whose
measurement is made and cannot decide it (its runs are all in, and their intervals
admit either answer) calls ``ledger.cannot_tell(claim_id, ours=..., cause=...)``: a
verdict of its own, "cannot tell", with the measurement and why.
The ledger page (``chapters/seed_ledger.ipynb``) reads both halves with ``rows`` and
shows them with ``page``.
"""

import json
import os
import re
from html import escape
from pathlib import Path

from ..runtime import on_gpu
from . import report

CLAIMS_FILE = Path(__file__).with_name("seed_claims.json")
LEDGER_DIR = Path(__file__).resolve().parents[2] / "results" / "ledger"
LEDGER_DIR_ENV = "ROPETUT_LEDGER_DIR"
AGREE, DISAGREE = "agree", "disagree"
CANNOT_TELL = "cannot tell"  # measured, and the measurement cannot decide
NOT_DECIDED = "not decided yet"
NOT_TESTABLE = "not testable yet"
# the key of a withdrawn claim's entry in a chapter's file: why it is not decided yet
WITHDRAWN = "withdrawn"
# the notebook the table of contents lists, unnumbered, as the appendix
APPENDIX = "10_two_dsls"
# an HTML id, as docutils writes a label's or heading's
WHERE = re.compile(r"[a-z][a-z0-9-]*")
# claim id -> {"ours", "agree", "cause", "where"}: this session's, for verdicts();
# agree None: cannot tell
_recorded = {}
# claim id -> why it is not decided yet: this session's withdrawals, for verdicts()
_withdrawn = {}


def load_claims(path=CLAIMS_FILE) -> dict:
    """The whole claims file:
    {"scope": ..., "issues": {number: title}, "claims": [row, ...]}."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def claims(path=CLAIMS_FILE) -> dict:
    """Every claim by id, in the file's order."""
    return {row["id"]: row for row in load_claims(path)["claims"]}


def output_dir(out_dir=None):
    """Where record writes: out_dir, else $ROPETUT_LEDGER_DIR, else results/ledger on a
    GPU; None (write nothing) under the interpreter."""
    if out_dir is not None:
        return Path(out_dir)
    if os.environ.get(LEDGER_DIR_ENV):
        return Path(os.environ[LEDGER_DIR_ENV])
    return LEDGER_DIR if on_gpu() else None


def record(
    claim_id: str,
    *,
    ours: str,
    agree: bool,
    cause: str,
    where: str | None = None,
    out_dir=None,
    show: bool = True,
) -> None:
    """Record the verdict a chapter cell just computed on one seed claim.

    ours: our measurement, formatted from the cell's values; agree: the cell's computed
    comparison (a bool, or anything bool() takes, such as a one-element tensor); cause:
    why, in one line; where: the HTML id of the place in the chapter that measured it, a
    MyST label such as ``(v2-vs-v4)=`` or a heading's id (the ledger page links there).
    show: display the verdict as a one-row table; show=False keeps it for ``verdicts``
    (or for the cell's own words). Returns None, so a call that ends a cell adds no
    output to it.
    """
    if agree is None:
        raise TypeError(f"claim {claim_id!r}: agree must be True or False, not None")
    _keep(claim_id, ours, bool(agree), cause, where, out_dir, show)


def cannot_tell(
    claim_id: str,
    *,
    ours: str,
    cause: str,
    where: str | None = None,
    out_dir=None,
    show: bool = True,
) -> None:
    """Record that a chapter measured a claim and the measurement cannot decide it: the
    runs it rests on are all in, and their intervals admit agree and disagree alike.
    The ledger shows the verdict "cannot tell", with ours and cause (why: which rows
    could go either way), where ``withdraw`` would show "not decided yet". Arguments
    as ``record``'s. Returns None."""
    _keep(claim_id, ours, None, cause, where, out_dir, show)


def _keep(claim_id, ours, agree, cause, where, out_dir, show) -> None:
    """``record``'s and ``cannot_tell``'s entry (agree: True, False or None), kept for
    ``verdicts`` and written to the chapter's file."""
    claim = _chapter_claim(claim_id)
    if where is not None and not WHERE.fullmatch(where):
        raise ValueError(
            f"claim {claim_id!r}: where={where!r} is not an HTML id "
            "(a lowercase letter, then lowercase letters, digits and hyphens)"
        )
    entry = {"ours": str(ours), "agree": agree, "cause": str(cause), "where": where}
    _recorded[claim_id] = entry
    _withdrawn.pop(claim_id, None)
    if show:
        report.show(verdicts([claim_id]))
    directory = output_dir(out_dir)
    if directory is not None:
        _write(
            directory / f"{claim['chapter']}.json",
            claim_id,
            {**entry, **_provenance()},
        )


def withdraw(claim_id: str, *, why: str, out_dir=None) -> None:
    """Say that a chapter cannot measure a claim yet (why: in one line, such as the
    runs it rests on that are missing), and take back any verdict recorded on it
    before: in the chapter's file, where ``record`` would write, the claim's entry
    becomes ``{"withdrawn": why}`` (with the run's device and commit), so the ledger
    page shows it as not decided yet, with why, until a later run records it.
    ``verdicts`` shows it the same way in the session. Returns None."""
    claim = _chapter_claim(claim_id)
    _recorded.pop(claim_id, None)
    _withdrawn[claim_id] = str(why)
    directory = output_dir(out_dir)
    if directory is not None:
        _write(
            directory / f"{claim['chapter']}.json",
            claim_id,
            {WITHDRAWN: str(why), **_provenance()},
        )


def _chapter_claim(claim_id: str) -> dict:
    """The claim ``claim_id``; KeyError if there is none, ValueError if no chapter
    tests it."""
    known = claims()
    if claim_id not in known:
        raise KeyError(
            f"unknown seed claim {claim_id!r}: add it to {CLAIMS_FILE.name} first"
        )
    claim = known[claim_id]
    if not claim.get("chapter"):
        raise ValueError(
            f"claim {claim_id!r} is not tested by a chapter "
            f"(issue {claim.get('issue')})"
        )
    return claim


def _verdict(agree):
    """agree (True, False, or None: cannot tell) as the page's word."""
    if agree is None:
        return CANNOT_TELL
    word = AGREE if agree else DISAGREE
    return report.Markup(word, f'<span class="verdict-{word}">{word}</span>')


def verdicts(claim_ids):
    """One table of the verdicts this session recorded on claim_ids (claim, what the
    seed says, ours, verdict, and why: the recorded cause): a cell records them with
    show=False, then ends with this. A claim that was not recorded (its measurement
    was skipped, or withdrawn: then why is the withdrawal's) shows as not measured."""
    known = claims()
    table = []
    for claim_id in claim_ids:
        claim, found = known[claim_id], _recorded.get(claim_id)
        table.append(
            {
                "claim": f"seed {claim['seed']}, {claim['section']}",
                "says": claim["claim"],
                "ours": found["ours"] if found else None,
                "verdict": _verdict(found["agree"]) if found else NOT_DECIDED,
                "why": found["cause"] if found else _withdrawn.get(claim_id),
            }
        )
    columns = ["claim", ("says", "seed says"), "ours", "verdict", "why"]
    return report.html_table(table, columns)


def _provenance() -> dict:
    # imports git and torch details lazily: GPU runs only
    from .provenance import environment

    env = environment()
    return {"device": env["device"], "ropetut commit": env["ropetut commit"]}


def _write(path: Path, claim_id: str, entry: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    verdicts = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    verdicts[claim_id] = entry
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(
        json.dumps(verdicts, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
        encoding="utf-8",
    )
    tmp.replace(path)


def load_verdicts(directory=LEDGER_DIR) -> dict:
    """Every recorded verdict, by claim id, from all the chapter files in directory;
    a withdrawn claim's entry holds ``WITHDRAWN`` (its why) in place of a verdict."""
    verdicts = {}
    for path in sorted(Path(directory).glob("*.json")):
        for claim_id, entry in json.loads(path.read_text(encoding="utf-8")).items():
            verdicts[claim_id] = {**entry, "file": path.name}
    return verdicts


def rows(claims_data=None, verdicts=None) -> list:
    """One row per claim, in the claims file's order: what the ledger page shows."""
    claims_data = load_claims() if claims_data is None else claims_data
    verdicts = load_verdicts() if verdicts is None else verdicts
    table = []
    for claim in claims_data["claims"]:
        found = verdicts.get(claim["id"])
        why = found.get(WITHDRAWN) if found else None
        if why is not None:  # withdrawn: not decided yet, and why
            found = {"cause": why, "ours": "", "device": found.get("device", "")}
        if claim.get("chapter") is None:
            issue = claim["issue"]
            verdict = (
                f"{NOT_TESTABLE} — open issue {issue} of this project "
                f"({claims_data['issues'][str(issue)]})"
            )
        elif found is None or why is not None:
            verdict = NOT_DECIDED
        elif found["agree"] is None:
            verdict = CANNOT_TELL
        else:
            verdict = AGREE if found["agree"] else DISAGREE
        table.append(
            {
                "id": claim["id"],
                "seed": claim["seed"],
                "section": claim["section"],
                "claim": claim["claim"],
                "chapter": claim.get("chapter"),
                "issue": claim.get("issue"),
                "ours": found["ours"] if found else "",
                "verdict": verdict,
                "cause": found["cause"] if found else "",
                "device": found.get("device", "") if found else "",
                "where": found.get("where") if found else None,
            }
        )
    return table


STATES = (AGREE, DISAGREE, CANNOT_TELL, NOT_TESTABLE, NOT_DECIDED)


def page(table=None):
    """The ledger page: a summary (claims per seed, and how many of them agree,
    disagree, cannot tell, are not testable yet or not decided yet), then one table
    per seed: each claim, our measurement, the verdict, why (the recorded cause), and
    a link to the place in its chapter that measured it. table: ``rows()`` (the
    default)."""
    table = rows() if table is None else table
    seeds = sorted({r["seed"] for r in table})
    counts = [_counts(seed, [r for r in table if r["seed"] == seed]) for seed in seeds]
    counts.append(_counts("all", table))
    summary = report.html_table(
        counts, ["seed", "claims", *STATES], caption="Claims per seed"
    )
    per_seed = [
        report.html_table(
            [_page_row(r) for r in table if r["seed"] == seed],
            [
                "claim",
                ("ours", "our measurement"),
                "verdict",
                "why",
                ("shown", "shown in"),
            ],
            caption=f"Seed {seed}",
        )
        for seed in seeds
    ]
    return report.stack(summary, *per_seed)


def _counts(seed, table) -> dict:
    states = [r["verdict"] if r["chapter"] else NOT_TESTABLE for r in table]
    return {"seed": seed, "claims": len(table), **{s: states.count(s) for s in STATES}}


def _page_row(row) -> dict:
    verdict = row["verdict"]
    if verdict in (AGREE, DISAGREE):
        verdict = _verdict(verdict == AGREE)
    shown = None
    if row["chapter"]:
        href = f"../chapters/{row['chapter']}.html" + (
            f"#{row['where']}" if row["where"] else ""
        )
        text = (
            "the appendix"
            if row["chapter"] == APPENDIX
            else f"chapter {row['chapter'][:2]}"
        )
        shown = report.Markup(text, f'<a href="{escape(href)}">{text}</a>')
    return {
        "claim": f"{row['claim']} ({row['section']})",
        "ours": row["ours"] or None,
        "verdict": verdict,
        "why": row["cause"] or None,
        "shown": shown,
    }
