"""`delaylab theory bound|tune|penalty|stability|axis|pep|nqm|check|estimators`: delaylab.theory from the shell.

Values are validated by the library (ValueError -> one-line error, exit 2), so the rules
live in one place (delaylab/theory/bound.py).
"""

from __future__ import annotations

import argparse

from delaylab.errors import install_hint
from delaylab._io import save_figure
from delaylab.commands._common import (add_json_flag, csv_list, emit, nonneg_int, positive_float, positive_int,
                                       unit_interval)

CONSTANT_FLAGS = (
    ("L", "smoothness in the method's norm (Euclidean for sgdm)"),
    ("sigma", "Euclidean noise std: E||g - grad f||_2^2 <= sigma^2"),
    ("rho", "norm equivalence ||v||_* <= rho ||v||_2 (default 1)"),
    ("G0", "||grad f(x0)||_* (needed with --init zero, the default)"),
)


def _add_bound_flags(p: argparse.ArgumentParser, with_eta: bool, with_T: bool = True) -> None:
    b = p.add_argument_group("bound")
    b.add_argument("--method", default="lmo", help="lmo (momentum-LMO: Muon, Signum, normalized SGD) or sgdm")
    b.add_argument("--delay", "--tau", dest="delay", type=int, default=0, help="gradient delay tau (default 0)")
    b.add_argument("--ef", action="store_true", help="with Error Feedback (lmo only)")
    b.add_argument("--nesterov", action="store_true", help="Nesterov momentum (lmo only)")
    b.add_argument("--init", default="zero", help="momentum start: zero (m_{-1}=0, default) or first (m_0=g_0)")
    b.add_argument("--point", default="virtual",
                   help="EF only: measure the gradient at the virtual (default) or real iterates")
    c = p.add_argument_group("constants")
    for name, text in CONSTANT_FLAGS:
        c.add_argument(f"--{name}", type=float, default=1.0 if name == "rho" else None, help=text)
    c.add_argument("--Delta", "--delta", dest="Delta", type=float, help="f(x0) - inf f")
    c.add_argument("--delta-bar", dest="delta_bar", type=float,
                   help="EF: measured mean direction drift in [0, 2] (default 1)")
    if with_T:
        c.add_argument("--T", type=float, required=True, help="number of updates")
    if with_eta:
        c.add_argument("--eta", type=float, required=True, help="step size (the step norm for lmo)")
        c.add_argument("--beta", type=float, required=True, help="momentum in [0, 1)")
    else:
        c.add_argument("--beta", type=float, help="fix the momentum (default: tune it too)")


def _bound_from(args):
    from delaylab.theory import get_bound

    return get_bound(args.method, args.delay, args.ef, args.nesterov, args.init, args.point)


def _constants(args, bound) -> dict:
    from delaylab.commands._common import UsageError

    vals = {k: getattr(args, k) for k in ("L", "sigma", "rho", "Delta", "G0", "delta_bar")}
    if vals["delta_bar"] is None and "delta_bar" in bound.symbols:
        vals["delta_bar"] = 1.0
    vals = {k: v for k, v in vals.items() if v is not None}
    missing = [n for n in bound.symbols if n not in vals and n not in ("eta", "beta", "T", "tau")]
    if missing:
        raise UsageError(f"{bound.name} needs " + ", ".join(f"--{n}" for n in missing))
    return vals


def _fmt(x) -> str:
    return "null" if x is None else f"{x:.6g}" if isinstance(x, float) else str(x)


def cmd_bound(args) -> int:
    from delaylab.theory import evaluate

    bound = _bound_from(args)
    consts = _constants(args, bound)
    ev = evaluate(bound, **consts, T=args.T, eta=args.eta, beta=args.beta)
    result = {
        "bound": bound.name, "metric": bound.metric, "value": ev.value, "terms": ev.terms,
        "valid": ev.valid, "grad_norm": ev.value ** (1.0 / bound.power), "power": bound.power,
        "proof": bound.proof, "assumptions": list(bound.assumptions),
        "constants": dict(consts, T=args.T, eta=args.eta, beta=args.beta, tau=args.delay),
    }

    def render(r):
        lines = [f"{r['bound']}: {r['metric']} <= {_fmt(r['value'])}"]
        lines += [f"  {k:>10} {_fmt(v)}" for k, v in r["terms"].items()]
        if not r["valid"]:
            lines.append("  (outside the bound's validity conditions: step size too large)")
        lines.append(f"  proof: {r['proof']}")
        return "\n".join(lines)

    emit(result, args.json, render)
    return 0


