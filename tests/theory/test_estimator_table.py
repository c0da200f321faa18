"""The table of docs/assumptions.md (both estimates of L on the toy problems) recomputed, and checked
against the exact constants: no estimate above an exact L."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from delaylab.cli import main
from delaylab.toy.estimators import markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "assumptions.md"


def _doc_table() -> str:
    text = DOC.read_text()
    m = re.search(r"<!-- estimators:begin -->\n(.*?)<!-- estimators:end -->", text, flags=re.S)
    assert m, "docs/assumptions.md has lost its estimator table markers"
    return m.group(1)


@pytest.fixture(scope="module")
def table():
    """The rows as `delaylab theory estimators --json` prints them (the command the docs name)."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["theory", "estimators", "--json"]) == 0
    out = buf.getvalue()
    assert out.count("\n") == 1
    return json.loads(out)["rows"]


def test_the_docs_table_is_what_the_estimators_give_now(table):
    doc = _doc_table().strip().splitlines()[2:]
    assert len(doc) == len(table)
    for line, r in zip(doc, table):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:3] == [r["problem"], r["shape"], r["norm"]]
        assert float(cells[3].split()[0]) == pytest.approx(r["L"], rel=1e-3)
        assert float(cells[4]) == pytest.approx(r["secant"], rel=1e-3)
        assert float(cells[6]) == pytest.approx(r["curvature"], rel=1e-3)
    assert markdown(table).strip().splitlines()[0] == _doc_table().strip().splitlines()[0]


def test_no_estimate_is_above_an_exact_constant_and_the_curvature_one_reaches_it_on_the_witness_path(table):
    for r in table:
        if r["exact"]:
            assert r["secant"] <= r["L"] * (1 + 1e-9) and r["curvature"] <= r["L"] * (1 + 1e-9), r
    # the Euclidean (l2 on one tensor) power method reaches the top eigenvalue at the witness point
    for r in table:
        if r["norm"] in ("l2", "euclidean") and r["exact"]:
            assert r["curvature"] == pytest.approx(r["L"], rel=1e-6), r
