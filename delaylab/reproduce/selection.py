"""The winner's curse of the tuned numbers: each one again with every seed held out of its own lr choice.

Findings 1-3, the tokens axis and the delay axis quote gaps at lrs chosen on the very seeds they are
measured on (the best sync lr; each mode at its own best lr; the delay axis's scan seeds, which
its cells reuse). The least mean of a grid is partly a lucky draw, so such a number carries
the luck of its choice. Here every seed's lrs are chosen again on the other base seeds only (leave
one seed out: :func:`delaylab.reproduce.stats.tuned_values`; a seed beyond the base seeds did not
choose and keeps the choice), and its gap read there. The in-sample mean minus the held-out mean
is the optimism of the choice, stated beside the number. The held-out means carry no interval:
the seeds' choices depend on one another, and a t interval over them covers less than 95% (the
coverage table of docs/intervals.md measures both).

:func:`selection` computes it for a part from the Ledger (at build and at rescore), :func:`text`
renders it.
"""

from __future__ import annotations

from delaylab.reproduce import plan as P
from delaylab.reproduce import stats as S


def _mean(values: list) -> float | None:
    return S.sample(values)["mean"]


def _pair(tv: dict) -> dict:
    """In-sample and held-out means over the seeds both have, and their difference (the optimism);
    ``in_sample_all``: the in-sample mean over every seed (the number the report quotes)."""
    inside = dict(zip(tv["seeds"], tv["in_sample"]))
    held = dict(zip(tv["held_seeds"], tv["held_out"]))
    seeds = [s for s in tv["seeds"] if s in held]
    a, b = _mean([inside[s] for s in seeds]), _mean([held[s] for s in seeds])
    chosen = dict(zip(tv["held_seeds"], tv["held_lrs"]))
    return {"seeds": seeds, "lrs": [tv["sync_lr"], tv["lr"]], "held_lrs": [chosen[s] for s in seeds],
            "in_sample": a, "held_out": b, "optimism": None if a is None or b is None else a - b,
            "in_sample_all": _mean(tv["in_sample"]),
            "values": [held[s] for s in seeds], "in_values": [inside[s] for s in seeds]}


def _optimizers(L) -> list[dict]:
    p, best, d = L.preset, L.best, L.decided
    rows = L.records(d["grid"] + d["headline"])
    out = []
    for opt in p.llm.optimizers:
        base, mom = set(range(P.seeds(p, opt))), best[opt]["momentum"]
        sync, delayed = S.by_lr(rows, opt, "sync", mom), S.by_lr(rows, opt, "delayed", mom)
        out.append({"optimizer": opt, "gap": _pair(S.tuned_values(sync, delayed, base, tune_other=False)),
                    "tuned": _pair(S.tuned_values(sync, delayed, base))})
    return out


def _ef_tuned(L) -> list[dict]:
    p, best, d = L.preset, L.best, L.decided
    if "ef" not in p.llm.mitigations or not p.llm.ef_lrs:
        return []
    rows = L.records(d["grid"] + d["headline"] + d["mitigations"]) + L.records(d["ef_lrs"])
    out = []
    for opt in p.llm.ef_lrs:
        base, mom = set(range(P.seeds(p, opt))), best[opt]["momentum"]
        sync = S.by_lr(rows, opt, "sync", mom)
        delayed = _pair(S.tuned_values(sync, S.by_lr(rows, opt, "delayed", mom), base))
        ef = _pair(S.tuned_values(sync, S.by_lr(rows, opt, "ef", mom), base))
        rec = {}
        for key, src in (("in_sample", "in_values"), ("held_out", "values")):
            dv, ev = dict(zip(delayed["seeds"], delayed[src])), dict(zip(ef["seeds"], ef[src]))
            seeds = [s for s in dv if s in ev]
            md, me = _mean([dv[s] for s in seeds]), _mean([ev[s] for s in seeds])
            rec[key] = None if md in (None, 0) or me is None else 100 * (1 - me / md)
        out.append({"optimizer": opt, "delayed": delayed, "ef": ef, "recovered": rec,
                    "optimism": None if None in rec.values() else rec["in_sample"] - rec["held_out"]})
    return out


