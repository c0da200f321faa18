"""Part 9 of the report: the delay axis (issue 28), from the runs of :func:`delaylab.reproduce.plan.delay_axis`.

At every delay setting (uniform tau, PipeDream's per-stage delays, a random delay) and for each
optimizer and mode (none, EF, weight prediction, EF + prediction, each at its own lr):

- the **gap**: the mode's final val loss minus sync's at its best lr, paired by seed, with its
  95% t interval;
- the **share a corrector recovers**: ``100 (1 - mean corrected gap / mean plain gap)`` over the
  seeds all three have, Fieller's 95% set (unbounded where the plain gap is not resolved from 0;
  :func:`delaylab.llm.metrics.recovery`);
- the **iso-loss token overhead** where the preset measures it: a number only where every seed
  reaches its sync run's final loss (runs up to ``max(overhead_lengths)`` times as long).

The theory beside it (:mod:`delaylab.theory.axis`): the numbers it yields are scored by the one
rule (:mod:`delaylab.reproduce.verdicts`): the lr shift at the tuned settings, delayed against
sync (Adam's stability limit at tau, Theorem 1's bound-optimal eta for Muon) and EF against
delayed (Adam's EF widening); the rest is shown as sketches (the gap's growth with tau if the loss
gap followed Theorem 1's delay term, a random delay through its mean, PipeDream by its mean delay)
or as qualitative rows. The paper's one claim on this axis, 2BW's constant delay beating
PipeDream's at depth 4 and 8, is scored where the setting's model has a 2BW row.
"""

from __future__ import annotations

from delaylab.llm import metrics
from delaylab.reproduce import plan as P
from delaylab.reproduce import predict
from delaylab.reproduce import stats as S
from delaylab.reproduce.findings import pipedream_verdict
from delaylab.reproduce.verdicts import part_states, qualitative, theory_number, verdict
from delaylab.reproduce.presets import Preset

TITLE = "The delay axis: gap, recovery and overhead against tau"


def _losses(rows: list[dict]) -> dict[int, float | None]:
    return {r["seed"]: r["val_loss"] for r in rows}


def _gap_values(sync: dict, other: dict) -> list:
    """Per seed ``other - sync`` over the seeds both have, in seed order (None where one diverged)."""
    return list(_gap_map(sync, other).values())


def _gap_map(sync: dict, other: dict) -> dict[int, float | None]:
    return {s: None if sync[s] is None or other[s] is None else other[s] - sync[s]
            for s in sorted(set(sync) & set(other))}


def _two_bw(p: Preset, setting):
    """The setting on the same model with the 2BW delay (tau = 1), or None."""
    return next((s for s in p.delays.settings if s.delay == 1 and s.model == setting.model), None)


def _theory_point(opt: str, mom, tau: float, steps: int) -> dict | None:
    """:mod:`delaylab.theory.axis` at one tau: the LMO point (Muon) or the Adam point (AdamW)."""
    from dataclasses import asdict

    from delaylab.theory.axis import adam_point, lmo_point

    kind = predict.kind(opt)
    beta, nesterov = predict.direction_beta(opt, mom)
    if kind == "lmo":
        return {"kind": kind, **asdict(lmo_point(beta, tau, nesterov, T=steps))}
    if kind == "adam" and float(tau).is_integer():
        return {"kind": kind, **asdict(adam_point(beta, int(tau)))}
    return None


def censored_lr(L, *keys) -> bool:
    """Whether an lr the delay-axis cells ``keys`` ((setting, optimizer, mode)) ran at rests on an
    optimum at its grid's edge: the cell's own grid, or for an interpolated lr any tuned grid of its
    (optimizer, mode), which the interpolation starts from; sync's for a sync cell."""
    lrs, g = L.delay_axis["lrs"], L.preset.delays
    for setting, opt, mode in keys:
        if mode == "sync":
            if lrs["sync"][opt]["censored"].get("sync"):
                return True
            continue
        info = lrs.get((setting, opt, mode))
        grids = [info["grid"]] if info and info["grid"] else [
            lrs[(n, opt, mode)]["grid"] for n in g.tuned if (n, opt, mode) in lrs]
        if any(gr["censored"].get(mode) for gr in grids):
            return True
    return False


