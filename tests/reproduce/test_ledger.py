"""The Ledger written out renders the same report: each committed report's report.md, rendered
from the Ledger read back from its folder (runs.jsonl, sessions.jsonl and report.json), is the
committed text byte for byte. These reports were written before the Ledger (report version 3):
the train-loss diagnostics their runs.jsonl lacks are carried from report.json
(:func:`delaylab.reproduce.ledger._carry`), and the test says which parts needed them. Every run a
report reads, the toy runs included, is a line of its runs.jsonl."""

import json
import math
import shutil
from pathlib import Path

import pytest

from delaylab._io import dumps
from delaylab.errors import MissingFile
from delaylab.reproduce import ledger, report
from delaylab.reproduce import plan as P
from delaylab.reproduce.markdown import markdown
from delaylab.reproduce.presets import get_preset

ROOT = Path(__file__).resolve().parents[2]
REPORTS = sorted(p.parent for p in (ROOT / "docs" / "reproduce").glob("*/runs.jsonl"))


@pytest.mark.parametrize("folder", REPORTS, ids=[p.name for p in REPORTS])
def test_a_committed_report_renders_from_its_ledger(folder):
    book = ledger.read(folder)
    rep = report.build(book)
    assert markdown(rep) == (folder / "report.md").read_text()
    # the decisions were made again on the Ledger: each optimum the report names is the plan's
    stored = {p["key"]: p for p in json.loads((folder / "report.json").read_text())["parts"]}
    if "optimizers" in stored:
        assert {r["optimizer"]: r["lr"] for r in stored["optimizers"]["rows"]} == {
            o: b["lr"] for o, b in book.decisions()["best_sync"].items()}
    # carried from report.json: only the train-loss diagnostics of the cells a part shows (findings 1,
    # 7 and 8 show them; runs.jsonl v3 kept no train curve), never a val loss
    shows = {"optimizers", "ablations", "scale"} & set(stored)
    assert bool(book.carried) == bool(shows)
    assert all(set(d) == {"spike", "spike_steps", "plateau_exit", "plateau_left"} for d in book.carried.values())


@pytest.mark.parametrize("folder", REPORTS, ids=[p.name for p in REPORTS])
def test_a_committed_report_json_is_its_ledger_built_again(folder):
    """Not only the Markdown: the whole report.json, but for what the Ledger adds (its decisions) and
    what a version-3 report cannot give back: finding 1's rows kept the diagnostics of EF runs whose
    folders they do not list (no per-run diagnostics were kept to recompute them from)."""
    built = json.loads(dumps(report.build(ledger.read(folder))))
    stored = json.loads((folder / "report.json").read_text())
    decisions = built.pop("decisions")
    assert set(decisions) <= {"best_sync", "power", "momentum_grid", "ef_grid", "overhead", "axis",
                              "delay_lrs", "tokens_axis"}
    if "decisions" in stored:  # a report written by the Ledger keeps them: the same ones
        assert stored.pop("decisions") == decisions
    for part in stored["parts"]:
        if part["key"] == "optimizers":
            for row in part["rows"]:
                row["diagnostics"] = {m: d for m, d in row["diagnostics"].items() if m in row["runs"]}
    assert built == stored


@pytest.mark.parametrize("folder", REPORTS, ids=[p.name for p in REPORTS])
def test_every_run_a_committed_report_reads_is_a_line_of_its_runs_jsonl(folder):
    """The toy runs included (the rate checks, the delay cost and the EF comparison): the plan made on
    the Ledger lists exactly the runs of runs.jsonl, none taken from report.json."""
    book = ledger.read(folder)
    listed = [r.folder for r in P.plan(book.preset, book)]
    assert listed == [x["folder"] for x in book.lines]  # settle's order, one line per run
    if book.preset.toy is not None:
        tasks = [x["task"] for x in book.lines if x["kind"] == "toy"]
        assert tasks.count("cost") == tasks.count("compare") == 1 and tasks.count("rates") > 0


def test_a_runs_jsonl_without_a_run_the_report_reads_is_refused(tmp_path):
    folder = tmp_path / "cpu-quick"
    shutil.copytree(ROOT / "docs" / "reproduce" / "cpu-quick", folder)
    lines = (folder / ledger.RUNS).read_text().splitlines()
    (folder / ledger.RUNS).write_text("".join(x + "\n" for x in lines if '"task": "compare"' not in x))
    with pytest.raises(MissingFile, match="lacks 1 of the report's runs .first: toy/compare-logdet"):
        ledger.read(folder)


def _toy_lines_made_again(folder, names=None) -> list[tuple[dict, dict]]:
    """(committed line, the run made again as a line) for the toy runs of a committed report."""
    import torch

    from delaylab.reproduce.runner import toy_result

    book = ledger.read(folder)
    runs = [r for g in P.toy(book.preset).values() for r in g if names is None or r.name in names]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the runner runs them
    try:
        return [(book._by[r.folder], json.loads(dumps(ledger._toy_line(r, toy_result(r.task, r.kwargs)))))
                for r in runs]
    finally:
        torch.set_num_threads(threads)


def _same(a, b, rel=1e-9) -> bool:
    """Equal structures, floats to ``rel`` (a toy run made again differs in the last bits: 2e-16 in
    a rate check's mean, up to 1.6e-13 in the EF comparison's small differences, measured)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k], rel) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=rel, abs_tol=1e-300)
    return a == b


def test_a_toy_line_is_its_run_made_again():
    """One rate check of cpu-quick (a second's work), made again: its line, every field (floats to
    1e-9 relative); a line 1e-8 off in one mean fails."""
    (line, again), = _toy_lines_made_again(ROOT / "docs" / "reproduce" / "cpu-quick", {"rates-logdet-lmo-sign-tau1"})
    assert _same(line, again) and line["points"][0]["measured"] > 0
    off = json.loads(json.dumps(line))
    off["points"][1]["measured"] *= 1 + 1e-8
    assert not _same(off, again)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cpu-quick", "cpu-small"])
def test_every_toy_line_is_its_run_made_again(name):
    """Every toy run of the report made again (cpu-small: 36 s at load 3), every field."""
    pairs = _toy_lines_made_again(ROOT / "docs" / "reproduce" / name)
    assert len(pairs) == len(P.toy(get_preset(name))["rates"]) + 2
    for line, again in pairs:
        assert _same(line, again), line["folder"]


def test_rescore_reads_the_toy_runs_from_runs_jsonl_and_changes_no_byte(tmp_path):
    """Re-scoring cpu-quick (a toy part: rate checks, delay cost, EF comparison) reruns nothing and
    rewrites its report.json and report.md unchanged."""
    from delaylab.reproduce.rescore import rescore_folder

    src = ROOT / "docs" / "reproduce" / "cpu-quick"
    shutil.copytree(src, tmp_path / "r")
    assert rescore_folder(tmp_path / "r") == []
    for name in ("report.json", "report.md"):
        assert (tmp_path / "r" / name).read_text() == (src / name).read_text(), name
