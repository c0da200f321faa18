"""docs/predict.md and its figure, from the harness's result; every sentence that reads the data
is a row of :func:`readings`.

A reading is ``{"key", "statement", "interval", "region", "verdict"}``: the sentence, the 95%
interval it rests on, the region it claims, and :func:`delaylab.reproduce.verdicts.state` of the
two. A count compared with a baseline's on the same cells is the sum over cells of the per-cell
difference of hits (1 where the predictor is within x2 and the baseline is not, -1 the other way),
with the t interval of its mean times the number of cells; a count against a goal, the t interval
of the hit rate times the cells. Spearman's rho has no interval here (the project's intervals are
t, Welch and Fieller): a reading on it is undetermined by the rule, and says only the two values.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np

from delaylab import stats
from delaylab.predict import metrics as M
from delaylab.predict.cells import pilot_updates
from delaylab.predict.pilot import pilot as _val_pilot
from delaylab.predict.pilot import pilot_dense as _dense_pilot
from delaylab.reproduce.verdicts import UNDETERMINED, state

DENSE, _VAL_PILOT = _dense_pilot().name, _val_pilot().name  # the pilot candidates the dense paragraph compares

GREY = "0.6"


def _hits(cells: list[dict], name: str, what: str, preds_key: str = "predictions") -> list[int]:
    return [int(M.per_cell(c[preds_key].get(name), c["measured"])[what]) for c in cells]


def count_difference(a: list[int], b: list[int]) -> dict:
    """Sum of ``a - b`` over cells and the t interval of its mean, times the cells."""
    d = [x - y for x, y in zip(a, b)]
    ci = stats.t_interval(d)
    n = len(d)
    return {"value": sum(d), "interval": None if ci is None else [ci[0] * n, ci[1] * n]}


def count_interval(hits: list[int]) -> list | None:
    """Clopper-Pearson's exact 95% interval of the number of hits among the cells (a t interval of 0/1
    values collapses to a point where every cell is a hit, and under-covers near 0 or all)."""
    from scipy.stats import binomtest

    if not hits:
        return None
    ci = binomtest(sum(hits), len(hits)).proportion_ci(confidence_level=0.95, method="exact")
    return [ci.low * len(hits), ci.high * len(hits)]


DIFF_RULE = "95% t interval of the per-cell difference of hits (1, 0 or -1), times the cells"
COUNT_RULE = "Clopper-Pearson's exact 95% interval of the number of hits"


def _row(key, statement, interval=None, region=None, measured=None, rule="") -> dict:
    """One reading; ``region`` as a list (as score.json keeps it), None for a reading that claims no region;
    ``measured`` the count it reads, ``rule`` how its interval was formed."""
    verdict = state(interval, region) if region is not None else UNDETERMINED
    return {"key": key, "statement": statement, "interval": interval,
            "region": None if region is None else list(region), "verdict": verdict, "measured": measured,
            "rule": rule}


def _iv(iv, spec="+.1f") -> str:
    return "no interval" if iv is None else f"[{format(iv[0], spec)}, {format(iv[1], spec)}]"


def _beats(key, cells, name, base, what, label, fold_text, preds_key="predictions"):
    a, b = _hits(cells, name, what, preds_key), _hits(cells, base, what, preds_key)
    d = count_difference(a, b)
    words = {"within_x2": "within x2", "inside": "inside the cell's 95% interval"}[what]
    return _row(key, f"{label}: {name} has {sum(a)} of {len(cells)} cells {words}, {base} {sum(b)} ({fold_text}); "
                     f"the difference {d['value']:+d} cells, 95% t {_iv(d['interval'])}", d["interval"], (0, None),
                d["value"], DIFF_RULE)


def _goal(key, cells, name, what, goal, label):
    hits = _hits(cells, name, what)
    iv = count_interval(hits)
    words = {"within_x2": "within x2", "inside": "inside the cell's 95% interval"}[what]
    return _row(key, f"{label}: {name} is {words} in {sum(hits)} of {len(cells)} cells, exact 95% {_iv(iv)} "
                     f"against the goal of at least {goal}", iv, (goal, None), sum(hits), COUNT_RULE)


def readings(result: dict, fresh: dict | None = None, fresh2: dict | None = None) -> list[dict]:
    """Every reading of the data docs/predict.md makes, as rows (module doc)."""
    s, cells = result["summary"], result["cells"]
    sync, pilot = s["sync_only"], s["pilot"]
    nqm = [c for c in cells if c["report"] in s["nqm_reports"]]
    lor = "leave one report out"
    sc = s["scores"]["report"]
    out = [
        _beats("sync_vs_gap_per_tau_x2", cells, sync, "per-optimizer gap/tau", "within_x2", "sync-only", lor),
        _row("sync_vs_gap_per_tau_rho", f"sync-only: Spearman's rho over cells {sc[sync]['spearman']:.2f} for {sync}, "
                                        f"{sc['per-optimizer gap/tau']['spearman']:.2f} for per-optimizer gap/tau ({lor})"),
        _goal("sync_goal_x2", nqm, sync, "within_x2", 150, f"sync-only on the NQM score's {len(nqm)} cells"),
        _row("sync_goal_rho", f"sync-only on the NQM score's {len(nqm)} cells: Spearman's rho "
                              f"{sc[sync]['nqm_cells']['spearman']:.2f} against the goal of 0.8"),
        _beats("pilot_vs_held20_x2", cells, pilot, "pilot held, 20%", "within_x2", "pilot", lor),
        _beats("pilot_vs_held20_inside", cells, pilot, "pilot held, 20%", "inside", "pilot", lor),
        _goal("pilot_goal_x2", nqm, pilot, "within_x2", 170, f"pilot on the NQM score's {len(nqm)} cells"),
        _goal("pilot_goal_inside", nqm, pilot, "inside", 130, f"pilot on the NQM score's {len(nqm)} cells"),
    ]
    if DENSE in sc:  # the dense pilot, whether named or not: does a pilot with more points close the gap?
        out += [_beats("dense_vs_held20_x2", cells, DENSE, "pilot held, 20%", "within_x2", "dense pilot", lor),
                _beats("dense_vs_held20_inside", cells, DENSE, "pilot held, 20%", "inside", "dense pilot", lor)]
    fl = s["floor"]
    out.append(_row("floor", f"seed-noise floor: half the seeds predict the other half within x2 in {fl['within_x2']:.1f} "
                             f"of {fl['cells']} cells on average, inside its interval in {fl['inside']:.1f}, "
                             f"Spearman's rho {fl['spearman']:.2f}"))
    cor = s["corrector"]
    out.append(_corrector_resolved(cor))
    if cor["resolved"]:
        right = [int(r["chosen"] == r["best"]) for r in cor["rows"] if r["resolved"]]
        base = [int(r["baseline"] == r["best"]) for r in cor["rows"] if r["resolved"]]
        iv = count_interval(right)
        out.append(_row("corrector_goal", f"which corrector: the chooser picks the best of the measured correctors in "
                                          f"{sum(right)} of the {len(right)} settings whose best is resolved, exact 95% "
                                          f"{_iv(iv)} against the goal of 80% ({0.8 * len(right):.1f})", iv,
                        (0.8 * len(right), None), sum(right), COUNT_RULE))
        d = count_difference(right, base)
        out.append(_row("corrector_vs_majority", f"which corrector: the chooser is right {d['value']:+d} settings more "
                                                 f"often than always picking the held-in settings' most frequent best "
                                                 f"({sum(base)} of {len(base)}), 95% t {_iv(d['interval'])}",
                        d["interval"], (0, None), d["value"], DIFF_RULE))
    out = _headlines(result, out) + out
    for grid, key, label in ((fresh, "fresh", "fresh cells"), (fresh2, "fresh2", "second fresh grid")):
        if grid is not None:
            out += _fresh_readings(grid, sync, pilot, key, label)
    return out


def _fresh_readings(grid: dict, sync: str, pilot: str, key: str, label: str) -> list[dict]:
    """The readings of one fresh grid (``key``: their keys' prefix, ``label``: how the page names it)."""
    fc, fs = grid["cells"], grid["summary"]
    rows = [_beats(f"{key}_sync_vs_gap_per_tau_x2", fc, sync, "per-optimizer gap/tau", "within_x2",
                   f"{label}, sync-only", "fitted on every committed cell"),
            _beats(f"{key}_pilot_vs_held20_x2", fc, pilot, "pilot held, 20%", "within_x2",
                   f"{label}, pilot", "fitted on every committed cell"),
            _beats(f"{key}_pilot_vs_held20_inside", fc, pilot, "pilot held, 20%", "inside",
                   f"{label}, pilot", "fitted on every committed cell")]
    rows += _fresh_headlines(grid, rows, key, label)
    rows.append(_row(f"{key}_rho", f"{label}: Spearman's rho {_f(fs['scores'][sync]['spearman'])} for {sync}, "
                                   f"{_f(fs['scores']['per-optimizer gap/tau']['spearman'])} for per-optimizer gap/tau, "
                                   f"{_f(fs['scores'][pilot]['spearman'])} for {pilot}"))
    return rows


def _headlines(result: dict, rows: list[dict]) -> list[dict]:
    """One row per target of the request: met or missed on these cells (the counts themselves), with
    the interval, region and verdict of the reading it rests on."""
    s = result["summary"]
    sc = s["scores"]["report"]
    sync, pilot = s["sync_only"], s["pilot"]
    base, held = sc["per-optimizer gap/tau"], sc["pilot held, 20%"]
    a, p = sc[sync], sc[pilot]
    qa, qp, qb, qh = a["nqm_cells"], p["nqm_cells"], base["nqm_cells"], held["nqm_cells"]
    by = {r["key"]: r for r in rows}

    def head(key, met, statement, on):
        r = by[on]
        return {"key": key, "statement": statement, "interval": r["interval"], "region": r["region"],
                "verdict": r["verdict"], "headline": True, "met": bool(met)}

    n, m = s["cells"], s["nqm_cells"]
    beats = a["within_x2"] > base["within_x2"] and (a["spearman"] or -1) > (base["spearman"] or -1)
    goal = qa["within_x2"] >= 150 and (qa["spearman"] or -1) >= 0.8
    pbeats = p["within_x2"] > held["within_x2"] and p["inside"] > held["inside"]
    pgoal = qp["within_x2"] >= 170 and qp["inside"] >= 130
    out = [
        head("target_sync_beats", beats,
             f"sync-only ({sync}) against per-optimizer gap/tau, leave one report out: within x2 in {a['within_x2']} "
             f"vs {base['within_x2']} of {n} cells ({qa['within_x2']} vs {qb['within_x2']} of the {m}), Spearman "
             f"{_f(a['spearman'])} vs {_f(base['spearman'])} ({_f(qa['spearman'])} vs {_f(qb['spearman'])})",
             "sync_vs_gap_per_tau_x2"),
        head("target_sync_goal", goal,
             f"sync-only goal (within x2 in 150 or more of the {m} cells, Spearman 0.8 or more): {qa['within_x2']} "
             f"and {_f(qa['spearman'])}", "sync_goal_x2"),
        head("target_pilot_beats", pbeats,
             f"pilot ({pilot}) against the gap at 20% held, leave one report out: within x2 in {p['within_x2']} vs "
             f"{held['within_x2']} of {n} cells ({qp['within_x2']} vs {qh['within_x2']} of the {m}), inside the "
             f"cell's interval {p['inside']} vs {held['inside']} ({qp['inside']} vs {qh['inside']})",
             "pilot_vs_held20_x2"),
        head("target_pilot_goal", pgoal,
             f"pilot goal (within x2 in 170 or more of the {m} cells, inside in 130 or more): {qp['within_x2']} "
             f"and {qp['inside']}", "pilot_goal_x2"),
    ]
    if "corrector_goal" in by:
        cor = s["corrector"]
        out.append(head("target_corrector", cor["right"] >= 0.8 * cor["resolved"],
                        f"which corrector (right in 80% or more of the settings whose best is resolved): "
                        f"{cor['right']} of {cor['resolved']}; always picking the held-in settings' most frequent "
                        f"best (EF) is right in {cor['baseline_right']}", "corrector_goal"))
    return out


def _fresh_headlines(fresh: dict, rows: list[dict], key: str = "fresh", label: str = "fresh cells") -> list[dict]:
    """The two beats-the-baseline targets again, on a fresh grid's cells (counts there, readings of them)."""
    fs = fresh["summary"]
    sc = fs["scores"]
    by = {r["key"]: r for r in rows}
    a, b = sc[fs["sync_only"]], sc["per-optimizer gap/tau"]
    p, h = sc[fs["pilot"]], sc["pilot held, 20%"]
    n = fs["cells"]
    sync_met = a["within_x2"] > b["within_x2"] and (a["spearman"] or -1) > (b["spearman"] or -1)
    pilot_met = p["within_x2"] > h["within_x2"] and p["inside"] > h["inside"]
    return [
        {**{k: by[f"{key}_sync_vs_gap_per_tau_x2"][k] for k in ("interval", "region", "verdict")},
         "key": f"target_{key}_sync_beats", "headline": True, "met": sync_met,
         "statement": f"{label}, sync-only ({fs['sync_only']}) against per-optimizer gap/tau: within x2 in "
                      f"{a['within_x2']} vs {b['within_x2']} of {n}, Spearman {_f(a['spearman'])} vs {_f(b['spearman'])}"},
        {**{k: by[f"{key}_pilot_vs_held20_x2"][k] for k in ("interval", "region", "verdict")},
         "key": f"target_{key}_pilot_beats", "headline": True, "met": pilot_met,
         "statement": f"{label}, pilot ({fs['pilot']}) against the gap at 20% held: within x2 in {p['within_x2']} "
                      f"vs {h['within_x2']} of {n}, inside {p['inside']} vs {h['inside']}"},
    ]


def _nearest_lrs(cells: list[dict], optimizer: str, lrs) -> str:
    have = sorted({c["lr"] for c in cells if c["optimizer"] == optimizer})
    return f"{optimizer} " + ", ".join(f"{min(have, key=lambda h: abs(math.log(h / x))):g}" for x in lrs)


def _issue_agreement(it: dict, scores: dict) -> str:
    """Which recomputed baselines equal the quoted numbers in every count, and over how many cells the
    pilots' Spearman is taken."""
    same = [n for n, q in it["quoted"].items()
            if all(it["measured"][n][k] == q[k] for k in ("within_x2", "inside", "sign"))]
    pilots = [n for n in it["quoted"] if n.startswith("pilot held")]
    return (f"Equal in every count to the quoted numbers: {', '.join(same) or 'none'}. The pilots' Spearman is over "
            f"the {scores[pilots[0]]['nqm_cells']['predicted']} of the 193 cells with a validation in the pilot.")


def _corrector_resolved(cor: dict) -> dict:
    """What the resolved settings measured and which corrector was best in them (descriptive)."""
    res = [r for r in cor["rows"] if r["resolved"]]
    measured = sorted({" / ".join(r["measured"]) for r in res})
    best = {}
    for r in res:
        best[r["best"]] = best.get(r["best"], 0) + 1
    four = [r for r in cor["rows"] if len(r["measured"]) >= 3]
    return _row("corrector_resolved",
                f"The resolved settings measured {', '.join(measured) or 'nothing'}; their best: "
                + ", ".join(f"{k} in {v}" for k, v in sorted(best.items()))
                + f"; of the {len(four)} settings with three or more correctors measured, "
                  f"{sum(r['resolved'] for r in four)} resolved")


def _f(x, spec=".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def _n(x) -> str:
    return "n/a" if x is None else (f"{x:.1f}" if isinstance(x, float) and not float(x).is_integer() else f"{int(x)}")


def score_table(scores: dict, cells: int, floor: dict | None = None, subset: str | None = "nqm_cells") -> list[str]:
    """One row per predictor: the counts, median |log ratio|, rho, coverage; the 193-cell subset beside
    (``subset``: its key in the scores; None: no such column)."""
    head = "| predictor | kind | within x2 | inside 95% | right sign | median abs log ratio | Spearman | own interval covers |"
    lines = [head + (" within x2 / inside / rho on the NQM score's cells |" if subset else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|" if subset else "")]
    for name, s in scores.items():
        tag = f"{name}" if s["kind"] != "baseline" else f"*{name}*"
        row = (f"| {tag} | {s['kind']} | {s['within_x2']} | {s['inside']} | {s['sign']} | "
               f"{_f(s['median_abs_log'])} | {_f(s['spearman'])} | {_n(s['covered'])} |")
        if subset:
            q = s.get(subset) or {}
            row += f" {_n(q.get('within_x2'))} / {_n(q.get('inside'))} / {_f(q.get('spearman'))} |"
        lines.append(row)
    if floor is not None:
        lines.append(f"| seed-noise floor (half the seeds) | - | {floor['within_x2']:.1f} | {floor['inside']:.1f} | "
                     f"{floor['sign']:.1f} | {_f(floor['median_abs_log'])} | {_f(floor['spearman'])} | - |"
                     + (" |" if subset else ""))
    lines.append("")
    lines.append(f"Counts of {cells} cells; a cell without a prediction counts as a miss; median abs log ratio n/a: "
                 "half the cells or more without a prediction or of the wrong sign. *Baselines* in italics.")
    return lines


def figure(result: dict, path, fresh: dict | None = None) -> None:
    """Predicted against measured end gap on log axes: the named sync-only predictor and the pilot in
    colour, the baselines beside each in grey; gaps at or below 1e-3 (five measured ones are negative)
    are drawn at 1e-3 as open markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, cells = result["summary"], result["cells"]
    panels = [(s["sync_only"], ["per-optimizer gap/tau", "median of the other cells"], "C0"),
              (s["pilot"], ["pilot held, 20%", "pilot held, 10%"], "C1")]
    fig, axes = plt.subplots(1, len(panels), figsize=(12, 5.5), sharex=True, sharey=True)
    lo = 1e-3
    for ax, (name, bases, color) in zip(axes, panels):
        for base, marker in zip(bases, ("s", "^")):
            _scatter(ax, cells, base, GREY, marker, f"{base} (baseline)", lo)
        _scatter(ax, cells, name, color, "o", f"{name}, leave one report out", lo)
        if fresh is not None:
            _scatter(ax, fresh["cells"], name, "C3", "D", f"{name}, fresh cells", lo)
        t = np.geomspace(lo, 2, 50)
        ax.plot(t, t, "k-", lw=0.7)
        ax.fill_between(t, t / 2, t * 2, color="k", alpha=0.07, label="within x2")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured end gap (delayed - sync val loss)")
        ax.set_title(name)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("predicted end gap (held out)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _scatter(ax, cells, name, color, marker, label, lo):
    xs, ys, clipped = [], [], []
    for c in cells:
        p = c["predictions"].get(name)
        if p is None or not math.isfinite(p):
            continue
        m = c["measured"]["gap"]
        xs.append(max(m, lo))
        ys.append(max(p, lo))
        clipped.append(m <= lo or p <= lo)
    xs, ys, clipped = np.array(xs), np.array(ys), np.array(clipped, bool)
    ax.scatter(xs[~clipped], ys[~clipped], s=12, c=color, marker=marker, alpha=0.7, label=label, linewidths=0)
    ax.scatter(xs[clipped], ys[clipped], s=14, facecolors="none", edgecolors=color, marker=marker, alpha=0.7)


def _reading(rows: list[dict], key: str) -> str:
    return _line(next(x for x in rows if x["key"] == key))


def _marked(r: dict) -> str:
    """A scored reading between the claims registry's markers (its id: :func:`claim_id`), others as text."""
    return _line(r) if r["region"] is None else f"<!-- claim:{claim_id(r)} -->{_line(r)}<!-- /claim -->"


def claim_id(r: dict) -> str:
    return f"predict.{r['key']}"


def claims(root) -> list:
    """The scored readings of docs/predict.md as claims of the registry (:class:`delaylab.reproduce.claims.Claim`),
    read from the committed docs/predict/score.json: one per reading that claims a region (the headlines
    repeat theirs and are not listed again); its text is the page's sentence."""
    from pathlib import Path

    from delaylab.reproduce import verdicts as V
    from delaylab.reproduce.claims import Claim

    rows = json.loads((Path(root) / "docs/predict/score.json").read_text())["summary"]["readings"]
    out = []
    for r in rows:
        if r["region"] is None or r.get("headline"):
            continue
        sc = V.score(r["statement"], r["interval"], tuple(r["region"]), measured=r["measured"])
        report = ("docs/predict/fresh-2.json" if r["key"].startswith("fresh2") else
                  "docs/predict/fresh.json" if r["key"].startswith("fresh") else "docs/predict/score.json")
        out.append(Claim(claim_id(r), report, r["statement"], r["interval"], r["region"], r["verdict"], r["measured"],
                         r["rule"], V.why(sc), _line(r)))
    return out


def _line(r: dict) -> str:
    """A reading as text: a scored one with its verdict; one that claims no region (a description, or
    a value without an interval) says so."""
    if r["region"] is None:
        return f"{r['statement']} (no region claimed, not scored)"
    return f"{r['statement']} -> **{r['verdict']}**"


def validations_within(cell: dict, fraction: float) -> int:
    """How many of the cell's gap-curve validations a pilot of ``fraction`` of the updates holds
    (the cut of :func:`delaylab.predict.cells.pilot_view`)."""
    last = pilot_updates(cell["steps"], fraction)
    return sum(u <= last for u, _ in cell["measured"]["curve"])


def _fresh_section(grid: dict | None, sync: str, pilot: str, name: str, later) -> list[str]:
    """One fresh grid's score table and per-cell predictions."""
    if grid is None:
        return ["Not scored yet.", ""]
    fs = grid["summary"]
    L = [f"{fs['runs']} runs, {fs['cells']} cells (`docs/predict/{name}/runs.jsonl`); every predictor fitted on "
         "all committed cells:", ""]
    L += score_table(fs["scores"], fs["cells"], fs["floor"], subset=None)
    later = [n for n in later if n in fs["scores"]]
    if later:
        L += ["", "Written after this grid had run and been scored, so listed here but not tested clean by it: "
              + ", ".join(later) + "."]
    L += ["", "| cell | measured (95% t) | " + f"{sync} | {pilot} | per-optimizer gap/tau | pilot held, 20% |",
          "|---|---|---|---|---|---|"]
    for c in grid["cells"]:
        m, p = c["measured"], c["predictions"]
        L.append(f"| {c['id']} | {m['gap']:+.3f} {_iv(m['ci'], '+.3f')} | {_f(p[sync], '+.3f')} | "
                 f"{_f(p[pilot], '+.3f')} | {_f(p['per-optimizer gap/tau'], '+.3f')} | "
                 f"{_f(p['pilot held, 20%'], '+.3f')} |")
    return L + [""]


def pilot_holds(cells: list[dict], fraction: float, scores: dict) -> list[str]:
    """Why a pilot has little to extrapolate from: how many validations it holds, per cell; and what
    the dense pilot, which holds more, scored (``scores``: the primary fold's)."""
    def counts(f):
        n = Counter(validations_within(c, f) for c in cells)
        return ", ".join(f"{k} in {v}" for k, v in sorted(n.items()))

    sizes = [len(c["measured"]["curve"]) for c in cells if c["measured"]["curve"]]
    one_two = sum(validations_within(c, fraction) == 1 and validations_within(c, 0.2) == 2 for c in cells)
    return [f"What a pilot has to go on: the committed runs validate {min(sizes)} to {max(sizes)} times each, so "
            f"the first {fraction:.0%} of the updates hold this many validations of the gap per cell: "
            f"{counts(fraction)} (of {len(cells)} cells); the first 20% hold {counts(0.2)}. In {one_two} cells the pilot "
            "extrapolates one noisy point where the 20% baseline holds two.", ""] + _dense_lines(scores)


def _agreement_lines(agree: dict) -> list[str]:
    """Whether the reruns are the committed runs: their validations compared at the same updates."""
    if not agree:
        return []
    same = [r for r, a in agree.items() if a["equal"] == a["compared"]]
    other = [f"{r} ({a['equal']} of {a['compared']}; the rest within a relative {a['max_rel']:.1e})"
             for r, a in agree.items() if a["equal"] != a["compared"]]
    return ["The reruns are the committed runs' first updates: their validations equal the committed runs' at the "
            f"same updates bit for bit in {', '.join(same)}" + (f"; not bit for bit in {', '.join(other)}: same config "
                                                                "and threads, and the difference grows with the "
                                                                "pilot's length, as float-level differences amplified "
                                                                "by training do (its runs were made in another "
                                                                "session; the CPU it ran on was not recorded)"
                                                                if other else "")
            + ".", ""]


def _dense_lines(scores: dict) -> list[str]:
    if DENSE not in scores:
        return []
    d, v, h = scores[DENSE], scores[_VAL_PILOT], scores["pilot held, 20%"]
    return [f"A dense pilot holds more: every run of the cells had its first 10% rerun with its train loss logged at "
            "every update (`python -m delaylab.predict.pilots`, docs/predict/pilots/), "
            "and the sync and delayed runs of a seed draw the same batches, so their paired train-loss gap along the "
            f"pilot's window stands in for the one validation (**{DENSE}**, the same tau law of the settings). Its "
            f"counts: within x2 in {d['within_x2']} cells, inside in {d['inside']}, Spearman's rho {_f(d['spearman'])}; "
            f"the validation pilot law's {v['within_x2']}, {v['inside']}, {_f(v['spearman'])}; the gap at 20% held "
            f"{h['within_x2']}, {h['inside']}, {_f(h['spearman'])}. Its readings against the 20% baseline are above.", ""]


def markdown(result: dict, fresh: dict | None, fitted: dict, fresh2: dict | None = None) -> str:
    """docs/predict.md: the targets first (met or missed, with the numbers), then the tables."""
    from delaylab.predict import fresh as F
    from delaylab.predict.harness import FOLDS, PRIMARY

    s, cells = result["summary"], result["cells"]
    rows = s["readings"]
    sync, pilot = s["sync_only"], s["pilot"]
    sc = s["scores"][PRIMARY]
    nqm_n = s["nqm_cells"]
    by = {}
    for c in cells:
        by[c["report"]] = by.get(c["report"], 0) + 1
    L = ["# Predicting the delay gap before paying for it", "",
         "What will a delay (PipeDream-2BW's one step, PipeDream's per-stage delays, any tau) cost in final "
         "validation loss, and which corrector should go with it, before the delayed run is paid for? This page "
         "scores predictors of the end gap (delayed minus sync val loss, paired by seed) on every delayed cell of "
         "the committed reports, each predicted with its own report held out, beside the cheap answers a user "
         "gets without any model. `delaylab predict score` regenerates every number here "
         "(docs/predict/score.json has every cell and prediction).", "",
         "## The targets, first", ""]
    heads = [x for x in rows if x.get("headline")]
    for x in sorted(heads, key=lambda x: x["met"]):
        L.append(f"- **{'met' if x['met'] else 'missed'}** on these cells: {x['statement']}.")
    L += ["", "Met or missed is the count on these cells. Whether it would hold on other cells is the reading "
          "each rests on, below, with its 95% t interval and verdict (agrees: the interval lies inside the claimed "
          "region; disagrees: outside it; undetermined: it straddles an edge); Spearman's rho has no interval "
          "here, so no verdict rests on it:", ""]
    for x in rows:
        if not x.get("headline") and not x["key"].startswith("fresh"):
            L.append(f"- {_marked(x)}")
    L.append("")
    if fresh is not None:
        L += ["Fresh cells (grids no predictor had seen when it was frozen, each scored once: the first "
              "[below](#fresh-cells-scored-once), the second [below](#second-fresh-grid-scored-once)):", ""]
        for x in rows:
            if x["key"].startswith("fresh") and not x.get("headline"):
                L.append(f"- {_marked(x)}")
        L.append("")
    else:
        L += ["The fresh cells (a grid no predictor has seen) have not been scored yet.", ""]
    L += pilot_holds(cells, s["pilot_fraction"], sc) + _agreement_lines(s.get("pilots_agree") or {})
    L += ["## The score (leave one report out)", "",
          f"{s['cells']} cells: " + ", ".join(f"{r} {n}" for r, n in sorted(by.items())) + ". "
          f"The NQM score's {nqm_n} cells ({', '.join(s['nqm_reports'])}; the goals count on them) are "
          f"the last column; the other {s['cells'] - nqm_n} come from "
          + ", ".join(r for r in sorted(by) if r not in s["nqm_reports"])
          + " (moe-cpu: the dense and MoE runs of docs/beyond.md), whose paired sync runs the NQM score did not read. "
          f"Named by the harness's rule (most cells within x2 of its kind, then Spearman): sync-only **{sync}**, "
          f"pilot **{pilot}** (the first {s['pilot_fraction']:.0%} of the updates).", ""]
    L += score_table(sc, s["cells"], s["floor"])
    L += ["", "![predicted vs measured end gap](predict/predicted_vs_measured.png)", "",
          "The seed-noise floor is how well half of a cell's seeds predict the other half (expected counts over "
          "every split; inside counts only cells with 4 seeds or more, against the other half's own interval). "
          "Half the seeds are noisier than all of them, so it is what seed noise alone allows at these seed "
          "counts, not a bound a predictor scored against the full cell cannot pass.", ""]
    L += ["## The baselines, recomputed on the 193 cells", "",
          "The harness's baselines on the NQM score's cells alone (leave one of their three reports out), beside "
          "the numbers the request for this harness quoted:", "",
          "| baseline | within x2 (quoted) | inside (quoted) | right sign (quoted) | Spearman (quoted) | "
          "Spearman, ties ranked in cell order: this page's, the NQM score's |",
          "|---|---|---|---|---|---|"]
    it = s["issue_table"]
    for name, q in it["quoted"].items():
        m = it["measured"][name]
        L.append(f"| {name} | {m['within_x2']} ({q['within_x2']}) | {m['inside']} ({q['inside']}) | {m['sign']} "
                 f"({q['sign']}) | {_f(m['spearman'])} ({q['spearman']:+.2f}) | {_f(m['spearman_ties_in_order'], '+.2f')}, "
                 f"{_f(m['spearman_ties_in_nqm_order'], '+.2f')} |")
    L += ["", "Where they differ: a constant has no Spearman's rho (every rank ties, and an average rank for ties "
          "leaves nothing to correlate); ranking tied predictions in the order the cells happen to be listed "
          "gives one, and which one depends on that order (the last column, in two orders). The per-optimizer gap/tau baseline counts as \"no corrector\" "
          "every cell with correction none (the sync-start and sync-cooldown cells among them) and falls back to "
          "the median over all optimizers for an optimizer no held-in cell has (Lion, SOAP, Adan and MARS, all in "
          "cpu-small); the quoted numbers came from another such choice. "
          + _issue_agreement(it, s["scores"][PRIMARY]), ""]
    L += ["## The candidates", ""]
    for name, v in sc.items():
        L.append(f"- **{name}** ({v['kind']}): {v['about']}.")
    L += ["", "The fitted ones are ridge regressions in log gap (a measured gap below 0.01 fitted as 0.01), their "
          "penalty chosen by leave-one-report-out among the held-in cells alone; their interval is the 95% t band "
          "of those held-in residuals. Features: `delaylab/predict/features.py`.", ""]
    for fold in FOLDS:
        if fold == PRIMARY or fold not in s["scores"]:
            continue
        L += [f"## Leave one {fold} out", ""]
        L += score_table(s["scores"][fold], s["cells"])
        L.append("")
    cor = s["corrector"]
    L += ["## Which corrector", "",
          f"{cor['settings']} settings have two or more of none / EF / prediction / EF + prediction measured; in "
          f"{cor['resolved']} the best one is resolved (its per-seed difference to every other has a 95% t interval "
          "above 0). " + next(x for x in rows if x["key"] == "corrector_resolved")["statement"] + ".", "",
          "| report | setting | measured | best (resolved) | chooser | majority baseline |", "|---|---|---|---|---|---|"]
    for r in cor["rows"]:
        st = r["setting"]
        L.append(f"| {r['report']} | {st[1]} {st[2]} lr {st[3]:g} | "
                 + ", ".join(f"{k} {v:+.3f}" for k, v in sorted(r["gaps"].items()))
                 + f" | {r['best']}{' (yes)' if r['resolved'] else ''} | {r['chosen']} | {r['baseline']} |")
    L.append("")
    L += ["## Fresh cells, scored once", "",
          f"The predictors were frozen at commit `{F.FROZEN}` (fitted.json is their fit on every committed cell, "
          "written from that code before any fresh run finished). Then one grid no predictor had seen ran, "
          "different from every committed one in three ways at once: delays of "
          + " and ".join(str(t) for t in F.DELAYS) + " (the reports' mean delays: "
          + ", ".join(f"{t:g}" for t in sorted({c["mean_delay"] for c in cells})) + "), lrs no committed cell of the optimizer has ("
          + "; ".join(f"{o} " + ", ".join(f"{x:g}" for x in v) for o, v in F.LRS.items()) + "; the nearest committed: "
          + "; ".join(_nearest_lrs(cells, o, v) for o, v in F.LRS.items())
          + f") and a batch of {F.BATCH} sequences (the reports': "
          + ", ".join(str(b) for b in sorted({c["batch_size"] for c in cells})) + "); cpu-delays' model and length "
          f"(the small GPT, context 64, 220 updates), sync, delayed at every delay and EF at tau 3, {F.SEEDS} seeds. "
          "Trimmed to fit about an hour of the shared 2-core host: two lrs per optimizer, EF only at tau 3, no "
          "weight prediction, one run length.", ""]
    L += _fresh_section(fresh, sync, pilot, F.NAME, F.LATER)
    g = F.GRID_2
    L += ["## Second fresh grid, scored once", "",
          "The pilot ratio law was written after reading the pilot law's held-out errors report by report (it "
          "over-predicted Muon's gaps in cpu-delays, the one report with mean delays of 2 to 8), so its "
          "leave-one-report-out score flatters it; and the first fresh grid had been scored by then, so that grid is "
          f"no clean test of it either. The predictors were frozen again at commit `{F.FROZEN_2}`, with the pilot "
          "ratio law named, "
          "and a second grid ran, new in four ways at once: delays of "
          + " and ".join(str(t) for t in g["delays"]) + ", lrs "
          + "; ".join(f"{o} " + ", ".join(f"{x:g}" for x in v) for o, v in g["lrs"].items())
          + f" (a factor 2^(1/4) below the reports' lattice points), a batch of {g['batch']} sequences and "
          f"{g['steps']} updates; the same small GPT, sync, delayed at every delay and EF at tau "
          f"{next(t for t, m in g['delays'].items() if 'ef' in m)}, {F.SEEDS} seeds.", ""]
    L += _fresh_section(fresh2, sync, pilot, F.NAME_2, ())
    L += ["## What the predictors saw", "",
          "No prediction of a held-out cell reads its delayed runs beyond the pilot's fraction: the harness hands "
          "a predictor a view of the cell (the settings and sync runs; for a pilot, every run cut at its fraction), "
          "never the cell, and a test plants a wrong measured gap and wrong late curve points into a held-out cell "
          "and checks that the named predictions do not move (`tests/predict/test_predict_honesty.py`). Fits read "
          "only the held-in cells of their fold. What did read the held-out scores: the choice of features, of "
          "the candidates, and the rule that names the winners were made while looking at these leave-one-report-out "
          "scores, so they flatter the winners somewhat; the fresh cells are the clean test.", "",
          "## Commands", "",
          "```",
          "delaylab predict score                     # this page, docs/predict/score.json, the figure, fitted.json",
          "python -m delaylab.predict.fresh --out DIR  # the fresh grid (resumable); then",
          "delaylab predict score --fresh DIR          # scores it once",
          "python -m delaylab.predict.fresh --grid fresh-2 --out DIR2  # the second grid; --fresh2 DIR2 scores it",
          "python -m delaylab.predict.pilots --out DIR # the dense pilots (resumable; about 30 min on 2 cores)",
          "delaylab predict gap --sync RUN_DIR --delay 2 [--correction ef] [--json]",
          "delaylab predict pilot --sync RUN_DIR --delayed RUN_DIR --steps N [--json]",
          "delaylab llm train ... --delay 1 --predict-at 0.1 --predict-sync SYNC_PILOT --out DIR  # a pilot, then pilot",
          "```", "",
          "A pilot is the run with its full schedule stopped early (`llm train --steps N --stop-at K`, or "
          "`--predict-at F`); the sync pilot is the same command with `--delay 0`. Bad input (a run folder without "
          "a val curve, a pilot longer than the run, mismatched sync and delayed configs) is one line on stderr, "
          "exit 2.", "",
          f"`predict gap` uses {sync} fitted on all {fitted['cells']} cells and quotes its held-out score "
          f"(within x2 on {fitted['sync_only']['held_out']['within_x2']} of {fitted['sync_only']['held_out']['cells']} "
          f"cells, leave one report out); `predict pilot` uses {pilot} "
          f"({fitted['pilot']['held_out']['within_x2']} of {fitted['pilot']['held_out']['cells']}).", ""]
    return "\n".join(L)
