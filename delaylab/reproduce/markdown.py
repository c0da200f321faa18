"""The report's Markdown: rendered from report.json alone (every number, verdict and line the
parts stored), so a report re-scored or read back renders the same text."""

from __future__ import annotations

from delaylab.llm.metrics import fmt_overhead
from delaylab.stats import fmt_set
from delaylab.reproduce import coverage, selection
from delaylab.reproduce.findings import mode_label
from delaylab.reproduce.protocol import recovery_text
from delaylab.reproduce.report import RUNS
from delaylab.reproduce.stats import ci_text
from delaylab.reproduce.tokens import READS

YES = {True: "yes", False: "no", None: "n/a"}


def _n(x, spec=".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _ms(s: dict | None, spec=".3f") -> str:
    """mean +- std (and how many runs diverged)."""
    if not s or s.get("mean") is None:
        return "diverged" if s and s.get("diverged") else "n/a"
    std = s.get("std")
    text = format(s["mean"], spec) + ("" if std is None else f" ± {format(std, spec.lstrip('+'))}")
    return text + (f" ({s['diverged']} diverged)" if s.get("diverged") else "")


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"] + [
        "| " + " | ".join(r) + " |" for r in rows]


def _pred_text(pred: dict) -> str:
    if pred.get("kind") == "lmo":
        nesterov = ", Nesterov" if pred["nesterov"] else ""
        return f"LMO: penalty {pred['relative_penalty']:.3f} (beta {pred['beta']:g}{nesterov})"
    if pred.get("kind") == "adam":
        return f"Adam-type: stable range /{pred['stable_shrink']:.0f} (beta1 {pred['beta']:g})"
    return "none"


def _cens(c) -> str:
    """`` (censored low)`` for an optimum at its grid's edge."""
    return f" (censored {c})" if c else ""


def _power(pw: dict | None) -> str:
    if not pw:
        return ""
    return f"{pw['seeds']} ({'resolved' if pw['resolved'] else 'unresolved at the cap'})"


def _gap_ci(s: dict | None) -> str:
    return f"{_ms(s, '+.3f')} {ci_text(s)}".strip()


