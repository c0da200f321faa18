"""`delaylab llm train|sweep|pipeline ...`: the flags of all three are the config's fields."""

from __future__ import annotations

import math
import os
import statistics
from pathlib import Path

from delaylab.commands import pipeline
from delaylab.commands._common import EXIT_CODES, UsageError, add_json_flag, csv_list, emit, finished_already
from delaylab.commands._config_flags import add_config_flags, config_from_args, reject_changes_on_resume
from delaylab.llm.config import CORRECTIONS_BY_ENGINE


def _render_summary(s: dict) -> str:
    def num(v, fmt):
        return "n/a" if v is None else format(v, fmt)

    return (f"{s['optimizer']} delay {s['delay']} (correction {s['correction']}): val_loss {num(s['val_loss'], '.4f')}"
            f"  train_loss {num(s['train_loss'], '.4f')}  steps {s['steps']}  tokens {s['tokens']}"
            f"  tokens/s {num(s['tokens_per_s'], '.0f')}")


def cmd_train(args) -> int:
    from delaylab.errors import Diverged, Preempted
    from delaylab.llm.distributed.launch import as_rank
    from delaylab.llm.distributed.world import under_launcher
    from delaylab.llm.run.folder import require_folder
    from delaylab.llm.run.setup import claim_folder, load_data, resolve
    from delaylab.llm.run.trainer import train, train_replicas

    if args.resume:
        reject_changes_on_resume(args, args.resume)
        folder, cfg = Path(args.resume), config_from_args(args, require_folder(args.resume))
    elif args.out or args.dry_run:
        folder, cfg = (Path(args.out) if args.out else None), config_from_args(args)
    else:
        raise UsageError("give --out DIR (or --resume DIR)")
    if args.stop_at is not None and args.stop_at < 1:
        raise UsageError(f"--stop-at must be >= 1, got {args.stop_at}")
    if args.dry_run:  # planned here, maybe for GPUs this host does not have
        from delaylab.llm.estimate import estimate, planned, render

        emit(estimate(planned(cfg)), args.json, render)
        return 0
    cfg = resolve(cfg, "simulator")
    if args.resume and finished_already(cfg, folder, args.json, _render_summary,
                                        report=int(os.environ.get("RANK", "0")) == 0):
        return 0
    if cfg.parallel.dp > 1 and not under_launcher():  # start the D replicas ourselves
        summary = train_replicas(cfg, folder, resume=bool(args.resume), stop_at=args.stop_at)
    elif not under_launcher():  # one process: the config and data checked, config.json written, then the run
        data = load_data(cfg)
        claim_folder(cfg, folder, bool(args.resume), stages=1)
        summary = train(cfg, folder, resume=bool(args.resume), stop_at=args.stop_at, dataset=data)
    else:  # this replica under torchrun (they all see the same loss: a NaN stops each)
        summary = as_rank(lambda: train(cfg, folder, resume=bool(args.resume), stop_at=args.stop_at),
                          stages=1, dp=cfg.parallel.dp, passes=(Diverged, Preempted))
        if int(os.environ.get("RANK", "0")) != 0:  # under torchrun, replica 0 reports
            return 0
    emit(summary, args.json, _render_summary)
    return 0


def _per_optimizer(values: list[str] | None, flag: str, lower: float, upper: float | None = None):
    """``FLAG 0.1,0.2`` for every optimizer, or ``FLAG adamw=0.1,0.2 FLAG muon=0.3`` (repeated)."""
    if not values:
        return None
    shared, per = None, {}
    bounds = f"> {lower}" if upper is None else f"in [{lower}, {upper})"
    for text in values:
        name, _, rest = text.rpartition("=")
        try:
            vals = [float(t) for t in rest.split(",") if t.strip()]
        except ValueError:
            raise UsageError(f"{flag}: expected numbers, got {text!r}") from None
        ok = [(v > lower if upper is None else lower <= v < upper) for v in vals]
        if not vals or not all(ok):
            raise UsageError(f"{flag}: values must be {bounds}, got {text!r}")
        if name:
            per[name] = vals
        else:
            shared = vals
    if shared is not None and per:
        raise UsageError(f"{flag}: give either one list for all optimizers or NAME=... lists, not both")
    return per or shared


