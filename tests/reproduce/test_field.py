"""The field's claims (`delaylab reproduce --preset cpu-field`, part 11, docs/field.md): the claims
function on a Ledger of synthetic losses whose answers are known, every row recomputed from runs.jsonl
lines alone (tests/reproduce/recompute.py, plain Python), the preset's stated run count, and ci-field
end to end with its resume."""

import json
import math
import re
import sys
from pathlib import Path

import pytest

from delaylab.reproduce import PRESETS, plan as P, reproduce
from delaylab.reproduce.field import claims
from delaylab.reproduce.ledger import SESSIONS, Ledger
from delaylab.reproduce.markdown import markdown
from delaylab.reproduce.presets import FIELD_REGIONS
from delaylab.reproduce.runner import LLMRun
from delaylab.reproduce.verdicts import STATES, state

sys.path.insert(0, str(Path(__file__).parent))
import recompute as R  # noqa: E402

# The synthetic world: the gap is SLOPE[opt] x the mean delay, a corrector keeps FACTOR of it, and every
# delayed run of seed s is NOISE[opt] x 0.002 s worse (so that gaps vary over seeds, and differences of
# gaps too); each grid's middle lr is best.
SLOPE = {"adamw": 0.05, "rotated-adam": 0.02, "muon": 0.03}
FACTOR = {"delayed": 1.0, "ef": 0.3, "predict": 0.5, "lookahead": -0.2, "dc-asgd-a": 0.99, "predict-momentum": 1.2,
          "drop-4": 0.5}
NOISE = {"adamw": 1.0, "rotated-adam": 0.5, "muon": 1.0}


