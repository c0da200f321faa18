"""The delay axis (`delaylab reproduce --preset ci-delays`, part 9): its plan, its report, and its gaps
recomputed from runs.jsonl alone (tests/reproduce/recompute.py, plain Python)."""

import json
import math

import pytest

from delaylab.errors import ConfigError
from delaylab.reproduce import PRESETS, plan, reproduce
from delaylab.reproduce.ledger import Folders
from delaylab.reproduce.presets import DelayGrid, DelaySetting
from delaylab.reproduce.markdown import markdown
from delaylab.reproduce.verdicts import STATES, aggregate

import recompute

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("delays")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DELAYLAB_CACHE", str(tmp_path_factory.mktemp("cache")))  # the spawned workers inherit it
        rep = reproduce("ci-delays", out, jobs=2, progress=False)
        yield out, rep


def _part(rep):
    (part,) = rep["parts"]
    assert part["key"] == "delays"
    return part


def test_report_renders_with_three_valued_verdicts(made):
    out, rep = made
    on_disk = json.loads((out / "report.json").read_text())
    assert (out / "report.md").read_text() == markdown(on_disk)
    part = _part(on_disk)
    g = PRESETS["ci-delays"].delays
    assert len(part["rows"]) == sum(len(g.optimizers) * len(g.modes_of(s)) for s in g.settings)
    assert (out / part["figure"]).read_bytes()[:8] == PNG
    for v in part["verdicts"]:
        assert v["state"] in (*STATES, None) and (v["state"] is None) == (v["kind"] == "note")
    assert part["reproduced"] == aggregate([v["state"] for v in part["verdicts"] if v["kind"] == "paper"])
    scored = [n for n in part["theory_numbers"] if n["state"] is not None]
    assert scored and all(n["state"] in STATES for n in scored)
    # ci's runs break the protocol (16 updates): nothing scored on them can agree or disagree
    assert {n["state"] for n in scored} == {"undetermined"}
    # sketches and qualitative rows are shown, never scored
    assert all(n["score"] is None for n in part["theory_numbers"] if n["note"] in ("sketch", "qualitative"))
    assert any(n["note"] == "sketch" for n in part["theory_numbers"])


def test_every_mode_and_setting_ran_as_planned(made):
    """Each cell's runs carry the setting's delay, distribution, model and corrector list (config.json)."""
    from delaylab.llm.config import Config

    out, rep = made
    g = PRESETS["ci-delays"].delays
    for row in _part(rep)["rows"]:
        s = g.setting(row["setting"])
        for folder in row["runs"][row["mode"]]:
            cfg = Config.from_dict(json.loads((out / folder / "config.json").read_text()))
            want = {"delayed": "none", "ef+predict": "ef,predict"}[row["mode"]]
            assert cfg.delay.correction == want
            assert cfg.delay.delay_dist == s.delay_dist
            if s.delay_dist is None:
                assert cfg.delay.delay == (list(s.delay) if isinstance(s.delay, tuple) else s.delay)
            assert cfg.model.n_layer == s.model.get("n_layer")
        for folder in row["runs"]["sync"]:
            cfg = Config.from_dict(json.loads((out / folder / "config.json").read_text()))
            assert cfg.delay.delay == 0 and cfg.delay.delay_dist is None
            assert cfg.model.n_layer == s.model.get("n_layer") and cfg.optim.lr == row["sync_lr"]


def test_gaps_and_recoveries_recomputed_from_runs_jsonl(made):
    out, rep = made
    runs = recompute.load(out / "runs.jsonl")
    assert len({r["folder"] for r in runs}) == len(runs) == len(list(out.glob("llm/*/cells/*/summary.json")))
    part = _part(rep)
    checked = 0
    for row in part["rows"]:
        model = PRESETS["ci-delays"].delays.setting(row["setting"]).model
        sync_variant = plan.delay_sync(PRESETS["ci-delays"], PRESETS["ci-delays"].delays.setting(row["setting"]))[0]
        assert sync_variant == ("delays-sync" if not model else "delays-sync-nlayer3")
        per, (m, ci) = recompute.delay_gap(runs, row["optimizer"], row["setting"], row["mode"], row["momentum"],
                                           sync_variant)
        g = PRESETS["ci-delays"].delays
        assert len(per) == row["gap"]["n"] == g.seeds_of(g.setting(row["setting"]))
        assert math.isclose(m, row["gap"]["mean"], abs_tol=1e-12)
        assert all(math.isclose(a, b, abs_tol=1e-12) for a, b in zip(ci, row["gap"]["ci"]))
        if "recovered" in row:
            rec, rci = recompute.delay_recovery(runs, row["optimizer"], row["setting"], row["mode"], row["momentum"],
                                                sync_variant)
            assert math.isclose(rec, row["recovered"]["ratio_of_means"], rel_tol=1e-9, abs_tol=1e-9)
            if row["recovered"]["ci"] is not None:
                assert all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(rci, row["recovered"]["ci"]))
            else:
                assert rci is None
        checked += 1
    assert checked == len(part["rows"])


def test_plan_rules_on_the_cpu_preset():
    """PipeDream's settings are the schedule model's delays, one block per stage; an interpolated lr lies
    on the lattice between the tuned optima; the plan of an empty folder is the sync grid alone."""
    from delaylab.llm.model import preset as model_preset
    from delaylab.llm.config import schedule_delays

    p = PRESETS["cpu-delays"]
    g = p.delays
    for s in g.settings:
        if isinstance(s.delay, tuple):
            assert list(s.delay) == schedule_delays("pipedream", len(s.delay))
            n_layer = s.model.get("n_layer", model_preset(g.base["preset"]).n_layer)
            assert n_layer == len(s.delay)  # one block per stage: the simulator's per-stage split
    assert g.setting("uniform-0-4").mean_delay == g.setting("tau-2").delay
    # log-linear in the mean delay: halfway (in log) between 4e-3 at tau 1 and 1e-3 at tau 4 is 2e-3
    assert plan.interpolate_lr(p, "adamw", {1.0: 4e-3, 4.0: 1e-3}, 2.0) == pytest.approx(2e-3)
    # rounded to the factor-2 lattice of the grid (5e-4 * 2^k): 1/3 of the way (in log) from 4e-3 to 1e-3
    # is 2.52e-3, whose nearest lattice point is 2e-3
    assert plan.interpolate_lr(p, "adamw", {1.0: 4e-3, 8.0: 1e-3}, 2.0) == pytest.approx(2e-3)
    assert plan.interpolate_lr(p, "adamw", {1.0: 4e-3, 8.0: 5e-4}, 0.5) == 4e-3  # outside: the nearest
    runs = plan.plan(p, Folders("/nonexistent-delaylab-folder"))
    assert {r.variant for r in runs} == {"delays-sync"}
    assert len(runs) == sum(len(g.lrs[o]) for o in g.optimizers) * g.scan_seeds


def test_delay_grid_is_checked():
    with pytest.raises(ConfigError, match="tuned at no setting"):
        DelayGrid(base={}, optimizers=("adamw",), lrs={"adamw": (1e-3,)}, momentum={},
                  settings=(DelaySetting("tau-1", 1, modes=("delayed",)), DelaySetting("tau-2", 2)),
                  tuned=("tau-1",))
    with pytest.raises(ConfigError, match="not both or neither"):
        DelayGrid(base={}, optimizers=("adamw",), lrs={"adamw": (1e-3,)}, momentum={},
                  settings=(DelaySetting("tau-1", 1, delay_dist="uniform:0-2"),), tuned=("tau-1",))
