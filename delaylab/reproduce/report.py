"""``DIR/report.json`` and ``DIR/report.md`` from the runs in ``DIR``.

:func:`build` reads every finding (:mod:`delaylab.reproduce.findings`), draws the figures and
lists the commands that make each run; :func:`markdown` renders the JSON as Markdown and
nothing else, so the two always say the same. The ``session`` entry (wall time, how many runs
were computed or read) is the only part that differs between a straight and a resumed run.
"""

from __future__ import annotations

from pathlib import Path

from delaylab.reproduce import figures, findings, protocol
from delaylab.reproduce import plan as P
from delaylab.llm.metrics import fmt_overhead
from delaylab.reproduce.findings import _ci, _mode
from delaylab.reproduce.protocol import recovery_text
from delaylab.reproduce.presets import Preset

REPORT_VERSION = 2  # 2: protocol v2 (theory column, ablations, scale axis)
YES = {True: "yes", False: "no", None: "n/a"}


# -- commands ---------------------------------------------------------------------------------------


def _flag(name: str, value) -> str:
    if isinstance(value, bool):
        value = "true" if value else "false"
    elif isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    return f"--{name.replace('_', '-')} {value}"


def train_flags(base: dict) -> list[str]:
    """The ``delaylab llm train/sweep`` flags that give the config fields ``base`` (flat)."""
    from delaylab.llm.config import Config

    default = Config().flat()
    return [_flag(k, v) for k, v in base.items() if k != "progress" and v != default.get(k)]


def _sweep_command(variant: str, base: dict, runs: list, out: str) -> list[str]:
    """``delaylab llm sweep`` commands whose grids are exactly ``runs`` (checked with sweep.plan)."""
    from delaylab.llm.config import Config
    from delaylab.llm.sweep import plan as sweep_plan

    def command(rs) -> str | None:
        opts = list(dict.fromkeys(r.cell.optimizer for r in rs))
        modes = list(dict.fromkeys(r.cell.mode for r in rs))
        lrs = {o: sorted({r.cell.lr for r in rs if r.cell.optimizer == o}) for o in opts}
        moms = {o: sorted({r.cell.momentum for r in rs if r.cell.optimizer == o}, key=lambda m: (m is not None, m))
                for o in opts}
        seeds = sorted({r.cell.seed for r in rs})
        if seeds != list(range(len(seeds))) or any(None in m and len(m) > 1 for m in moms.values()):
            return None
        grid = sweep_plan(Config.from_dict(base), opts, modes, lrs,
                          {o: m for o, m in moms.items() if m != [None]}, len(seeds))
        if {c.name for c in grid} != {r.cell.name for r in rs} or len(grid) != len(rs):
            return None
        parts = ["delaylab llm sweep", *train_flags(base), f"--optimizers {','.join(opts)}",
                 f"--modes {','.join(modes)}"]
        parts += [f"--lrs {o}={','.join(f'{x:g}' for x in lrs[o])}" for o in opts]
        parts += [f"--momentum {o}={','.join(f'{x:g}' for x in moms[o])}" for o in opts if moms[o] != [None]]
        parts += [f"--seeds {len(seeds)}", "--jobs 2", f"--out {out}/llm/{variant}"]
        return " ".join(parts)

    whole = command(runs)
    if whole:
        return [whole]
    cmds = []
    for opt in dict.fromkeys(r.cell.optimizer for r in runs):
        mine = [r for r in runs if r.cell.optimizer == opt]
        one = command(mine)
        cmds += [one] if one else [c for mode in dict.fromkeys(r.cell.mode for r in mine)
                                   for c in [command([r for r in mine if r.cell.mode == mode])] if c]
    return cmds


def llm_commands(runs: list, out: str) -> list[str]:
    by_variant: dict[str, list] = {}
    for r in runs:
        by_variant.setdefault(r.variant, []).append(r)
    return [c for variant, rs in by_variant.items() for c in _sweep_command(variant, rs[0].base, rs, out)]