def cmd_tune(args) -> int:
    from delaylab.theory import tune

    bound = _bound_from(args)
    consts = _constants(args, bound)
    r = tune(bound, args.T, consts, beta=args.beta)
    result = {"bound": bound.name, **r.as_dict(), "grad_norm": r.value ** (1.0 / bound.power), "T": args.T}

    def render(d):
        c = d["closed_form"]
        return "\n".join([
            f"{d['bound']} at T={_fmt(d['T'])} ({d['regime']}): value {_fmt(d['value'])}",
            f"  eta*  {_fmt(d['eta'])}   (closed form {_fmt(c['eta'])})",
            f"  beta* {_fmt(d['beta'])}   (closed form {_fmt(c['beta'])})",
            f"  closed-form value {_fmt(c['value'])} (+{100 * d['rel_gap']:.3g}%)",
            f"  rate: value ~ T^{_fmt(d['exponent'])} (gradient norm ~ T^{_fmt(d['exponent_norm'])})",
        ])

    emit(result, args.json, render)
    return 0


def cmd_penalty(args) -> int:
    from delaylab.theory import delay_penalty

    bound = _bound_from(args)
    consts = _constants(args, bound)
    p = delay_penalty(args.T, args.delay, consts, method=args.method, ef=args.ef, nesterov=args.nesterov,
                      init=args.init, beta=args.beta)
    result = {"bound": bound.name, "T": args.T, "tau": args.delay, **p.as_dict()}
    if args.plot:
        _plot_penalty(args, consts)
        result["plot"] = args.plot

    def render(d):
        lines = [f"delay {d['tau']} at T={_fmt(d['T'])}: tuned bound ratio {_fmt(d['ratio'])} "
                 f"(delayed {_fmt(d['delayed']['value'])} / sync {_fmt(d['sync']['value'])})",
                 f"  limit as T -> infinity: {_fmt(d['limit'])}"]
        if d["relative_penalty"] is not None:
            lines.append(f"  delay term / momentum term: {_fmt(d['relative_penalty'])}")
        return "\n".join(lines)

    emit(result, args.json, render)
    return 0


def _plot_penalty(args, consts) -> None:
    import numpy as np

    from delaylab.theory.plots import plot_penalty

    Ts = np.logspace(2, max(np.log10(args.T) + 2, 4), 8)
    fig = plot_penalty(Ts, args.delay, consts, method=args.method, ef=args.ef, nesterov=args.nesterov,
                       init=args.init, beta=args.beta)
    save_figure(fig, args.plot, dpi=120, bbox_inches="tight")


def cmd_stability(args) -> int:
    from delaylab.theory import stability as st

    beta = 0.0 if args.method == "gd" and args.beta is None else (0.9 if args.beta is None else args.beta)
    hmax = st.max_stable(args.method, beta, args.delay, args.ef)
    sync = st.max_stable(args.method, beta, 0)
    result = {
        "method": args.method, "beta": beta, "tau": args.delay, "ef": args.ef,
        "max_stable": hmax, "sync_max_stable": sync, "shrink": hmax / sync,
        "closed_form": st.threshold_closed_form(args.method, beta, args.delay, args.ef),
        "quantity": "eta*lambda" if args.method != "adam" else
                    "eta*lambda with lambda an eigenvalue of diag(sqrt(v)+eps)^-1 H (v frozen)",
    }
    if args.plot:
        fig = st.plot_stability("ema" if args.method == "adam" else args.method,
                                betas=[0.0] if args.method == "gd" else None)
        save_figure(fig, args.plot, dpi=120, bbox_inches="tight")
        result["plot"] = args.plot

    def render(d):
        lines = [f"{d['method']} beta={_fmt(d['beta'])} delay={d['tau']}{' +EF' if d['ef'] else ''}: "
                 f"stable iff {d['quantity']} < {_fmt(d['max_stable'])}",
                 f"  sync: < {_fmt(d['sync_max_stable'])}; the delay shrinks the stable range "
                 f"{_fmt(1 / d['shrink'])}x"]
        if d["method"] in ("adam", "ema"):
            lines.append("  an LMO method (Muon) has no such threshold: its step norm is eta whatever the "
                         "gradient; delay adds 2 L eta tau to its bound (Theorem 1)")
        return "\n".join(lines)

    emit(result, args.json, render)
    return 0