def _part_table(part: dict) -> list[str]:
    key, rows = part["key"], part["rows"]
    if key == "optimizers":
        lines = _table(["optimizer", "lrs (grown)", "best sync lr", "seeds", "sync val loss", "delayed",
                        "gap (95% t)", "gap / sync", "iso-loss overhead delayed / EF", "tuned gap (delayed lr)",
                        "theory", "paper gap"],
                       [[r["optimizer"], ", ".join(f"{x:g}" for x in r["lrs"]), f"{r['lr']:g}{_cens(r['censored'])}",
                         _power(r.get("power")) or str(r["gap"]["n"]), _ms(r["sync"]), _ms(r["delayed"]),
                         _gap_ci(r["gap"]), _n(r["relative_gap_pct"], "+.1f") + "%",
                         " / ".join(_overhead(r["overhead"].get(m)) for m in ("delayed", "ef")) if r["overhead"]
                         else "not measured",
                         f"{_ms(r['tuned']['gap'], '+.3f')} ({_n(r['tuned']['lr'], 'g')}"
                         f"{_cens(r['tuned']['censored'].get('delayed'))})",
                         _pred_text(r["prediction"]), _n(r["paper_gap"], "+.3f")] for r in rows])
        lines += ["", "Iso-loss overhead: tokens the delayed (EF) run needs to reach its seed's sync run's final "
                      "val loss, over sync's tokens, mean over seeds with its t interval; a seed whose run misses "
                      "it is rerun 1.5x, 2x and 4x as long (schedule stretched) and the first that reaches it "
                      "counts; 'not reached at 4x' prints no number.",
                  "", "The gap at the three lrs around each optimizer's best sync lr (base seeds), and the regime "
                      "diagnostics at the best (mean over seeds: the largest train-loss spike after warmup, in "
                      "nats, and the update at which the loss leaves its end-of-warmup level by 0.1 nats):", ""]
        lines += _table(["optimizer", "gap at lr (95% t)", "spike sync / delayed", "plateau exit sync / delayed"],
                        [[r["optimizer"], "; ".join(f"{x['lr']:g}: {_n(x['gap']['mean'], '+.3f')} {ci_text(x['gap'])}"
                                                    for x in r["neighbourhood"]),
                          " / ".join(_n(r["diagnostics"].get(m, {}).get("spike"), ".2f") for m in ("sync", "delayed")),
                          " / ".join(_n(r["diagnostics"].get(m, {}).get("plateau_exit"), ".0f")
                                     for m in ("sync", "delayed"))] for r in rows])
        return lines
    if key == "mitigations":
        mits = [k[: -len("_recovered")] for k in rows[0] if k.endswith("_recovered")]
        head = ["optimizer", "gap (no fix)"] + [f"{m}: gap / recovered" for m in mits]
        body = []
        for r in rows:
            cells = [r["optimizer"], _gap_ci(r["gap"]) + ("" if r["resolved"] else " (n.s.)")]
            for m in mits:
                cells.append(f"{_ms(r[f'{m}_gap'], '+.3f')} / {_rec(r[f'{m}_recovered'])}")
            body.append(cells)
        lines = _table(head, body)
        lines += ["", "Recovered: 100 (mean delayed - mean fixed) / (mean delayed - mean sync) over the seeds all "
                      "three have, with Fieller's 95% set for the ratio of the paired gaps (unbounded, or a union of "
                      "two half-lines, where the gap itself is not resolved from 0)."]
        if part.get("ef_by_lr"):
            lines += ["", "EF at the three lrs around the best sync lr:", ""]
            lines += _table(["optimizer", "lr", "gap", "EF gap", "EF recovers"],
                            [[r["optimizer"], f"{r['lr']:g}", _ms(r["gap"], "+.3f"), _ms(r["ef_gap"], "+.3f"),
                              _rec(r["recovered"])] for r in part["ef_by_lr"]])
        if part.get("ef_tuned"):
            lines += ["", "Each mode at its own best lr (sync and delayed over their grown grids, EF over its own):", ""]
            lines += _table(["optimizer", "sync lr", "delayed lr / gap", "EF lr / gap", "EF recovers"],
                            [[r["optimizer"], f"{r['sync_lr']:g}{_cens(r['censored']['sync'])}",
                              f"{r['delayed_lr']:g}{_cens(r['censored']['delayed'])} / {_ms(r['delayed_gap'], '+.3f')}",
                              f"{r['ef_lr']:g}{_cens(r['censored']['ef'])} / {_ms(r['ef_gap'], '+.3f')}",
                              _rec({"ratio_of_means": r["recovered"], "ci": r["ci"], "set": r["set"]})]
                             for r in part["ef_tuned"]])
        return lines
    if key == "momentum":
        return [f"Protocol: {part['protocol']}.", ""] + _table(
            ["optimizer", "momentum", "lrs (grown)", "gap at lr fixed", "best sync lr", "sync", "delayed",
             "gap (sync-tuned)", "tuned gap (delayed lr)", "theory"],
            [[r["optimizer"], f"{r['momentum']:g}", ", ".join(f"{x:g}" for x in r["lrs"]),
              f"{_ms(r['fixed_gap'], '+.3f')} ({r['fixed_lr']:g})",
              f"{r['lr']:g}{_cens(r['censored'].get('sync'))}", _ms(r["sync"]), _ms(r["delayed"]),
              _gap_ci(r["gap"]), f"{_ms(r['tuned']['gap'], '+.3f')} ({_n(r['tuned']['lr'], 'g')}"
              f"{_cens(r['censored'].get('delayed'))})", _pred_text(r["prediction"])] for r in rows])
    if key == "learning_rate":
        return _table(["optimizer", "peak lr", "sync", "delayed", "gap"],
                      [[r["optimizer"], f"{r['lr']:g}", _ms(r["sync"]), _ms(r["delayed"]), _gap_ci(r["gap"])]
                       for r in rows])
    if key == "schedules":
        return _table(["optimizer", "schedule", "stage delays", "mean tau", "val loss", "gap to sync", "vs 2BW",
                       "gap / 2BW gap (95% Fieller)"],
                      [[r["optimizer"], r["schedule"], str(r["delays"]), f"{r['mean_delay']:.2f}", _ms(r["loss"]),
                        _gap_ci(r.get("gap")) if "gap" in r else "-",
                        _gap_ci(r.get("vs_2bw")) if "vs_2bw" in r else "-",
                        _ratio_text(r.get("gap_ratio"))] for r in rows])
    if key == "ablations":
        return _ablation_tables(rows)
    if key == "scale":
        return _scale_tables(part)
    if key == "delays":
        return _delay_tables(part)
    if key == "tokens":
        return _tokens_tables(part)
    if key == "field":
        from delaylab.reproduce.field import markdown_lines

        return markdown_lines(part)
    if key == "toy":
        ts = rows[0]["T"]
        lines = _table(["problem", "method", "mode"] + [f"measured/bound T={t}" for t in ts]
                       + ["slope", "bound exponent", "holds"],
                       [[r["problem"], r["method"], mode_label(r)] + [_n(x, ".2f") for x in r["ratios"]]
                        + [f"{r['slope']:.3f}", f"{r['exponent']:.3f}", YES[r["holds"]]]
                        for r in rows])
        c = part["cost"]
        lines += ["", f"Delay cost on {c['problem']} ({c['method']}, T = {c['T']}, {c['seeds']} seeds), relative gap "
                      "(delayed - sync) / sync, measured and the bound's:", ""]
        lines += _table(["sweep", "eta", "beta", "measured", "bound: delay term / sync bound"],
                        [[{"eta_sweep": "eta (beta fixed)", "beta_sweep": f"beta (eta {c['beta_sweep_eta']})"}[name],
                          f"{r['eta']:.3g}", f"{r['beta']:g}", _signed_pct(r["relative_gap"]),
                          _signed_pct(r["predicted_relative_gap"])]
                         for name in ("eta_sweep", "beta_sweep") for r in c[name]])
        if part["ef"]:
            lines += ["", "EF on the toy problem: its condition (delta_bar < 2/3) against what EF did:", ""]
            lines += _table(["method", "delta_bar", "EF recovers", "predicted to help", "EF's gain (95% t)"],
                            [[r["method"], f"{r['delta_bar']:.2f}", f"{r['ef_recovers_pct']:.0f}%",
                              YES[r["predicted_helps"]],
                              "n/a" if r.get("ef_gain_ci") is None else
                              f"{r['ef_gain']:+.3f} [{r['ef_gain_ci'][0]:+.3f}, {r['ef_gain_ci'][1]:+.3f}]"]
                             for r in part["ef"]])
        return lines
    return []


