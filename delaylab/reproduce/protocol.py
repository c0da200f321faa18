"""The protocol's own parts of the report: the ablations (7) and the scale axis (8).

Like :mod:`delaylab.reproduce.findings`, each reads its runs from the
:class:`~delaylab.reproduce.ledger.Ledger` and returns a JSON-ready part; neither is one of the paper's six
findings, so "reproduced" is ``n.a.`` and the theory column says what it can.

- **Ablations** at the best sync lr: warmup (the base's 5% against ``warmup_fractions``), run
  length (1x against ``length_factors``; the longer runs give the iso-loss overhead against the
  1x sync run, a number only where every seed reaches that run's final loss), DC-ASGD's
  lambda over decades and DC-ASGD-a.
- **Axes** (tokens per parameter, and model size where sizes share a ratio): sync, delayed and EF
  of AdamW and Muon at each point, the lr tuned at each; gaps (t intervals), the AdamW/Muon gap
  ratio and EF recovery (Fieller's sets), and the direction each moves toward 20 tokens per
  parameter: the change of a gap paired by seed along one model's axis (Welch's across sizes),
  disjoint Fieller intervals for a ratio.
"""

from __future__ import annotations

from delaylab.llm import metrics
from delaylab.llm.config import warmup_updates
from delaylab.llm.sweep import summarize
from delaylab.reproduce import plan as P
from delaylab.reproduce import stats as S
from delaylab.reproduce.findings import cell_row, diagnostics_of
from delaylab.reproduce.verdicts import part_states, qualitative

# The paper's 360M figures the axes head toward (DESIGN.md; arXiv:2606.30634), at 20 tokens per parameter.
PAPER_SCALE = {"adamw_gap": 0.278, "muon_gap": 0.012, "gap_ratio": 0.278 / 0.012, "adamw_ef": (50.0, 90.0),
               "muon_ef": (50.0, 90.0)}
PAPER_TOKENS_PER_PARAM = 20.0


def _line(text: str) -> dict:
    """A verdict that states a measurement: nothing here to agree or disagree with."""
    return {"claim": "", "predicted": "", "measured": text, "kind": "note", "state": None, "score": None,
            "line": text}


def _sign(s: dict | None) -> int:
    """+1 / -1 where the 95% interval of a per-seed difference excludes zero, 0 where it does not."""
    if not s or s.get("ci") is None or s.get("diverged"):
        return 0
    return 1 if s["ci"][0] > 0 else -1 if s["ci"][1] < 0 else 0


def _seed_map(rows: list[dict], opt: str, mode: str) -> dict[int, float | None]:
    return {r["seed"]: r["val_loss"] for r in rows if (r["optimizer"], r["mode"]) == (opt, mode)}


def _setting(L, rows: list[dict], opt: str, lr: float, mom, fix: str | None = "ef") -> dict:
    """Gap, the fix's gap and recovery, iso-loss overheads and diagnostics of one (opt, lr, mom)."""
    sel = [r for r in rows if (r["optimizer"], r["lr"], r["momentum"]) == (opt, lr, mom)]
    modes = ("sync", "delayed") + ((fix,) if fix and any(r["mode"] == fix for r in sel) else ())
    cell = cell_row(sel, opt, lr, mom, modes)
    renamed = [dict(r, mode="ef") if r["mode"] == fix else r for r in sel if r["mode"] in modes]
    grid = summarize(renamed, diagnostics=False)["grid"][0]
    out = {"optimizer": opt, "lr": lr, "gap": cell["gap"], "runs": cell["runs"],
           "overhead": {m: v for m, v in (grid.get("overhead") or {}).items()},
           "diagnostics": diagnostics_of(L, {("ef" if m == fix else m): f for m, f in cell["runs"].items()})}
    if len(modes) == 3:
        rec = grid.get("ef_recovered_pct") or {}
        out["fix"] = fix
        out["fix_gap"] = cell[f"{fix}_gap"]
        out["recovered"] = {k: rec.get(k) for k in ("ratio_of_means", "ci", "set", "median", "unstable", "n")}
    return out


