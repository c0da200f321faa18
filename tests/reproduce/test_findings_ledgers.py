"""Each finding from a small hand-made Ledger, reaching agrees, disagrees and undetermined.

A Ledger here is what the runner would settle on if every GPT run's final val loss were the loss
model the test writes down: :func:`simulate` plays the runner's fixed point (plan on the Ledger,
add a line for each run it lists, again) with no GPT trained, so the lr grids grow, the seeds and
the cells are the plan's own. The loss model is a parabola in log2(lr) around each mode's optimum,
plus a per-seed offset shared by a seed's runs (a seed's sync and delayed runs share init and
batches) and a per-run noise; the gap a mode adds is the test's.
"""

import math
import random
import zlib
from dataclasses import replace

import pytest

from delaylab.reproduce import delays as D
from delaylab.reproduce import findings as F
from delaylab.reproduce import plan as P
from delaylab.reproduce.ledger import Ledger
from delaylab.reproduce.presets import DelayGrid, DelaySetting, ToyGrid, get_preset

SMALL = get_preset("cpu-small")  # 300 updates: AdamW 0.9 and Muon 0.95 keep the protocol, verdicts are scored
CENTRE = {"adamw": 2e-3, "muon": 0.02}


def preset(llm=None, **parts):
    """cpu-small's GPT grid cut to AdamW and Muon, EF, no extra seeds, ablations or overheads."""
    g = replace(SMALL.llm, **{**dict(optimizers=("adamw", "muon"), momenta={}, ef_lrs=(), ablation_optimizers=(),
                                     lrs={"adamw": (1e-3, 2e-3, 4e-3), "muon": (0.01, 0.02, 0.04)}, headline=(),
                                     overhead=(), optimizer_seeds={}, mitigations=("ef",)), **(llm or {})})
    return replace(SMALL, **{**dict(llm=g, schedules=None, toy=None, scale=None, delays=None), **parts})


def _noise(key: str, sd: float) -> float:
    return random.Random(zlib.crc32(key.encode())).gauss(0.0, sd) if sd else 0.0


def loss_model(gap, optimum=None, noise=0.002, seed_sd=0.02, curvature=0.05):
    """``run -> val loss``: ``gap(run)`` added to sync's parabola around ``optimum(run)`` (CENTRE)."""
    def loss(run):
        c = run.cell
        centre = optimum(run) if optimum else CENTRE[c.optimizer]
        return (3.0 + curvature * math.log2(c.lr / centre) ** 2 + _noise(f"seed{c.seed}", seed_sd)
                + gap(run) + _noise(run.folder, noise))
    return loss


def _line(run, value) -> dict:
    if hasattr(run, "cell"):
        return {"kind": "gpt", "folder": run.folder, "val_loss": value, "params": 1000, "tokens": 1000,
                "ns_dtype": None, "val_curve": [[1000, value]], "diagnostics": None}
    return {"kind": "toy", "task": run.task, "name": run.name, "folder": run.folder, **value}


def simulate(p, loss, toy=None) -> Ledger:
    """The runner's fixed point with ``loss(run)`` as each GPT run's result (``toy(run)``: a toy run's)."""
    lines: list = []
    while True:
        book = Ledger(p, "hand-made", lines)
        new = [r for r in P.plan(p, book) if book.summary(r) is None]
        if not new:
            return book
        lines = lines + [_line(r, loss(r) if hasattr(r, "cell") else toy(r)) for r in new]


def state(part: dict, claim: str) -> str:
    (v,) = [v for v in part["verdicts"] if v["claim"].startswith(claim)]
    return v["state"]


# -- 1: optimizer sensitivity -------------------------------------------------------------------


@pytest.mark.parametrize("gaps, noise, want", [
    ({"adamw": 0.30, "muon": 0.01}, 0.002, "agrees"),
    ({"adamw": 0.01, "muon": 0.30}, 0.002, "disagrees"),
    ({"adamw": 0.10, "muon": 0.10}, 0.05, "undetermined"),  # equal gaps under noise: the order is not resolved
])
def test_finding1_order_claim(gaps, noise, want):
    book = simulate(preset(), loss_model(lambda r: gaps[r.cell.optimizer] * (r.label == "delayed"), noise=noise))
    part = F.optimizers(book)
    assert {o: b["lr"] for o, b in book.best.items()} == CENTRE  # the plan found the optimum the model put there
    assert state(part, "adamw degrades more than muon") == want


# -- 2: mitigations -----------------------------------------------------------------------------


@pytest.mark.parametrize("gap, share, want", [
    (0.2, 0.7, "agrees"),        # EF recovers 70%: inside the paper's 50-90%
    (0.2, 0.0, "disagrees"),     # EF recovers nothing
    (0.0, 0.7, "undetermined"),  # no gap to recover: Fieller's set is unbounded
])
def test_finding2_ef_recovery(gap, share, want):
    def gap_of(r):
        return {"delayed": gap, "ef": gap * (1 - share)}.get(r.label, 0.0)

    part = F.mitigations(simulate(preset(), loss_model(gap_of)))
    assert state(part, "adamw: EF recovers 50-90% of the gap (best sync lr)") == want
    row = next(r for r in part["rows"] if r["optimizer"] == "adamw")
    if want != "undetermined":
        assert row["ef_recovered"]["ratio_of_means"] == pytest.approx(100 * share, abs=3)


# -- 3: momentum ----------------------------------------------------------------------------------


