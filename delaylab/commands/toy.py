"""`delaylab toy list|rates|compare|cost|profile`: delayed LMO methods on synthetic problems vs the bounds.

* ``list``     the problems (with their constants) and the methods;
* ``rates``    the rate check: measured mean ||grad f||_* at theory-tuned (eta, beta) for each T
               against the bound, the log-log slope against the bound's exponent, ``holds``;
               ``--suite`` runs it for every problem x LMO method x {sync, tau=1, tau=1+EF};
* ``compare``  sync vs delayed vs delayed+EF, one row per method (the toy demo);
* ``cost``     the delay's cost at fixed (eta, beta): gap vs eta and vs beta, measured and predicted;
* ``profile``  any torch optimizer (``--optimizer package.module:factory``) under delays 0, 1, 2 with
               and without EF: delay cost, rate slope, stable lr on a quadratic, bound check.

Each command checks its arguments, calls one function of :mod:`delaylab.toy` and prints its
result (:mod:`delaylab.toy.report`, :mod:`delaylab.toy.plots`). torch, sympy and scipy are
imported inside the command functions so ``delaylab --help`` is fast.
"""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path

from delaylab.commands._common import UsageError, add_json_flag, emit

PROBLEM_HELP = "problem name (see `delaylab toy list`); default: logdet, the matrix problem"


# -- argument checks (UsageError: one line, exit 2, before anything is written) ----------------


