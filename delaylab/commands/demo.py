"""`delaylab demo`: the main job on built-in data (what `make demo` runs).

Trains the tiny GPT on the built-in Shakespeare corpus with AdamW and Muon, each sync,
one-step delayed and delayed + Error Feedback, and prints the loss-gap table: the paper's
central comparison at a size that finishes in a few minutes on two CPU cores. It is a
resumable `delaylab llm sweep` underneath (rerunning skips finished runs).
"""

from __future__ import annotations

from delaylab.commands._common import add_json_flag, emit, positive_int


def cmd_demo(args) -> int:
    from delaylab.commands.llm import _render_gaps
    from delaylab.llm.sweep import sweep
    from delaylab.llm.config import Config

    # 10 validations per run: enough points for the iso-loss token overhead (the sweep warns below 8)
    base = Config.from_dict(preset="tiny", steps=args.steps, threads=1, eval_every=max(1, args.steps // 10))
    gaps = sweep(base, args.out, args.optimizers, ("sync", "delayed", "ef"), seeds=1, jobs=args.jobs)

    def render(g: dict) -> str:
        return (f"delaylab demo: tiny GPT, {args.steps} updates, Shakespeare, one seed "
                f"(loss = final validation loss; gap = delayed - sync; EF % = share of the gap EF recovers)\n"
                + _render_gaps(g) + f"\nruns and figures under {args.out}")

    emit(gaps, args.json, render)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="train the tiny GPT sync vs delayed vs EF for AdamW and Muon (a few minutes on CPU)",
        description=__doc__.splitlines()[2].strip() if __doc__ else None,
    )
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument("--steps", type=positive_int, default=300, help="updates per run (default 300)")
    p.add_argument("--optimizers", type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
                   default=["adamw", "muon"], help="comma-separated (default adamw,muon)")
    p.add_argument("--jobs", type=positive_int, default=2, help="runs in parallel, one thread each (default 2)")
    add_json_flag(p)
    p.set_defaults(func=cmd_demo)