def _difference(a: dict, b: dict) -> dict:
    """Per-seed ``b - a`` of two settings' gaps (the same seeds)."""
    return S.sample([None if x is None or y is None else y - x for x, y in zip(a["values"], b["values"])])


def recovery_text(rec: dict | None, unstable: str = " (gap not resolved)") -> str:
    """``74% [56, 94]``: a recovered share (ratio of means) and Fieller's set, mapped to percent."""
    if not rec or rec.get("ratio_of_means") is None:
        return "n/a"
    return f"{rec['ratio_of_means']:.0f}% {S.ci_text(rec, '.0f')}" + (unstable if rec.get("unstable") else "")


def ablations(L) -> dict:
    p, best, d = L.preset, L.best, L.decided
    g = p.llm
    groups = d["ablations"]
    seeds = range(g.ablation_seeds or g.seeds)  # the 1x reference on the ablations' seeds
    base_runs = [r for r in d["grid"] + d["mitigations"]
                 if r.cell.optimizer in g.ablation_optimizers and r.cell.lr == best[r.cell.optimizer]["lr"]
                 and r.label in ("sync", "delayed", "ef") and r.variant == P.MAIN and r.cell.seed in seeds]
    base = L.records(base_runs, curves=True)
    warmup, length, dc, verdicts = [], [], [], []
    default_warmup = f"{round(100 * warmup_updates(g.base['steps'], g.base.get('warmup')) / g.base['steps'])}%"
    for opt in g.ablation_optimizers:
        lr, mom = best[opt]["lr"], best[opt]["momentum"]
        ref = _setting(L, base, opt, lr, mom)
        for name in [n for n in groups if n.startswith("warmup-")]:
            var = _setting(L, L.records(groups[name], curves=True), opt, lr, mom)
            change = _difference(ref["gap"], var["gap"])
            warmup.append({"optimizer": opt, "settings": {f"warmup-{default_warmup}": ref, name: var},
                           "gap_change": change})
            verdicts.append(
                f"{opt}, warmup {default_warmup} -> {name[len('warmup-'):]}: gap {S.fmt(ref['gap']['mean'])} -> "
                f"{S.fmt(var['gap']['mean'])} (change {S.fmt(change['mean'])} {S.ci_text(change)}, "
                + ("resolved" if _sign(change) else "not resolved") + f"); EF recovers "
                f"{recovery_text(ref.get('recovered'))} -> {recovery_text(var.get('recovered'))}.")
        for name in [n for n in groups if n.startswith("length-")]:
            rows = L.records(groups[name], curves=True)
            var = _setting(L, rows, opt, lr, mom)
            change = _difference(ref["gap"], var["gap"])
            sync_1x = {r["seed"]: r["metrics"] for r in base if (r["optimizer"], r["mode"]) == (opt, "sync")}
            cross = {}
            for mode in ("delayed", "ef"):
                mine = {r["seed"]: r["metrics"] for r in rows if (r["optimizer"], r["mode"]) == (opt, mode)}
                seeds = sorted(set(sync_1x) & set(mine))
                if seeds:
                    cross[mode] = metrics.overhead_over_seeds(
                        [metrics.iso_loss_overhead(sync_1x[s], mine[s]) for s in seeds],
                        max_length=float(name[len("length-"):-1]))
            length.append({"optimizer": opt, "settings": {"length-1x": ref, name: var}, "gap_change": change,
                           "overhead_vs_1x_sync": cross})
            verdicts.append(
                f"{opt}, length 1x -> {name[len('length-'):]}: gap {S.fmt(ref['gap']['mean'])} -> "
                f"{S.fmt(var['gap']['mean'])} (change {S.fmt(change['mean'])} {S.ci_text(change)}, "
                + ("resolved" if _sign(change) else "not resolved") + "); EF recovers "
                f"{recovery_text(ref.get('recovered'))} -> {recovery_text(var.get('recovered'))}; tokens the "
                f"{name[len('length-'):]} delayed run needs to reach the 1x sync run's final loss: "
                f"{metrics.fmt_overhead(cross.get('delayed'))} x the 1x run's.")
        dc_rows = []
        for name in [n for n in groups if n.startswith("dc-asgd")]:
            rows = L.records(groups[name]) + [r for r in base if r["mode"] in ("sync", "delayed")]
            s = _setting(L, rows, opt, lr, mom, fix=name)
            lam = None if name == "dc-asgd-a" else float(name[len("dc-asgd-"):])
            dc_rows.append({"optimizer": opt, "variant": name, "lambda": lam, "fix_gap": s.get("fix_gap"),
                            "recovered": s.get("recovered"), "runs": s["runs"]})
        dc += dc_rows
        if dc_rows:
            verdicts.append(f"{opt}, DC-ASGD recovery by lambda: " + ", ".join(
                f"{'adaptive' if r['lambda'] is None else format(r['lambda'], 'g')}: "
                f"{recovery_text(r['recovered'])}" for r in dc_rows) + ".")
    parts = [f"warmup {len(warmup)}", f"length {len(length)}", f"DC-ASGD {len(dc)}"]
    heads = [f"{r['optimizer']} gap change: warmup {S.fmt(r['gap_change']['mean'])} {S.ci_text(r['gap_change'])}"
             for r in warmup] + [f"{r['optimizer']} length {S.fmt(r['gap_change']['mean'])} {S.ci_text(r['gap_change'])}, "
                                 f"iso-loss overhead vs 1x sync {metrics.fmt_overhead(r['overhead_vs_1x_sync'].get('delayed'))}"
                                 for r in length]
    best_dc = {}
    for r in dc:
        v = (r["recovered"] or {}).get("ratio_of_means")
        if v is not None and (r["optimizer"] not in best_dc or v > best_dc[r["optimizer"]][1]):
            best_dc[r["optimizer"]] = (r, v)
    heads += [f"{o} best DC-ASGD {'adaptive' if r['lambda'] is None else 'lambda ' + format(r['lambda'], 'g')}: "
              f"{recovery_text(r['recovered'])}" for o, (r, _) in best_dc.items()]
    headline = "; ".join(heads) if heads else "no ablation in this preset"
    lines = [_line(v) for v in verdicts]
    numbers = [qualitative("warmup and length", "no bound here predicts the loss gap's change"),
               qualitative("DC-ASGD lambda", "no bound covers DC-ASGD")]
    return {"id": 7, "key": "ablations", "title": "Protocol ablations: warmup, run length, DC-ASGD's lambda",
            "paper": "(not a finding of the paper) the paper tunes per optimizer and compares at identical "
                     "hyperparameters; these ablations test whether the findings above depend on choices it fixes.",
            "theory": "Theorem 1's delay term 2 L eta tau is summed over the updates: a longer warmup lowers eta "
                      "early, where the delayed runs spike. DC-ASGD (Zheng et al. 2017) corrects g by lambda g*g*(x_t - "
                      "x_{t-tau}); no bound here covers it.",
            "rows": {"warmup": warmup, "length": length, "dc": dc}, "verdicts": lines, "counts": parts,
            "headline": headline, "theory_numbers": numbers, **part_states(lines, numbers)}