def _momentum(L) -> list[dict]:
    p = L.preset
    rows = L.records(L.decided["momentum"])
    out = []
    for opt, grid in p.llm.momenta.items():
        ends = []
        for mom in (grid[0], grid[-1]):
            sync, delayed = S.by_lr(rows, opt, "sync", mom), S.by_lr(rows, opt, "delayed", mom)
            ends.append(_pair(S.tuned_values(sync, delayed)))
        change = {}
        for key, src in (("in_sample", "in_values"), ("held_out", "values")):
            lo, hi = (dict(zip(e["seeds"], e[src])) for e in ends)
            seeds = [s for s in lo if s in hi]
            change[key] = _mean([None if lo[s] is None or hi[s] is None else hi[s] - lo[s] for s in seeds])
        out.append({"optimizer": opt, "momenta": [grid[0], grid[-1]], "ends": ends, "change": change,
                    "optimism": None if None in change.values() else change["in_sample"] - change["held_out"]})
    return out


def _fresh(tv: dict, base) -> float | None:
    """The mean gap over the seeds that chose nothing (outside ``base``): a held-out read by design."""
    return _mean([v for s, v in zip(tv["seeds"], tv["in_sample"]) if s not in base])


def _tokens(L) -> list[dict]:
    """Each point of the tokens axis: both modes' lrs are tuned over all its seeds."""
    opt = L.preset.tokens.optimizer
    out = []
    for (size, ratio, kind), point in L.tokens_axis.items():
        rows = L.records(point["runs"])
        mom = rows[0]["momentum"]
        tv = S.tuned_values(S.by_lr(rows, opt, "sync", mom), S.by_lr(rows, opt, "delayed", mom))
        out.append({"size": size, "tokens_per_param": ratio, "kind": kind, **_pair(tv)})
    return out


def _delays(L) -> list[dict]:
    """The delay axis's tuned settings: sync's lr and each mode's chosen on the scan's seeds, the cells
    read on more; the seeds beyond the scan's chose nothing (``fresh``)."""
    g, res = L.preset.delays, L.delay_axis
    base = set(range(g.scan_seeds))
    lines = [x for x in L.lines if x["kind"] == "gpt"]
    out = []
    for opt in res["lrs"]["sync"]:
        sync = S.by_lr([x for x in lines if x["variant"] == "delays-sync"], opt, "sync", g.momentum.get(opt))
        for name in g.tuned:
            for mode in g.modes_of(g.setting(name)):
                mine = S.by_lr([x for x in lines if x["variant"] == f"delays-{name}"], opt, mode, g.momentum.get(opt))
                if not mine or (name, opt, mode) not in res["lrs"]:
                    continue
                tv = S.tuned_values(sync, mine, base)
                out.append({"setting": name, "optimizer": opt, "mode": mode, "fresh": _fresh(tv, base),
                            "fresh_seeds": [s for s in tv["seeds"] if s not in base], **_pair(tv)})
    return out


def _scale(L) -> list[dict]:
    """The first tokens axis: each point's lr is the best of a sync scan on the scan's seeds, and its
    cells reuse them; the seeds beyond the scan's chose nothing (``fresh``)."""
    from delaylab.reproduce.plan import axis_variant

    s = L.preset.scale
    base = set(range(s.scan_seeds))
    out = []
    for (size, ratio, opt), point in L.axis.items():
        rows = [x for x in L.lines if x["kind"] == "gpt" and x["variant"] == axis_variant(size, ratio)]
        mom = s.momentum.get(opt)
        tv = S.tuned_values(S.by_lr(rows, opt, "sync", mom), S.by_lr(rows, opt, "delayed", mom), base,
                            tune_other=False)
        out.append({"size": size, "tokens_per_param": ratio, "optimizer": opt, "fresh": _fresh(tv, base),
                    "fresh_seeds": [x for x in tv["seeds"] if x not in base], **_pair(tv)})
    return out


PARTS = {"optimizers": _optimizers, "mitigations": _ef_tuned, "momentum": _momentum, "tokens": _tokens,
         "delays": _delays, "scale": _scale}