def _overhead(o: dict | None) -> str:
    if not o:
        return "n/a"
    text = fmt_overhead(o)
    lengths = o.get("lengths") or []
    if o.get("mean") is not None and any(x not in (None, 1) for x in lengths):
        # which schedule each seed crossed sync's loss in: a mean over 2x and 4x runs mixes schedules
        text += " (per seed, overhead in the run that crossed: " + ", ".join(
            f"{v:.2f} in {x:g}x" for v, x in zip(o["values"], lengths) if v is not None and x is not None) + ")"
    return text


def _ratio_text(r: dict | None) -> str:
    if not r or r.get("ratio") is None:
        return "-"
    return f"{r['ratio']:.2f} {ci_text(r, '.2f')}"


def _rec(rec: dict | None) -> str:
    """A recovered share in a table cell."""
    return recovery_text(rec, unstable="")


def _ablation_tables(rows: dict) -> list[str]:
    lines = []
    for key, title in (("warmup", "Warmup"), ("length", "Run length")):
        if not rows[key]:
            continue
        lines += [f"{title} (at the best sync lr; overhead: tokens to reach the same-length sync run's final loss, "
                  "a number only where every seed reaches it):", ""]
        body = []
        for r in rows[key]:
            for name, st in r["settings"].items():
                d = st["diagnostics"].get("delayed", {})
                body.append([r["optimizer"], name, _ms(st["gap"], "+.3f"), _ms(st.get("fix_gap"), "+.3f"),
                             _rec(st.get("recovered")), fmt_overhead(st["overhead"].get("delayed")),
                             _n(d.get("spike"), ".2f"), _n(d.get("plateau_exit"), ".0f")])
            extra = ""
            if key == "length":
                extra = "longer delayed run vs the 1x sync run: " + fmt_overhead(
                    r["overhead_vs_1x_sync"].get("delayed")) + ", EF: " + fmt_overhead(
                    r["overhead_vs_1x_sync"].get("ef"))
            body.append([r["optimizer"], "change", _ms(r["gap_change"], "+.3f") + f" {ci_text(r['gap_change'])}", "",
                         "", extra, "", ""])
        lines += _table(["optimizer", "setting", "gap", "EF gap", "EF recovers", "overhead (delayed)",
                         "delayed spike", "delayed plateau exit"], body) + [""]
    if rows["dc"]:
        lines += ["DC-ASGD by lambda (and DC-ASGD-a), at the best sync lr:", ""]
        lines += _table(["optimizer", "lambda", "gap with DC-ASGD", "recovers"],
                        [[r["optimizer"], "adaptive (DC-ASGD-a)" if r["lambda"] is None else f"{r['lambda']:g}",
                          _ms(r["fix_gap"], "+.3f"), _rec(r["recovered"])] for r in rows["dc"]])
    return lines