# -- 8: the tokens-per-parameter and model-size axes ---------------------------------------------------------


def _gap_ratio(a: dict, m: dict) -> dict:
    """AdamW gap / Muon gap at one point, paired by seed (Fieller's set)."""
    ga = {k: None if a["delayed"].get(k) is None or a["sync"][k] is None else a["delayed"][k] - a["sync"][k]
          for k in a["sync"]}
    gm = {k: None if m["delayed"].get(k) is None or m["sync"][k] is None else m["delayed"][k] - m["sync"][k]
          for k in m["sync"]}
    return metrics.mean_ratio(ga, gm)


def _change(first: dict, last: dict, kind: str, paired: bool = False) -> dict:
    """How a quantity moves from the first to the last point of an axis: for a mean (``gap``), the
    difference with its 95% interval, paired by seed where the two points are one model (its seeds
    share init and batch order: ``paired``, the samples carrying ``seeds``), else Welch's for two
    independent means; for a ratio, the change is resolved only where the two points' bounded 95%
    intervals are disjoint (a conservative test)."""
    if kind == "gap":
        if paired:
            return S.paired_change(first["values"], first["seeds"], last["values"], last["seeds"])
        return S.change(first, last)
    a, b = first.get("value"), last.get("value")
    if a is None or b is None:
        return {"delta": None, "ci": None, "sign": 0}
    ia, ib = first.get("ci"), last.get("ci")
    sign = 0 if not (ia and ib) else 1 if ib[0] > ia[1] else -1 if ib[1] < ia[0] else 0
    return {"delta": b - a, "ci": None, "sign": sign}


