"""The anchors a quoted number is checked at (tests/reproduce/anchors.py): each kind finds its one
place and no other, and on the committed docs a quote moved out of its place fails although the
page still contains it elsewhere."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import anchors as A  # noqa: E402
import test_committed_reports as C  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

PAGE = """# Title

Intro with 6/6 in it.

## Results (2026-12-04)

| setting | optimizer | gap | share |
|---|---|---|---|
| tau-1 | adamw | +0.1 [+0.0, +0.2] | 33% [-4, 54] |
| tau-1 | muon | +0.3 [+0.2, +0.4] | 5% [-6, 15] |
| tau-8 | adamw | +0.7 \\| wide | 5% [-6, 15] |

- **First item.** AdamW's lr is
  censored (grown to the edge).
- **Second item.** Nothing is censored here <!-- claim:order -->the order +0.040 [+0.001,
  +0.078] <!-- claim:inner -->holds<!-- /claim --> at 1e-3<!-- /claim --> and so on.

### Sub (a subsection)

A paragraph with 116 [6.3, 30] and 0.41.

```bash
# not a heading
```

## Other

| setting | gap |
|---|---|
| tau-1 | +9.9 |

<!-- table:other.more -->
| setting | gap |
|---|---|
| tau-1 | +8.8 |
<!-- /table -->
"""


def test_a_cell_is_its_row_and_column():
    assert A.region(PAGE, {"section": "Results", "row": {"setting": "tau-1", "optimizer": "muon"},
                           "column": "share"}) == "5% [-6, 15]"
    assert A.region(PAGE, {"section": "Results", "row": {"setting": "tau-8"}, "column": "gap"}) == "+0.7 | wide"
    with pytest.raises(A.AnchorError, match="2 cells"):  # two tables of the section have the row
        A.region(PAGE, {"section": "Other", "row": "tau-1", "column": "gap"})
    assert A.region(PAGE, {"table": "other.more", "row": "tau-1", "column": "gap"}) == "+8.8"  # a marked table
    with pytest.raises(A.AnchorError, match="0 markers"):
        A.region(PAGE, {"table": "other", "row": "tau-1", "column": "gap"})
    with pytest.raises(A.AnchorError, match="2 cells"):  # two tau-1 rows
        A.region(PAGE, {"section": "Results", "row": "tau-1", "column": "gap"})
    with pytest.raises(A.AnchorError, match="0 cells"):
        A.region(PAGE, {"section": "Results", "row": "tau-2", "column": "gap"})
    with pytest.raises(A.AnchorError, match="0 headings"):  # a section is named by its heading's start
        A.region(PAGE, {"section": "Resultz", "row": "tau-2", "column": "gap"})


def test_a_paragraph_is_the_one_that_holds_its_phrase():
    first = A.region(PAGE, {"section": "Results", "paragraph": "**First item.**"})
    assert first == "- **First item.** AdamW's lr is censored (grown to the edge)."  # the wrapped line joined
    assert A.quotes(first, "censored")
    # a subsection is part of its parent's section
    assert A.quotes(A.region(PAGE, {"section": "Results", "paragraph": "A paragraph"}), "0.41")
    with pytest.raises(A.AnchorError, match="2 paragraphs"):
        A.region(PAGE, {"section": "Results", "paragraph": "item."})
    with pytest.raises(A.AnchorError, match="0 paragraphs"):  # a table is not a paragraph
        A.region(PAGE, {"section": "Results", "paragraph": "+0.1 [+0.0, +0.2]"})
    with pytest.raises(A.AnchorError, match="0 headings"):  # fenced code has no headings
        A.section(PAGE, "not a heading")


def test_a_claim_is_the_text_between_its_markers():
    assert A.region(PAGE, {"claim": "inner"}) == "holds"
    order = A.region(PAGE, {"claim": "order"})
    assert A.quotes(order, "+0.040 [+0.001, +0.078]") and order.endswith("at 1e-3")
    with pytest.raises(A.AnchorError, match="0 markers"):
        A.region(PAGE, {"claim": "missing"})
    with pytest.raises(A.AnchorError, match="never closed"):
        A.region("<!-- claim:x --> open", {"claim": "x"})
    with pytest.raises(A.AnchorError, match="not an anchor"):
        A.region(PAGE, {"section": "Results"})


def test_a_quote_is_a_whole_token():
    text = "A paragraph with 116 [6.3, 30] and 0.41, x0.44 and 18/18."
    assert not A.quotes(text, "16 [6.3, 30]") and A.quotes(text, "116 [6.3, 30]")
    assert not A.quotes(text, "0.4") and A.quotes(text, "0.41")
    assert not A.quotes(text, "8/18") and A.quotes(text, "18/18") and A.quotes(text, "x0.44")
    assert not A.quotes("x0.445", "x0.44") and not A.quotes("x0.44.5", "x0.44")


def _doc_quotes(folder, doc, text):
    quoted = C.recomputed(folder)
    for key, places in json.loads((folder / "quoted.json").read_text())[doc].items():
        for anchor in places:
            if not A.quotes(A.region(text, anchor), quoted[key]):
                return key, anchor
    return None


def test_a_short_quote_moved_from_its_place_fails_though_the_page_still_has_it():
    """cpu-quick's AdamW lr shift is "censored", quoted in its findings table and in its learning-rate
    paragraph; the page says "censored" many more times, so a search of the page would pass with it
    gone from its place."""
    folder = ROOT / "docs" / "reproduce" / "cpu-quick"
    doc = "docs/reproduction.md"
    text = (ROOT / doc).read_text()
    assert _doc_quotes(folder, doc, text) is None
    anchor = {"section": "cpu-quick", "paragraph": "**Learning rate:**"}
    assert "AdamW's is censored (its delayed loss" in A.region(text, anchor)
    planted = text.replace("censored (its delayed loss", "interior (its delayed loss", 1)
    assert planted != text and planted.count("censored") >= 4
    assert _doc_quotes(folder, doc, planted) == ("adamw lr shift", anchor)


def test_two_cells_that_print_the_same_interval_are_each_checked():
    """cpu-delays: Muon's EF + prediction at tau 2 and AdamW's prediction at tau 8 both print
    5% [-6, 15]; swapping one cell for another interval fails at that cell, not anywhere."""
    folder = ROOT / "docs" / "reproduce" / "cpu-delays"
    doc = "docs/beyond.md"
    text = (ROOT / doc).read_text()
    anchor = {"section": "Delay axis", "row": {"setting": "tau-8", "optimizer": "adamw"},
              "column": "predict recovers (95% Fieller)"}
    assert A.region(text, anchor) == "5% [-6, 15]"
    row = next(line for line in text.splitlines() if line.startswith("| tau-8 | 8 | adamw |"))
    planted = text.replace(row, row.replace("| 5% [-6, 15] |", "| 6% [-6, 15] |"))
    assert planted.count("5% [-6, 15]") >= 1  # the other cell still prints it
    assert _doc_quotes(folder, doc, planted) == ("adamw tau-8 predict recovers", anchor)