def delays(L) -> dict:
    p, res = L.preset, L.delay_axis
    g = p.delays
    lrs, cells, plans = res["lrs"], res["cells"], res["overhead"]
    steps = g.base["steps"]
    rows, data = [], {}
    for s in g.settings:
        for opt in g.optimizers:
            mom = g.momentum.get(opt)
            sync_rows = L.records(cells[(s.name, opt, "sync")])
            sync = _losses(sync_rows)
            data[(s.name, opt, "sync")] = sync
            sync_grid = lrs["sync"][opt]
            for mode in g.modes_of(s):
                mine_rows = L.records(cells[(s.name, opt, mode)])
                mine = data[(s.name, opt, mode)] = _losses(mine_rows)
                info = lrs[(s.name, opt, mode)]
                row = {"setting": s.name, "delay": list(s.delay) if isinstance(s.delay, tuple) else s.delay,
                       "delay_dist": s.delay_dist, "mean_delay": s.mean_delay, "model": dict(s.model),
                       "optimizer": opt, "mode": mode, "momentum": mom, "lr": info["lr"], "tuned": info["tuned"],
                       "lrs": info["grid"]["lrs"] if info["grid"] else [info["lr"]],
                       "censored": info["grid"]["censored"].get(mode) if info["grid"] else None,
                       "rests_on_censored": censored_lr(L, (s.name, opt, "sync"), (s.name, opt, mode)),
                       "sync_lr": sync_grid["best"]["sync"], "sync_censored": sync_grid["censored"].get("sync"),
                       "sync": S.sample([sync[k] for k in sorted(sync)]), "loss": S.sample([mine[k] for k in sorted(mine)]),
                       "gap": S.sample(_gap_values(sync, mine)), "issues": S.issues_of(sync_rows + mine_rows),
                       "runs": {"sync": [r.folder for r in cells[(s.name, opt, "sync")]],
                                mode: [r.folder for r in cells[(s.name, opt, mode)]]}}
                if mode != "delayed" and "delayed" in g.modes_of(s):
                    rec = metrics.recovery(sync, data[(s.name, opt, "delayed")], mine)
                    row["recovered"] = {k: rec[k] for k in ("ratio_of_means", "ci", "set", "unstable", "n", "values")}
                per = [plans[(s.name, opt, mode, k)] for k in range(g.overhead_seeds)
                       if (s.name, opt, mode, k) in plans]
                if per:
                    o = metrics.overhead_over_seeds([x["overhead"] for x in per],
                                                    max_length=max((1, *g.overhead_lengths)))
                    o["lengths"] = [x["length"] for x in per]
                    o["runs"] = [[r.folder for r in x["runs"]] for x in per]
                    row["overhead"] = o
                rows.append(row)
    by = {(r["setting"], r["optimizer"], r["mode"]): r for r in rows}
    verdicts, numbers = [], []
    verdicts += _schedule_verdicts(p, by, data)
    verdicts += _trend_notes(p, by, data)
    numbers += _lr_numbers(L, lrs, steps)
    numbers += _sketches(p, by, data, steps)
    theory = _theory_rows(p, by, steps)
    uniform = [s for s in g.settings if isinstance(s.delay, int) and not s.model]
    headline = "; ".join(
        f"{opt} gap at tau " + " / ".join(f"{s.delay}" for s in uniform) + ": " + " / ".join(
            S.fmt(by[(s.name, opt, "delayed")]["gap"]["mean"]) for s in uniform) for opt in g.optimizers)
    best = []
    for opt in g.optimizers:
        last = uniform[-1].name
        recs = [(m, by[(last, opt, m)].get("recovered") or {}) for m in g.modes_of(uniform[-1]) if m != "delayed"]
        recs = [(m, r) for m, r in recs if r.get("ratio_of_means") is not None]
        if recs:
            m, r = max(recs, key=lambda x: x[1]["ratio_of_means"])
            best.append(f"{opt} at tau {uniform[-1].delay}: {m} recovers {r['ratio_of_means']:.0f}% {S.ci_text(r, '.0f')}")
    headline += ("; best corrector " + ", ".join(best)) if best else ""
    return {"id": 9, "key": "delays", "title": TITLE,
            "paper": "The paper studies one step of delay; it names multi-step and variable delays as open and "
                     "reports 2BW's constant delay beating PipeDream's per-stage delays at depth 4 and 8.",
            "theory": "Theorem 1 (LMO, Muon): the delay adds 2 L eta tau to the bound, so its relative penalty "
                      "tau/lag is linear in tau and the bound-optimal eta shrinks by sqrt(C_0/C_tau); a random delay "
                      "enters through its mean; EF's bound beats plain delay iff delta_bar < 2/(tau+1). Adam-type "
                      "(frozen preconditioner): the largest stable eta*lambda falls from 38 (sync) to about 1/tau, EF "
                      "widens it by x2.70 at tau 1 and x1.39 at tau 8 (delaylab theory axis).",
            "setup": setup_text(p), "rows": rows, "theory_rows": theory, "verdicts": verdicts,
            "theory_numbers": numbers, "headline": headline, **part_states(verdicts, numbers)}