def render_gaps(g: dict) -> str:
    """The gap table of a sweep (``llm sweep``, ``demo``)."""
    from delaylab.llm.metrics import fmt_overhead
    from delaylab.stats import fmt_set

    def f(v, fmt=".4f"):
        return "n/a" if v is None else format(v, fmt)

    def ci(s, fmt="+.3f"):
        c = (s or {}).get("ci")
        return "n/a" if c is None else f"[{format(c[0], fmt)},{format(c[1], fmt)}]"

    from delaylab.llm.sweep import FIXES

    fixes = [m for m in FIXES if any(m in r for r in g["grid"])]
    others = [m for m in ("delayed", *fixes) if any(m in r.get("overhead", {}) for r in g["grid"])]
    head = (f"{'optimizer':<9} {'lr':>8} {'mom':>5}  {'sync':>7} {'delayed':>8} {'gap':>7} {'±':>6} {'gap 95% t':>17}"
            + "".join(f" {m:>7} {m + ' %':>9} {'95% Fieller':>16}" for m in fixes)
            + "".join(f" {'tok× ' + m:>12}" for m in others))
    lines = [head]
    for row in g["grid"]:
        gap = row.get("gap", {})
        line = (f"{row['optimizer']:<9} {row['lr']:>8g} {'' if row['momentum'] is None else row['momentum']:>5}"
                f"  {f(row.get('sync', {}).get('mean')):>7} {f(row.get('delayed', {}).get('mean')):>8}"
                f" {f(gap.get('mean'), '+.4f'):>7} {f(gap.get('std'), '.3f'):>6} {ci(gap):>17}")
        for m in fixes:
            rec = row.get(f"{m}_recovered_pct", {})
            pct = f(rec.get("ratio_of_means"), ".0f") + ("*" if rec.get("unstable") else "")
            line += f" {f(row.get(m, {}).get('mean')):>7} {pct:>9} {fmt_set(rec.get('set'), '.0f'):>16}"
        for m in others:
            line += f" {fmt_overhead(row.get('overhead', {}).get(m)):>12}"
        lines.append(line)
    if fixes:
        lines.append("% of the gap recovered: ratio of means over seeds; * unstable (the gap's 95% t interval "
                     "contains 0); 95% Fieller: Fieller's set for the ratio of the paired gaps (unbounded where the gap is not "
                     "resolved)")
    if others:
        lines.append("tok× MODE: iso-loss token overhead, tokens MODE needs to reach sync's final val loss / sync's "
                     "tokens (mean over seeds, only where every seed reached it)")
    diag = [r for r in g["grid"] if "diagnostics" in r]
    if diag:
        modes = [m for m in ("sync", "delayed", *fixes) if any(m in r["diagnostics"] for r in diag)]
        lines.append("")
        lines.append(f"{'optimizer':<9} {'lr':>8} {'mom':>5} "
                     + "".join(f" {'spike ' + m:>14} {'exit ' + m:>12}" for m in modes))
        for row in diag:
            line = f"{row['optimizer']:<9} {row['lr']:>8g} {'' if row['momentum'] is None else row['momentum']:>5} "
            for m in modes:
                d = row["diagnostics"].get(m)
                if d is None:
                    line += f" {'':>14} {'':>12}"
                    continue
                left = sum(bool(x) for x in d["plateau_left"])
                exits = [x for x in d["plateau_exit"]["values"] if x is not None]
                exit_ = f(statistics.median(exits) if exits else None, ".0f") + f" ({left}/{len(d['plateau_left'])})"
                line += f" {f(d['spike']['mean'], '.3f'):>14} {exit_:>12}"
            lines.append(line)
        lines.append("spike: largest rise of the train loss above its running minimum after warmup (nats, mean over "
                     "seeds); exit: update at which the smoothed train loss is 0.1 below its end-of-warmup level "
                     "(median over the seeds that left; in parentheses how many did)")
    best = ", ".join(f"{k} lr {v['lr']:g}" for k, v in g["best"].items())
    lines.append(f"best sync lr: {best}; figures: {', '.join(g['figures']) or 'none'}")
    lines += [f"warning: {w}" for w in g.get("warnings", [])]
    return "\n".join(lines)


