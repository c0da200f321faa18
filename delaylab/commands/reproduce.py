"""`delaylab reproduce --preset cpu-small|ci --out DIR`: the paper's findings at small scale vs the theory."""

from __future__ import annotations


from dataclasses import replace

from delaylab.commands._common import add_json_flag, emit, positive_int
from delaylab.commands._config_flags import add_config_flags, given_fields
from delaylab.reproduce.presets import PRESETS

# Config fields a user may set for every GPT run of a report; the rest are what the findings vary.
RUN_OVERRIDES = ("data", "tokenizer", "vocab_size", "text_field", "val_fraction", "device", "log")


def register(sub) -> None:
    p = sub.add_parser(
        "reproduce",
        help="run the paper's six findings at small scale and report them against the theory",
        description="Run (or resume) every run of the preset's grid under --out and write report.md, report.json "
                    "and repro_*.png there: optimizer sensitivity, mitigations, momentum, learning rate, "
                    "2BW vs PipeDream delays, toy rates, each with the theory's prediction and a verdict. "
                    "Finished runs are read, not rerun; rerun the same command to resume. SIGTERM, SIGUSR1 or "
                    "Ctrl-C stop the running runs at a checkpoint and exit 75.",
    )
    p.add_argument("--preset", default="cpu-small",
                   help=f"grid: {', '.join(PRESETS)} (default cpu-small: the full protocol; cpu-quick: AdamW vs Muon "
                        "on the small GPT; cpu-tokens: the tokens-per-parameter axis; cpu-tokens-2: the same axis with tokens, "
                        "updates and the lr's decay moved one at a time; cpu-delays: the delay axis; each within 90 "
                        "min on 2 CPU cores; cpu-field: the field's claims side by side, about 25 min; ci, "
                        "ci-delays, ci-tokens, ci-field: seconds)")
    p.add_argument("action", nargs="?", choices=["claims"],
                   help="claims: list every reading of data that README.md and docs/ state, with its interval, "
                        "claimed region and verdict (from the committed reports; --render rewrites the pages' "
                        "rendered readings, --check fails where a page differs from its rendering)")
    p.add_argument("--out", metavar="DIR", help="report folder (rerun to resume); required unless 'claims'")
    p.add_argument("--render", action="store_true", help="with 'claims': rewrite every page's rendered readings")
    p.add_argument("--check", action="store_true",
                   help="with 'claims': exit 1 where a page differs from its rendering (nothing is written)")
    p.add_argument("--jobs", type=positive_int, default=2, help="runs at a time, one thread each (default 2)")
    p.add_argument("--rescore", action="store_true",
                   help="re-score the report already in --out (report.json, runs.jsonl) under this version's verdict "
                        "rule and rewrite report.json/report.md; runs no run (every result is read from runs.jsonl); "
                        "prints every verdict whose state changed")
    add_config_flags(p, only=RUN_OVERRIDES, title="every GPT run of the report (the config's fields)")
    add_json_flag(p)
    p.set_defaults(func=cmd_reproduce)


def _render(rep: dict) -> str:
    from delaylab.reproduce.markdown import summary_table

    s = rep["session"]
    lines = [f"delaylab reproduce --preset {rep['preset']}: {s['runs']} runs ({s['computed']} computed, "
             f"{s['read']} read) in {s['seconds'] / 60:.1f} min", ""]
    lines += summary_table(rep)
    lines += ["", f"report: {rep['out']}/report.md (and report.json, repro_*.png)"]
    return "\n".join(lines)


def _render_changes(result: dict) -> str:
    from delaylab.reproduce.rescore import changes_table

    if not result["changes"]:
        return f"{result['report']}: no verdict changed"
    return "\n".join([f"{result['report']}: {len(result['changes'])} verdicts changed", "",
                      *changes_table(result["changes"])])


def _render_claims(result: dict) -> str:
    lines = [f"{len(result['claims'])} claims: " + ", ".join(f"{v} {k}" for k, v in result["counts"].items())]
    for c in result["claims"]:
        lines.append(f"[{c['verdict']}] {c['id']}: {c['text']}")
    if result.get("pages"):
        lines += ["", "pages " + ("rewritten" if result["rendered"] else "that differ from their rendering") + ": "
                  + ", ".join(result["pages"])]
    return "\n".join(lines)


def cmd_claims(args) -> int:
    from delaylab.reproduce import claims as C

    root = C.repository_root()
    found = C.claims(root)
    changed = C.render_pages(root, found, write=args.render) if (args.render or args.check) else []
    counts = {v: sum(c.verdict == v for c in found) for v in C.WORD}
    emit({"claims": [c.json() for c in found], "counts": counts, "pages": changed, "rendered": args.render},
         args.json, _render_claims)
    return 1 if args.check and changed else 0


def cmd_reproduce(args) -> int:
    from pathlib import Path

    from delaylab.errors import ConfigError
    from delaylab.reproduce import get_preset, reproduce

    if args.action == "claims":
        return cmd_claims(args)
    if args.render or args.check:
        raise ConfigError("--render and --check go with 'delaylab reproduce claims'")
    if not args.out:
        raise ConfigError("delaylab reproduce: --out DIR is required (or 'delaylab reproduce claims')")
    if args.rescore:
        from delaylab.reproduce.rescore import rescore_folder

        if not (Path(args.out) / "report.json").is_file():
            raise ConfigError(f"--rescore: {args.out}/report.json not found (run the report first)")
        changes = rescore_folder(Path(args.out))
        emit({"report": f"{args.out}/report.md", "changes": changes}, args.json, _render_changes)
        return 0
    preset = get_preset(args.preset)
    given = given_fields(args, RUN_OVERRIDES)
    if given:  # the same data / device for every GPT run: the grids themselves stay the preset's
        if preset.llm is not None:
            preset = replace(preset, llm=replace(preset.llm, base={**preset.llm.base, **given}))
        if preset.scale is not None:
            preset = replace(preset, scale=replace(preset.scale, base={**preset.scale.base, **given}))
        if preset.delays is not None:
            preset = replace(preset, delays=replace(preset.delays, base={**preset.delays.base, **given}))
        if preset.tokens is not None:
            preset = replace(preset, tokens=replace(preset.tokens, base={**preset.tokens.base, **given}))
    # A crashed run raises RunFailed (exit 1): its folder keeps what it had; rerunning resumes.
    rep = reproduce(preset, args.out, jobs=args.jobs)
    result = {"preset": rep["preset"], "out": rep["out"], "report": f"{rep['out']}/report.md",
              "summary": rep["summary"], "session": rep["session"]}
    emit(result if args.json else rep, args.json, _render)
    return 0
