"""`delaylab llm pipeline ...`: train a GPT on a real multi-process pipeline (registered by commands/llm.py).

Spawns one rank per stage through torch's elastic launcher, or, when started by torchrun
(``torchrun --nproc-per-node P -m delaylab llm pipeline --stages P ...``), runs the rank it is.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from delaylab.commands._common import (
    UsageError, add_json_flag, emit, nonneg_int, positive_float, positive_int,
)

SCHEDULE_HELP = ("2bw (PipeDream-2BW: no flush, one-step delay), 1f1b or gpipe (flush every batch), "
                 "pipedream (weight stashing, delay P-1-s on stage s), torch-1f1b or torch-gpipe "
                 "(torch.distributed.pipelining's runtime on the same stages, the baseline)")
SCHEDULE_CHOICES = ["2bw", "1f1b", "gpipe", "pipedream", "torch-1f1b", "torch-gpipe"]


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _config(args, base: dict | None = None):
    """A PipelineConfig from ``base`` (a saved config) and the flags that were given."""
    from dataclasses import fields

    from delaylab.llm.pipeline.engine import PipelineConfig

    given = {}
    for f in fields(PipelineConfig):
        val = getattr(args, f.name, None)
        if val is not None:
            given[f.name] = val[0] if f.name == "data" and len(val) == 1 else val
    merged = {**(base or {}), **given}
    if "microbatches" not in merged:
        stages = merged.get("stages", 2)
        merged["microbatches"] = 1 if merged.get("pipeline", "2bw") == "pipedream" else max(4, stages - 1)
    return PipelineConfig.from_dict(merged)


def _render(s: dict) -> str:
    def num(v, fmt):
        return "n/a" if v is None else format(v, fmt)

    bubble = "" if s.get("bubble") is None else f"  bubble {s['bubble']:.1%}"
    return (f"{s['schedule']} P={s['stages']} M={s['microbatches']} {s['optimizer']} {s['mode']} "
            f"(correction {s['correction']}): val_loss {num(s['val_loss'], '.4f')}  train_loss "
            f"{num(s['train_loss'], '.4f')}  steps {s['steps']}  tokens {s['tokens']}  tokens/s "
            f"{num(s['tokens_per_s'], '.0f')}  s/batch {num(s['seconds_per_batch'], '.4f')}{bubble}")


def _show_schedule(cfg) -> int:
    from delaylab.llm.pipeline.schedules import Schedule
    from delaylab.llm.pipeline.simulator import Costs, predict

    name = cfg.pipeline.removeprefix("torch-")  # torch's runtime, the same order of actions
    print(Schedule(name, cfg.stages, cfg.microbatches, cfg.steps))
    costs = Costs.make(cfg.stages, 1.0, 2.0)
    pred = predict(name, cfg.stages, cfg.microbatches, costs)
    print(f"simulated with forward 1, backward 2 per microbatch and stage, free sends: "
          f"{pred['seconds_per_batch']:g} per batch, bubble {pred['bubble']:.1%}")
    return 0


def cmd_pipeline(args) -> int:
    from delaylab.llm.pipeline.engine import run_rank
    from delaylab.llm.pipeline.launch import PipelineFailed, check_folder, train_pipeline

    if args.resume:
        folder = Path(args.resume)
        if args.out and Path(args.out).resolve() != folder.resolve():
            raise UsageError("--resume continues the run in its own folder; drop --out")
        saved = folder / "config.json"
        if not saved.is_file():
            raise FileNotFoundError(f"no run to resume in {folder} (config.json missing)")
        cfg = _config(args, json.loads(saved.read_text()))
    else:
        cfg = _config(args)
        folder = Path(args.out) if args.out else None
    cfg.validate()  # bad configuration: exit 2 here, before any process group exists
    if args.show_schedule:
        return _show_schedule(cfg)
    if folder is None:
        raise UsageError("give --out DIR (or --resume DIR)")
    if args.stop_at is not None and args.stop_at < 1:
        raise UsageError(f"--stop-at must be >= 1, got {args.stop_at}")
    if _under_torchrun():
        check_folder(cfg, folder, bool(args.resume))
        summary = run_rank(cfg, folder, bool(args.resume), args.stop_at)
        if summary is not None:  # the last stage reports
            emit(summary, args.json, _render)
        return 0
    try:
        summary = train_pipeline(cfg, folder, resume=bool(args.resume), stop_at=args.stop_at)
    except PipelineFailed as err:
        print(f"delaylab: error: {err}", file=sys.stderr)
        return 1
    emit(summary, args.json, _render)
    return 0


def register(llm_sub) -> None:
    p = llm_sub.add_parser(
        "pipeline", help="train on a real multi-process pipeline: 2bw, 1f1b, gpipe or pipedream",
        description="Train a GPT with one process per pipeline stage (gloo on CPU, NCCL on GPUs). "
        "Writes config.json, metrics.jsonl, summary.json, timeline.json/.png, model.pt and "
        "ckpt/ under --out. Under torchrun (one process per stage) it runs the rank it is.",
    )
    g = p.add_argument_group("pipeline")
    g.add_argument("--stages", type=positive_int, help="pipeline stages = processes (default 2)")
    g.add_argument("--schedule", dest="pipeline", choices=SCHEDULE_CHOICES,
                   metavar="NAME", help=SCHEDULE_HELP + " (default 2bw)")
    g.add_argument("--microbatches", type=positive_int,
                   help="microbatches per update, M (default max(4, P-1); 1 for pipedream; 2bw needs M >= P-1)")
    g.add_argument("--timeout", type=positive_float, help="seconds a message may take before the run fails (default 60)")
    g.add_argument("--show-schedule", action="store_true",
                   help="print each stage's actions and the simulated bubble, then exit")
    m = p.add_argument_group("model and data")
    m.add_argument("--preset", help="model size: tiny, small, 135m, 360m (default tiny; embeddings untied)")
    m.add_argument("--mlp", help="gelu or swiglu (default: the preset's)")
    m.add_argument("--dropout", type=float)
    m.add_argument("--data", nargs="+", metavar="PATH",
                   help="shakespeare (built in, default) or .txt/.md/.jsonl/.parquet files or folders")
    m.add_argument("--tokenizer", help="byte (default) or bpe")
    m.add_argument("--vocab-size", type=positive_int, help="BPE vocabulary size (default 4096)")
    m.add_argument("--text-field", help="JSONL field / parquet column holding the text (default text)")
    m.add_argument("--batch-size", type=positive_int, help="sequences per microbatch (default 32)")
    m.add_argument("--block-size", type=positive_int, help="context length (default: the preset's)")
    o = p.add_argument_group("optimizer and schedule")
    o.add_argument("--optimizer", help="adamw (default), muon, lion, soap, adan, mars, sgd, lmo")
    o.add_argument("--lr", type=positive_float, help="peak learning rate (default: the optimizer's)")
    o.add_argument("--momentum", type=float, help="the optimizer's momentum knob")
    o.add_argument("--weight-decay", type=float)
    o.add_argument("--lr-schedule", dest="schedule", help="cosine (default), wsd or constant, after a linear warmup")
    o.add_argument("--warmup", type=nonneg_int, help="warmup updates (default 5%% of steps)")
    o.add_argument("--min-lr-ratio", type=float, help="final lr / peak lr (default 0.1)")
    o.add_argument("--wsd-decay", type=float, help="WSD: fraction of steps in the decay (default 0.2)")
    o.add_argument("--correction", help="none (default) or ef (error feedback, per stage; delayed schedules)")
    r = p.add_argument_group("run")
    r.add_argument("--steps", type=positive_int, help="optimizer updates of every stage (default 200)")
    r.add_argument("--seed", type=nonneg_int, help="init and batch order (default 0)")
    r.add_argument("--eval-batches", type=positive_int, help="validation batches at the end (default 16)")
    r.add_argument("--log-every", type=positive_int, help="updates between metrics.jsonl lines (default 10)")
    r.add_argument("--ckpt-every", type=nonneg_int, help="updates between checkpoints (default 100; 0: only at the end)")
    r.add_argument("--device", help="auto (default: one GPU per rank when present) or cpu")
    r.add_argument("--threads", type=positive_int, help="torch threads per rank (default 1)")
    r.add_argument("--out", metavar="DIR", help="run folder (must not hold a run already)")
    r.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its newest complete checkpoint")
    r.add_argument("--stop-at", type=int, metavar="K", help="stop after update K with a checkpoint")
    add_json_flag(p)
    p.set_defaults(func=cmd_pipeline)