def _tokens_tables(part: dict) -> list[str]:
    lines = [f"Setup: {part['setup']}.", ""]
    lines += _table(["size", "params", "tokens/param", "schedule", "batch", "updates", "lrs (grown)", "sync lr",
                     "delayed lr", "seeds", "sync", "delayed", "gap (95% t)"],
                    [[r["size"], f"{r['params'] / 1e6:.3f}M", f"{r['tokens_per_param']:g}", r["lr_schedule"],
                      str(r["batch_size"]), str(r["updates"]), ", ".join(f"{x:g}" for x in r["lrs"]),
                      f"{r['best']['sync']:g}{_cens(r['censored'].get('sync'))}",
                      f"{r['best']['delayed']:g}{_cens(r['censored'].get('delayed'))}", str(r["seeds"]),
                      _ms(r["sync"]), _ms(r["delayed"]), _gap_ci(r["gap"])] for r in part["rows"]])
    lines += ["", "The gap along each run (per seed at the same validation, 95% t): at the peak lr (the first "
                  "validation after warmup), at the validation nearest mid-run and at the end; closing = peak - end:",
              ""]
    lines += _table(["size", "tokens/param", "schedule", "batch"] + [f"gap at {k} (update, lr/peak)" for k in
                                                                    READS] + ["closing (95% t)"],
                    [[r["size"], f"{r['tokens_per_param']:g}", r["lr_schedule"], str(r["batch_size"])]
                     + [f"{_gap_ci(r['reads'][k]['gap'])} ({r['reads'][k]['step']}, {r['reads'][k]['lr_factor']:.2f})"
                        for k in READS] + [_gap_ci(r["closing"])] for r in part["rows"]])
    lines += ["", "What moves the gap, one factor at a time (second point - first, per seed: a seed fixes the init "
                  "at both points, so the difference is paired; 95% t interval). Each change is scored in the "
                  "direction named, at the optima and at every pair of lrs the data cannot tell from them "
                  "(undetermined where those disagree):", ""]
    lines += _table(["size", "what changes", "from", "to", "quantity", "from -> to", "change (95% t, paired)",
                     "claim", "verdict"],
                    [[s["size"], s["what"], s["from"], s["to"], s["quantity"],
                      f"{_n(s['first'], '+.3f')} -> {_n(s['second'], '+.3f')}",
                      f"{_n(s['delta'], '+.3f')} {ci_text(s)}".strip(), s["claim"],
                      s["state"] + (" (lr-dependent)" if len(s["lr_states"]) > 1 else "")]
                     for s in part["separations"]])
    lines += [""] + [f"- {c}." for c in part["conclusion"]]
    return lines


def _scale_tables(part: dict) -> list[str]:
    lines = [f"Setup: {part['setup']}.", ""]
    body = []
    for e in part["rows"]:
        for opt, st in e["optimizers"].items():
            scan = st["lr_scan"]
            body.append([e["size"], f"{e['params'] / 1e6:.2f}M", f"{e['tokens_per_param']:g}", str(e["steps"]), opt,
                         f"{st['lr']:g}{_cens(scan['censored'])}", ", ".join(f"{x:g}" for x in scan["lrs"]),
                         _power(st["power"]), _gap_ci(st["gap"]), _ms(st.get("fix_gap"), "+.3f"),
                         _rec(st.get("recovered"))])
    lines += _table(["size", "params", "tokens/param", "updates", "optimizer", "lr (scan best)", "lrs scanned",
                     "seeds", "gap (95% t)", "EF gap", "EF recovers (95% Fieller)"], body)
    ratios = [f"{e['size']} {e['tokens_per_param']:g}: {_ratio_text(e.get('gap_ratio'))}" for e in part["rows"]
              if e.get("gap_ratio")]
    if ratios:
        lines += ["", "AdamW gap / Muon gap (ratio of means paired by seed, 95% Fieller): " + "; ".join(ratios) + "."]
    lines += ["", "Each quantity from the fewest to the most tokens per parameter (a gap's change: 95% t interval "
                  "paired by seed, the two points being one model; a ratio's: resolved only where the two "
                  "intervals are disjoint):", ""]
    lines += _table(["size", "quantity", "per tokens/param", "change", "direction", "paper (20 tokens/param)"],
                    [[t["size"], t["quantity"], ", ".join(f"{r:g}: {_n(v, '.3g')}" for r, v in zip(t["ratios"], t["values"])),
                      (f"{_n(t['change']['delta'], '+.3g')} {ci_text(t['change'], '+.3g')}").strip(), t["direction"],
                      _paper(t["paper"])] for t in part["trends"].values()])
    return lines


