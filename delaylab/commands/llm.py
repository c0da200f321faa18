"""`delaylab llm train|sweep|pipeline ...` (train/sweep: the llm issue; pipeline: the pipeline issue)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from delaylab.commands import pipeline
from delaylab.commands._common import UsageError, add_json_flag, csv_list, emit

# Names are listed for --help only; the library validates them (one-line errors).
PRESETS = "tiny, small, 135m, 360m"
OPTIMIZERS = "adamw, muon, lion, soap, adan, mars, sgd, lmo"


def _delay(text: str):
    try:
        vals = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or a comma-separated list, got {text!r}") from None
    if not vals:
        raise argparse.ArgumentTypeError("expected an integer")
    return vals[0] if len(vals) == 1 else vals


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _add_train_flags(p: argparse.ArgumentParser, sweep: bool) -> None:
    """TrainConfig fields as flags. Defaults are None so a resume can tell what was given."""
    m = p.add_argument_group("model and data")
    m.add_argument("--preset", help=f"model size: {PRESETS} (default tiny)")
    m.add_argument("--n-layer", type=int, help="transformer blocks (default: the preset's)")
    m.add_argument("--mlp", help="gelu or swiglu (default: the preset's)")
    m.add_argument("--tie-embeddings", type=_bool, metavar="BOOL", help="share embedding and lm_head weights")
    m.add_argument("--dropout", type=float)
    m.add_argument("--data", nargs="+", metavar="PATH",
                   help="shakespeare (built in, default) or .txt/.md/.jsonl/.parquet files or folders")
    m.add_argument("--tokenizer", help="byte (default) or bpe (trained locally on the training documents)")
    m.add_argument("--vocab-size", type=int, help="BPE vocabulary size (default 4096)")
    m.add_argument("--text-field", help="JSONL field / parquet column holding the text (default text)")
    m.add_argument("--batch-size", type=int, help="sequences per (micro)batch (default 32)")
    m.add_argument("--block-size", type=int, help="context length (default: the preset's)")
    m.add_argument("--grad-accum", type=int, help="microbatches per step (default 1)")
    o = p.add_argument_group("optimizer and schedule")
    if not sweep:
        o.add_argument("--optimizer", help=f"{OPTIMIZERS} (default adamw)")
        o.add_argument("--lr", type=float, help="peak learning rate (default: the optimizer's)")
        o.add_argument("--momentum", type=float, help="the optimizer's momentum knob (AdamW beta1, Muon momentum, ...)")
    o.add_argument("--weight-decay", type=float)
    o.add_argument("--schedule", help="cosine (default), wsd or constant, after a linear warmup")
    o.add_argument("--warmup", type=int, help="warmup updates (default 5%% of steps)")
    o.add_argument("--min-lr-ratio", type=float, help="final lr / peak lr (default 0.1)")
    o.add_argument("--wsd-decay", type=float, help="WSD: fraction of steps in the decay (default 0.2)")
    d = p.add_argument_group("delay")
    if not sweep:
        d.add_argument("--mode", help="sync (default) or delayed")
        d.add_argument("--correction", help="none (default), ef or dc-asgd")
    d.add_argument("--delay", type=_delay, metavar="TAU[,TAU...]",
                   help="gradient delay (default 1, PipeDream-2BW); a list gives one tau per pipeline stage, "
                        "e.g. 3,2,1,0 for PipeDream on 4 stages")
    d.add_argument("--dc-lambda", type=float, help="DC-ASGD's lambda (default 0.04)")
    d.add_argument("--sync-start", type=int, help="first K updates undelayed")
    d.add_argument("--sync-cooldown", type=int, help="last K updates undelayed")
    r = p.add_argument_group("run")
    r.add_argument("--steps", type=int, help="optimizer updates (default 200)")
    if not sweep:
        r.add_argument("--seed", type=int, help="init and batch order (default 0)")
    r.add_argument("--eval-every", type=int, help="updates between validations (default 50)")
    r.add_argument("--eval-batches", type=int, help="fixed validation batches (default 16)")
    r.add_argument("--log-every", type=int, help="updates between metrics.jsonl lines (default 10)")
    r.add_argument("--ckpt-every", type=int, help="updates between checkpoints (default 100; 0: only at the end)")
    r.add_argument("--device", help="auto (default: CUDA when present), cpu, cuda, cuda:1, ...")
    r.add_argument("--threads", type=int, help="torch CPU threads")


def _config(args, base: dict | None = None):
    """A TrainConfig from ``base`` (a saved config) and the flags that were given."""
    from dataclasses import fields

    from delaylab.llm.train import TrainConfig

    given = {}
    for f in fields(TrainConfig):
        val = getattr(args, f.name, None)
        if val is not None:
            given[f.name] = val[0] if f.name == "data" and len(val) == 1 else val
    return TrainConfig.from_dict({**(base or {}), **given})


def _render_summary(s: dict) -> str:
    def num(v, fmt):
        return "n/a" if v is None else format(v, fmt)

    return (f"{s['optimizer']} {s['mode']} (correction {s['correction']}): val_loss {num(s['val_loss'], '.4f')}"
            f"  train_loss {num(s['train_loss'], '.4f')}  steps {s['steps']}  tokens {s['tokens']}"
            f"  tokens/s {num(s['tokens_per_s'], '.0f')}")


def cmd_train(args) -> int:
    from delaylab.llm.train import Diverged, train

    if args.resume:
        folder = Path(args.resume)
        if args.out and Path(args.out).resolve() != folder.resolve():
            raise UsageError("--resume continues the run in its own folder; drop --out")
        saved = folder / "config.json"
        if not saved.is_file():
            raise FileNotFoundError(f"no run to resume in {folder} (config.json missing)")
        cfg = _config(args, json.loads(saved.read_text()))
    elif args.out:
        folder, cfg = Path(args.out), _config(args)
    else:
        raise UsageError("give --out DIR (or --resume DIR)")
    if args.stop_at is not None and args.stop_at < 1:
        raise UsageError(f"--stop-at must be >= 1, got {args.stop_at}")
    try:
        summary = train(cfg, folder, resume=bool(args.resume), stop_at=args.stop_at)
    except Diverged as err:
        print(f"delaylab: diverged: {err}", file=sys.stderr)
        return 1
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


def _render_gaps(g: dict) -> str:
    def f(v, fmt=".4f"):
        return "   n/a" if v is None else format(v, fmt)

    lines = [f"{'optimizer':<9} {'lr':>8} {'mom':>5}  {'sync':>7} {'delayed':>8} {'gap':>7} {'±':>6}"
             f" {'ef':>7} {'EF %':>6}"]
    for row in g["grid"]:
        gap = row.get("gap", {})
        lines.append(
            f"{row['optimizer']:<9} {row['lr']:>8g} {'' if row['momentum'] is None else row['momentum']:>5}"
            f"  {f(row.get('sync', {}).get('mean'))} {f(row.get('delayed', {}).get('mean')):>8}"
            f" {f(gap.get('mean'), '+.4f'):>7} {f(gap.get('std'), '.3f'):>6}"
            f" {f(row.get('ef', {}).get('mean')):>7} {f(row.get('ef_recovered_pct', {}).get('of_mean_gap'), '.0f'):>6}")
    best = ", ".join(f"{k} lr {v['lr']:g}" for k, v in g["best"].items())
    lines.append(f"best sync lr: {best}; figures: {', '.join(g['figures']) or 'none'}")
    return "\n".join(lines)


def cmd_sweep(args) -> int:
    from delaylab.llm.sweep import sweep

    if not args.out:
        raise UsageError("give --out DIR")
    if args.seeds < 1 or args.jobs < 1:
        raise UsageError("--seeds and --jobs must be >= 1")
    lrs = _per_optimizer(args.lrs, "--lrs", 0.0)
    momenta = _per_optimizer(args.momenta, "--momentum", 0.0, 1.0)
    gaps = sweep(_config(args), args.out, args.optimizers, args.modes, lrs, momenta, args.seeds, jobs=args.jobs)
    emit(gaps, args.json, _render_gaps)
    return 0


def register(sub) -> None:
    p = sub.add_parser("llm", help="GPT pretraining: sync vs delayed vs mitigations")
    llm_sub = p.add_subparsers(dest="llm_command", metavar="LLM_COMMAND", required=True)

    t = llm_sub.add_parser(
        "train", help="train a GPT: sync, delayed (any tau), EF / DC-ASGD, sync start/cooldown",
        description="Train a GPT with the exact one-step-delay simulator. Writes config.json, "
        "metrics.jsonl, summary.json and ckpt.pt under --out.",
    )
    _add_train_flags(t, sweep=False)
    t.add_argument("--out", metavar="DIR", help="run folder (must not hold a run already)")
    t.add_argument("--resume", metavar="DIR", help="continue the run in DIR bit-exactly")
    t.add_argument("--stop-at", type=int, metavar="K", help="stop after update K with a checkpoint")
    add_json_flag(t)
    t.set_defaults(func=cmd_train)

    s = llm_sub.add_parser(
        "sweep", help="grid of runs and the delayed-minus-sync gap (gaps.json, PNG figures)",
        description="Run optimizers x modes x lrs x momenta x seeds (resumable: finished cells are "
        "not rerun) and write gaps.json and figures under --out.",
    )
    s.add_argument("--optimizers", type=csv_list(str), default=["adamw", "muon"], help="default adamw,muon")
    s.add_argument("--modes", type=csv_list(str), default=["sync", "delayed", "ef"],
                   help="of sync, delayed, ef, dc-asgd (default sync,delayed,ef)")
    s.add_argument("--lrs", action="append", metavar="[NAME=]LR,...",
                   help="peak lrs for every optimizer, or per optimizer (repeat the flag)")
    s.add_argument("--momentum", dest="momenta", action="append", metavar="[NAME=]M,...",
                   help="momentum grid for every optimizer, or per optimizer (repeat the flag); "
                        "default: each optimizer's own")
    s.add_argument("--seeds", type=int, default=1, help="seeds 0..N-1 (default 1)")
    s.add_argument("--jobs", type=int, default=1, help="runs in parallel, one thread each (default 1)")
    _add_train_flags(s, sweep=True)
    s.add_argument("--out", metavar="DIR", help="sweep folder (rerun to resume)")
    add_json_flag(s)
    s.set_defaults(func=cmd_sweep)

    pipeline.register(llm_sub)