def toy_commands(p: Preset) -> list[str]:
    t = p.toy
    cmds = [f"delaylab toy rates --suite --problem {prob} --method {','.join(t.methods)} "
            f"--T {','.join(map(str, t.T))} --seeds {t.seeds}" for prob in t.problems]
    cmds.append(f"delaylab toy cost --problem {t.cost_problem} --method {t.cost_method} --T {t.cost_T} "
                f"--seeds {t.seeds} --betas {','.join(f'{b:g}' for b in t.cost_betas)}")
    cmds.append(f"delaylab toy compare --problem {t.compare_problem} --T {t.compare_T} --seeds {t.compare_seeds}")
    return cmds


def commands(p: Preset, out: Path) -> dict[str, list[str]]:
    """Per finding, commands that make (or, rerun, read) exactly its runs."""
    o = str(out)
    best = P.best_sync(p, out)
    lr_runs = [r for r in P.grid(p) if r.cell.optimizer in p.llm.lr_sweep]
    return {
        "optimizers": llm_commands(P.grid(p), o),
        "mitigations": llm_commands(P.mitigations(p, best) + P.ef_lrs(p, best), o),
        "momentum": llm_commands(P.momentum(p, best), o),
        "learning_rate": llm_commands(lr_runs, o),
        "schedules": llm_commands([r for g in P.schedules(p).values() for r in g], o),
        "toy": toy_commands(p),
        "ablations": llm_commands([r for g in P.ablations(p, best).values() for r in g], o),
        "scale": llm_commands([r for g in P.scale(p, P.scale_lrs(p, out)).values() for r in g], o)
        if p.scale else [],
    }


def parts_of(p: Preset) -> list:
    """The report's parts for this preset: the six findings (momentum only with a momentum grid),
    the ablations where the preset has any, the scale axis where it has one."""
    g = p.llm
    out = [f for f in findings.FINDINGS if f is not findings.momentum or g.momenta]
    if g.ablation_optimizers and (g.warmup_fractions or g.length_factors or g.dc_lambdas or g.dc_adaptive):
        out.append(protocol.ablations)
    if p.scale:
        out.append(protocol.scale)
    return out


# -- the report ---------------------------------------------------------------------------------------


def build(p: Preset, out: Path, sessions: list[dict] | None = None) -> dict:
    """The report of the runs in ``out``; ``sessions``: the invocations that made them (the last is this one)."""
    parts = {f.__name__: f(p, out) for f in parts_of(p)}
    figs = figures.write(parts, out)
    cmds = commands(p, out)
    for key, part in parts.items():
        part["figure"] = figs.get(key)
        part["commands"] = cmds[key]
    summary = [{"id": part["id"], "finding": part["title"], "paper": part["paper"], "measured": part["headline"],
                "reproduced": part["reproduced"], "theory_agrees": part["theory_agrees"]} for part in parts.values()]
    theory = [{"id": part["id"], **n} for part in parts.values() for n in part.get("theory_numbers", [])]
    return {"version": REPORT_VERSION, "preset": p.name, "preset_summary": p.summary, "out": str(out),
            "command": f"delaylab reproduce --preset {p.name} --out {out}", "notes": list(p.notes),
            "summary": summary, "theory_column": theory, "parts": list(parts.values()), "sessions": sessions or [],
            "session": (sessions or [{}])[-1]}


# -- Markdown -----------------------------------------------------------------------------------------


