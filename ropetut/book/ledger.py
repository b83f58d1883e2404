"""The seed-claims ledger: every numeric or factual claim of seeds 000-004, and what the book measured.

Two halves, kept apart on purpose:

- the **claims**, typed once, in ``seed_claims.json`` next to this file: an id, the seed, its
  section, a brief quote, and the chapter that tests the claim (or the issue that will);
- the **verdicts**, never typed: a chapter's cell calls
  ``ledger.record(claim_id, ours=..., agree=..., cause=...)`` with what it has just computed.

``record`` writes ``results/ledger/<chapter>.json`` only on a GPU, the run whose outputs the book
stores. Under the interpreter (CI, a laptop) it writes nothing, so a CPU run never rewrites
committed results. An explicit ``out_dir`` (or ``$ROPETUT_LEDGER_DIR``) writes there on any device.
The ledger page (``chapters/seed_ledger.ipynb``) reads both halves with ``rows`` and
``markdown_table``.
"""

import json
import os
from pathlib import Path

from ..runtime import on_gpu

CLAIMS_FILE = Path(__file__).with_name("seed_claims.json")
LEDGER_DIR = Path(__file__).resolve().parents[2] / "results" / "ledger"
LEDGER_DIR_ENV = "ROPETUT_LEDGER_DIR"
AGREE, DISAGREE = "✅ agree", "❌ disagree"
NOT_MEASURED = "not measured yet"


def load_claims(path=CLAIMS_FILE) -> dict:
    """The whole claims file: {"scope": ..., "issues": {number: title}, "claims": [row, ...]}."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def claims(path=CLAIMS_FILE) -> dict:
    """Every claim by id, in the file's order."""
    return {row["id"]: row for row in load_claims(path)["claims"]}


def output_dir(out_dir=None):
    """Where record writes: out_dir, else $ROPETUT_LEDGER_DIR, else results/ledger on a GPU;
    None (write nothing) under the interpreter."""
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
    out_dir=None,
    show: bool = True,
) -> None:
    """Record the verdict a chapter cell just computed on one seed claim.

    ours: our measurement, formatted from the cell's values; agree: the cell's computed
    comparison (a bool, or anything bool() takes, such as a one-element tensor); cause: why,
    in one line. show=False when the cell prints the verdict in its own words. Returns None, so
    a call that ends a cell adds no output to it.
    """
    known = claims()
    if claim_id not in known:
        raise KeyError(
            f"unknown seed claim {claim_id!r}: add it to {CLAIMS_FILE.name} first"
        )
    claim = known[claim_id]
    if not claim.get("chapter"):
        raise ValueError(
            f"claim {claim_id!r} is not tested by a chapter (issue {claim.get('issue')})"
        )
    if agree is None:
        raise TypeError(f"claim {claim_id!r}: agree must be True or False, not None")
    agree = bool(agree)
    mark = AGREE if agree else DISAGREE
    if show:
        print(
            f"{mark}  seed {claim['seed']}, {claim['section']}: {claim['claim']} | ours: {ours}"
        )
    directory = output_dir(out_dir)
    if directory is not None:
        _write(
            directory / f"{claim['chapter']}.json",
            claim_id,
            {"ours": str(ours), "agree": agree, "cause": str(cause), **_provenance()},
        )


def _provenance() -> dict:
    from .provenance import (
        environment,
    )  # imports git and torch details lazily: GPU runs only

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
    """Every recorded verdict, by claim id, from all the chapter files in directory."""
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
        if claim.get("chapter") is None:
            issue = claim["issue"]
            verdict = f"not testable yet — issue {issue} ({claims_data['issues'][str(issue)]})"
        elif found is None:
            verdict = NOT_MEASURED
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
            }
        )
    return table


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(table: list, chapter_link=lambda stem: f"{stem}.ipynb") -> str:
    """The ledger as one Markdown table; chapter_link turns a chapter stem into a link target."""
    lines = [
        "| claim | our measurement | verdict | cause | shown in |",
        "|---|---|---|---|---|",
    ]
    for r in table:
        claim = f"“{_cell(r['claim'])}” (seed {r['seed']}, {_cell(r['section'])})"
        where = (
            f"[chapter {r['chapter'][:2]}]({chapter_link(r['chapter'])})"
            if r["chapter"]
            else f"issue {r['issue']}"
        )
        lines.append(
            f"| {claim} | {_cell(r['ours'])} | {r['verdict']} | {_cell(r['cause'])} | {where} |"
        )
    return "\n".join(lines)