@pytest.mark.parametrize("slope, noise, want", [
    (-2.0, 0.002, "agrees"),      # the gap falls from 0.35 at 0.8 to 0.05 at 0.95
    (2.0, 0.002, "disagrees"),
    (0.0, 0.05, "undetermined"),
])
def test_finding3_momentum(slope, noise, want):
    p = preset({"momenta": {"adamw": (0.8, 0.9, 0.95)}})
    book = simulate(p, loss_model(lambda r: (0.2 + slope * (r.cell.momentum - 0.875)) * (r.label == "delayed"),
                                  noise=noise))
    part = F.momentum(book)
    assert [r["momentum"] for r in part["rows"]] == [0.8, 0.9, 0.95]
    assert state(part, "adamw: higher momentum shrinks the gap") == want


# -- 4: learning rate -----------------------------------------------------------------------------


@pytest.mark.parametrize("factor, want", [
    (0.25, "agrees"),      # delayed's optimum at a quarter of sync's
    (4.0, "disagrees"),    # at four times
    (1.0, "undetermined"),  # at the same lr: the ratio's interval holds 1
])
def test_finding4_optimum_shift(factor, want):
    def optimum(r):
        return CENTRE[r.cell.optimizer] * (factor if r.label == "delayed" else 1.0)

    book = simulate(preset(), loss_model(lambda r: 0.1 * (r.label == "delayed"), optimum=optimum, noise=0.01))
    part = F.learning_rate(book)
    assert state(part, "adamw: delayed degrades faster than sync at high lr") == want
    if want != "undetermined":  # the grid grew until delayed's optimum was inside it
        assert part["optima"]["adamw"]["delayed"]["ratio"] == pytest.approx(factor, rel=0.2)


# -- 5: schedules ------------------------------------------------------------------------------------


@pytest.mark.parametrize("pipedream, noise, want", [
    (0.20, 0.002, "agrees"),     # PipeDream's per-stage delays cost more than 2BW's one step
    (0.01, 0.002, "disagrees"),
    (0.05, 0.05, "undetermined"),
])
def test_finding5_2bw_beats_pipedream(pipedream, noise, want):
    p = preset(schedules=replace(SMALL.schedules, optimizers=("adamw",), lrs={"adamw": 2e-3}, depths=(4,)))
    gaps = {"2bw": 0.05, "pipedream-4": pipedream}
    part = F.schedules(simulate(p, loss_model(lambda r: gaps.get(r.label, 0.0), noise=noise)))
    assert state(part, "adamw, depth 4: 2BW (tau = 1) beats PipeDream") == want


# -- 6: toy rates ------------------------------------------------------------------------------------


def _toy_results(over: float):
    """Hand-made toy results: every rate run measured at ``over`` x its bound (95% interval +-5%)."""
    def result(run):
        if run.task == "rates":
            k = run.kwargs
            pts = [{"T": T, "measured": over * 2.0 / T ** 0.25, "bound": 2.0 / T ** 0.25,
                    "ci": [0.95 * over * 2.0 / T ** 0.25, 1.05 * over * 2.0 / T ** 0.25], "ratio": over}
                   for T in k["steps"]]
            return {"problem": k["problem"], "method": k["method"], "delay": k["delay"],
                    "correction": k["correction"], "points": pts, "slope": -0.25, "exponent": -0.25,
                    "tolerance": 0.1, "bound_slope": -0.25, "holds": over < 1}
        if run.task == "cost":
            sweep = [{"eta": e, "gap": e, "gap_ci": [0.9 * e, 1.1 * e]} for e in (0.1, 0.2, 0.4)]
            betas = [{"beta": b, "gap": 0.1 * (1 - b), "gap_ci": [0.09 * (1 - b), 0.11 * (1 - b)], "sync": 1.0}
                     for b in (0.5, 0.9)]
            return {"problem": "logdet", "method": "lmo-spectral", "T": 100, "seeds": 2, "trends": {},
                    "eta_sweep": sweep, "beta_sweep": betas, "beta_sweep_eta": "tuned", "delay": 1}
        return {"rows": []}
    return result


@pytest.mark.parametrize("over, want", [(0.5, "agrees"), (2.0, "disagrees"), (1.0, "undetermined")])
def test_finding6_rate_under_the_bound(over, want):
    p = preset(toy=ToyGrid(problems=("logdet",), methods=("lmo-spectral",), T=(100, 400), seeds=2))
    book = simulate(replace(p, llm=None), None, toy=_toy_results(over))
    part = F.toy(book)
    assert len(part["rows"]) == 3  # sync, tau=1, tau=1 + EF
    assert {state(part, f"logdet lmo-spectral {m}: under the bound") for m in ("sync", "tau=1", "tau=1+EF")} == {want}
    assert state(part, "logdet lmo-spectral, gap grows with eta") == "agrees"


# -- 9: the delay axis -------------------------------------------------------------------------------


@pytest.mark.parametrize("pipedream, noise, want", [(0.3, 0.002, "agrees"), (0.0, 0.002, "disagrees"),
                                                    (0.1, 0.05, "undetermined")])
def test_delay_axis_2bw_beats_pipedream(pipedream, noise, want):
    """The delay axis scores the paper's one claim on it, 2BW against PipeDream at depth 4."""
    grid = DelayGrid(base={**SMALL.llm.base, "block_size": 64}, optimizers=("adamw",), lrs={"adamw": (1e-3, 2e-3, 4e-3)},
                     momentum={"adamw": 0.9}, settings=(DelaySetting("tau1", delay=1),
                                                        DelaySetting("pd4", delay=(3, 2, 1, 0))),
                     tuned=("tau1",), modes=("delayed",), seeds=5, scan_seeds=2)
    p = replace(preset(), llm=None, delays=grid)
    gaps = {"delays-tau1": 0.1, "delays-pd4": pipedream}
    book = simulate(p, loss_model(lambda r: gaps.get(r.variant, 0.0), noise=noise))
    part = D.delays(book)
    assert state(part, "adamw, depth 4: 2BW (tau = 1) beats PipeDream") == want
