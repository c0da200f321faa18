"""`delaylab reproduce --preset cpu-small|ci --out DIR`: the paper's findings at small scale vs the theory."""

from __future__ import annotations


from delaylab.commands._common import add_json_flag, emit, positive_int

PRESET_NAMES = ("cpu-small", "ci")  # listed for --help; delaylab.reproduce.presets validates


def register(sub) -> None:
    p = sub.add_parser(
        "reproduce",
        help="run the paper's six findings at small scale and report them against the theory",
        description="Run (or resume) every run of the preset's grid under --out and write report.md, report.json "
                    "and repro_*.png there: optimizer sensitivity, mitigations, momentum, learning rate, "
                    "2BW vs PipeDream delays, toy rates, each with the theory's prediction and a verdict. "
                    "Finished runs are read, not rerun; rerun the same command to resume.",
    )
    p.add_argument("--preset", default="cpu-small",
                   help=f"grid: {', '.join(PRESET_NAMES)} (default cpu-small: under an hour on 2 CPU cores)")
    p.add_argument("--out", required=True, metavar="DIR", help="report folder (rerun to resume)")
    p.add_argument("--jobs", type=positive_int, default=2, help="runs at a time, one thread each (default 2)")
    add_json_flag(p)
    p.set_defaults(func=cmd_reproduce)


def _render(rep: dict) -> str:
    from delaylab.reproduce.report import summary_table

    s = rep["session"]
    lines = [f"delaylab reproduce --preset {rep['preset']}: {s['runs']} runs ({s['computed']} computed, "
             f"{s['read']} read) in {s['seconds'] / 60:.1f} min", ""]
    lines += summary_table(rep)
    lines += ["", f"report: {rep['out']}/report.md (and report.json, repro_*.png)"]
    return "\n".join(lines)


def cmd_reproduce(args) -> int:
    from delaylab.reproduce import get_preset, reproduce

    # A crashed run raises RunFailed (exit 1): its folder keeps what it had; rerunning resumes.
    rep = reproduce(get_preset(args.preset), args.out, jobs=args.jobs)
    result = {"preset": rep["preset"], "out": rep["out"], "report": f"{rep['out']}/report.md",
              "summary": rep["summary"], "session": rep["session"]}
    emit(result if args.json else rep, args.json, _render)
    return 0
