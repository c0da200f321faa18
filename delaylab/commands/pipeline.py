"""`delaylab llm pipeline ...`: train a GPT on a real multi-process pipeline (registered by commands/llm.py).

Spawns one rank per stage and data-parallel replica (``--stages P --dp D``: P x D ranks) through
torch's elastic launcher, or, when started by torchrun (``torchrun --nproc-per-node P*D -m delaylab
llm pipeline --stages P ...``), runs the rank it is.
"""

from __future__ import annotations

from pathlib import Path

from delaylab.commands._common import EXIT_CODES, UsageError, add_json_flag, emit, finished_already
from delaylab.commands._config_flags import add_config_flags, config_from_args, reject_changes_on_resume


def _render(s: dict) -> str:
    def num(v, fmt):
        return "n/a" if v is None else format(v, fmt)

    bubble = "" if s.get("bubble") is None else f"  bubble {s['bubble']:.1%}"
    dp = f" D={s['dp']}" if s.get("dp", 1) > 1 else ""
    return (f"{s['schedule']} P={s['stages']}{dp} M={s['microbatches']} {s['optimizer']} delay {s['delay']} "
            f"(correction {s['correction']}): val_loss {num(s['val_loss'], '.4f')}  train_loss "
            f"{num(s['train_loss'], '.4f')}  steps {s['steps']}  tokens {s['tokens']}  tokens/s "
            f"{num(s['tokens_per_s'], '.0f')}  s/batch {num(s['seconds_per_batch'], '.4f')}{bubble}")


def _show_schedule(cfg) -> int:
    from delaylab.llm.pipeline.schedules import Schedule
    from delaylab.llm.pipeline.cost_model import Costs, predict

    P, M = cfg.parallel.stages, cfg.data.grad_accum
    name = cfg.parallel.schedule.removeprefix("torch-")  # torch's runtime, the same order of actions
    print(Schedule(name, P, M, cfg.run.steps))
    pred = predict(name, P, M, Costs.make(P, 1.0, 2.0))
    print(f"simulated with forward 1, backward 2 per microbatch and stage, free sends: "
          f"{pred['seconds_per_batch']:g} per batch, bubble {pred['bubble']:.1%}")
    return 0


def _rank() -> int:
    import os

    return int(os.environ.get("RANK", "0"))


def cmd_pipeline(args) -> int:
    from delaylab.errors import Preempted
    from delaylab.llm.distributed.launch import as_rank
    from delaylab.llm.distributed.world import check_world, under_launcher
    from delaylab.llm.run.folder import require_folder
    from delaylab.llm.run.rank import run_rank, train_pipeline
    from delaylab.llm.run.setup import check_folder, resolve

    if args.resume:
        reject_changes_on_resume(args, args.resume)
        folder, cfg = Path(args.resume), config_from_args(args, require_folder(args.resume))
    else:
        folder, cfg = (Path(args.out) if args.out else None), config_from_args(args)
    cfg = resolve(cfg, "pipeline")  # bad configuration: exit 2 here, before any process group exists
    if args.show_schedule:
        return _show_schedule(cfg)
    if folder is None:
        raise UsageError("give --out DIR (or --resume DIR)")
    if args.stop_at is not None and args.stop_at < 1:
        raise UsageError(f"--stop-at must be >= 1, got {args.stop_at}")
    if args.resume and finished_already(cfg, folder, args.json, _render,  # under torchrun: the writer rank says so
                                        report=not under_launcher() or _rank() == cfg.parallel.stages - 1):
        return 0
    if under_launcher():
        P, D = cfg.parallel.stages, cfg.parallel.dp
        check_world(P, D)  # P x D ranks, or one line and exit 2
        check_folder(cfg, folder, bool(args.resume), stages=P)
        summary = as_rank(lambda: run_rank(cfg, folder, bool(args.resume), args.stop_at), stages=P, dp=D,
                          passes=(Preempted,))  # every rank stops at the same update: each exits 75
        if summary is not None:  # the last stage reports
            emit(summary, args.json, _render)
        return 0
    summary = train_pipeline(cfg, folder, resume=bool(args.resume), stop_at=args.stop_at)
    emit(summary, args.json, _render)
    return 0


def register(llm_sub) -> None:
    p = llm_sub.add_parser(
        "pipeline", help="train on a real multi-process pipeline: 2bw, 1f1b, gpipe or pipedream",
        description="Train a GPT with one process per pipeline stage (gloo on CPU, NCCL on GPUs): the same "
        "flags as `delaylab llm train`, which simulates the same run in one process; --dp D replicates "
        "every stage D times (P x D processes). Writes config.json, metrics.jsonl, summary.json, "
        "timeline.json/.png, model.pt and ckpt/ under --out. Under torchrun (P x D processes) it runs the "
        "rank it is.",
        epilog=EXIT_CODES,
    )
    add_config_flags(p)
    p.add_argument("--show-schedule", action="store_true",
                   help="print each stage's actions and the simulated bubble, then exit")
    p.add_argument("--out", metavar="DIR", help="run folder (must not hold a run already)")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its newest complete checkpoint")
    p.add_argument("--stop-at", type=int, metavar="K", help="stop after update K with a checkpoint")
    add_json_flag(p)
    p.set_defaults(func=cmd_pipeline)