def _delay_tables(part: dict) -> list[str]:
    lines = [f"Setup: {part['setup']}.", ""]
    body = []
    for r in part["rows"]:
        lr = f"{r['lr']:g}" + (_cens(r["censored"]) if r["tuned"] else " (interpolated)")
        body.append([r["setting"], f"{r['mean_delay']:g}", r["optimizer"], r["mode"], lr,
                     f"{r['sync_lr']:g}{_cens(r['sync_censored'])}", str(r["gap"]["n"]), _gap_ci(r["gap"]),
                     _rec(r.get("recovered")) if "recovered" in r else "-",
                     _overhead(r.get("overhead")) if "overhead" in r else "not measured"])
    lines += _table(["setting", "mean tau", "optimizer", "mode", "lr", "sync lr", "seeds", "gap (95% t)",
                     "recovers (95% Fieller)", "iso-loss overhead"], body)
    lines += ["", "Gap: the mode's final val loss minus sync's (at sync's best lr, on the setting's model), paired by "
                  "seed. Recovers: 100 (1 - mean gap with the corrector / mean gap without), Fieller's 95% set "
                  "(unbounded where the gap without is not resolved from 0). Iso-loss overhead: tokens the run needs "
                  "to reach its seed's sync final loss over sync's tokens; a run that misses it is rerun longer "
                  "(schedule stretched) and 'not reached at Nx' prints no number.", "",
              "The theory beside the plain gap (delaylab theory axis; Muon: Theorem 1, AdamW: the stability limits "
              "with a frozen preconditioner):", ""]
    body = []
    for t in part["theory_rows"]:
        th = t["theory"]
        if th is None:
            text = "-"
        elif th["kind"] == "lmo":
            text = (f"penalty tau/lag {th['relative_penalty']:.3f}, bound x{th['bound_ratio']:.3f}, best eta "
                    f"x{th['lr_shift']:.3f}, EF pays iff delta_bar < {th['ef_drift_limit']:.2f}")
        else:
            text = (f"stable eta*lambda {th['stable']:.3g} (sync {th['stable_sync']:.3g}, x{th['shrink']:.0f} "
                    f"smaller), with EF {th['stable_ef']:.3g} (x{th['ef_gain']:.2f})")
        body.append([t["optimizer"], t["setting"], f"{t['mean_delay']:g}", _gap_ci(t["gap"]), text, t["note"] or "-"])
    lines += _table(["optimizer", "setting", "mean tau", "measured gap (95% t)", "theory", "note"], body)
    return lines


def _paper(x) -> str:
    return f"{x[0]:g}-{x[1]:g}%" if isinstance(x, (list, tuple)) else f"{x:.3g}"


def theory_table(report: dict) -> list[str]:
    """The theory column: each number the theory gives against the measured one."""
    rows = report.get("theory_column") or []

    def measured(n):
        if n["measured"] is None:
            return "-"
        ci = f" [{n['ci'][0]:.3g}, {n['ci'][1]:.3g}]" if n.get("ci") else (
            f" {fmt_set(n['set'])}" if n.get("set") else "")
        return _n(n["measured"], ".3g") + _unit(n) + ci

    def state(n):
        if n["note"] in ("qualitative", "sketch"):
            return f"{n['note']} (not scored)"
        return n["state"] or "-"

    return _table(["#", "quantity", "theory", "measured (95% interval)", "verdict", "from"],
                  [[str(n["id"]), n["quantity"],
                    "qualitative" if n["note"] == "qualitative" else _n(n["predicted"], ".3g") + _unit(n),
                    measured(n), state(n), n["source"]] for n in rows])


def _unit(n: dict) -> str:
    return "%" if n["unit"] == "%" else ""


def _signed_pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:+.2f}%"


def summary_table(report: dict) -> list[str]:
    def with_counts(state, counts):
        return state if not counts or counts == "nothing scored" else f"{state} ({counts})"

    return _table(["#", "finding", "paper", "measured here", "reproduced", "theory agrees"],
                  [[str(s["id"]), s["finding"], s["paper"], s["measured"],
                    with_counts(s["reproduced"], s.get("reproduced_counts")),
                    with_counts(s["theory_agrees"], s.get("theory_counts"))] for s in report["summary"]])