NEEDS = {"optimizers": "best", "mitigations": "best", "momentum": "best", "tokens": "tokens_axis",
         "delays": "delay_axis", "scale": "axis"}  # the Ledger's decision each part's choice is read from


def selection(L, key: str) -> list[dict] | None:
    """The held-out numbers of part ``key`` (None for a part that quotes no tuned number)."""
    fn = PARTS.get(key)
    return fn(L) if fn is not None and getattr(L, NEEDS[key]) is not None else None


def _f(x, spec: str = "+.3f") -> str:
    return S.fmt(x, spec)


def text(key: str, sel: list[dict] | None) -> str:
    """The part's selection line: each tuned number held out, beside its in-sample value."""
    if not sel:
        return ""
    if key == "optimizers":
        gap = "; ".join(f"{r['optimizer']} {_f(r['gap']['held_out'])} vs {_f(r['gap']['in_sample'])} "
                        f"({_f(r['gap']['optimism'])})" for r in sel)
        tuned = "; ".join(f"{r['optimizer']} {_f(r['tuned']['held_out'])} vs {_f(r['tuned']['in_sample'])} "
                          f"({_f(r['tuned']['optimism'])})" for r in sel)
        return ("Selection (the winner's curse): each seed's lrs chosen again on the other base seeds only (leave "
                "one out), so no seed is read at an lr it helped choose; held out vs in sample, and the difference "
                f"(the choice's optimism): gap at the best sync lr: {gap}. Tuned gap (each mode at its own best lr): "
                f"{tuned}. Held-out means carry no interval: the seeds' choices depend on one another and a t "
                "interval over them covers less than 95% (docs/intervals.md).")
    head = "Selection (held out as in finding 1; in sample and the optimism beside)"
    if key == "tokens":
        return ("Selection (the winner's curse): both modes' lrs are chosen on the point's own seeds; each seed "
                "again at the lrs the other seeds choose (leave one out), held out vs in sample and the optimism: "
                + "; ".join(f"{r['size']} {r['tokens_per_param']:g}:1 {r['kind']} {_f(r['held_out'])} vs "
                            f"{_f(r['in_sample'])} ({_f(r['optimism'])})" for r in sel)
                + ". Held-out means carry no interval (docs/intervals.md).")
    if key == "scale":
        fresh = sorted({x for r in sel for x in r["fresh_seeds"]})
        return ("Selection (the winner's curse): each point's lr is the best of a sync scan on seed"
                f"{'s' if len(fresh) != 1 else ''} its cells reuse; the gap on the seeds that chose nothing "
                f"({', '.join(str(x) for x in fresh) or 'none'}) vs all seeds: " + "; ".join(
                    f"{r['size']} {r['tokens_per_param']:g}:1 {r['optimizer']} {_f(r['fresh'])} vs {_f(r['in_sample_all'])}"
                    for r in sel) + ". No interval on these means (docs/intervals.md).")
    if key == "delays":
        fresh = sorted({s for r in sel for s in r["fresh_seeds"]})
        return ("Selection (the winner's curse): the tuned settings' lrs are chosen on the scan's seeds; on the "
                f"seeds that chose nothing ({', '.join(str(s) for s in fresh) or 'none'}), vs all seeds in sample, "
                "and each seed held out of its own choice (leave one out): " + "; ".join(
                    f"{r['setting']} {r['optimizer']} {r['mode']} {_f(r['fresh'])} vs {_f(r['in_sample_all'])} "
                    f"(held out {_f(r['held_out'])})" for r in sel) + ". No interval on these means (docs/intervals.md).")
    if key == "mitigations":
        return f"{head}: EF's recovery with each mode at its own best lr: " + "; ".join(
            f"{r['optimizer']} {_f(r['recovered']['held_out'], '.0f')}% vs {_f(r['recovered']['in_sample'], '.0f')}% "
            f"({_f(r['optimism'], '+.0f')} points)" for r in sel) + "."
    return f"{head}: gap change from the lowest to the highest momentum, each mode tuned: " + "; ".join(
        f"{r['optimizer']} {_f(r['change']['held_out'])} vs {_f(r['change']['in_sample'])} ({_f(r['optimism'])})"
        for r in sel) + "."