def _toward(change: dict, value, target) -> str:
    """Direction toward the longer training, and whether that heads to the paper's figure."""
    if change["delta"] is None:
        return "n/a"
    if change["sign"] == 0:
        return "no resolved change"
    up = change["sign"] > 0
    word = "grows" if up else "shrinks"
    lo, hi = target if isinstance(target, (tuple, list)) else (target, target)
    if value is not None and lo <= value <= hi:
        return f"{word}; at the paper's value"
    if value is None:
        return word
    toward = (value < lo) == up
    return f"{word}, " + ("toward" if toward else "away from") + " the paper's"


def scale(L) -> dict:
    p, cells = L.preset, L.axis
    s = p.scale
    points, table = s.points(), []
    for size, ratio in points:
        entry = {"size": size, "tokens_per_param": ratio, "optimizers": {}}
        cols = {}
        for opt in s.optimizers:
            c = cells[(size, ratio, opt)]
            rows = L.records(c["cell"]["runs"], curves=True)
            setting = _setting(L, rows, opt, c["lr"], s.momentum.get(opt))
            summary = L.summary(c["cell"]["runs"][0])
            entry.update(params=summary["params"], steps=P.axis_base(p, size, ratio)["steps"],
                         tokens=summary.get("tokens"))
            setting["overhead"] = {}  # not measured on the axes (no longer runs): absent, not a bound
            setting["lr_scan"] = {"lrs": c["scan"]["lrs"], "censored": c["scan"]["censored"].get("sync"),
                                  "extended": c["scan"]["extended"]}
            setting["power"] = c["cell"]["power"]
            setting["issues"] = sorted({i for r in rows for i in r["issues"]})
            entry["optimizers"][opt] = setting
            cols[opt] = {m: {r["seed"]: r["val_loss"] for r in rows if r["mode"] == m} for m in ("sync", "delayed", "ef")}
        if {"adamw", "muon"} <= set(s.optimizers):
            entry["gap_ratio"] = _gap_ratio(cols["adamw"], cols["muon"])
        table.append(entry)

    def value(e, key):
        """{"value", "ci", "values", "mean"} of one quantity at one point."""
        if key.endswith("_gap"):
            st = e["optimizers"][key[:-4]]
            g, runs = st["gap"], st["runs"]
            return {**g, "value": g["mean"], "seeds": sorted(set(S.seeds_of(runs["sync"])) & set(S.seeds_of(runs["delayed"])))}
        if key == "gap_ratio":
            r = e.get("gap_ratio") or {}
            return {"value": r.get("ratio"), "ci": r.get("ci"), "set": r.get("set")}
        rec = e["optimizers"][key[:-3]].get("recovered") or {}
        return {"value": rec.get("ratio_of_means"), "ci": rec.get("ci"), "set": rec.get("set")}

    quantities = [(f"{o}_gap", f"{o} gap") for o in s.optimizers] + (
        [("gap_ratio", "AdamW gap / Muon gap")] if {"adamw", "muon"} <= set(s.optimizers) else []) + [
        (f"{o}_ef", f"{o} EF recovery (%)") for o in s.optimizers if "ef" in s.modes]
    trends, verdicts = {}, []
    for size in s.sizes:
        mine = [e for e in table if e["size"] == size]
        if len(mine) < 2:
            continue
        for key, label in quantities:
            vals = [value(e, key) for e in mine]
            ch = _change(vals[0], vals[-1], "gap" if key.endswith("_gap") else "ratio", paired=True)
            target = PAPER_SCALE[key]
            direction = _toward(ch, vals[-1]["value"], target)
            trends[f"{size}:{key}"] = {"size": size, "quantity": key, "ratios": [e["tokens_per_param"] for e in mine],
                                       "values": [v["value"] for v in vals], "intervals": [v.get("ci") for v in vals],
                                       "change": ch, "direction": direction, "paper": target}
            spec = ".0f" if key.endswith("_ef") else ".3g" if key == "gap_ratio" else "+.3f"
            verdicts.append(f"{size}, {label} against tokens per parameter: " + ", ".join(
                f"{e['tokens_per_param']:g}: {S.fmt(v['value'], spec)} {S.ci_text(v, spec)}" for e, v in zip(mine, vals))
                + f"; from {mine[0]['tokens_per_param']:g} to {mine[-1]['tokens_per_param']:g} tokens/param: "
                + (f"change {S.fmt(ch['delta'], spec)} {S.ci_text(ch, spec)}, " if ch["ci"] else "")
                + f"{direction} (paper at 20 tokens/param: {_paper_text(target)}).")
    sizes = {}
    for ratio in s.ratios:
        here = [e for e in table if e["tokens_per_param"] == ratio]
        if len(here) < 2:
            continue
        for key, label in quantities:
            vals = [value(e, key) for e in here]
            ch = _change(vals[0], vals[-1], "gap" if key.endswith("_gap") else "ratio")
            sizes[f"{ratio:g}:{key}"] = {"ratio": ratio, "quantity": key, "sizes": [e["size"] for e in here],
                                         "params": [e["params"] for e in here], "values": [v["value"] for v in vals],
                                         "change": ch}
            spec = ".0f" if key.endswith("_ef") else ".3g" if key == "gap_ratio" else "+.3f"
            verdicts.append(f"{ratio:g} tokens/param, {label} against model size: " + ", ".join(
                f"{e['size']} ({e['params'] / 1e6:.2f}M) {S.fmt(v['value'], spec)} {S.ci_text(v, spec)}"
                for e, v in zip(here, vals)) + "; " + ("no resolved change" if ch["sign"] == 0 else
                                                      "grows" if ch["sign"] > 0 else "shrinks") + " with size.")
    headline = "; ".join(
        f"{e['size']} {e['tokens_per_param']:g} tok/param: " + ", ".join(
            f"{o} {S.fmt(st['gap']['mean'])} {S.ci_text(st['gap'])}" for o, st in e["optimizers"].items()) for e in table)
    setup = (f"{', '.join(f'{size} at ' + ', '.join(f'{r:g}' for r in s.ratios if (size, r) in points) for size in s.sizes)} "
             f"tokens per parameter; batch " + ", ".join(f"{k} {v}" for k, v in s.batch_size.items())
             + f" x {s.block_size} tokens; {s.seeds} seeds"
             + (f" (power rule up to {s.max_seeds})" if s.max_seeds else " (none added: an unresolved gap says so)")
             + "; lr: the best of a "
             f"{s.scan_seeds}-seed sync scan at each point, grown at an edge up to {s.lr_extend} steps per side")
    lines = [_line(v) for v in verdicts]
    numbers = [qualitative("gaps against tokens per parameter and size",
                           "no number: the bounds' L and sigma are not measured at each point")]
    return {"id": 8, "key": "scale", "title": "Axes: the gaps against tokens per parameter and model size",
            "paper": "360M at 20 tokens per parameter: AdamW +0.278, Muon +0.012; EF recovers 50-90%.",
            "theory": "No bound here depends on the training length or the model size except through L, sigma and T, "
                      "which are not measured at each point.",
            "setup": setup, "rows": table, "trends": trends, "sizes": sizes, "verdicts": lines, "headline": headline,
            "theory_numbers": numbers, **part_states(lines, numbers)}


def _paper_text(x) -> str:
    return f"{x[0]:g}-{x[1]:g}%" if isinstance(x, (list, tuple)) else f"{x:.3g}"
