"""`delaylab toy list|rates|compare|cost`: delayed LMO methods on synthetic problems vs the bounds.

* ``list``     the problems (with their constants) and the methods;
* ``rates``    the rate check: measured mean ||grad f||_* at theory-tuned (eta, beta) for each T
               against the bound, the log-log slope against the bound's exponent, ``holds``;
               ``--suite`` runs it for every problem x LMO method x {sync, tau=1, tau=1+EF};
* ``compare``  sync vs delayed vs delayed+EF, one row per method (the toy demo);
* ``cost``     the delay's cost at fixed (eta, beta): gap vs eta and vs beta, measured and predicted;
* ``profile``  any torch optimizer (``--optimizer package.module:factory``) under delays 0, 1, 2 with
               and without EF: delay cost, rate slope, stable lr on a quadratic, bound check.

torch, sympy and scipy are imported inside the command functions so ``delaylab --help`` is fast.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import time
from pathlib import Path

from delaylab.commands._common import UsageError, add_json_flag, dumps, emit, write_json

PROBLEM_HELP = "problem name (see `delaylab toy list`); default: logdet, the matrix problem"
LMO_METHODS = ("lmo-spectral", "lmo-sign", "lmo-l2")


# -- argument helpers (errors surface as UsageError: one line, exit 2) -------------------------


def _int_list(text: str, name: str, minimum: int) -> list[int]:
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"{name} must be a comma-separated list of integers, got {text!r}") from None
    if not values:
        raise UsageError(f"{name} must not be empty")
    bad = [v for v in values if v < minimum]
    if bad:
        raise UsageError(f"{name} must be >= {minimum}, got {bad[0]}")
    return values


def _check_int(value: int, name: str, minimum: int) -> int:
    if value < minimum:
        raise UsageError(f"{name} must be >= {minimum}, got {value}")
    return value


def _problem(args):
    from delaylab.toy.problems import PROBLEMS, make_problem

    name = args.problem
    if name not in PROBLEMS:
        raise UsageError(f"unknown problem {name!r}; expected one of {', '.join(PROBLEMS)}")
    kwargs = {}
    params = inspect.signature(PROBLEMS[name]).parameters
    for key in ("sigma", "batch"):
        value = getattr(args, key, None)
        if value is None:
            continue
        if key not in params:
            raise UsageError(f"problem {name!r} has no --{key} option")
        kwargs[key] = value
    if "batch" in kwargs and kwargs["batch"] < 1:
        raise UsageError(f"--batch must be >= 1, got {kwargs['batch']}")
    if "sigma" in kwargs and not kwargs["sigma"] >= 0:
        raise UsageError(f"--sigma must be >= 0, got {kwargs['sigma']}")
    return make_problem(name, **kwargs)


def _methods(text: str) -> list[str]:
    from delaylab.toy.runs import METHODS

    names = [t.strip() for t in text.split(",") if t.strip()]
    for n in names:
        if n not in METHODS:
            raise UsageError(f"unknown method {n!r}; expected one of {', '.join(METHODS)}")
    if not names:
        raise UsageError("no method given")
    return names


class _Recorder:
    """tqdm progress (off on a non-TTY) plus, with --out, one metrics.jsonl line per result,
    flushed as it arrives so an interrupted run keeps what it measured."""

    def __init__(self, total: int, out: str | None, desc: str, config: dict):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, disable=None, leave=False, file=sys.stderr)
        self.out = Path(out) if out else None
        self.context: dict = {}
        if self.out:
            self.out.mkdir(parents=True, exist_ok=True)
            write_json(self.out / "config.json", config)
            self.metrics = open(self.out / "metrics.jsonl", "w")

    def __call__(self, item: dict) -> None:
        self.bar.update(1)
        if self.out:
            self.metrics.write(dumps({**self.context, **item}) + "\n")
            self.metrics.flush()

    def finish(self, summary: dict) -> None:
        self.bar.close()
        if self.out:
            self.metrics.close()
            write_json(self.out / "summary.json", summary)


def _config(args) -> dict:
    return {k: v for k, v in vars(args).items() if k != "func"}


def _fmt(x, spec=".3g") -> str:
    return "-" if x is None else format(x, spec)


def _yes(flag) -> str:
    return {True: "yes", False: "NO", None: "n/a"}[flag]


# -- list ------------------------------------------------------------------------------------------


def cmd_list(args) -> int:
    from delaylab.toy.problems import DEFAULT_PROBLEM, PROBLEMS
    from delaylab.toy.runs import METHODS

    problems = [PROBLEMS[name]().describe() for name in PROBLEMS]
    result = {
        "default_problem": DEFAULT_PROBLEM,
        "problems": problems,
        "methods": [{"name": m.name, "summary": m.summary, "norm": m.norm} for m in METHODS.values()],
        "corrections": ["none", "ef", "dc-asgd"],
    }

    def render(r):
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

    emit(result, args.json, render)
    return 0


# -- rates -----------------------------------------------------------------------------------------


def _render_rates(r: dict) -> str:
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
    lines.append(f"holds: {_yes(r['holds'])}   ({r['seconds']:.1f} s)")
    return "\n".join(lines)


def _render_suite(r: dict) -> str:
    lines = [f"rate suite: T = {r['T']}, {r['seeds']} seeds; ratio = measured / bound (max over T); "
             f"slope must be <= exponent + {r['tolerance']:.2f}",
             f"{'problem':18s} {'method':13s} {'mode':10s} {'max ratio':>9} {'slope':>7} {'exponent':>8} holds"]
    for x in r["results"]:
        lines.append(f"{x['problem']:18s} {x['method']:13s} {_mode(x):10s} {x['max_ratio']:>9.2f} "
                     f"{x['slope']:>7.3f} {x['exponent']:>8.3f} {_yes(x['holds'])}")
    lines.append(f"holds: {_yes(r['holds'])}   ({r['seconds']:.1f} s)")
    return "\n".join(lines)


def _mode(x: dict) -> str:
    if x["delay"] == 0 and x["correction"] == "none":
        return "sync"
    return f"tau={x['delay']}" + ("" if x["correction"] == "none" else f"+{x['correction'].upper()}")


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
        cells = [x["problem"], x["method"], _mode(x)] + [_fmt(ratios.get(t), ".2f") for t in ts]
        cells += [f"{x['slope']:.3f}", _fmt(x["bound_slope"], ".3f"), _yes(x["holds"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def cmd_rates(args) -> int:
    from delaylab.toy.problems import PROBLEMS

    steps = _int_list(args.T, "--T", 1)
    _check_int(args.seeds, "--seeds", 1)
    if not args.tolerance >= 0:
        raise UsageError(f"--tolerance must be >= 0, got {args.tolerance}")
    if args.suite:
        return _rates_suite(args, steps, PROBLEMS)
    if args.method is None:
        raise UsageError("--method is required (or use --suite)")
    method = _methods(args.method)
    if len(method) != 1:
        raise UsageError("--method takes one method (use --suite for many)")
    delay = _delay(args)
    problem = _problem(args)
    from delaylab.toy.plots import plot_rates, save
    from delaylab.toy.rates import rate_check

    rec = _Recorder(len(steps), args.out, "rates", _config(args))
    if args.beta is not None and not 0 <= args.beta < 1:
        raise UsageError(f"--beta must be in [0, 1), got {args.beta}")
    result = rate_check(problem, method[0], steps=steps, delay=delay, correction=args.correction,
                        seeds=args.seeds, seed=args.seed, tolerance=args.tolerance, beta=args.beta, progress=rec)
    if args.plot:
        result["figures"] = [str(save(plot_rates([result]), Path(args.plot) / "toy_rate.png"))]
    rec.finish(result)
    emit(result, args.json, _render_rates)
    return 0


def _delay(args):
    if args.block_delays is not None:
        if args.delay is not None:
            raise UsageError("give either --delay or --block-delays, not both")
        return _int_list(args.block_delays, "--block-delays", 0)
    delay = 0 if args.delay is None else _check_int(args.delay, "--delay", 0)
    if args.correction != "none" and delay == 0:
        raise UsageError(f"--correction {args.correction} needs --delay >= 1")
    return delay


def _rates_suite(args, steps, problems) -> int:
    from delaylab.toy.plots import plot_rates_grid, save
    from delaylab.toy.problems import make_problem
    from delaylab.toy.rates import rate_check, suite_settings

    if args.sigma is not None or args.batch is not None:
        raise UsageError("--suite runs the default instances; --sigma/--batch apply to a single problem")
    if args.delay is not None or args.block_delays is not None or args.correction != "none":
        raise UsageError("--suite runs sync, tau=1 and tau=1+EF itself; drop --delay/--block-delays/--correction")
    names = [args.problem] if args.problem_given else list(problems)
    for n in names:
        if n not in problems:
            raise UsageError(f"unknown problem {n!r}; expected one of {', '.join(problems)}")
    methods = _methods(args.method) if args.method else None
    if methods and any(m not in LMO_METHODS for m in methods):
        raise UsageError(f"--suite runs the LMO methods only ({', '.join(LMO_METHODS)})")
    settings = suite_settings(names, methods)
    start = time.perf_counter()
    rec = _Recorder(len(settings) * len(steps), args.out, "rate suite", _config(args))
    results = []
    for name, method, delay, corr in settings:
        rec.context = {"problem": name, "method": method, "delay": delay, "correction": corr}
        r = rate_check(make_problem(name), method, steps=steps, delay=delay, correction=corr, seeds=args.seeds,
                       seed=args.seed, tolerance=args.tolerance, progress=rec)
        r["max_ratio"] = max(p["ratio"] for p in r["points"])
        results.append(r)
    summary = {"holds": all(r["holds"] for r in results), "T": steps, "seeds": args.seeds,
               "tolerance": args.tolerance, "results": results, "seconds": time.perf_counter() - start}
    if args.plot:
        summary["figures"] = [str(save(plot_rates_grid(results), Path(args.plot) / "toy_rates.png"))]
    if args.markdown:
        command = f"delaylab toy rates --suite --T {','.join(map(str, steps))} --seeds {args.seeds}"
        command += f" --seed {args.seed}" if args.seed else ""
        command += f" --problem {args.problem}" if args.problem_given else ""
        command += f" --method {args.method}" if args.method else ""
        command += f" --plot {args.plot}" if args.plot else ""
        command += f" --markdown {args.markdown}"
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(suite_markdown(summary, command))
        summary["markdown"] = args.markdown
    rec.finish(summary)
    emit(summary, args.json, _render_suite)
    return 0


# -- compare ---------------------------------------------------------------------------------------


def _render_compare(r: dict) -> str:
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


def cmd_compare(args) -> int:
    from delaylab.toy.rates import MODES, compare

    _check_int(args.T, "--T", 1)
    _check_int(args.seeds, "--seeds", 1)
    _check_int(args.delay, "--delay", 1)
    if not 0 <= args.beta < 1:
        raise UsageError(f"--beta must be in [0, 1), got {args.beta}")
    methods = _methods(args.methods)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or modes[0] != "sync" or any(m not in MODES for m in modes):
        raise UsageError(f"--modes must start with sync and use {', '.join(MODES)}; got {args.modes!r}")
    problem = _problem(args)
    if args.norm is not None:
        problem.check_norm(args.norm)
    from delaylab.toy.runs import get_method

    for m in methods:
        norm = get_method(m).norm
        if norm is not None and norm not in problem.norms:
            raise UsageError(f"method {m} needs the {norm} norm, which problem {problem.name!r} has no constant for")
    rec = _Recorder(len(methods) * len(modes), args.out, "compare", _config(args))
    if not args.eta_scale > 0:
        raise UsageError(f"--eta-scale must be > 0, got {args.eta_scale}")
    result = compare(problem, methods, steps=args.T, delay=args.delay, beta=args.beta, eta_scale=args.eta_scale,
                     modes=modes,
                     norm=args.norm, seeds=args.seeds, seed=args.seed, progress=rec)
    if args.plot:
        result["figures"] = [str(_plot_compare(result, Path(args.plot)))]
    rec.finish(result)
    emit(result, args.json, _render_compare)
    return 0


def _plot_compare(result: dict, folder: Path) -> Path:
    from matplotlib.figure import Figure

    from delaylab.toy.plots import save

    fig = Figure(figsize=(6.0, 3.4), layout="constrained")
    ax = fig.add_subplot()
    modes = [m for m in result["modes"] if m != "sync"]
    width = 0.8 / max(len(modes), 1)
    for i, mode in enumerate(modes):
        xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(result["rows"]))]
        ys = [100 * row[mode]["relative_gap"] for row in result["rows"]]
        errs = [100 * (row[mode]["relative_gap_ci"][1] - row[mode]["relative_gap"]) for row in result["rows"]]
        ax.bar(xs, ys, width, yerr=errs, capsize=2, label=mode)
    ax.set_xticks(range(len(result["rows"])), [row["method"] for row in result["rows"]], fontsize=8)
    ax.axhline(0, color="k", lw=0.6)
    ax.set_ylabel("gap vs sync (%)")
    ax.set_title(f"{result['problem']}: T={result['T']}, tau={result['delay']}, beta={result['beta']:g}",
                 fontsize=9)
    ax.legend(fontsize=8)
    return save(fig, folder / "toy_compare.png")


# -- cost ------------------------------------------------------------------------------------------


def _render_cost(r: dict) -> str:
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


def cmd_cost(args) -> int:
    from delaylab.toy.plots import plot_gap_vs_beta, plot_gap_vs_eta, save
    from delaylab.toy.rates import delay_cost

    _check_int(args.T, "--T", 1)
    _check_int(args.seeds, "--seeds", 1)
    _check_int(args.delay, "--delay", 1)
    if not 0 <= args.beta < 1:
        raise UsageError(f"--beta must be in [0, 1), got {args.beta}")
    method = _methods(args.method)
    if len(method) != 1:
        raise UsageError("--method takes one method")
    betas = [float(b) for b in args.betas.split(",") if b.strip()] if args.betas else None
    if betas is not None and not all(0 <= b < 1 for b in betas):
        raise UsageError(f"--betas must be in [0, 1), got {args.betas}")
    problem = _problem(args)
    kw = {} if betas is None else {"betas": betas}
    rec = _Recorder(5 + len(betas or range(6)), args.out, "cost", _config(args))
    result = delay_cost(problem, method[0], steps=args.T, delay=args.delay, beta=args.beta,
                        beta_sweep_eta=args.beta_sweep_eta, seeds=args.seeds, seed=args.seed, progress=rec, **kw)
    if args.plot:
        folder = Path(args.plot)
        result["figures"] = [str(save(plot_gap_vs_eta(result), folder / "toy_gap_vs_eta.png")),
                             str(save(plot_gap_vs_beta(result), folder / "toy_gap_vs_beta.png"))]
    rec.finish(result)
    emit(result, args.json, _render_cost)
    return 0


# -- profile ---------------------------------------------------------------------------------------


def _render_profile(r: dict) -> str:
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
                     f"{_fmt(worst, '.2f')}, slope {b['slope']:.3f}, holds: {_yes(b['holds'])}")
    lines.append(f"({r['seconds']:.1f} s)")
    return "\n".join(lines)


def _floats(text: str, name: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"{name} must be a comma-separated list of numbers, got {text!r}") from None
    if not values or not all(v > 0 for v in values):
        raise UsageError(f"{name} must be numbers > 0, got {text!r}")
    return values


def cmd_profile(args) -> int:
    import json

    from delaylab.toy.profile import Declared, expected_progress, load_optimizer, profile

    try:
        kwargs = json.loads(args.kwargs) if args.kwargs else {}
    except json.JSONDecodeError as err:
        raise UsageError(f"--kwargs is not JSON: {err}") from None
    if not isinstance(kwargs, dict):
        raise UsageError(f"--kwargs must be a JSON object, got {args.kwargs!r}")
    factory = load_optimizer(args.optimizer, kwargs)
    declare = Declared.parse(args.declare) if args.declare else None
    problems = [t.strip() for t in args.problems.split(",") if t.strip()] if args.problems else None
    delays = _int_list(args.delays, "--delays", 0)
    steps = _int_list(args.T, "--T", 1)
    scales = _floats(args.lr_scales, "--lr-scales")
    _check_int(args.seeds, "--seeds", 1)
    from delaylab.toy.problems import PROBLEMS

    n = len(problems or PROBLEMS)
    total = expected_progress(n, delays, not args.no_ef, len(scales), not args.no_stability, False)
    rec = _Recorder(total, args.out, "profile", _config(args))
    result = profile(factory, problems=problems, delays=delays, ef=not args.no_ef, lr_scales=scales, steps=steps,
                     seeds=args.seeds, seed=args.seed, norm=args.norm, declare=declare,
                     stability_check=not args.no_stability, bound_check=not args.no_bound_check,
                     bound_steps=_int_list(args.bound_T, "--bound-T", 1) if args.bound_T else None,
                     name=args.optimizer, progress=rec)
    if args.plot:
        from delaylab.toy.plots import plot_profile, save

        result["figures"] = [str(save(plot_profile(result), Path(args.plot) / "toy_profile.png"))]
    rec.finish(result)
    emit(result, args.json, _render_profile)
    return 0


# -- the parser ------------------------------------------------------------------------------------


class _ProblemAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.problem_given = True


def _common(p, seeds: int) -> None:
    p.add_argument("--problem", default="logdet", action=_ProblemAction, help=PROBLEM_HELP)
    p.set_defaults(problem_given=False)
    p.add_argument("--sigma", type=float, default=None, help="noise level of a Gaussian oracle (problem default)")
    p.add_argument("--batch", type=int, default=None, help="minibatch size of a finite-sum problem")
    p.add_argument("--seeds", type=int, default=seeds, help=f"independent runs, advanced as one batch ({seeds})")
    p.add_argument("--seed", type=int, default=0, help="base random seed (0)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write config.json, metrics.jsonl (as results arrive) and summary.json")
    p.add_argument("--plot", default=None, metavar="DIR", help="write PNG figures to DIR")
    add_json_flag(p)


def register(sub) -> None:
    p = sub.add_parser("toy", help="delayed LMO optimizers on synthetic problems, rates checked against the bounds",
                       description=__doc__.split("\n\n")[0])
    toy = p.add_subparsers(dest="toy_command", metavar="TOY_COMMAND", required=True)

    q = toy.add_parser("list", help="problems (with constants) and methods")
    add_json_flag(q)
    q.set_defaults(func=cmd_list)

    q = toy.add_parser("rates", help="measured rate vs the bound at theory-tuned (eta, beta), for each T",
                       description="Run at the (eta, beta) that delaylab.theory's tune gives for each T and "
                       "the problem's constants; check measured <= bound (upper 95%% CI end) at every T and "
                       "the log-log slope <= the bound's exponent + tolerance.")
    _common(q, seeds=16)
    q.add_argument("--method", default=None, help="lmo-spectral, lmo-sign, lmo-l2, sgdm or adam")
    q.add_argument("--delay", type=int, default=None, help="gradient delay tau (0)")
    q.add_argument("--block-delays", default=None, metavar="T1,T2,..",
                   help="per-block delays: split the variable into blocks (rows / coordinates), one tau each")
    q.add_argument("--correction", default="none", choices=["none", "ef", "dc-asgd"], help="delay correction")
    q.add_argument("--T", default="100,400,1600,6400", help="grid of horizons (100,400,1600,6400)")
    q.add_argument("--tolerance", type=float, default=0.1, help="allowed slope excess over the exponent (0.1)")
    q.add_argument("--beta", type=float, default=None,
                   help="fix the momentum (theory then tunes eta alone); default: tuned with eta")
    q.add_argument("--suite", action="store_true",
                   help="every problem (or --problem) x LMO method (or --method list) x {sync, tau=1, tau=1+EF}")
    q.add_argument("--markdown", default=None, metavar="FILE", help="with --suite: write the ratio/slope table")
    q.set_defaults(func=cmd_rates)

    q = toy.add_parser("compare", help="sync vs delayed vs delayed+EF for each method (the toy demo)")
    _common(q, seeds=8)
    q.add_argument("--methods", default="lmo-spectral,lmo-sign,lmo-l2,sgdm,adam", help="comma-separated methods")
    q.add_argument("--modes", default="sync,delayed,ef", help="sync first, then any of delayed, ef, dc-asgd")
    q.add_argument("--T", type=int, default=1000, help="updates per run (1000)")
    q.add_argument("--delay", type=int, default=1, help="gradient delay tau (1)")
    q.add_argument("--beta", type=float, default=0.9, help="momentum for every method (0.9)")
    q.add_argument("--eta-scale", type=float, default=1.0,
                   help="multiply every method's tuned eta (1); the delay's cost grows with eta")
    q.add_argument("--norm", default=None, help="norm of the common yardstick (the problem's first)")
    q.set_defaults(func=cmd_compare)

    q = toy.add_parser("cost", help="the delay's cost at fixed (eta, beta): gap vs eta and vs beta")
    _common(q, seeds=8)
    q.add_argument("--method", default="lmo-spectral", help="one method (lmo-spectral)")
    q.add_argument("--T", type=int, default=1000, help="updates per run (1000)")
    q.add_argument("--delay", type=int, default=1, help="gradient delay tau (1)")
    q.add_argument("--beta", type=float, default=0.9, help="beta of the eta sweep (0.9)")
    q.add_argument("--betas", default=None, help="betas of the beta sweep (0,0.5,0.8,0.9,0.95,0.99)")
    q.add_argument("--beta-sweep-eta", default="tuned", choices=["tuned", "fixed"],
                   help="beta sweep: eta tuned per beta (default) or fixed at its value for --beta")
    q.set_defaults(func=cmd_cost)

    q = toy.add_parser("profile", help="any torch optimizer under delays: cost, rate, stability, bound check",
                       description="Profile a torch optimizer factory (make_optimizer(params, **kwargs)) on the "
                       "toy problems under delays, with and without EF; see docs/toy.md#profile.")
    q.add_argument("--optimizer", required=True, metavar="PKG.MOD:FACTORY",
                   help="a factory or optimizer class (torch.optim:AdamW), or a registry method (lmo-spectral, ...)")
    q.add_argument("--kwargs", default=None, metavar="JSON", help='keyword arguments for it, e.g. \'{"lr": 0.01}\'')
    q.add_argument("--declare", default=None, metavar="KIND:..",
                   help="the optimizer's type for the predictions: heavyball:B, ema:B, adam:B1 or lmo:NORM:B "
                   "(default: inferred for torch SGD/Adam/AdamW and LMOMomentum)")
    q.add_argument("--problems", default=None, help="comma-separated problems (default: the whole suite)")
    q.add_argument("--delays", default="0,1,2", help="delays (0,1,2); sync always runs")
    q.add_argument("--no-ef", action="store_true", help="skip the EF runs")
    q.add_argument("--lr-scales", default="0.25,0.5,1,2,4", help="lr grid as multiples of the factory's lr")
    q.add_argument("--T", default="25,50,100,200", help="horizons; the longest is run, the rest are its prefixes")
    q.add_argument("--seeds", type=int, default=8, help="independent runs (8)")
    q.add_argument("--seed", type=int, default=0, help="noise seed, shared by every mode (0)")
    q.add_argument("--norm", default=None, help="dual norm of the metric (declared LMO norm, else l2)")
    q.add_argument("--no-stability", action="store_true", help="skip the stable-lr bisection on the quadratic")
    q.add_argument("--no-bound-check", action="store_true", help="skip the bound check of a declared LMO method")
    q.add_argument("--bound-T", default=None, help="horizons of the bound check (the first and last of --T)")
    q.add_argument("--out", default=None, metavar="DIR",
                   help="write config.json, metrics.jsonl (as results arrive) and summary.json")
    q.add_argument("--plot", default=None, metavar="DIR", help="write toy_profile.png to DIR")
    add_json_flag(q)
    q.set_defaults(func=cmd_profile)
