"""``DIR/report.json`` and ``DIR/report.md`` from the runs in ``DIR``.

:func:`build` reads every finding (:mod:`delaylab.reproduce.findings`), draws the figures and
lists the commands that make each run; :func:`markdown` renders the JSON as Markdown and
nothing else, so the two always say the same. The ``session`` entry (wall time, how many runs
were computed or read) is the only part that differs between a straight and a resumed run.
"""

from __future__ import annotations

from pathlib import Path

from delaylab.reproduce import figures, findings
from delaylab.reproduce import plan as P
from delaylab.reproduce.presets import Preset

REPORT_VERSION = 1
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
        "mitigations": llm_commands(P.mitigations(p, best), o),
        "momentum": llm_commands(P.momentum(p, best), o),
        "learning_rate": llm_commands(lr_runs, o),
        "schedules": llm_commands([r for g in P.schedules(p).values() for r in g], o),
        "toy": toy_commands(p),
    }


# -- the report ---------------------------------------------------------------------------------------


def build(p: Preset, out: Path, sessions: list[dict] | None = None) -> dict:
    """The report of the runs in ``out``; ``sessions``: the invocations that made them (the last is this one)."""
    parts = {f.__name__: f(p, out) for f in findings.FINDINGS}
    figs = figures.write(parts, out)
    cmds = commands(p, out)
    for key, part in parts.items():
        part["figure"] = figs.get(key)
        part["commands"] = cmds[key]
    summary = [{"id": part["id"], "finding": part["title"], "paper": part["paper"], "measured": part["headline"],
                "reproduced": part["reproduced"], "theory_agrees": part["theory_agrees"]} for part in parts.values()]
    return {"version": REPORT_VERSION, "preset": p.name, "preset_summary": p.summary, "out": str(out),
            "command": f"delaylab reproduce --preset {p.name} --out {out}", "notes": list(p.notes),
            "summary": summary, "parts": list(parts.values()), "sessions": sessions or [],
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
        return _table(["optimizer", "best sync lr", "sync val loss", "delayed", "gap", "gap 95% CI", "gap / sync",
                       "theory", "paper gap"],
                      [[r["optimizer"], f"{r['lr']:g}", _ms(r["sync"]), _ms(r["delayed"]), _ms(r["gap"], "+.3f"),
                        "n/a" if not r["gap"]["ci"] else f"[{r['gap']['ci'][0]:+.3f}, {r['gap']['ci'][1]:+.3f}]",
                        _n(r["relative_gap_pct"], "+.1f") + "%", _pred_text(r["prediction"]),
                        _n(r["paper_gap"], "+.3f")] for r in rows])
    if key == "mitigations":
        mits = [k[: -len("_recovered")] for k in rows[0] if k.endswith("_recovered")]
        head = ["optimizer", "gap (no fix)"] + [f"{m}: gap / recovered" for m in mits]
        body = []
        for r in rows:
            cells = [r["optimizer"], _ms(r["gap"], "+.3f") + ("" if r["resolved"] else " (n.s.)")]
            for m in mits:  # a share of a gap that is not resolved would be a share of noise
                rec = r[f"{m}_recovered"]["of_mean_gap"]
                cells.append(f"{_ms(r[f'{m}_gap'], '+.3f')} / " + (f"{_n(rec, '.0f')}%" if r["resolved"] else "n.s."))
            body.append(cells)
        return _table(head, body)
    if key == "momentum":
        return _table(["optimizer", "lr", "momentum", "sync", "delayed", "gap", "theory"],
                      [[r["optimizer"], f"{r['lr']:g}", f"{r['momentum']:g}", _ms(r["sync"]), _ms(r["delayed"]),
                        _ms(r["gap"], "+.3f"), _pred_text(r["prediction"])] for r in rows])
    if key == "learning_rate":
        return _table(["optimizer", "peak lr", "sync", "delayed", "gap"],
                      [[r["optimizer"], f"{r['lr']:g}", _ms(r["sync"]), _ms(r["delayed"]), _ms(r["gap"], "+.3f")]
                       for r in rows])
    if key == "schedules":
        return _table(["optimizer", "schedule", "stage delays", "mean tau", "val loss", "gap to sync", "vs 2BW"],
                      [[r["optimizer"], r["schedule"], str(r["delays"]), f"{r['mean_delay']:.2f}", _ms(r["loss"]),
                        _ms(r.get("gap"), "+.3f") if "gap" in r else "-",
                        _ms(r.get("vs_2bw"), "+.3f") if "vs_2bw" in r else "-"] for r in rows])
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


def _signed_pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:+.2f}%"


def _mode(r: dict) -> str:
    if r["delay"] == 0:
        return "sync"
    return f"tau={r['delay']}" + ("" if r["correction"] == "none" else f"+{r['correction'].upper()}")


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