def _setting_text(g, s) -> str:
    what = ("delay " + ",".join(map(str, s.delay)) if isinstance(s.delay, tuple)
            else s.delay_dist if s.delay_dist else f"tau {s.delay}")
    extra = [] if isinstance(s.delay, int) else [f"mean {s.mean_delay:g}"]
    extra += [f"{k} {v}" for k, v in s.model.items()]
    extra += [f"{g.seeds_of(s)} seeds"] if g.seeds_of(s) != g.seeds else []
    return f"{s.name} ({', '.join([what, *extra])})"


def _reused(g) -> str:
    """The settings on another model that take the base model's lrs (their own are never tuned)."""
    other = [s for s in g.settings if s.model and s.name not in g.tuned]
    if not other:
        return ""
    return (f"; {', '.join(f'{s.name} (' + ', '.join(f'{k} {v}' for k, v in s.model.items()) + ')' for s in other)} "
            f"take the lrs interpolated on the base model, sync's included: none is tuned on its own model")


def setup_text(p: Preset) -> str:
    g = p.delays
    b = g.base
    return (f"{b['preset']} GPT, {b['steps']} updates of {b['batch_size']} x {b['block_size']} tokens; settings: "
            f"{', '.join(_setting_text(g, s) for s in g.settings)}; modes {', '.join(g.modes)}; sync's lr and "
            f"every mode's tuned at {', '.join(g.tuned)} ({g.scan_seeds}-seed grids, grown at an edge up to "
            f"{g.lr_extend} steps per side), interpolated in log mean delay elsewhere (rounded to the factor-2 lr "
            f"lattice){_reused(g)}; {g.seeds} seeds per cell where not stated; iso-loss overhead of "
            f"{', '.join(g.overhead_modes)} at {', '.join(g.overhead) or 'no setting'} on seeds "
            f"0..{g.overhead_seeds - 1}, runs up to {max((1, *g.overhead_lengths)):g}x as long")


def _schedule_verdicts(p: Preset, by: dict, data: dict) -> list[dict]:
    """The paper's claim: 2BW (tau = 1 everywhere) beats PipeDream's per-stage delays at depth >= 4,
    each at its lr, loss difference paired by seed (the same model, the same seeds)."""
    out = []
    for s in p.delays.settings:
        if not isinstance(s.delay, tuple):
            continue
        ref = _two_bw(p, s)
        for opt in p.delays.optimizers:
            if ref is None or (ref.name, opt, "delayed") not in by:
                continue
            diff = S.sample(_gap_values(data[(ref.name, opt, "delayed")], data[(s.name, opt, "delayed")]))
            rows = (by[(s.name, opt, "delayed")], by[(ref.name, opt, "delayed")])
            measured = (f"PipeDream - 2BW = {S.fmt(diff['mean'])} {S.ci_text(diff)} over {diff['n']} seeds "
                        f"({ref.name} vs {s.name})")
            out.append(pipedream_verdict(opt, list(s.delay), diff, measured, rows[0]["issues"] + rows[1]["issues"],
                                         censored=any(r["rests_on_censored"] for r in rows)))
    return out