def _numbers(text: str, name: str, kind: type) -> list:
    noun = "integers" if kind is int else "numbers"
    try:
        values = [kind(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"{name} must be a comma-separated list of {noun}, got {text!r}") from None
    if not values:
        raise UsageError(f"{name} must not be empty")
    return values


def _int_list(text: str, name: str, minimum: int) -> list[int]:
    values = _numbers(text, name, int)
    bad = [v for v in values if v < minimum]
    if bad:
        raise UsageError(f"{name} must be >= {minimum}, got {bad[0]}")
    return values


def _check_int(value: int, name: str, minimum: int) -> int:
    if value < minimum:
        raise UsageError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_beta(value: float | None, name: str = "--beta") -> None:
    if value is not None and not 0 <= value < 1:
        raise UsageError(f"{name} must be in [0, 1), got {value}")


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


def _method(text: str, hint: str = "") -> str:
    names = _methods(text)
    if len(names) != 1:
        raise UsageError("--method takes one method" + hint)
    return names[0]


def _delay(args):
    if args.block_delays is not None:
        if args.delay is not None:
            raise UsageError("give either --delay or --block-delays, not both")
        return _int_list(args.block_delays, "--block-delays", 0)
    delay = 0 if args.delay is None else _check_int(args.delay, "--delay", 0)
    if args.correction != "none" and delay == 0:
        raise UsageError(f"--correction {args.correction} needs --delay >= 1")
    return delay


def _common_checks(args) -> None:
    """--T (one horizon), --seeds, --delay >= 1 and --beta: compare's and cost's."""
    _check_int(args.T, "--T", 1)
    _check_int(args.seeds, "--seeds", 1)
    _check_int(args.delay, "--delay", 1)
    _check_beta(args.beta)


# -- the run folder --------------------------------------------------------------------------------


class _Folder:
    """``--out DIR`` as the check's progress (:data:`delaylab.toy.rates.Progress`): the guard at
    once; config.json and metrics.jsonl only from ``start`` on, which the library calls when
    every input is checked; one metrics line (and bar step) per run; summary.json at the end."""

    def __init__(self, args, desc: str):
        from delaylab.run_folder import RunFolder

        self.run = RunFolder(args.out, {k: v for k, v in vars(args).items() if k != "func"})
        self.run.check_new()
        self.desc = desc

    def start(self, total: int) -> None:
        self.run.open(total=total, desc=self.desc, unit="run", leave=False)

    def __call__(self, item: dict) -> None:
        self.run.log(item)
        self.run.advance()

    def __enter__(self) -> "_Folder":
        return self

    def __exit__(self, *exc) -> None:
        self.run.close()


def _figures(args, kind: str, result: dict) -> None:
    """With --plot: write ``kind``'s figures (:data:`delaylab.toy.plots.FIGURES`), list them in ``result``."""
    from delaylab.toy.plots import save_figures

    if args.plot:
        result["figures"] = save_figures(kind, result, args.plot)


def _finish(args, folder: _Folder, result: dict, render) -> int:
    """summary.json (with --out), then the result on stdout."""
    folder.run.finish(result)
    emit(result, args.json, render)
    return 0


# -- the commands ----------------------------------------------------------------------------------


def cmd_list(args) -> int:
    from delaylab.toy import report
    from delaylab.toy.problems import DEFAULT_PROBLEM, PROBLEMS
    from delaylab.toy.runs import METHODS

    result = {
        "default_problem": DEFAULT_PROBLEM,
        "problems": [PROBLEMS[name]().describe() for name in PROBLEMS],
        "methods": [{"name": m.name, "summary": m.summary, "norm": m.norm} for m in METHODS.values()],
        "corrections": ["none", "ef", "dc-asgd"],
    }
    emit(result, args.json, report.render_list)
    return 0


def cmd_rates(args) -> int:
    steps = _int_list(args.T, "--T", 1)
    _check_int(args.seeds, "--seeds", 1)
    if not args.tolerance >= 0:
        raise UsageError(f"--tolerance must be >= 0, got {args.tolerance}")
    _check_beta(args.beta)
    if args.suite:
        return _rates_suite(args, steps)
    if args.markdown:
        raise UsageError("--markdown writes the suite's table: it needs --suite")
    if args.suite_delays != "1":
        raise UsageError("--suite-delays sets the suite's delays: it needs --suite")
    if args.method is None:
        raise UsageError("--method is required (or use --suite)")
    method = _method(args.method, " (use --suite for many)")
    delay, problem = _delay(args), _problem(args)
    from delaylab.toy import report
    from delaylab.toy.rates import rate_check

    with _Folder(args, "rates") as folder:
        result = rate_check(problem, method, steps=steps, delay=delay, correction=args.correction, seeds=args.seeds,
                            seed=args.seed, tolerance=args.tolerance, beta=args.beta, progress=folder)
        _figures(args, "rates", result)
        return _finish(args, folder, result, report.render_rates)


def _rates_suite(args, steps) -> int:
    from delaylab.toy import report
    from delaylab.toy.problems import PROBLEMS
    from delaylab.toy.rates import rate_suite

    if args.sigma is not None or args.batch is not None:
        raise UsageError("--suite runs the default instances; --sigma/--batch apply to a single problem")
    if args.delay is not None or args.block_delays is not None or args.correction != "none":
        raise UsageError("--suite runs sync and each --suite-delays tau with and without EF itself; drop "
                         "--delay/--block-delays/--correction")
    if args.beta is not None:
        raise UsageError("--suite tunes (eta, beta) from the bound at every T; drop --beta")
    names = [args.problem] if args.problem_given else list(PROBLEMS)
    methods = _methods(args.method) if args.method else None
    delays = _int_list(args.suite_delays, "--suite-delays", 1)
    with _Folder(args, "rate suite") as folder:
        summary = rate_suite(names, methods, steps=steps, seeds=args.seeds, seed=args.seed,
                             tolerance=args.tolerance, progress=folder, delays=delays)
        _figures(args, "suite", summary)  # before the Markdown, which names it
        if args.markdown:
            Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(args.markdown).write_text(report.suite_markdown(summary, _suite_command(args, steps)))
            summary["markdown"] = args.markdown
        return _finish(args, folder, summary, report.render_suite)


def _suite_command(args, steps) -> str:
    """The command line that made the suite's table, for the table's caption."""
    command = f"delaylab toy rates --suite --T {','.join(map(str, steps))} --seeds {args.seeds}"
    command += f" --seed {args.seed}" if args.seed else ""
    command += f" --problem {args.problem}" if args.problem_given else ""
    command += f" --method {args.method}" if args.method else ""
    command += f" --suite-delays {args.suite_delays}" if args.suite_delays != "1" else ""
    command += f" --plot {args.plot}" if args.plot else ""
    return command + f" --markdown {args.markdown}"


def cmd_compare(args) -> int:
    from delaylab.toy import report
    from delaylab.toy.rates import MODES, compare

    _common_checks(args)
    if not args.eta_scale > 0:
        raise UsageError(f"--eta-scale must be > 0, got {args.eta_scale}")
    methods = _methods(args.methods)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or modes[0] != "sync" or any(m not in MODES for m in modes):
        raise UsageError(f"--modes must start with sync and use {', '.join(MODES)}; got {args.modes!r}")
    problem = _problem(args)
    with _Folder(args, "compare") as folder:
        result = compare(problem, methods, steps=args.T, delay=args.delay, beta=args.beta, eta_scale=args.eta_scale,
                         modes=modes, norm=args.norm, seeds=args.seeds, seed=args.seed, progress=folder)
        _figures(args, "compare", result)
        return _finish(args, folder, result, report.render_compare)


def cmd_cost(args) -> int:
    from delaylab.toy import report
    from delaylab.toy.rates import delay_cost

    _common_checks(args)
    method = _method(args.method)
    kw = {}
    if args.betas is not None:
        kw["betas"] = _numbers(args.betas, "--betas", float)
        for b in kw["betas"]:
            _check_beta(b, "--betas")
    problem = _problem(args)
    with _Folder(args, "cost") as folder:
        result = delay_cost(problem, method, steps=args.T, delay=args.delay, beta=args.beta,
                            beta_sweep_eta=args.beta_sweep_eta, seeds=args.seeds, seed=args.seed, progress=folder, **kw)
        _figures(args, "cost", result)
        return _finish(args, folder, result, report.render_cost)


def cmd_profile(args) -> int:
    from delaylab.commands._plugins import load_optimizer
    from delaylab.optim.declared import Declared
    from delaylab.toy import report
    from delaylab.toy.profile import profile

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
    scales = _numbers(args.lr_scales, "--lr-scales", float)
    if not all(s > 0 for s in scales):
        raise UsageError(f"--lr-scales must be numbers > 0, got {args.lr_scales!r}")
    _check_int(args.seeds, "--seeds", 1)
    bound_steps = _int_list(args.bound_T, "--bound-T", 1) if args.bound_T else None
    with _Folder(args, "profile") as folder:
        result = profile(factory, problems=problems, delays=delays, ef=not args.no_ef, lr_scales=scales, steps=steps,
                         seeds=args.seeds, seed=args.seed, norm=args.norm, declare=declare,
                         stability_check=not args.no_stability, bound_check=not args.no_bound_check,
                         bound_steps=bound_steps, name=args.optimizer, progress=folder)
        _figures(args, "profile", result)
        return _finish(args, folder, result, report.render_profile)


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
                   help="every problem (or --problem) x LMO method (or --method list) x {sync, tau, tau+EF}")
    q.add_argument("--suite-delays", default="1", metavar="T1,T2,..",
                   help="with --suite: the delays tau it runs, each without and with EF (1)")
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