def cmd_axis(args) -> int:
    from delaylab.commands._common import UsageError
    from delaylab.reproduce.predict import direction_beta, kind
    from delaylab.theory.axis import axis_markdown, delay_axis, plot_delay_axis

    optimizers = {}
    for name in args.optimizers:
        if kind(name) is None:
            raise UsageError(f"theory has no model for optimizer {name!r} (LMO: muon, lion, lmo; Adam-type: adamw, "
                             f"soap, adan, mars)")
        optimizers[name] = (kind(name), *direction_beta(name))
    rows = delay_axis(optimizers, args.taus, T=args.T)
    result = {"taus": args.taus, "T": args.T, "rows": rows}
    if args.plot:
        save_figure(plot_delay_axis(rows), args.plot, dpi=120, bbox_inches="tight")
        result["plot"] = args.plot
    emit(result, args.json, lambda d: axis_markdown(d["rows"]).rstrip())
    return 0


def cmd_pep(args) -> int:
    from delaylab.commands._common import UsageError
    from delaylab.theory import pep

    if args.sweep:
        rows = pep.sweep(L=args.L, Delta=args.Delta)
        result = {"rows": [r.as_dict() for r in rows], "all_hold": all(r.holds is not False for r in rows),
                  "min_ratio": min(r.ratio for r in rows if r.ratio is not None),
                  "max_ratio": max(r.ratio for r in rows if r.ratio is not None),
                  "max_gap": max(abs(r.gap) for r in rows), "solver": rows[0].solver}
        if args.plot:
            save_figure(pep.plot_tightness(rows), args.plot, dpi=120, bbox_inches="tight")
            result["plot"] = args.plot

        def render_sweep(d):
            return "\n".join([
                pep.tightness_table(rows), "",
                f"{len(rows)} grid points, Theorem 4 >= PEP worst case at all: {d['all_hold']}; ratio "
                f"{_fmt(d['min_ratio'])} .. {_fmt(d['max_ratio'])}; solver {d['solver']}, largest relative "
                f"primal-dual gap {d['max_gap']:.1e}"])

        emit(result, args.json, render_sweep)
        return 0
    missing = [f"--{n}" for n in ("T", "eta") if getattr(args, n) is None]
    if missing:
        raise UsageError("theory pep needs " + " and ".join(missing) + " (or --sweep)")
    c = pep.compare(args.method, T=args.T, eta=args.eta, beta=args.beta, tau=args.delay, ef=args.ef,
                    momentum=args.momentum, L=args.L, Delta=args.Delta)
    result = dict(c.as_dict(), metric="(1/T) sum_{t<T} ||grad f(y_t)||^2, y_t = x_{max(t-tau,0)}",
                  assumption="L-smooth (nonconvex), f(x0) - inf f <= Delta, exact gradients",
                  reference=pep.REF_PEP)

    def render(d):
        m = f"{d['method']}" + (f" ({d['momentum']} momentum)" if d["method"] == "sgdm" else "")
        lines = [f"{m}, delay {d['tau']}{' +EF' if d['ef'] else ''}, T={d['T']}, eta={_fmt(d['eta'])}, "
                 f"beta={_fmt(d['beta'])}, L={_fmt(d['L'])}, Delta={_fmt(d['Delta'])}, no noise:",
                 f"  PEP worst case  mean_t ||grad f(y_t)||^2 = {_fmt(d['worst_mean'])}, "
                 f"min_t = {_fmt(d['worst_min'])}  ({d['solver']}, relative gap {d['gap']:.1e})"]
        if d["bound_name"] is None:
            lines.append("  no bound of ours covers SGDM with Error Feedback: worst case only")
        elif not d["valid"]:
            lines.append(f"  {d['bound_name']} (Theorem 4): step size beyond its cap, the bound says nothing")
        else:
            lines.append(f"  {d['bound_name']} (Theorem 4): {_fmt(d['bound'])}, {_fmt(d['ratio'])}x the worst case"
                         + ("" if d["holds"] else "  -- BELOW THE WORST CASE: the bound is wrong here"))
        return "\n".join(lines)

    emit(result, args.json, render)
    return 0


