"""The claims registry (delaylab/reproduce/claims.py): every reading of data in README.md and docs/
is a registered claim rendered from its verdict.

- every committed page equals its rendering (a page edited by hand, or a report regenerated without
  rendering, fails);
- no sentence outside a marker reads data: a sentence with a 95% interval and a reading word (an
  order, a trend, "recovers", "resolved"), or one of the phrases a reading is made of ("follows the",
  "survive"), fails, with the page and the sentence;
- every claim's verdict is the one rule recomputed here, and a claim that does not agree says so in
  its sentence;
- ``delaylab reproduce claims --json`` lists them in the documented shape.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from delaylab.reproduce import claims as C

ROOT = Path(__file__).resolve().parents[2]

# A sentence that carries a 95% interval and one of these words reads the data.
READING = re.compile(
    r"\b(order|survives?|follows?|recover(s|ed|ing)?|shrinks?|grows?|clos(es|ing)|larger|smaller|beats?|faster|"
    r"slower|no difference|depends?|rises?|falls?|more than|less than|degrades?|resolved|agrees?|disagrees?|"
    r"wins?|loses?|worse|better|helps?|hurts?)\b", re.I)
INTERVAL = re.compile(r"\[[-+]?\d[\d.]*%?,\s*[-+]?\d[\d.]*%?\]")
# Phrases that state a reading with or without a number beside them.
PHRASES = re.compile(r"follows the (updates|tokens)|survives? (the|every) lr|less as tau|recover little|"
                     r"not what closes|no (resolved )?difference between", re.I)
SKIP = re.compile(r"<!-- (claim|table):\S+ -->.*?<!-- /\1 -->|<!-- record -->.*?<!-- /record -->|```.*?```", re.S)


def readings_outside_markers(text: str) -> list[str]:
    """The sentences of ``text`` (markers, records and code blocks left out) that read data."""
    text = SKIP.sub(" ", text)
    out = []
    for para in re.split(r"\n\s*\n", text):
        for sent in re.split(r"(?<=[.!?;])\s+(?=[A-Z*(])|\n(?=\|)|\n\s*[-*] |\n\s*\d+\. ", para):
            flat = " ".join(sent.split())
            if (INTERVAL.search(flat) and READING.search(flat)) or PHRASES.search(flat):
                out.append(flat)
    return out


@pytest.fixture(scope="module")
def found():
    return C.claims(ROOT)


def test_every_page_is_its_rendering(found):
    changed = C.render_pages(ROOT, found)
    assert not changed, f"pages differ from their rendering (run `delaylab reproduce claims --render`): {changed}"


@pytest.mark.parametrize("page", [p.relative_to(ROOT) for p in C.pages(ROOT)], ids=str)
def test_no_page_reads_data_outside_a_claim(page):
    bad = readings_outside_markers((ROOT / page).read_text())
    assert not bad, f"{page}: readings outside a claim marker:\n" + "\n".join(f"  - {b[:200]}" for b in bad)


def test_the_scanner_finds_a_planted_reading():
    planted = ("Some setup text.\n\nThe gap follows the updates, not the tokens.\n\n"
               "AdamW's gap shrinks by -0.5 [-0.6, -0.4] at 20:1.\n\n<!-- claim:x -->the gap shrinks [-1, -0.5]<!-- /claim -->")
    assert readings_outside_markers(planted) == ["The gap follows the updates, not the tokens.",
                                                 "AdamW's gap shrinks by -0.5 [-0.6, -0.4] at 20:1."]


def _rule(interval, region) -> str:
    """The one rule written out again (verdicts.state without censoring and lr dependence)."""
    if interval is None:
        return "undetermined"
    lo, hi = interval
    r_lo = -math.inf if region[0] is None else region[0]
    r_hi = math.inf if region[1] is None else region[1]
    if hi < r_lo or lo > r_hi:
        return "disagrees"
    return "agrees" if r_lo < lo and hi < r_hi else "undetermined"


def test_every_claim_follows_the_rule_and_says_its_verdict(found):
    assert len({c.id for c in found}) == len(found) > 50
    for c in found:
        plain = _rule(c.interval, c.region)
        if c.why.startswith(("optimum censored", "protocol", "it depends on the lr", "depends on the lr")):
            assert c.verdict == "undetermined", c.id
        else:
            assert c.verdict == plain, (c.id, c.interval, c.region)
        if c.verdict == "undetermined":
            assert "undetermined" in c.text, c.id
        if c.verdict == "disagrees":
            assert "disagree" in c.text, c.id


def test_the_cli_lists_every_claim_as_json():
    out = subprocess.run([sys.executable, "-m", "delaylab", "reproduce", "claims", "--json"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert {"id", "statement", "report", "interval", "region", "verdict"} <= set(data["claims"][0])
    assert sum(data["counts"].values()) == len(data["claims"])
    bad = subprocess.run([sys.executable, "-m", "delaylab", "reproduce", "--render"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_a_hand_edited_page_fails_the_check(found, tmp_path):
    page = next(p for p in C.pages(ROOT) if "<!-- claim:" in p.read_text())
    text = page.read_text()
    m = C.MARKER.search(text)
    edited = text[:m.start(3)] + " agrees, and more than the data say " + text[m.end(3):]
    assert C.render_page(edited, {c.id: c for c in found}, C.tables(ROOT, found)) == text


def test_an_unknown_claim_id_is_refused():
    with pytest.raises(Exception, match="no claim 'nope' is registered"):
        C.render_page("<!-- claim:nope -->x<!-- /claim -->", {})