def _trend_notes(p: Preset, by: dict, data: dict) -> list[dict]:
    """How each mode's gap moves from the smallest to the largest uniform tau (paired by seed), and
    the random delay against the uniform one of its mean: measured, not scored (no claim to score)."""
    g = p.delays
    uniform = [s for s in g.settings if isinstance(s.delay, int) and not s.model]
    out = []
    if len(uniform) >= 2:
        lo, hi = uniform[0], uniform[-1]
        for opt in g.optimizers:
            for mode in g.modes:
                if (lo.name, opt, mode) not in by or (hi.name, opt, mode) not in by:
                    continue
                sync_lo, sync_hi = data[(lo.name, opt, "sync")], data[(hi.name, opt, "sync")]
                change = S.sample([None if a is None or b is None else b - a for a, b in
                                zip(_gap_values(sync_lo, data[(lo.name, opt, mode)]),
                                    _gap_values(sync_hi, data[(hi.name, opt, mode)]))])
                word = ("grows" if change["ci"][0] > 0 else "shrinks" if change["ci"][1] < 0 else "no resolved change") \
                    if change["ci"] else "undetermined (too few seeds)"
                text = (f"{opt} {mode}: gap " + ", ".join(f"tau {s.delay} {S.fmt(by[(s.name, opt, mode)]['gap']['mean'])}"
                                                          for s in uniform if (s.name, opt, mode) in by)
                        + f"; tau {lo.delay} -> {hi.delay}: change {S.fmt(change['mean'])} {S.ci_text(change)}, {word}")
                out.append(verdict("note", f"{opt} {mode}: gap against tau", "", text, line=text + "."))
    for s in g.settings:
        if s.delay_dist is None:
            continue
        twin = next((u for u in uniform if u.delay == s.mean_delay), None)
        if twin is None:
            continue
        for opt in g.optimizers:
            for mode in g.modes_of(s):
                if (twin.name, opt, mode) not in by:
                    continue
                diff = S.sample(_gap_values(data[(twin.name, opt, mode)], data[(s.name, opt, mode)]))
                text = (f"{opt} {mode}: {s.delay_dist} (mean {s.mean_delay:g}) - tau {twin.delay}, val loss "
                        f"{S.fmt(diff['mean'])} {S.ci_text(diff)} over {diff['n']} seeds ("
                        + ("resolved" if diff["ci"] and not diff["ci"][0] <= 0 <= diff["ci"][1] else "not resolved")
                        + f"; lrs {by[(s.name, opt, mode)]['lr']:g} and {by[(twin.name, opt, mode)]['lr']:g})")
                out.append(verdict("note", f"{opt} {mode}: random vs constant delay of the same mean", "", text,
                                   line=text + "."))
    return out


def _lr_numbers(L, lrs: dict, steps: int) -> list[dict]:
    """Scored: at each tuned setting, best delayed lr / best sync lr and best EF lr / best delayed lr
    (log-parabola optima over the grids' shared seeds, Fieller + Bonferroni) against the theory's."""
    p = L.preset
    g = p.delays
    numbers = []
    sync_variant, sync_base = P.delay_sync(p)
    for opt in g.optimizers:
        mom = g.momentum.get(opt)
        sync_rows = L.records([r for lr in lrs["sync"][opt]["lrs"]
                                    for r in P._runs(sync_variant, sync_base, opt, lr, mom, ("sync",), g.scan_seeds)])
        for name in g.tuned:
            s = g.setting(name)
            if not isinstance(s.delay, int):
                continue
            point = _theory_point(opt, mom, s.delay, steps)
            grids = {}
            for mode in ("delayed", "ef"):
                info = lrs.get((name, opt, mode))
                if info is None:
                    continue
                runs = [r for lr in info["grid"]["lrs"]
                        for r in P._runs(f"delays-{name}", P.delay_base(p, s), opt, lr, mom, (mode,), g.scan_seeds)]
                grids[mode] = S.by_lr(L.records(runs), opt, mode, mom)
            if "delayed" not in grids or point is None:
                continue
            issues = S.issues_of(sync_rows)
            shift = metrics.lr_shift(S.by_lr(sync_rows, opt, "sync", mom), grids["delayed"])
            if point["kind"] == "lmo":
                pred, source = point["lr_shift"], "Theorem 1's bound-optimal eta (delaylab theory axis)"
            else:
                pred, source = point["stable"] / point["stable_sync"], "Adam's stability limits at tau (theory axis)"
            numbers.append(theory_number(f"{opt}, {name}: best delayed lr / best sync lr", pred, shift["ratio"],
                                         shift["ci"], source, null=1.0, censored=bool(shift["censored"]),
                                         issues=issues))
            if "ef" in grids:
                ef = metrics.lr_shift(grids["delayed"], grids["ef"])
                q = f"{opt}, {name}: best EF lr / best delayed lr"
                if point["kind"] == "adam":
                    numbers.append(theory_number(q, point["ef_gain"], ef["ratio"], ef["ci"],
                                                 "Adam's stable range with EF over without, at tau (theory axis)",
                                                 null=1.0, censored=bool(ef["censored"]), issues=issues))
                else:
                    numbers.append(qualitative(q, "no number: Theorem 3 has no closed-form optimum here",
                                               measured=ef["ratio"], ci=ef["ci"]))
    return numbers