def cmd_sweep(args) -> int:
    from delaylab.llm.sweep import sweep

    if not args.out:
        raise UsageError("give --out DIR")
    if args.seeds < 1 or args.jobs < 1:
        raise UsageError("--seeds and --jobs must be >= 1")
    lrs = _per_optimizer(args.lrs, "--lrs", 0.0)
    momenta = _per_optimizer(args.momenta, "--momentum", 0.0, 1.0)
    gaps = sweep(config_from_args(args), args.out, args.optimizers, args.modes, lrs, momenta, args.seeds, jobs=args.jobs)
    emit(gaps, args.json, render_gaps)
    return 0


def cmd_advise(args) -> int:
    from delaylab.llm.advise import Overheads, advise, plot, render
    from delaylab.llm.pipeline.cost_model import Costs

    if args.figure:
        from delaylab._io import figure_path

        figure_path(args.figure)  # before the costs are measured
    given = [args.forward, args.backward]
    if any(v is not None for v in given) and not all(v is not None for v in given):
        raise UsageError("give both --forward and --backward (or neither: measured)")
    cfg = config_from_args(args).replace(stages=args.stages or 4)
    if args.forward is not None and args.n_layer is None:  # given costs: no model is built
        cfg = cfg.replace(n_layer=cfg.parallel.stages)
    from delaylab.llm.run.setup import resolve

    cfg = resolve(cfg, "pipeline")
    P, M = cfg.parallel.stages, cfg.data.grad_accum
    for name in ("forward", "backward", "weight_grad", "update", "send", "overhead", "pipedream_overhead"):
        v = getattr(args, name)
        if v is not None and not (v >= 0 and math.isfinite(v)):
            raise UsageError(f"--{name.replace('_', '-')} must be a number >= 0, got {v}")
    measured_run = None
    if args.costs_from:
        from delaylab.llm.pipeline.timeline import load_timeline

        timeline, measured_run = load_timeline(args.costs_from)
        costs, source = Costs.measured(timeline), f"measured in {args.costs_from}"
        if timeline.stages != P:
            raise UsageError(f"{args.costs_from} ran {timeline.stages} stages; give --stages {timeline.stages}")
    elif args.forward is not None:
        costs = Costs.make(P, args.forward, args.backward, args.update or 0.0, args.send or 0.0)
        source = "given"
    else:
        import torch

        from delaylab.llm.pipeline.measure_costs import measure_costs

        costs = measure_costs(cfg, cfg.torch_device())
        source = f"measured on {cfg.torch_device()} ({torch.get_num_threads()} threads)"
    overheads = Overheads() if args.overhead is None else Overheads(args.overhead, args.pipedream_overhead, "given")
    result = advise(P, M, costs, weight_grad=args.weight_grad, chunks=args.chunks, updates=cfg.run.steps,
                    overheads=overheads)
    result["costs_source"] = source
    if measured_run is not None:  # the model against the run whose costs it used
        row = next(r for r in result["rows"] if r["schedule"] == measured_run["schedule"].removeprefix("torch-"))
        result["check"] = {"schedule": measured_run["schedule"], "measured_s": measured_run["seconds_per_batch"],
                           "predicted_s": row["seconds_per_update"],
                           "measured_over_predicted": measured_run["seconds_per_batch"] / row["seconds_per_update"],
                           "foreign_cpu_cores": measured_run.get("foreign_cpu_cores")}
    if args.figure:
        plot(result, args.figure)
        result["figure"] = args.figure
    emit(result, args.json, render)
    return 0


