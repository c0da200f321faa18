"""`delaylab predict score|gap|pilot`: the delay gap before paying for it (docs/predict.md)."""

from __future__ import annotations

from delaylab.commands._common import add_json_flag, emit, positive_int


def register(sub) -> None:
    p = sub.add_parser("predict", help="predict the delay gap of a run before paying for it, and score the predictors")
    ps = p.add_subparsers(dest="predict_command", metavar="PREDICT_COMMAND", required=True)

    s = ps.add_parser("score", help="score every gap predictor on the committed reports' cells, held out",
                      description="Score every predictor and baseline on every delayed cell of the committed reports "
                                  "(leave one report / optimizer / tau out) and write docs/predict/score.json, "
                                  "docs/predict.md, the figure and the fitted models the other commands use.")
    s.add_argument("--root", default="docs", help="the docs folder (reproduce/, beyond/, nqm/ under it; default docs)")
    s.add_argument("--out", default="docs/predict", help="where score.json and the figure go (default docs/predict)")
    s.add_argument("--md", default="docs/predict.md", help="the page (default docs/predict.md)")
    s.add_argument("--fresh", metavar="DIR", help="a runs.jsonl folder of fresh cells to score once "
                                                  "(python -m delaylab.predict.fresh); default docs/predict/fresh if there")
    s.add_argument("--fresh2", metavar="DIR", help="the second fresh grid's runs.jsonl folder "
                                                   "(python -m delaylab.predict.fresh --grid fresh-2); "
                                                   "default docs/predict/fresh-2 if there")
    add_json_flag(s)
    s.set_defaults(func=cmd_score)

    g = ps.add_parser("gap", help="the end gap a delay would cost a finished sync run (sync-only predictor)",
                      description="Predict the final val loss gap (delayed - sync) of running the sync run in --sync "
                                  "with --delay, from that run alone, with its 95% interval and the held-out score "
                                  "that backs it.")
    g.add_argument("--sync", required=True, metavar="RUN_DIR", help="a finished sync run of `delaylab llm train`")
    g.add_argument("--delay", default="1", help="the delay: an integer, or one per pipeline stage (3,2,1,0)")
    g.add_argument("--correction", default="none", help="none, ef, predict, ef+predict, dc-asgd, dc-asgd-a")
    add_json_flag(g)
    g.set_defaults(func=cmd_gap)

    q = ps.add_parser("pilot", help="the end gap from a sync and a delayed pilot (the first 10%% of the updates)",
                      description="Predict the end gap of an --steps update run from pilots of its sync and delayed "
                                  "runs (the same config with the full schedule, stopped early: `llm train --steps N "
                                  "--stop-at K`), with its 95% interval and the held-out score that backs it.")
    q.add_argument("--sync", required=True, metavar="RUN_DIR", help="the sync pilot")
    q.add_argument("--delayed", required=True, metavar="RUN_DIR", help="the delayed pilot (same config, delay >= 1)")
    q.add_argument("--steps", required=True, type=positive_int, metavar="N", help="the updates of the full run")
    add_json_flag(q)
    q.set_defaults(func=cmd_pilot)


def _render_score(r: dict) -> str:
    s = r["summary"]
    sc = s["scores"]["report"]
    lines = [f"{s['cells']} cells, leave one report out: sync-only {s['sync_only']}, pilot {s['pilot']}", ""]
    for name, v in sc.items():
        lines.append(f"  {name:44s} within x2 {v['within_x2']:3d}  inside {v['inside']:3d}  "
                     f"Spearman {'n/a' if v['spearman'] is None else format(v['spearman'], '.2f')}")
    return "\n".join(lines)


def cmd_score(args) -> int:
    from pathlib import Path

    from delaylab.predict import publish

    def folder(given, name):
        return given or (Path(args.out) / name if (Path(args.out) / name / "runs.jsonl").is_file() else None)

    fresh, fresh2 = folder(args.fresh, "fresh"), folder(args.fresh2, "fresh-2")
    result = publish.score(args.root, args.out, args.md, fresh_dir=fresh, fresh2_dir=fresh2,
                           progress=None if args.json else (lambda what: print(f"scored: {what}", flush=True)))
    s = result["summary"]
    brief = {"cells": s["cells"], "sync_only": s["sync_only"], "pilot": s["pilot"],
             "pilot_fraction": s["pilot_fraction"], "scores": {name: {k: v[k] for k in ("kind", "within_x2", "inside",
                                                                                       "sign", "spearman")}
                                                              for name, v in s["scores"]["report"].items()},
             "written": [f"{args.out}/score.json", args.md, f"{args.out}/predicted_vs_measured.png"]}
    emit(brief, args.json, lambda b: _render_score(result))
    return 0


def _answer(r: dict) -> str:
    h = r["held_out"]
    lo, hi = r["interval"]
    return (f"predicted end gap {r['gap']:+.3f} (95% interval [{lo:+.3f}, {hi:+.3f}]) by {r['predictor']}; "
            f"within x2 on {100 * h['share_within_x2']:.0f}% of held-out cells ({h['within_x2']} of {h['cells']}, "
            f"{h['fold']})")


def cmd_gap(args) -> int:
    from delaylab.predict import apply

    emit(apply.gap(args.sync, args.delay, args.correction), args.json, _answer)
    return 0


def cmd_pilot(args) -> int:
    from delaylab.predict import apply

    emit(apply.pilot(args.sync, args.delayed, args.steps), args.json, _answer)
    return 0


def add_pilot_flags(t) -> None:
    """``llm train --predict-at F --predict-sync DIR``: stop this delayed run after F of its updates (a pilot)
    and print the pilot predictor's end gap against the sync pilot in DIR (the same config, delay 0)."""
    t.add_argument("--predict-at", type=float, metavar="F",
                   help="stop after this fraction of the updates (a pilot; the predictor reads the validations in "
                        "the first 10%%) and print the predicted end gap against --predict-sync (`delaylab predict pilot`)")
    t.add_argument("--predict-sync", metavar="DIR", help="with --predict-at: the sync pilot of the same config")


def with_pilot(train):
    """``train`` (the ``llm train`` command), which with ``--predict-at`` stops a pilot there and then prints
    :func:`delaylab.predict.apply.pilot` of it against ``--predict-sync`` instead of the run's summary."""
    def run(args) -> int:
        import math

        from delaylab.commands._common import UsageError
        from delaylab.commands._config_flags import config_from_args

        if getattr(args, "predict_at", None) is None:
            if getattr(args, "predict_sync", None):
                raise UsageError("--predict-sync needs --predict-at")
            return train(args)
        if not 0 < args.predict_at < 1:
            raise UsageError(f"--predict-at must be in (0, 1), got {args.predict_at}")
        if args.stop_at is not None or args.resume:
            raise UsageError("--predict-at stops the run itself: drop --stop-at and --resume")
        if not args.predict_sync or not args.out:
            raise UsageError("--predict-at needs --predict-sync DIR (the sync pilot) and --out DIR")
        steps = config_from_args(args).run.steps
        args.stop_at = max(1, math.floor(args.predict_at * steps))
        from delaylab.predict import apply

        apply.read_run(args.predict_sync)  # a bad sync pilot fails before the run, not after it
        as_json = args.json
        args.json = True  # the run's summary is not printed: the prediction is
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            code = train(args)
        if code:
            return code
        emit(apply.pilot(args.predict_sync, args.out, steps), as_json, _answer)
        return 0

    return run