def _n(x, spec=".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def _ms(s: dict | None, spec=".3f") -> str:
    """mean +- std (and how many runs diverged)."""
    if not s or s.get("mean") is None:
        return "diverged" if s and s.get("diverged") else "n/a"
    text = f"{format(s['mean'], spec)} ± {format(s['std'], spec.lstrip('+'))}"
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


def _part_table(part: dict) -> list[str]:
    key, rows = part["key"], part["rows"]
    if key == "optimizers":
        lines = _table(["optimizer", "best sync lr", "sync val loss", "delayed", "gap", "gap 95% CI", "gap / sync",
                        "iso-loss overhead", "tuned gap (delayed lr)", "theory", "paper gap"],
                       [[r["optimizer"], f"{r['lr']:g}", _ms(r["sync"]), _ms(r["delayed"]), _ms(r["gap"], "+.3f"),
                         _ci(r["gap"]), _n(r["relative_gap_pct"], "+.1f") + "%", fmt_overhead(r.get("overhead")),
                         f"{_ms(r['tuned']['gap'], '+.3f')} ({_n(r['tuned']['lr'], 'g')})",
                         _pred_text(r["prediction"]), _n(r["paper_gap"], "+.3f")] for r in rows])
        lines += ["", "The gap at the three lrs around each optimizer's best sync lr, and the regime diagnostics "
                      "at the best (mean over seeds: the largest train-loss spike after warmup, in nats, and the "
                      "update at which the loss leaves its end-of-warmup level by 0.1 nats):", ""]
        lines += _table(["optimizer", "gap at lr (95% CI)", "spike sync / delayed", "plateau exit sync / delayed"],
                        [[r["optimizer"], "; ".join(f"{x['lr']:g}: {_n(x['gap']['mean'], '+.3f')} {_ci(x['gap'])}"
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
            cells = [r["optimizer"], _ms(r["gap"], "+.3f") + ("" if r["resolved"] else " (n.s.)")]
            for m in mits:  # a share of a gap that is not resolved would be a share of noise
                rec = r[f"{m}_recovered"]
                cells.append(f"{_ms(r[f'{m}_gap'], '+.3f')} / " + (
                    f"{_n(rec['ratio_of_means'], '.0f')}% {_ci(rec, '.0f')}" if r["resolved"] else "n.s."))
            body.append(cells)
        lines = _table(head, body)
        lines += ["", "Recovered: 100 (mean delayed - mean fixed) / (mean delayed - mean sync) over the seeds, with a "
                      "bootstrap 95% interval (whole seeds resampled); n.s. where the gap itself is not resolved."]
        if part.get("ef_by_lr"):
            lines += ["", "EF at the three lrs around the best sync lr:", ""]
            lines += _table(["optimizer", "lr", "gap", "EF gap", "EF recovers"],
                            [[r["optimizer"], f"{r['lr']:g}", _ms(r["gap"], "+.3f"), _ms(r["ef_gap"], "+.3f"),
                              f"{_n(r['recovered']['ratio_of_means'], '.0f')}% {_ci(r['recovered'], '.0f')}"
                              + (" (unstable)" if r["recovered"]["unstable"] else "")] for r in part["ef_by_lr"]])
        if part.get("ef_tuned"):
            lines += ["", "Each mode at its own best lr (sync over the lr grid, delayed over the grid, EF over its "
                          "three lrs):", ""]
            lines += _table(["optimizer", "sync lr", "delayed lr / gap", "EF lr / gap", "EF recovers"],
                            [[r["optimizer"], f"{r['sync_lr']:g}", f"{r['delayed_lr']:g} / {_ms(r['delayed_gap'], '+.3f')}",
                              f"{r['ef_lr']:g} / {_ms(r['ef_gap'], '+.3f')}", _rec({"ratio_of_means": r["recovered"],
                                                                                  "ci_boot": r["ci_boot"],
                                                                                  "unstable": r["unstable"]})]
                             for r in part["ef_tuned"]])
        return lines
    if key == "momentum":
        return [f"Protocol: {part['protocol']}.", ""] + _table(
            ["optimizer", "momentum", "gap at lr fixed", "best sync lr", "sync", "delayed", "gap (sync-tuned)",
             "tuned gap (delayed lr)", "theory"],
            [[r["optimizer"], f"{r['momentum']:g}", f"{_ms(r['fixed_gap'], '+.3f')} ({r['fixed_lr']:g})",
              f"{r['lr']:g}" + (" (edge)" if r["sync_lr_at_edge"] else ""), _ms(r["sync"]), _ms(r["delayed"]),
              _ms(r["gap"], "+.3f"), f"{_ms(r['tuned']['gap'], '+.3f')} ({_n(r['tuned']['lr'], 'g')})",
              _pred_text(r["prediction"])] for r in rows])
    if key == "learning_rate":
        return _table(["optimizer", "peak lr", "sync", "delayed", "gap"],
                      [[r["optimizer"], f"{r['lr']:g}", _ms(r["sync"]), _ms(r["delayed"]), _ms(r["gap"], "+.3f")]
                       for r in rows])
    if key == "schedules":
        return _table(["optimizer", "schedule", "stage delays", "mean tau", "val loss", "gap to sync", "vs 2BW",
                       "gap / 2BW gap (95% CI)"],
                      [[r["optimizer"], r["schedule"], str(r["delays"]), f"{r['mean_delay']:.2f}", _ms(r["loss"]),
                        _ms(r.get("gap"), "+.3f") if "gap" in r else "-",
                        _ms(r.get("vs_2bw"), "+.3f") if "vs_2bw" in r else "-",
                        _ratio_text(r.get("gap_ratio"))] for r in rows])
    if key == "ablations":
        return _ablation_tables(rows)
    if key == "scale":
        return _scale_tables(part)
    if key == "toy":
        ts = rows[0]["T"]
        lines = _table(["problem", "method", "mode"] + [f"measured/bound T={t}" for t in ts]
                       + ["slope", "bound exponent", "holds"],
                       [[r["problem"], r["method"], _mode(r)] + [_n(x, ".2f") for x in r["ratios"]]
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
            lines += _table(["method", "delta_bar", "EF recovers", "predicted to help", "helped"],
                            [[r["method"], f"{r['delta_bar']:.2f}", f"{r['ef_recovers_pct']:.0f}%",
                              YES[r["predicted_helps"]], YES[r["helps"]]] for r in part["ef"]])
        return lines
    return []


def _ratio_text(r: dict | None) -> str:
    if not r or r.get("ratio") is None:
        return "-"
    return f"{r['ratio']:.2f} {_ci(r, '.2f')}" + (" (unstable: the denominator is not resolved from 0)" if r.get("unstable") else "")


def _rec(rec: dict | None) -> str:
    """A recovered share in a table cell: the verdicts' text with the short unstable mark."""
    return recovery_text(rec, unstable=" (unstable)")


def _ablation_tables(rows: dict) -> list[str]:
    lines = []
    for key, title in (("warmup", "Warmup"), ("length", "Run length")):
        if not rows[key]:
            continue
        lines += [f"{title} (at the best sync lr; overhead: tokens to reach the same-length sync run's final loss, "
                  "'>' a lower bound where never reached):", ""]
        body = []
        for r in rows[key]:
            for name, st in r["settings"].items():
                d = st["diagnostics"].get("delayed", {})
                body.append([r["optimizer"], name, _ms(st["gap"], "+.3f"), _ms(st.get("fix_gap"), "+.3f"),
                             _rec(st.get("recovered")), fmt_overhead(st["overhead"].get("delayed")),
                             _n(d.get("spike"), ".2f"), _n(d.get("plateau_exit"), ".0f")])
            extra = ""
            if key == "length":
                extra = "; longer delayed run vs the 1x sync run: " + fmt_overhead(
                    r["overhead_vs_1x_sync"].get("delayed")) + ", EF: " + fmt_overhead(
                    r["overhead_vs_1x_sync"].get("ef"))
            body.append([r["optimizer"], "change", _ms(r["gap_change"], "+.3f") + f" {_ci(r['gap_change'])}", "",
                         "", extra.lstrip("; "), "", ""])
        lines += _table(["optimizer", "setting", "gap", "EF gap", "EF recovers", "overhead (delayed)",
                         "delayed spike", "delayed plateau exit"], body) + [""]
    if rows["dc"]:
        lines += ["DC-ASGD by lambda (and DC-ASGD-a), at the best sync lr:", ""]
        lines += _table(["optimizer", "lambda", "gap with DC-ASGD", "recovers"],
                        [[r["optimizer"], "adaptive (DC-ASGD-a)" if r["lambda"] is None else f"{r['lambda']:g}",
                          _ms(r["fix_gap"], "+.3f"), _rec(r["recovered"])] for r in rows["dc"]])
    return lines


def _scale_tables(part: dict) -> list[str]:
    lines = [f"Setup: {part['setup']}.", ""]
    body = []
    for e in part["rows"]:
        for opt, st in e["optimizers"].items():
            body.append([e["size"], f"{e['params'] / 1e6:.2f}M", str(e["steps"]), opt, f"{st['lr']:g}",
                         _ms(st["gap"], "+.3f"), _ms(st.get("fix_gap"), "+.3f"), _rec(st.get("recovered")),
                         fmt_overhead(st["overhead"].get("delayed"))])
    lines += _table(["size", "params", "updates", "optimizer", "lr", "gap", "EF gap", "EF recovers",
                     "iso-loss overhead"], body)
    lines += ["", "Trends against log10(parameters), bootstrap 95% interval (seeds resampled within each size):", ""]
    lines += _table(["quantity", "per size", "slope per decade", "direction", "paper (135M-360M)"],
                    [[k, ", ".join(_n(v, ".3g") for v in t["values"]), f"{_n(t['slope'], '+.3g')} {_ci(t, '+.3g')}",
                      t["direction"], _paper(t["paper"])] for k, t in part["trends"].items()])
    ratios = [f"{e['size']} {_ratio_text(e.get('gap_ratio'))}" for e in part["rows"] if e.get("gap_ratio")]
    if ratios:
        lines += ["", "AdamW gap / Muon gap per size (ratio of means, paired by seed): " + "; ".join(ratios) + "."]
    return lines


def _paper(x) -> str:
    return f"{x[0]:g}-{x[1]:g}%" if isinstance(x, (list, tuple)) else f"{x:.3g}"


def theory_table(report: dict) -> list[str]:
    """The theory column: each number the theory gives against the measured one."""
    rows = report.get("theory_column") or []
    return _table(["#", "quantity", "theory", "measured (95% CI)", "agrees", "from"],
                  [[str(n["id"]), n["quantity"],
                    "qualitative" if n["note"] == "qualitative" else _n(n["predicted"], ".3g") + _unit(n),
                    "-" if n["measured"] is None else _n(n["measured"], ".3g") + _unit(n) + (
                        f" [{n['ci'][0]:.3g}, {n['ci'][1]:.3g}]" if n["ci"] else ""),
                    "-" if n["note"] == "qualitative" else YES[n["agree"]] if n["agree"] is not None
                    else "not resolved", n["source"]] for n in rows])


def _unit(n: dict) -> str:
    return "%" if n["unit"] == "%" else ""


def _signed_pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:+.2f}%"




def summary_table(report: dict) -> list[str]:
    return _table(["#", "finding", "paper", "measured here", "reproduced", "theory agrees"],
                  [[str(s["id"]), s["finding"], s["paper"], s["measured"], s["reproduced"], s["theory_agrees"]]
                   for s in report["summary"]])


def markdown(report: dict) -> str:
    lines = [f"# delaylab reproduce: preset `{report['preset']}`", "",
             f"{report['preset_summary']}.", "", f"Made by `{report['command']}`.", ""]
    sessions = report.get("sessions") or []
    rereads = [s for s in sessions if not s["computed"] and s.get("status", "finished") == "finished"]
    for s in sessions:
        if s in rereads and s is not sessions[-1]:
            continue  # a rerun that only read finished runs adds no time worth listing
        lines += [f"Session {s['date']} ({s.get('status', 'finished')}): {s['computed']} runs computed and "
                  f"{s['read']} read from the folder in {s['seconds'] / 60:.1f} min wall time, {s['jobs']} runs at a "
                  f"time on {s['cpus']} CPUs (load average at start {s['load_start']}).", ""]
    lines += ["All GPT numbers are final validation losses (mean ± std over seeds; a gap is delayed - sync "
              "computed per seed, since the two runs of a seed share init and batches). A gap is resolved "
              "when its 95% t-interval over seeds excludes 0.", "", "## Summary", ""]
    lines += summary_table(report)
    lines += ["", "## Theory column", "",
              "Each number the theory gives, against the measured one; 'agrees' means the theory's number lies in "
              "the measured 95% interval (toy rates: measured <= bound). Where the theory gives a direction but no "
              "number, the row says qualitative and no verdict is drawn from a sign.", ""]
    lines += theory_table(report)
    for note in report.get("notes", []):
        lines += ["", f"Note: {note}."]
    for part in report["parts"]:
        lines += ["", f"## {part['id']}. {part['title']}", "", f"**Paper.** {part['paper']}", "",
                  f"**Theory.** {part['theory']}", ""]
        lines += _part_table(part)
        lines += [""] + [f"- {v['line']}" for v in part["verdicts"]]
        if part.get("figure"):
            lines += ["", f"![{part['title']}]({part['figure']})"]
        lines += ["", "Commands (each reads the finished runs of this folder, or makes the missing ones):", "", "```"]
        lines += part["commands"] + ["```"]
    return "\n".join(lines) + "\n"
