"""The unconfounded tokens axis (issue 36): its points hold what they claim to hold fixed, each
mode's lr is its own best over every seed, and the gap along the run, the closing and the
separations equal a hand computation from loss curves the test writes down (run folders made
here, not trained), with Welch's interval from scipy."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from delaylab.reproduce import PRESETS
from delaylab.reproduce import plan as P
from delaylab.reproduce import tokens as T
from delaylab.reproduce.ledger import Folders, settle
from delaylab.reproduce.runner import SUMMARY

GRID = replace(PRESETS["ci-tokens"].tokens, sizes=("nano",), ratios=(0.2, 0.8), batch_size=2, wide_batch=8,
               lrs=(1e-3, 2e-3, 4e-3), seeds=3, lr_extend=1, evals=4)
PRE = replace(PRESETS["ci-tokens"], tokens=GRID)
LR_OPT = {("sync", "cosine"): 2e-3, ("delayed", "cosine"): 1e-3, ("sync", "wide"): 4e-3,
          ("delayed", "wide"): 2e-3, ("sync", "constant"): 1e-3, ("delayed", "constant"): 1e-3}
SEED_NOISE = [0.0, 0.02, -0.015]


def loss(mode: str, kind: str, ratio: float, lr: float, seed: int, frac: float) -> float:
    """A made-up validation loss: falls along the run, is lowest at LR_OPT, and the delayed run's
    gap shrinks along the run under cosine (to a quarter) but not under a constant lr."""
    sync = 3.0 - 0.8 * frac + 0.1 * math.log2(lr / LR_OPT[("sync", kind)]) ** 2 + SEED_NOISE[seed] - 0.1 * ratio
    if mode == "sync":
        return sync
    start = 0.3 if kind != "wide" else 0.2
    gap = start * (1 - 0.75 * frac) if kind != "constant" else start
    detune = 0.1 * math.log2(lr / LR_OPT[("delayed", kind)]) ** 2 - 0.1 * math.log2(lr / LR_OPT[("sync", kind)]) ** 2
    return sync + gap + detune + 0.01 * seed * (1 + frac)


def _fill(out: Path) -> None:
    """Write summary.json and metrics.jsonl for every run the plan lists, until it lists no new one."""
    while True:
        runs = [r for r in P.tokens_axis(PRE, Folders(out))[0] if not (out / r.folder / SUMMARY).exists()]
        if not runs:
            return
        for r in runs:
            kind = r.variant.rsplit("-", 1)[1]
            ratio = float(r.variant.split("-")[2].removesuffix("tpp"))
            steps, every = r.base["steps"], r.base["eval_every"]
            folder = out / r.folder
            folder.mkdir(parents=True)
            lines = []
            for step in [*range(every, steps + 1, every)] + ([steps] if steps % every else []):
                lr = r.cell.lr * (1.0 if kind == "constant" else 0.5)  # the factor is only read, not used
                lines.append({"step": step, "tokens": step * r.base["batch_size"] * r.base["block_size"], "lr": lr,
                              "val_loss": loss(r.cell.mode, kind, ratio, r.cell.lr, r.cell.seed, step / steps)})
            (folder / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
            (folder / SUMMARY).write_text(json.dumps({"val_loss": lines[-1]["val_loss"], "params": 43168,
                                                      "tokens": lines[-1]["tokens"]}))


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens")
    _fill(out)
    return T.tokens(settle(PRE, out))


def test_the_points_hold_fixed_what_they_claim():
    lo, hi = (P.tokens_base(PRE, "nano", r, k) for r, k in ((0.2, "cosine"), (0.8, "cosine")))
    wide, const = P.tokens_base(PRE, "nano", 0.8, "wide"), P.tokens_base(PRE, "nano", 0.8, "constant")
    tokens = {k: b["steps"] * b["batch_size"] * b["block_size"] for k, b in
              (("lo", lo), ("hi", hi), ("wide", wide), ("const", const))}
    assert wide["steps"] == lo["steps"] and abs(tokens["wide"] / tokens["hi"] - 1) < 0.01  # same updates / tokens
    assert hi["steps"] == 4 * lo["steps"] or abs(hi["steps"] / lo["steps"] - 4) < 0.02
    assert const == {**hi, "lr_schedule": "constant"} and hi["lr_schedule"] == "cosine"
    # the same validation windows everywhere: val_windows sequences per validation
    assert {b["eval_batches"] * b["batch_size"] for b in (lo, hi, wide)} == {GRID.val_windows}


def test_each_mode_gets_its_own_best_lr_over_all_seeds(part):
    for r in part["rows"]:
        for mode in ("sync", "delayed"):
            assert r["best"][mode] == LR_OPT[(mode, r["kind"])], (r["kind"], mode)
        assert r["seeds"] == 3


@pytest.mark.parametrize("kind,ratio", [("cosine", 0.2), ("cosine", 0.8), ("wide", 0.8), ("constant", 0.8)])
def test_gap_along_the_run_and_its_reads_equal_a_hand_computation(part, kind, ratio):
    r = next(x for x in part["rows"] if x["kind"] == kind and x["tokens_per_param"] == ratio)
    steps = r["updates"]
    for point in r["along"]:
        frac = point["step"] / steps
        want = [loss("delayed", kind, ratio, LR_OPT[("delayed", kind)], s, frac)
                - loss("sync", kind, ratio, LR_OPT[("sync", kind)], s, frac) for s in range(3)]
        assert point["gap"]["values"] == pytest.approx(want, abs=1e-12)
        m, se = np.mean(want), stats.sem(want)
        assert point["gap"]["ci"] == pytest.approx([m - stats.t.ppf(0.975, 2) * se, m + stats.t.ppf(0.975, 2) * se])
    warmup = steps // 20
    vals = [p["step"] for p in r["along"]]
    assert r["reads"]["peak"]["step"] == min(s for s in vals if s >= warmup)
    assert r["reads"]["end"]["step"] == steps
    assert abs(r["reads"]["mid"]["step"] - steps / 2) == min(abs(s - steps / 2) for s in vals)
    closing = np.subtract(r["reads"]["peak"]["gap"]["values"], r["reads"]["end"]["gap"]["values"])
    assert r["closing"]["values"] == pytest.approx(list(closing), abs=1e-12)
    if kind == "constant":  # the made-up gap does not close without the decay
        assert abs(r["closing"]["mean"]) < 0.02
    else:
        assert r["closing"]["ci"][0] > 0


def test_separations_are_paired_differences_of_the_right_points(part):
    """Two points of one size share their seeds (a seed fixes the init), so a separation is the per-seed
    difference with scipy's one-sample t interval; scored in its direction at every near-optimal lr pair."""
    rows = {(r["tokens_per_param"], r["kind"]): r for r in part["rows"]}
    seps = {s["name"]: s for s in part["separations"]}
    for name, a, b, q, region in (("tokens", (0.2, "cosine"), (0.8, "wide"), "gap", [0, None]),
                                  ("updates", (0.8, "wide"), (0.8, "cosine"), "gap", [None, 0]),
                                  ("decay: final gap", (0.8, "constant"), (0.8, "cosine"), "gap", [None, 0]),
                                  ("decay: closing", (0.8, "constant"), (0.8, "cosine"), "closing", [0, None])):
        assert rows[a]["seed_ids"] == rows[b]["seed_ids"]
        d = np.subtract(rows[b][q]["values"], rows[a][q]["values"])
        half = stats.t.ppf(0.975, len(d) - 1) * stats.sem(d)  # the made-up points differ by a constant: sem 0
        lo, hi = d.mean() - half, d.mean() + half
        assert seps[name]["delta"] == pytest.approx(d.mean(), abs=1e-12)
        assert seps[name]["ci"] == pytest.approx([lo, hi], abs=1e-9)
        assert seps[name]["n"] == len(d) and seps[name]["region"] == region
        assert seps[name]["sign"] == (0 if lo <= 0 <= hi else 1 if lo > 0 else -1)
        assert sum(seps[name]["lr_states"].values()) == len(rows[a]["at_near_lrs"]) * len(rows[b]["at_near_lrs"])
    # the made-up decay closes the gap: the cosine run ends with the smaller gap, resolved
    assert seps["decay: final gap"]["sign"] == -1 and seps["decay: closing"]["sign"] == 1