def _delay_arg(text: str):
    """--delay 1 | 3,2,1,0 (per pipeline stage) | uniform:0-4 (drawn each step)."""
    try:
        if text.startswith("uniform:"):
            lo, hi = (int(t) for t in text.split(":", 1)[1].split("-"))
            if not 0 <= lo <= hi:
                raise ValueError
            return {t: 1.0 / (hi - lo + 1) for t in range(lo, hi + 1)}
        taus = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, a list per stage (3,2,1,0) or uniform:LO-HI, "
                                         f"got {text!r}") from None
    if any(t < 0 for t in taus):
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return taus[0] if len(taus) == 1 else taus


def cmd_nqm(args) -> int:
    import numpy as np

    from delaylab.commands._common import UsageError
    from delaylab.theory import nqm

    if args.spectrum:
        spectrum = nqm.read_spectrum(args.spectrum)
    else:  # a synthetic power-law density, so that the command runs without a measured spectrum
        h = np.geomspace(1e-3, args.top, 60)
        spectrum = {"checkpoints": [{"val_loss": 0.0, "hessian": {"nodes": h.tolist(), "weights": [1.0] * 60},
                                     "precond": {"nodes": h.tolist(), "weights": [1.0] * 60},
                                     "noise_trace": args.noise, "noise_trace_precond": args.noise}],
                    "init_val_loss": 1.0, "d_model": 8}
    if args.warmup is not None and not 0 <= args.warmup <= args.steps:
        raise UsageError(f"--warmup must be in [0, steps], got {args.warmup}")
    r = nqm.predict_gap(spectrum, args.optimizer, args.lr, args.steps, args.batch, delay=args.delay,
                        correction=args.correction, momentum=args.momentum, schedule=args.schedule, warmup=args.warmup,
                        min_lr_ratio=args.min_lr_ratio, model=args.model, runs=args.runs, seed=args.seed,
                        checkpoint=args.checkpoint, eos=args.eos)
    every = max(1, args.steps // 20)
    idx = list(range(0, args.steps + 1, every)) + ([args.steps] if args.steps % every else [])

    def clean(v):  # a diverged curve: null, not 1e300
        return [float(x) if np.isfinite(x) and abs(x) < nqm.DIVERGED * max(r["start_loss"], 1e-300) else None
                for x in v]

    result = {k: r[k] for k in ("optimizer", "model", "density", "lr", "steps", "batch", "delay", "correction",
                                "momentum", "schedule", "eos", "end_gap", "diverged")}
    result["delay"] = {str(k): v for k, v in result["delay"].items()} if isinstance(result["delay"], dict) else \
        result["delay"]
    result.update(step=idx, sync=clean(r["sync"][idx]), delayed=clean(r["delayed"][idx]), gap=clean(r["gap"][idx]),
                  gap_se=[float(x) for x in r["se"][idx]], end_sync=clean(r["sync"][-1:])[0],
                  end_delayed=clean(r["delayed"][-1:])[0])
    if args.plot:
        save_figure(_plot_nqm(r), args.plot, dpi=120, bbox_inches="tight")
        result["plot"] = args.plot

    def render(d):
        if d["end_gap"] is None:
            which = " and ".join(k for k, v in d["diverged"].items() if v)
            return (f"NQM {d['optimizer']} ({d['model']}) lr {_fmt(d['lr'])}, delay {d['delay']} {d['correction']}: "
                    f"the {which} model diverges (expected loss beyond {nqm.DIVERGED:g}x its start): no gap to predict")
        return (f"NQM {d['optimizer']} ({d['model']}) lr {_fmt(d['lr'])}, delay {d['delay']} {d['correction']}, "
                f"{d['steps']} steps, batch {d['batch']}: sync {_fmt(d['end_sync'])}, delayed "
                f"{_fmt(d['end_delayed'])}, gap {d['end_gap']:+.4g} (excess loss of the quadratic)")

    emit(result, args.json, render)
    return 0


def _plot_nqm(r):
    import sys

    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    t = np.arange(r["sync"].size)
    a.plot(t, r["sync"], label="sync")
    a.plot(t, r["delayed"], label=f"delay {r['delay']} {r['correction']}")
    a.set_yscale("log")
    a.set_xlabel("update")
    a.set_ylabel("NQM expected excess loss")
    a.legend(fontsize=8)
    b.plot(t, r["gap"], color="C3")
    if np.any(r["se"] > 0):
        b.fill_between(t, r["gap"] - 2 * r["se"], r["gap"] + 2 * r["se"], color="C3", alpha=0.2, label="2 SE (MC)")
        b.legend(fontsize=8)
    b.axhline(0, color="k", lw=0.5)
    b.set_xlabel("update")
    b.set_ylabel("predicted gap (delayed - sync)")
    fig.suptitle(f"NQM: {r['optimizer']} ({r['model']}), lr {r['lr']:g}")
    return fig


def cmd_check(args) -> int:
    import sys

    from delaylab._io import figure_path
    from delaylab.llm.bound_check import measure, plot, render

    if args.figure:
        figure_path(args.figure)  # a bad figure path fails before the replay
    say = None if args.quiet else (lambda line: print(f"theory check: {line}", file=sys.stderr, flush=True))
    r = measure(args.run, every=args.every, probe_every=args.probe_every, held=args.held, samples=args.samples,
                iters=args.iters, seed=args.seed, progress=say)
    if args.figure:
        plot(r, args.figure)
        r["figure"] = args.figure
    emit(r, args.json, render)
    return 0


def cmd_estimators(args) -> int:
    from delaylab.toy.estimators import constant_rows, constants_markdown, markdown, rows

    result = {"rows": rows(seed=args.seed), "constants": constant_rows(seed=args.seed)}
    emit(result, args.json, lambda d: markdown(d["rows"]) + "\n" + constants_markdown(d["constants"]).rstrip())
    return 0


def register(sub) -> None:
    p = sub.add_parser("theory", help="convergence bounds, tuning, delay penalty, linear stability",
                       description="Bounds for momentum-LMO (Muon) and SGDM under a gradient delay; "
                       "see docs/theory.md for the proofs.")
    tsub = p.add_subparsers(dest="theory_command", metavar="SUBCOMMAND", required=True)

    b = tsub.add_parser("bound", help="evaluate a bound at given (eta, beta) and constants")
    _add_bound_flags(b, with_eta=True)
    add_json_flag(b)
    b.set_defaults(func=cmd_bound)

    t = tsub.add_parser("tune", help="the (eta, beta) minimising a bound: closed form + numeric check")
    _add_bound_flags(t, with_eta=False)
    add_json_flag(t)
    t.set_defaults(func=cmd_tune)

    q = tsub.add_parser("penalty", help="tuned delayed bound / tuned sync bound")
    _add_bound_flags(q, with_eta=False)
    q.add_argument("--plot", metavar="PNG", help="also plot the ratio against T")
    add_json_flag(q)
    q.set_defaults(func=cmd_penalty)

    s = tsub.add_parser("stability", help="largest stable eta*lambda on f = lambda x^2/2 under delay")
    s.add_argument("--method", default="ema", help="gd, heavyball, ema or adam (EMA with frozen preconditioner)")
    s.add_argument("--delay", "--tau", dest="delay", type=int, default=1, help="gradient delay (default 1)")
    s.add_argument("--ef", action="store_true", help="with Error Feedback")
    s.add_argument("--beta", type=float, help="momentum in [0, 1) (default 0.9; 0 for gd)")
    s.add_argument("--plot", metavar="PNG", help="plot the stable region against beta")
    add_json_flag(s)
    s.set_defaults(func=cmd_stability)

    a = tsub.add_parser("axis", help="the theory's numbers against tau: Theorem 1's penalty (LMO), the stability "
                        "limits (Adam-type), EF's break-even drift",
                        description="Constant-free predictions along the delay axis for each optimizer at its default "
                        "momentum (delaylab/theory/axis.py; docs/beyond.md).")
    a.add_argument("--taus", type=csv_list(positive_float), default=[1.0, 2.0, 4.0, 8.0],
                   help="delays (default 1,2,4,8; a random delay's mean may be fractional for LMO methods)")
    a.add_argument("--optimizers", type=csv_list(str), default=["muon", "adamw"], help="default muon,adamw")
    a.add_argument("--T", type=positive_float, default=1000.0, help="updates, for the start-up term (default 1000)")
    a.add_argument("--plot", metavar="PNG", help="also plot the numbers against tau")
    add_json_flag(a)
    a.set_defaults(func=cmd_axis)

    n = tsub.add_parser(
        "nqm", help="noisy quadratic model: predicted sync / delayed loss curves and their gap",
        description="The noisy quadratic model (Zhang et al. 2019) under a gradient delay, fitted to a spectrum file "
        "(`delaylab llm spectrum RUN`): exact expected loss by the second-moment recursion for AdamW through its "
        "fixed diagonal preconditioner (model exact), Monte Carlo of the real AdamW update, of Muon on a matrix and of "
        "sign descent (Lion). Without --spectrum a synthetic power-law density (--top, --noise). See docs/nqm.md.")
    n.add_argument("--spectrum", metavar="JSON", help="a spectrum file from `delaylab llm spectrum`")
    n.add_argument("--checkpoint", type=int, default=-1, help="which checkpoint of the file (default -1: the last)")
    n.add_argument("--optimizer", default="adamw", help="adamw, soap, adan, mars (diagonal model), muon, lion, sgd")
    n.add_argument("--lr", type=positive_float, default=1e-3, help="peak lr (default 1e-3)")
    n.add_argument("--momentum", type=unit_interval, help="momentum / beta1 (default: the optimizer's)")
    n.add_argument("--steps", type=positive_int, default=300, help="updates (default 300)")
    n.add_argument("--batch", type=positive_int, default=16, help="sequences per update (default 16)")
    n.add_argument("--schedule", default="cosine", choices=("cosine", "wsd", "constant"),
                   help="lr schedule after the warmup (default cosine)")
    n.add_argument("--warmup", type=nonneg_int, help="warmup updates (default 5%% of steps)")
    n.add_argument("--min-lr-ratio", type=float, default=0.1, help="final lr / peak (default 0.1)")
    n.add_argument("--delay", "--tau", dest="delay", type=_delay_arg, default=1,
                   help="1, per stage 3,2,1,0 (PipeDream), or uniform:0-4 (default 1)")
    n.add_argument("--correction", default="none", choices=("none", "ef", "predict", "ef+predict", "damp"),
                   help="none, ef, predict, ef+predict, damp")
    n.add_argument("--model", choices=("exact", "adamw", "sign", "muon"),
                   help="exact recursion or Monte Carlo of the real update (default by optimizer)")
    n.add_argument("--eos", action="store_true", help="exact model: cap each curve's curvatures at 0.9 x its own "
                   "stability limit / lr (the edge of stability an adaptive method settles at)")
    n.add_argument("--runs", type=positive_int, default=2000, help="Monte Carlo runs (default 2000)")
    n.add_argument("--seed", type=nonneg_int, default=0, help="Monte Carlo seed")
    n.add_argument("--top", type=positive_float, default=10.0, help="synthetic density: top curvature (default 10)")
    n.add_argument("--noise", type=positive_float, default=1.0, help="synthetic density: noise trace (default 1)")
    n.add_argument("--plot", metavar="PNG", help="also plot the curves and the gap")
    add_json_flag(n)
    n.set_defaults(func=cmd_nqm)

    k = tsub.add_parser(
        "check", help="replay an `llm train` run, measure the constants on it, and check its optimizer's bound",
        description="Replays the run in RUN_DIR from its config (checked against every checkpoint on disk) and "
        "measures, along it, on held-out batches: the gradient norm in the bound's norm, L both ways (secants "
        "between measured updates; Hessian-vector power iteration at the probes), sigma (fresh training batches), "
        "Delta, G0 and the step norms. Then evaluates the bound of the run's own optimizer (Theorem 1 for lmo, muon "
        "and lion, Theorem 4 for sgd; none covers adamw) at each estimate of L and prints one verdict: holds, "
        "violated, or cannot be evaluated, and why. See docs/assumptions.md.")
    k.add_argument("run", metavar="RUN_DIR", help="an `llm train` run folder with checkpoints (--ckpt-every N)")
    k.add_argument("--every", type=positive_int, default=1, help="measure the gradient every N-th update (default 1)")
    k.add_argument("--probe-every", type=nonneg_int, default=0,
                   help="curvature and sigma also every N-th update (default 0: at update 0, the checkpoints "
                   "and the end only)")
    k.add_argument("--held", type=positive_int, default=2, help="held-out batches that define f (default 2)")
    k.add_argument("--samples", type=positive_int, default=8,
                   help="stochastic gradients per probe for sigma, each on a fresh training batch (default 8)")
    k.add_argument("--iters", type=positive_int, default=20,
                   help="Hessian-vector products per probe, at most (default 20)")
    k.add_argument("--seed", type=nonneg_int, default=0, help="the power iteration's start (default 0)")
    k.add_argument("--figure", metavar="PNG", help="also plot the measured norms against the bound, and L")
    k.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_json_flag(k)
    k.set_defaults(func=cmd_check)

    m = tsub.add_parser(
        "estimators", help="the estimators against the toy problems' exact constants (markdown tables)",
        description="Both estimates of L (secant, curvature) on the toy problems whose L is known, in each norm, "
        "then sigma, Delta and G0 against their truth: the tables of docs/assumptions.md.")
    m.add_argument("--seed", type=nonneg_int, default=0, help="the perturbations' and power iteration's seed")
    add_json_flag(m)
    m.set_defaults(func=cmd_estimators)

    e = tsub.add_parser(
        "pep", help="exact worst case by performance estimation (PEPit) against our bound",
        description="Worst case of deterministic SGD with momentum (delayed, optionally with EF) over all "
        "L-smooth functions with f(x0) - inf f <= Delta, solved as a semidefinite program by PEPit "
        f"(Clarabel), against Theorem 4 at sigma = 0. Needs the extra: {install_hint('pep')}. "
        "LMO methods (Muon) cannot be expressed: their step is not linear in the gradients.")
    e.add_argument("--method", default="sgdm", help="sgdm (default) or gd; lmo is refused with the reason")
    e.add_argument("--momentum", default="ema", help="ema (m = beta m + (1-beta) g, default) or heavyball "
                   "(m = beta m + g, torch SGD with lr = eta)")
    e.add_argument("--delay", "--tau", dest="delay", type=nonneg_int, default=0, help="gradient delay tau")
    e.add_argument("--ef", action="store_true", help="with Error Feedback")
    e.add_argument("--T", type=positive_int, help="number of updates (a PEP of size about T; keep T <= 24)")
    e.add_argument("--eta", type=positive_float, help="step size")
    e.add_argument("--beta", type=unit_interval, default=0.0, help="momentum in [0, 1) (default 0)")
    e.add_argument("--L", type=positive_float, default=1.0, help="smoothness (default 1)")
    e.add_argument("--Delta", "--delta", dest="Delta", type=positive_float, default=1.0,
                   help="f(x0) - inf f (default 1)")
    e.add_argument("--sweep", action="store_true", help="the docs' grid: T 2..12, tau 0..2, three betas, two etas")
    e.add_argument("--plot", metavar="PNG", help="with --sweep: plot bound / worst case against T")
    add_json_flag(e)
    e.set_defaults(func=cmd_pep)