def _growth(n: int) -> str:
    """The lr grids' edge rule with the report's own limit (a report written before it was kept: two)."""
    if n == 0:
        return "No lr grid grows at an edge here; an optimum at an edge is marked censored."
    words = ("no", "one", "two", "three", "four", "five", "six")
    steps = (words[n] if n < len(words) else str(n)) + (" step" if n == 1 else " steps")
    return (f"Every lr grid grows by x2 or /2 while its best point is at an edge (at most {steps} per side); an "
            "optimum still at an edge is marked censored.")


def markdown(report: dict) -> str:
    lines = [f"# delaylab reproduce: preset `{report['preset']}`", "",
             f"{report['preset_summary']}.", "", f"Made by `{report['command']}`. Every GPT run is a line of "
             f"`{report.get('runs_file', RUNS)}` beside this report.", ""]
    if report.get("ns_dtypes"):
        lines += ["Muon's Newton-Schulz iteration ran in " + ", ".join(
            f"{dtype} ({n} runs)" for dtype, n in sorted(report["ns_dtypes"].items())) + " (`ns_dtype` in "
            f"`{report.get('runs_file', RUNS)}`).", ""]
    sessions = report.get("sessions") or []
    rereads = [s for s in sessions if not s["computed"] and s.get("status", "finished") == "finished"]
    for s in sessions:
        if s in rereads and s is not sessions[-1]:
            continue  # a rerun that only read finished runs adds no time worth listing
        load = f"load average at start {s['load_start']}" + (
            f", at the end {s['load_end']}" if s.get("load_end") is not None else "")
        lines += [f"Session {s['date']} ({s.get('status', 'finished')}): {s['computed']} runs computed and "
                  f"{s['read']} read from the folder in {s['seconds'] / 60:.1f} min wall time, {s['jobs']} runs at a "
                  f"time on {s['cpus']} CPUs ({load}).", ""]
    lines += ["All GPT numbers are final validation losses (mean ± std over seeds; a gap is delayed - sync "
              "computed per seed, since the two runs of a seed share init and batches). Intervals are 95%: "
              "Student-t for means and paired differences, Fieller's for ratios (a recovered share, a gap "
              "ratio, an lr optimum's shift; Fieller's set is unbounded where the denominator is not resolved "
              "from 0). " + _growth(report.get("lr_extend", 2)), ""]
    coverage_line = coverage.intervals_text(report.get("intervals"))
    if coverage_line:
        lines += [coverage_line, ""]
    lines += [
              "Verdicts, one rule for every claim against its claimed region (a range, a direction, or a point "
              "with a tolerance stated in the preset before any run): **agrees** where the 95% interval lies "
              "inside it, **disagrees** where it lies outside, **undetermined** where it straddles an edge, is "
              "unbounded, depends on an lr choice the data cannot make, rests on a censored optimum or on a run "
              "that broke the protocol; a point with no tolerance can only be undetermined or disagree. A part's "
              "summary: yes (all agree), no (none agrees, some disagree), undetermined (all are), partly (the "
              "rest); the counts follow.", "", "## Summary", ""]
    lines += summary_table(report)
    family_line = coverage.multiplicity_text(report.get("multiplicity"))
    if family_line:
        lines += ["", family_line]
    lines += ["", "## Theory column", "",
              "Each number the theory gives, against the measured one under the rule above (toy rates: measured <= "
              "bound). Where the theory gives only a direction the row says qualitative; a number derived beside "
              "the theory, not from an encoded bound, says sketch; neither is scored.", ""]
    lines += theory_table(report)
    for note in report.get("notes", []):
        lines += ["", f"Note: {note}."]
    for part in report["parts"]:
        lines += ["", f"## {part['id']}. {part['title']}", "", f"**Paper.** {part['paper']}", "",
                  f"**Theory.** {part['theory']}", ""]
        lines += _part_table(part)
        held_line = selection.text(part["key"], part.get("selection"))
        if held_line:
            lines += ["", held_line]
        lines += [""] + [f"- {v['line']}" for v in part["verdicts"]]
        if part.get("figure"):
            lines += ["", f"![{part['title']}]({part['figure']})"]
        lines += ["", "Commands (each reads the finished runs of this folder, or makes the missing ones):", "", "```"]
        lines += part["commands"] + ["```"]
    return "\n".join(lines) + "\n"
