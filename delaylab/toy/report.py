"""The toy checks' results as text: the terminal tables of ``delaylab toy`` and the README's
Markdown table of the rate suite. Inputs are the dicts of :mod:`delaylab.toy.rates` and
:mod:`delaylab.toy.profile`; nothing here computes a result."""

from __future__ import annotations


def mode_label(delay: int, correction: str) -> str:
    """``sync``, ``tau=1`` or ``tau=1+EF`` (the correction in capitals)."""
    if delay == 0:
        return "sync"
    return f"tau={delay}" + ("" if correction == "none" else f"+{correction.upper()}")


def _fmt(x, spec=".3g") -> str:
    return "-" if x is None else format(x, spec)


def _yes(flag) -> str:
    return {True: "yes", False: "NO", None: "n/a"}[flag]


def verdict(r: dict) -> str:
    """A rate check's two parts in words: ``holds``, ``bound holds, slope check fails``, ``bound
    fails, slope check holds``, ``bound and slope check fail`` or ``no bound``."""
    bound, slope = r.get("bound_holds"), r.get("slope_holds")
    if bound is None:
        return "no bound"
    if bound and slope:
        return "holds"
    if bound:
        return "bound holds, slope check fails"
    if slope:
        return "bound fails, slope check holds"
    return "bound and slope check fail"


def render_list(r: dict) -> str:
    lines = ["problems (constants of the default instance; * = an upper bound, not attained):"]
    for p in r["problems"]:
        consts = ", ".join(f"L_{n}={v:.4g}{'' if p['L_exact'][n] else '*'}" for n, v in p["L"].items())
        lines.append(f"  {p['name']:18s} shape {tuple(p['shape'])}  {consts}, sigma={p['sigma']:.3g}, "
                     f"Delta={p['Delta']:.4g}")
        lines.append(f"  {'':18s} {p['summary']}")
    lines.append("methods:")
    lines += [f"  {m['name']:18s} {m['summary']}" for m in r["methods"]]
    lines.append("corrections (with --delay K >= 1): " + ", ".join(r["corrections"]))
    return "\n".join(lines)


def render_rates(r: dict) -> str:
    mode = f"tau={r['delay']}" + ("" if r["correction"] == "none" else f" + {r['correction']}")
    lines = [
        f"rates: {r['problem']}, {r['method']}, {mode}, {r['seeds']} seeds; bound "
        f"{r['bound_name'] or 'none'}; metric: {r['metric']}",
        f"{'T':>7} {'eta':>9} {'beta':>7} {'measured [95% CI]':>26} {'bound':>9} {'ratio':>6} holds",
    ]
    for p in r["points"]:
        ci = f"{p['measured']:.4g} [{p['ci'][0]:.4g}, {p['ci'][1]:.4g}]"
        lines.append(f"{p['T']:>7} {p['eta']:>9.3g} {p['beta']:>7.3f} {ci:>26} {_fmt(p['bound'], '.4g'):>9} "
                     f"{_fmt(p['ratio'], '.2f'):>6} {_yes(p['holds'])}")
    lines.append(f"slope {r['slope']:.3f} vs the bound's exponent {r['exponent']:.3f} + tolerance "
                 f"{r['tolerance']:.2f}: {_yes(r['slope_holds'])}  (the tuned bound's own slope on this grid: "
                 f"{_fmt(r['bound_slope'], '.3f')})")
    lines.append(f"verdict: {verdict(r)}   ({r['seconds']:.1f} s)")
    return "\n".join(lines)


def render_suite(r: dict) -> str:
    lines = [f"rate suite: T = {r['T']}, {r['seeds']} seeds; ratio = measured / bound (max over T); "
             f"slope must be <= exponent + {r['tolerance']:.2f}",
             f"{'problem':18s} {'method':13s} {'mode':10s} {'max ratio':>9} {'slope':>7} {'exponent':>8} holds"]
    for x in r["results"]:
        mode = mode_label(x["delay"], x["correction"])
        lines.append(f"{x['problem']:18s} {x['method']:13s} {mode:10s} {x['max_ratio']:>9.2f} "
                     f"{x['slope']:>7.3f} {x['exponent']:>8.3f} {_yes(x['holds'])}")
    lines.append(f"holds: {_yes(r['holds'])}   ({r['seconds']:.1f} s)")
    return "\n".join(lines)


