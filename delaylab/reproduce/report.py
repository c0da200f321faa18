"""The report (``report.json``) from a :class:`~delaylab.reproduce.ledger.Ledger`.

:func:`build` reads every finding (:mod:`delaylab.reproduce.findings`), names (or draws) the
figures and lists the commands that make each run; :func:`delaylab.reproduce.markdown.markdown`
renders the JSON as Markdown and nothing else, so the two always say the same. The ``session``
entry (wall time, how many runs were computed or read) is the only part that differs between a
straight and a resumed run.
"""

from __future__ import annotations

from pathlib import Path

from delaylab.reproduce import coverage, delays, field, figures, findings, protocol, selection, tokens
from delaylab.reproduce import plan as P
from delaylab.reproduce.ledger import RUNS, Ledger
from delaylab.reproduce.presets import Preset

REPORT_VERSION = 3  # 3: three-valued verdicts, Fieller intervals, adaptive grids, runs.jsonl (issue 24)


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

    def split(rs, keys) -> list[str]:
        """One command for ``rs`` if a sweep grid is exactly them, else one per value of the next key
        (optimizer, momentum, mode, lr: grown lr grids and added seeds make grids that are not products)."""
        one = command(rs)
        if one or not keys:
            return [one] if one else []
        key, rest = keys[0], keys[1:]
        return [c for v in dict.fromkeys(key(r) for r in rs) for c in split([r for r in rs if key(r) == v], rest)]

    runs = list({r.folder: r for r in runs}.values())  # a run two findings share, once
    n_seeds: dict = {}
    for r in runs:
        key = (r.cell.optimizer, r.cell.mode, r.cell.lr, r.cell.momentum)
        n_seeds[key] = n_seeds.get(key, 0) + 1
    return split(runs, [lambda r: r.cell.optimizer, lambda r: r.cell.momentum,
                        lambda r: n_seeds[(r.cell.optimizer, r.cell.mode, r.cell.lr, r.cell.momentum)],
                        lambda r: r.cell.mode, lambda r: r.cell.lr])


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


def commands(L: Ledger) -> dict[str, list[str]]:
    """Per part, commands that make (or, rerun, read) exactly its runs."""
    p, o, d = L.preset, L.out, L.decided
    cmds: dict[str, list[str]] = {}
    if p.llm is not None:
        grid = d["grid"]
        longer = [r for rec in d["overhead"].values() for r in rec["runs"] if r.variant != P.MAIN]
        cmds.update({
            "optimizers": llm_commands(grid + d["headline"], o) + llm_commands(longer, o),
            "mitigations": llm_commands(d["mitigations"] + d["ef_lrs"], o),
            "momentum": llm_commands(d["momentum"], o),
            "learning_rate": llm_commands([r for r in grid if r.cell.optimizer in p.llm.lr_sweep], o),
            "ablations": llm_commands([r for g in d["ablations"].values() for r in g], o),
        })
    if p.schedules is not None:
        cmds["schedules"] = llm_commands([r for g in d["schedules"].values() for r in g], o)
    if p.toy is not None:
        cmds["toy"] = toy_commands(p)
    for part, key in (("scale", "axis"), ("delays", "delay_axis"), ("tokens", "tokens_axis"), ("field", "field_axis")):
        if key in d:
            cmds[part] = llm_commands(d[key][0], o)
    return cmds


def parts_of(p: Preset) -> list:
    """The report's parts for this preset: the six findings where it has their grids (momentum
    only with a momentum grid), the ablations where it has any, the axes where it has them."""
    g = p.llm
    out = []
    if g is not None:
        out += [findings.optimizers, findings.mitigations] + ([findings.momentum] if g.momenta else [])
        out.append(findings.learning_rate)
    if p.schedules is not None:
        out.append(findings.schedules)
    if p.toy is not None:
        out.append(findings.toy)
    if g is not None and g.ablation_optimizers and (g.warmup_fractions or g.length_factors or g.dc_lambdas
                                                      or g.dc_adaptive):
        out.append(protocol.ablations)
    if p.scale is not None:
        out.append(protocol.scale)
    if p.delays is not None:
        out.append(delays.delays)
    if p.tokens is not None:
        out.append(tokens.tokens)
    if p.field is not None:
        out.append(field.field)
    return out


# -- the report ---------------------------------------------------------------------------------------


def build(L: Ledger, draw: Path | None = None) -> dict:
    """The report of the Ledger's runs; ``draw``: the folder to draw the figures in (None: only
    named). ``sessions`` are the Ledger's: the invocations that made its runs (the last is this one)."""
    p, out, sessions = L.preset, L.out, L.sessions
    parts = {f.__name__: f(L) for f in parts_of(p)}
    figs = figures.names(parts) if draw is None else figures.write(parts, L, draw)
    cmds = commands(L)
    for key, part in parts.items():
        part["figure"] = figs.get(key)
        part["commands"] = cmds.get(key, [])
        held = selection.selection(L, part["key"])
        if held is not None:
            part["selection"] = held
    summary = [{"id": part["id"], "finding": part["title"], "paper": part["paper"], "measured": part["headline"],
                "reproduced": part["reproduced"], "reproduced_counts": part.get("reproduced_counts", ""),
                "theory_agrees": part["theory_agrees"], "theory_counts": part.get("theory_counts", "")}
               for part in parts.values()]
    theory = [{"id": part["id"], **n} for part in parts.values() for n in part.get("theory_numbers", [])]
    intervals = coverage.report_intervals(L.lines)
    return {"version": REPORT_VERSION, "preset": p.name, "preset_summary": p.summary, "out": str(out),
            "command": f"delaylab reproduce --preset {p.name} --out {out}", "notes": list(p.notes),
            "summary": summary, "intervals": intervals,
            "multiplicity": coverage.multiplicity(list(parts.values()), intervals), "theory_column": theory,
            "parts": list(parts.values()), "sessions": sessions or [],
            "session": (sessions or [{}])[-1], "runs_file": RUNS, "ns_dtypes": L.ns_dtypes(),
            "decisions": L.decisions(), "lr_extend": lr_extend(p)}


def lr_extend(p) -> int:
    """The most x2 or /2 steps per side any lr grid of the preset may grow (the report's header states it)."""
    return max((g.lr_extend for g in (p.llm, p.scale, p.delays, p.tokens, p.field) if g is not None), default=0)