def _loss(p, r: LLMRun) -> float:
    c, b = r.cell, r.base
    lrs = p.delays.lrs[c.optimizer]
    v = 3.0 + 0.1 * math.log(c.lr / lrs[len(lrs) // 2]) ** 2 - 0.3 * math.log(b["steps"] / 220)
    if c.mode == "sync":
        return v
    d = b.get("delay")
    tau = 4.0 if b.get("delay_dist") else (sum(d) / len(d) if isinstance(d, list) else d)
    return v + SLOPE[c.optimizer] * tau * FACTOR[c.mode] + 0.002 * c.seed * NOISE[c.optimizer]


def _line(p, r: LLMRun) -> dict:
    v, steps = _loss(p, r), r.base["steps"]
    curve = [[k * steps * 512, v + 0.02 * (10 - k)] for k in range(1, 11)]
    return {"kind": "gpt", "folder": r.folder, "seed": r.cell.seed, "optimizer": r.cell.optimizer, "mode": r.label,
            "lr": r.cell.lr, "val_loss": v, "params": 135_000, "tokens": steps * 512,
            "tokens_per_param": steps * 512 / 135_000, "ns_dtype": None, "val_curve": curve, "calls": steps}


def synthetic(name="cpu-field") -> Ledger:
    """A Ledger at the plan's fixed point with :func:`_loss` as every run's result."""
    p = PRESETS[name]

    class Source:
        def summary(self, r):
            return {"val_loss": _loss(p, r)} if isinstance(r, LLMRun) else {}

        def val_records(self, r):
            return [{"tokens": t, "val_loss": v} for t, v in _line(p, r)["val_curve"]]

    runs = P.plan(p, Source())
    return Ledger(p, "synthetic", [_line(p, r) for r in runs])


@pytest.fixture(scope="module")
def field_rows():
    L = synthetic()
    return L, claims(L)


def test_every_claim_of_the_table_is_scored(field_rows):
    _, rows = field_rows
    assert {r["key"] for r in rows} == set(FIELD_REGIONS)
    for r in rows:
        assert r["state"] in STATES and r["region"] == list(FIELD_REGIONS[r["key"]])
        assert r["state"] == state(r["interval"], tuple(r["region"]), issues=r["score"]["issues"])
        assert (r["state"] == "agrees") == (not r["reason"])


def test_each_claim_is_recomputed_from_the_lines(field_rows):
    L, rows = field_rows
    for r in rows:
        value, ci = R.field_claim(L.lines, r)
        assert value is not None and math.isclose(value, r["value"], rel_tol=1e-9, abs_tol=1e-12), r["claim"]
        assert (ci is None and r["interval"] is None) or all(map(math.isclose, ci, r["interval"])), r["claim"]


def test_the_known_answers(field_rows):
    _, rows = field_rows
    one = {(r["key"], r["claim"]): r for r in rows}
    by = {}
    for r in rows:
        by.setdefault(r["key"], []).append(r)
    # AdamW's gap - rotated Adam's at tau 8: (0.05 - 0.02) x 8 + 0.001 s over seeds 0..4
    assert by["rotation_gap_smaller"][0]["value"] == pytest.approx(0.242)
    assert by["rotation_grows_with_depth"][0]["value"] == pytest.approx(0.03 * 7)
    # P = 8 (mean 3.5, seeds 0-2) against P = 4 (mean 1.5, seeds 0-4)
    assert by["rotation_grows_with_pipeline"][0]["value"] == pytest.approx(0.106 - 0.047)
    # EF keeps 30% of a gap 0.05 + 0.002 s (AdamW, tau 1): 100 (1 - mean fix gap / mean gap), mean s = 2
    ef = next(r for r in by["ef_recovers"] if "adamw" in r["claim"])
    assert ef["value"] == pytest.approx(100 * (1 - (0.3 * 0.05 + 0.004) / (0.05 + 0.004)))
    # Muon: gap(8) / gap(2) = (0.24 + 0.004) / (0.06 + 0.004), every lr rule alike here
    assert all(r["value"] == pytest.approx(0.244 / 0.064) for r in by["muon_linear"])
    assert len(by["muon_linear"]) == 2  # lr tuned at every tau, and held at tau 1's
    # per-stage P = 4 (mean 1.5) against tau 3: (0.09 + 0.004) / (0.045 + 0.004)
    assert by["per_stage_milder"][0]["value"] == pytest.approx(0.094 / 0.049)
    # drop:4 halves the gap of the random delay (mean 4): 0.03 x 4 x 0.5
    assert by["drop_faster"][0]["value"] == pytest.approx(0.06)
    assert all(r["value"] < 0 for r in by["lookahead_beats_sync"])
    # the overhead: every delayed run reaches its sync loss (the longer runs are better), at both budgets
    assert by["overhead_falls"][0]["interval"] is not None
    assert not one.get(("muon_linear", "x"))


def test_the_stated_run_count_is_the_plans():
    """cpu-field states its run count before it starts: the plan's, where no grid grows and every delayed
    run of the overhead reaches its sync loss at its first length (synthetic: no gap at all)."""
    p = PRESETS["cpu-field"]

    class Flat:
        def summary(self, r):
            lrs = p.delays.lrs[r.cell.optimizer]
            return {"val_loss": 3.0 + 0.1 * math.log(r.cell.lr / lrs[len(lrs) // 2]) ** 2}

        def val_records(self, r):
            return [{"tokens": k, "val_loss": 3.0} for k in range(1, 11)]

    stated = int(re.search(r"at least (\d+) runs", p.estimate).group(1))
    assert len(P.plan(p, Flat())) == stated


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("field")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DELAYLAB_CACHE", str(tmp_path_factory.mktemp("cache")))
        rep = reproduce("ci-field", out, jobs=2, progress=False)
        again = reproduce("ci-field", out, jobs=2, progress=False)  # resumed: everything is read
        yield out, rep, again


def test_ci_field_end_to_end_and_resumed(made):
    out, rep, again = made
    on_disk = json.loads((out / "report.json").read_text())
    assert (out / "report.md").read_text() == markdown(on_disk)
    # the header states the preset's own lr-grid limit: ci-field's grids never grow, cpu-field's up to 4 steps
    assert on_disk["lr_extend"] == 0 and "No lr grid grows at an edge here" in markdown(on_disk)
    assert "(at most four steps per side)" in markdown({**on_disk, "lr_extend": PRESETS["cpu-field"].delays.lr_extend})
    part = next(x for x in on_disk["parts"] if x["key"] == "field")
    assert part["id"] == 11 and part["rows"]
    lines = R.load(out / "runs.jsonl")
    for r in part["rows"]:
        value, ci = R.field_claim(lines, r)
        if r["value"] is not None:
            assert math.isclose(value, r["value"], rel_tol=1e-9, abs_tol=1e-12), r["claim"]
        assert r["state"] == "undetermined"  # runs far too short for the protocol
    sessions = [json.loads(x) for x in (out / SESSIONS).read_text().splitlines()]
    assert sessions[-1]["computed"] == 0 and sessions[0]["computed"] == len(lines)
    assert [x["rows"] for x in again["parts"]] == [x["rows"] for x in rep["parts"]]
    drop = [x for x in lines if x["mode"].startswith("drop")]
    assert drop and all(x["calls"] > x["steps"] for x in drop)  # it discarded gradients