def suite_markdown(r: dict, command: str) -> str:
    """The README table: measured/bound ratios per T and the fitted slopes."""
    ts = r["T"]
    head = ["problem", "method", "mode"] + [f"ratio T={t}" for t in ts] + ["slope", "bound slope", "holds"]
    lines = [
        "### Toy rate suite: measured / bound",
        "",
        f"Measured `(1/T) sum_t E||grad f(x_t)||_*` over {r['seeds']} seeds divided by the bound of "
        "`delaylab.theory` at the theory-tuned (eta, beta) for each T (EF: at the gradient points, "
        "with the measured delta_bar); slope = least-squares log-log slope of the measured averages "
        f"(bound exponent -1/4, pass if <= -1/4 + {r['tolerance']:g}).",
        "",
        f"Made by `{command}` in {r['seconds']:.0f} s"
        + (f" (figure: `{r['figures'][0]}`)." if r.get("figures") else "."),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    for x in r["results"]:
        ratios = {p["T"]: p["ratio"] for p in x["points"]}
        cells = [x["problem"], x["method"], mode_label(x["delay"], x["correction"])]
        cells += [_fmt(ratios.get(t), ".2f") for t in ts]
        cells += [f"{x['slope']:.3f}", _fmt(x["bound_slope"], ".3f"), _yes(x["holds"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def render_compare(r: dict) -> str:
    modes = r["modes"]
    shape = "x".join(map(str, r["shape"]))
    dual = {"spectral": "nuclear", "sign": "l1", "l2": "l2"}[r["norm"]]
    lines = [
        f"compare: {r['problem']} ({shape}), T={r['T']} updates, tau={r['delay']}, beta={r['beta']:g}, "
        f"{r['seeds']} seeds, eta = " + ("" if r["eta_scale"] == 1 else f"{r['eta_scale']:g} x ")
        + "the sync bound's best at this beta",
        f"mean_t ||grad f(x_t)||_{dual} (lower is better), +-: 95% CI half-width; gap = change vs sync",
    ]
    head = f"{'method':13s} {'eta':>8}  {'sync':>15}"
    for m in modes[1:]:
        head += f"  {m:>15} {'gap':>7}"
    if "ef" in modes and "delayed" in modes:
        head += f"  {'EF recovers':>11} {'delta_bar':>9}"
    head += f"  {'bound: delay cost':>17}"
    lines.append(head)
    for row in r["rows"]:
        def cell(m):
            c = row[m]
            return f"{c['mean']:.4g} +-{(c['ci'][1] - c['ci'][0]) / 2:.2g}"
        line = f"{row['method']:13s} {row['eta']:>8.3g}  {cell('sync'):>15}"
        for m in modes[1:]:
            line += f"  {cell(m):>15} {100 * row[m]['relative_gap']:>+6.2f}%"
        if "ef" in modes and "delayed" in modes:
            rec = row.get("ef_recovers")
            text = "-" if rec is None else f"{100 * rec:.0f}%"
            if rec is not None and row["delayed"]["relative_gap_ci"][0] <= 0:
                text = "n.s."  # the delay's own gap is within noise: no gap to recover
            line += f"  {text:>11} {_fmt(row.get('delta_bar'), '.2f'):>9}"
        pred = row["predicted_relative_gap"]
        line += f"  {('-' if pred is None else f'+{100 * pred:.2f}%'):>17}"
        lines.append(line)
    lines.append("EF recovers = (delayed - EF) / (delayed - sync) (n.s.: the delay gap is within noise). "
                 "bound: delay cost = Theorem 1's delay term over the sync bound at the same (eta, beta):")
    lines.append("what the delay adds to the upper bound, not a bound on the gap; sgdm (Theorem 4 bounds "
                 f"another metric) and adam have none.   ({r['seconds']:.1f} s)")
    return "\n".join(lines)


def render_cost(r: dict) -> str:
    lines = [f"delay cost: {r['problem']}, {r['method']}, tau={r['delay']}, T={r['T']}, {r['seeds']} seeds "
             f"(paired), in the {r['norm']} dual norm"]
    for key, title in (("eta_sweep", "eta sweep (fixed beta)"),
                       ("beta_sweep", "beta sweep (eta " + ("tuned per beta)" if r["beta_sweep_eta"] == "tuned"
                                                          else "fixed)"))):
        lines.append(title)
        lines.append(f"  {'eta':>9} {'beta':>6} {'sync':>9} {'gap':>10} {'gap/sync':>9} {'bound: gap':>10} "
                     f"{'delay/sync bd':>13} {'delay/mom':>9}")
        for x in r[key]:
            lines.append(f"  {x['eta']:>9.3g} {x['beta']:>6.3g} {x['sync']:>9.4g} {x['gap']:>+10.3g} "
                         f"{100 * x['relative_gap']:>+8.2f}% {_fmt(x['predicted_gap'], '.3g'):>10} "
                         f"{_fmt(None if x['predicted_relative_gap'] is None else 100 * x['predicted_relative_gap'], '.2f'):>12}% "
                         f"{_fmt(x['delay_over_momentum'], '.3g'):>9}")
    t = r["trends"]
    lines.append(f"gap grows with eta: measured {_yes(t['gap_grows_with_eta']['measured'])}, "
                 f"predicted {_yes(t['gap_grows_with_eta']['predicted'])}")
    lines.append(f"relative gap shrinks as beta grows: measured {_yes(t['relative_gap_shrinks_with_beta']['measured'])}, "
                 f"predicted {_yes(t['relative_gap_shrinks_with_beta']['predicted'])}   ({r['seconds']:.1f} s)")
    return "\n".join(lines)


def render_profile(r: dict) -> str:
    dec = r["declared"]
    dec_text = "not declared" if dec is None else (
        f"{dec['kind']}" + (f" in {dec['norm']}" if dec["norm"] else "") + f", beta={dec['beta']:g} "
        f"({r['declared_source']})")
    lines = [f"profile: {r['optimizer']} ({dec_text}); metric: {r['metric']}, {r['seeds']} seeds, "
             f"lr grid x{', '.join(f'{s:g}' for s in r['lr_scales'])}",
             "cost = delayed / sync per seed (paired noise), mean [95% CI]; * = best lr at the edge of the grid",
             f"{'problem':18s} {'mode':9s} {'best lr':>9} {'best metric [CI]':>26} {'cost at best lr':>22} "
             f"{'cost at sync lr':>22} {'slope':>6}"]

    def ci(c):
        if c is None:
            return "-"
        return f"{c['mean']:.4g} [{c['ci'][0]:.3g}, {c['ci'][1]:.3g}]" if c["mean"] < float("inf") else "diverged"

    for p in r["problems"]:
        for m in p["modes"]:
            lr = f"{m['best_lr']:.3g}{'*' if m['best_at_edge'] else ''}"
            lines.append(f"{p['problem']:18s} {m['mode']:9s} {lr:>9} {ci(m['best']):>26} "
                         f"{ci(m.get('cost_best')):>22} {ci(m.get('cost_at_sync_lr')):>22} "
                         f"{_fmt(m['rate']['slope'], '.3f'):>6}")
        if p["seeds_coupled"]:
            lines.append(f"  ({p['problem']}: the optimizer couples its parameters; one optimizer per seed)")
    for s in r["skipped"]:
        lines.append(f"{s['problem']:18s} skipped: {s['reason']}")
    st = r.get("stability")
    if st:
        lines.append(f"largest stable lr on the quadratic {'x'.join(map(str, st['shape']))} "
                     f"(lambda={st['curvature']:g}, {st['steps']} steps, bisection to {100 * st['rtol']:g}%):")
        lines.append(f"  {'mode':9s} {'measured':>10} {'predicted':>10} {'measured/sync':>14} {'predicted/sync':>15}")
        for m in st["modes"]:
            lines.append(f"  {m['mode']:9s} {m['measured_lr']:>10.4g} {_fmt(m['predicted_lr'], '.4g'):>10} "
                         f"{_fmt(m['measured_ratio'], '.3g'):>14} {_fmt(m['predicted_ratio'], '.3g'):>15}")
    for b in r.get("bound_check", []):
        worst = max(p["ratio"] for p in b["points"]) if b["bound_name"] else None
        lines.append(f"bound check {b['problem']} {b['mode']}: {b['bound_name'] or 'no bound'}, measured/bound <= "
                     f"{_fmt(worst, '.2f')}, slope {b['slope']:.3f} (limit {b['exponent'] + b['tolerance']:.3f}): "
                     f"{verdict(b)}")
    lines.append(f"({r['seconds']:.1f} s)")
    return "\n".join(lines)