def _sketches(p: Preset, by: dict, data: dict, steps: int) -> list[dict]:
    """Shown, not scored: gap ratios against the ratios a loss gap proportional to Theorem 1's
    delay term would have (at a fixed eta: the mean delay), for the LMO optimizer."""
    g = p.delays
    numbers = []
    for opt in g.optimizers:
        if predict.kind(opt) != "lmo":
            continue
        for s in g.settings:
            ref = _two_bw(p, s)
            if ref is None or ref.name == s.name or (s.name, opt, "delayed") not in by:
                continue
            ratio = metrics.mean_ratio(_gap_map(data[(s.name, opt, "sync")], data[(s.name, opt, "delayed")]),
                                       _gap_map(data[(ref.name, opt, "sync")], data[(ref.name, opt, "delayed")]))
            numbers.append(qualitative(
                f"{opt}: gap at {s.name} / gap at {ref.name}",
                "sketch: Theorem 1's delay term 2 L eta tau is linear in the (mean) delay, so a loss gap that followed "
                "it at a fixed eta would grow by the mean delay (each mode's lr is tuned here, and per-stage delays "
                "are not encoded: equal L per stage assumed)", note="sketch", measured=ratio["ratio"],
                ci=ratio["ci"], set_=ratio["set"], predicted=s.mean_delay))
    for opt in g.optimizers:
        if predict.kind(opt) is None:
            continue
        mom = g.momentum.get(opt)
        pts = [(s, _theory_point(opt, mom, s.delay, steps)) for s in g.settings if isinstance(s.delay, int)
               and not s.model]
        if predict.kind(opt) == "lmo":
            text = "Theorem 1's relative penalty tau/lag: " + ", ".join(
                f"tau {s.delay} {pt['relative_penalty']:.3g}" for s, pt in pts if pt) + "; EF pays iff delta_bar < " + \
                ", ".join(f"{pt['ef_drift_limit']:.2f}" for s, pt in pts if pt) + " (delta_bar not measured in GPT runs)"
        else:
            text = "largest stable eta*lambda delayed / with EF (sync " + (
                f"{pts[0][1]['stable_sync']:.3g}" if pts and pts[0][1] else "-") + "): " + ", ".join(
                f"tau {s.delay} {pt['stable']:.3g} / {pt['stable_ef']:.3g}" for s, pt in pts if pt) + \
                "; no gap in loss units"
        numbers.append(qualitative(f"{opt}: penalty and stability against tau", text))
    return numbers


def _theory_rows(p: Preset, by: dict, steps: int) -> list[dict]:
    """The theory's numbers at each setting of the base model beside the measured plain gap: at a
    uniform tau both models; at a random delay Theorem 1 at its mean (the theory's result, docs/beyond.md)
    and no stability model; at per-stage delays Theorem 1 at the mean delay as a sketch (not encoded)."""
    g = p.delays
    out = []
    for opt in g.optimizers:
        mom = g.momentum.get(opt)
        kind = predict.kind(opt)
        for s in g.settings:
            if s.model or (s.name, opt, "delayed") not in by or kind is None:
                continue
            uniform = isinstance(s.delay, int)
            point = _theory_point(opt, mom, s.mean_delay, steps) if uniform or kind == "lmo" else None
            note = "" if uniform else ("Theorem 1 at the mean delay" if s.delay_dist else
                                       "sketch: Theorem 1 at the mean delay (per-stage delays are not encoded)") \
                if kind == "lmo" else "no stability model for a varying delay"
            out.append({"optimizer": opt, "setting": s.name, "mean_delay": s.mean_delay,
                        "gap": by[(s.name, opt, "delayed")]["gap"], "theory": point, "note": note})
    return out