def test_a_separation_is_undetermined_when_a_near_optimal_lr_pair_disagrees():
    """The lr-robustness rule: resolved at the optima but not at another lr pair the data cannot tell
    from them -> undetermined (lr-dependent); every pair resolved -> agrees."""
    from delaylab.reproduce.presets import get_preset

    p = get_preset("ci-tokens")
    t = p.tokens
    lo, hi = min(t.ratios), max(t.ratios)

    def point(gaps, other):  # at the optima `gaps`; at a second near-optimal lr pair `other`
        seeds = [0, 1, 2]
        g = {"values": gaps, "mean": float(np.mean(gaps))}
        return {"seed_ids": seeds, "gap": g, "closing": g, "censored": {},
                "at_near_lrs": [{"seed_ids": seeds, "gap": gaps, "closing": gaps},
                                {"seed_ids": seeds, "gap": other, "closing": other}]}

    table = {(size, r, k): point([0.5, 0.52, 0.49], [0.5, 0.52, 0.49]) for size in t.sizes
             for r, k in ((lo, "cosine"), (hi, "cosine"), (hi, "constant"))}
    for size in t.sizes:
        table[(size, hi, "wide")] = point([0.9, 0.95, 0.93], [0.4, 0.9, 0.2])  # resolved only at the optima
    seps = {(s["size"], s["name"]): s for s in T.separations(p, table)}
    s = seps[(t.sizes[0], "tokens")]
    assert s["ci"][0] > 0 and s["state"] == "undetermined" and len(s["lr_states"]) > 1
    for size in t.sizes:
        table[(size, hi, "wide")] = point([0.9, 0.95, 0.93], [0.91, 0.94, 0.95])
    s = {(x["size"], x["name"]): x for x in T.separations(p, table)}[(t.sizes[0], "tokens")]
    assert s["state"] == "agrees" and s["lr_states"] == {"agrees": 4}