def cmd_spectrum(args) -> int:
    import sys

    from delaylab._io import figure_path, write_json
    from delaylab.llm.spectrum import measure, plot

    for name in ("probes", "batches"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.lanczos_steps < 2 or args.noise_sequences < 2:
        raise UsageError("--lanczos-steps and --noise-sequences must be >= 2")
    out = Path(args.out) if args.out else Path(args.run) / "spectrum.json"
    if args.figure:
        figure_path(args.figure)  # a bad figure path fails before the minutes of measuring
    say = None if args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    spec = measure(args.run, probes=args.probes, lanczos_steps=args.lanczos_steps, batches=args.batches,
                   noise_sequences=args.noise_sequences, seed=args.seed, progress=say)
    write_json(out, spec)
    if args.figure:
        plot(spec, args.figure)
    top = [max(c["hessian"]["nodes"]) for c in spec["checkpoints"]]
    result = {"spectrum": str(out), "figure": args.figure, "seconds": spec["seconds"],
              "checkpoints": [c["step"] for c in spec["checkpoints"]], "top_eigenvalue": top,
              "noise_trace": [c["noise_trace"] for c in spec["checkpoints"]]}
    emit(result, args.json, lambda r: (f"{r['spectrum']}: checkpoints {r['checkpoints']}, top Hessian eigenvalue "
                                       + ", ".join(f"{t:.4g}" for t in r["top_eigenvalue"])
                                       + f"; {r['seconds']:.0f} s"))
    return 0


def register(sub) -> None:
    p = sub.add_parser("llm", help="GPT pretraining: sync vs delayed vs mitigations")
    llm_sub = p.add_subparsers(dest="llm_command", metavar="LLM_COMMAND", required=True)

    t = llm_sub.add_parser(
        "train", help="train a GPT: sync, delayed (any tau), EF / DC-ASGD, sync start/cooldown",
        description="Train a GPT in one process with the exact gradient-delay simulator (--delay 0 is "
        "synchronous; --schedule 2bw --stages P simulates that pipeline: the same flags give the same run "
        "as `delaylab llm pipeline`). Writes config.json, metrics.jsonl, summary.json and ckpt/ under --out.",
        epilog=EXIT_CODES,
    )
    add_config_flags(t)
    t.add_argument("--out", metavar="DIR", help="run folder (must not hold a run already)")
    t.add_argument("--resume", metavar="DIR", help="continue the run in DIR bit-exactly")
    t.add_argument("--stop-at", type=int, metavar="K", help="stop after update K with a checkpoint")
    t.add_argument("--dry-run", action="store_true",
                   help="print the resolved config, the parameters, the tokens, the estimated memory per process "
                   "and time, then exit without training (no --out needed)")
    add_json_flag(t)
    from delaylab.commands.predict import add_pilot_flags, with_pilot

    add_pilot_flags(t)  # --predict-at F --predict-sync DIR: a pilot, then its predicted end gap
    t.set_defaults(func=with_pilot(cmd_train))

    s = llm_sub.add_parser(
        "sweep", help="grid of runs and the delayed-minus-sync gap (gaps.json, PNG figures)",
        description="Run optimizers x modes x lrs x momenta x seeds (resumable: finished cells are "
        "not rerun) and write gaps.json and figures under --out.",
    )
    s.add_argument("--optimizers", type=csv_list(str), default=["adamw", "muon"], help="default adamw,muon")
    s.add_argument("--modes", type=csv_list(str), default=["sync", "delayed", "ef"],
                   help="sync, delayed, or delayed with a correction: "
                   + ", ".join(c for c in CORRECTIONS_BY_ENGINE["simulator"] if c != "none")
                   + " (default sync,delayed,ef)")
    s.add_argument("--lrs", action="append", metavar="[NAME=]LR,...",
                   help="peak lrs for every optimizer, or per optimizer (repeat the flag)")
    s.add_argument("--momentum", dest="momenta", action="append", metavar="[NAME=]M,...",
                   help="momentum grid for every optimizer, or per optimizer (repeat the flag); "
                        "default: each optimizer's own")
    s.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 (default 1)")
    s.add_argument("--jobs", type=int, default=1, help="runs in parallel, one thread each (default 1)")
    # The grid flags set these per cell; a sweep runs the simulator (no pipeline schedule).
    add_config_flags(s, exclude=("optimizer", "lr", "momentum", "correction", "seed", "schedule", "timeout"))
    s.add_argument("--out", metavar="DIR", help="sweep folder (rerun to resume)")
    add_json_flag(s)
    s.set_defaults(func=cmd_sweep)

    a = llm_sub.add_parser(
        "advise", help="is async pipelining worth it? time to a target loss for GPipe, 1F1B, interleaved, ZB-H1, "
        "2BW, PipeDream",
        description="Predict time per update, bubble, memory and time to the target loss of each pipeline schedule: "
        "per-stage costs given (--forward/--backward/...) or measured by profiling the model on this machine; the "
        "iso-loss token overhead of the delayed schedules given (--overhead) or assumed 1. Interleaved 1F1B and "
        "ZB-H1 are modelled, not run.",
    )
    add_config_flags(a, only=("preset", "n_layer", "block_size", "batch_size", "grad_accum", "stages", "optimizer",
                              "device", "tokenizer", "vocab_size", "steps"), title="the model and batch (config fields)")
    c = a.add_argument_group("costs, seconds per microbatch and stage (default: measured)")
    for flag, text in (("forward", "forward F"), ("backward", "full backward B"),
                       ("weight-grad", "weight-gradient part W of B (default B/2)"), ("update", "optimizer step"),
                       ("send", "one activation message")):
        c.add_argument(f"--{flag}", type=float, help=text)
    c.add_argument("--costs-from", metavar="RUN", help="a `llm pipeline` run folder: its measured per-stage costs "
                   "(timeline.json), and its measured time per update printed beside the prediction")
    a.add_argument("--chunks", type=int, default=2, help="interleaved 1F1B: model chunks per rank v (default 2)")
    a.add_argument("--overhead", type=float, help="2BW's iso-loss token overhead (default: none given, 1.0)")
    a.add_argument("--pipedream-overhead", type=float, help="PipeDream's (default: 2BW's)")
    a.add_argument("--figure", metavar="PNG", help="write the time-to-target bar chart here")
    add_json_flag(a)
    a.set_defaults(func=cmd_advise)

    sp = llm_sub.add_parser(
        "spectrum", help="Hessian spectral density (SLQ) and gradient noise at a run's checkpoints, for the NQM",
        description="At each checkpoint of RUN, on held-out batches: the Hessian's spectral density by stochastic "
        "Lanczos quadrature (Hessian-vector products, float64), for AdamW also that of D^1/2 H D^1/2 with D from its "
        "second moment, and the trace of the per-sequence gradient covariance. Writes a spectrum file (JSON) for "
        "`delaylab theory nqm --spectrum`. Minutes on a CPU for the tiny model.")
    sp.add_argument("run", metavar="RUN", help="a run folder with checkpoints (llm train --ckpt-every N)")
    sp.add_argument("--out", metavar="JSON", help="the spectrum file (default RUN/spectrum.json)")
    sp.add_argument("--probes", type=int, default=3, help="SLQ random probes (default 3)")
    sp.add_argument("--lanczos-steps", type=int, default=20, help="Lanczos steps per probe (default 20)")
    sp.add_argument("--batches", type=int, default=2, help="held-out batches for the Hessian (default 2)")
    sp.add_argument("--noise-sequences", type=int, default=32,
                    help="held-out sequences for the gradient noise (default 32)")
    sp.add_argument("--seed", type=int, default=0, help="the probes' seed")
    sp.add_argument("--figure", metavar="PNG", help="also plot the densities")
    add_json_flag(sp)
    sp.set_defaults(func=cmd_spectrum)

    pipeline.register(llm_sub)
