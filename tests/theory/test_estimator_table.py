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


def _doc_table(name: str = "estimators") -> str:
    text = DOC.read_text()
    m = re.search(rf"<!-- {name}:begin -->\n(.*?)<!-- {name}:end -->", text, flags=re.S)
    assert m, f"docs/assumptions.md has lost its {name} table markers"
    return m.group(1)


@pytest.fixture(scope="module")
def result():
    """The rows as `delaylab theory estimators --json` prints them (the command the docs name)."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["theory", "estimators", "--json"]) == 0
    out = buf.getvalue()
    assert out.count("\n") == 1
    return json.loads(out)


def test_the_docs_table_is_what_the_estimators_give_now(result):
    table = result["rows"]
    doc = _doc_table().strip().splitlines()[2:]
    assert len(doc) == len(table)
    for line, r in zip(doc, table):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:3] == [r["problem"], r["shape"], r["norm"]]
        assert float(cells[3].split()[0]) == pytest.approx(r["L"], rel=1e-3)
        assert float(cells[4]) == pytest.approx(r["secant"], rel=1e-3)
        assert float(cells[6]) == pytest.approx(r["curvature"], rel=1e-3)
    assert markdown(table).strip().splitlines()[0] == _doc_table().strip().splitlines()[0]


def test_no_estimate_is_above_an_exact_constant_and_the_curvature_one_reaches_it_on_the_witness_path(result):
    table = result["rows"]
    for r in table:
        if r["exact"]:
            assert r["secant"] <= r["L"] * (1 + 1e-9) and r["curvature"] <= r["L"] * (1 + 1e-9), r
    # the Euclidean (l2 on one tensor) power method reaches the top eigenvalue at the witness point
    for r in table:
        if r["norm"] in ("l2", "euclidean") and r["exact"]:
            assert r["curvature"] == pytest.approx(r["L"], rel=1e-6), r


def test_sigma_delta_and_g0_against_the_problems_constants_and_the_docs(result):
    table = result["constants"]
    doc = _doc_table("constants").strip().splitlines()[2:]
    assert len(doc) == len(table)
    for line, r in zip(doc, table):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == r["problem"]
        assert float(cells[2]) == pytest.approx(r["sigma_estimate"], rel=1e-3, abs=1e-12)
        assert [float(c) for c in cells[4:7]] == pytest.approx([r["Delta"], r["Delta_lower"], r["Delta_upper"]],
                                                               rel=1e-3)
        # G0: two implementations of the dual norms (numpy here, torch in delaylab.optim.lmo) agree
        for n, v in r["G0"].items():
            assert r["G0_estimate"][n] == pytest.approx(v, rel=1e-12)
        # the path ends at a minimiser (inf f = 0): the lower estimate of Delta is exact, the upper too
        assert r["Delta_lower"] == pytest.approx(r["Delta"], rel=1e-12) and r["Delta_upper"] == pytest.approx(
            r["Delta"], rel=1e-12)
        if r["sigma"] == 0:
            assert r["sigma_estimate"] < 1e-12
        elif r["sigma_exact"]:  # 64 draws: within 5% (the sampling error is about 2% here)
            assert r["sigma_estimate"] == pytest.approx(r["sigma"], rel=0.05)
        else:  # an upper bound on the minibatch noise, valid at every point
            assert r["sigma_estimate"] <= r["sigma"]