def test_read_points_on_a_run_whose_validations_miss_the_warmup_and_the_middle():
    assert T.read_points(100, 5, [8, 16, 24, 48, 56, 100]) == {"peak": 0, "mid": 3, "end": 5}
    assert T.read_points(100, 20, [8, 16, 24, 52, 100]) == {"peak": 2, "mid": 3, "end": 4}


def test_the_report_renders_the_part(part):
    from delaylab.reproduce.markdown import _tokens_tables

    text = "\n".join(_tokens_tables(part))
    assert "4x updates, same tokens" in text and "closing" in text
    assert text.count("| nano |") == 4 + 4 + 5  # points, reads, separations


def test_the_preset_trains_and_reports_end_to_end(tmp_path, monkeypatch):
    """ci-tokens at one lr: the real runs (16 short ones), report.md rendered from report.json,
    the figure, and runs.jsonl lines that say each run's schedule, batch and updates."""
    from delaylab.reproduce import reproduce
    from delaylab.reproduce.markdown import markdown

    monkeypatch.setenv("DELAYLAB_CACHE", str(tmp_path / "cache"))
    pre = replace(PRESETS["ci-tokens"], tokens=replace(PRESETS["ci-tokens"].tokens, lrs=(2e-3,)))
    out = tmp_path / "out"
    rep = reproduce(pre, out, jobs=2, progress=False)
    (part,) = rep["parts"]
    assert (out / "report.md").read_text() == markdown(json.loads((out / "report.json").read_text()))
    assert (out / part["figure"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * 2 * 4
    for line in lines:
        kind = line["variant"].rsplit("-", 1)[1]
        assert line["lr_schedule"] == ("constant" if kind == "constant" else "cosine")
        assert line["batch_size"] == (8 if kind == "wide" else 2)
        assert line["val_curve"][-1][0] == line["tokens"] == line["steps"] * line["batch_size"] * 32
    r = {(x["tokens_per_param"], x["kind"]): x for x in part["rows"]}
    assert r[(0.4, "wide")]["updates"] == r[(0.1, "cosine")]["updates"]
    # a gap recomputed from runs.jsonl's curves
    cos = [x for x in lines if x["variant"] == "tokens-nano-0.4tpp-cosine"]
    by = {(x["mode"], x["seed"]): x["val_loss"] for x in cos}
    assert r[(0.4, "cosine")]["gap"]["values"] == pytest.approx([by[("delayed", s)] - by[("sync", s)] for s in (0, 1)])
