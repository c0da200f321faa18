"""Command-line flags generated from :class:`delaylab.llm.config.Config`'s fields.

Each leaf field becomes ``--field-name`` in an argument group named after its section, with the
field's ``help`` metadata and its default from the dataclass (the one place defaults live). The
flags default to ``None`` so that a resume can tell what was given on the command line.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING

from delaylab.commands._common import UsageError
from delaylab.llm.config import SECTIONS, Config, leaf_fields

_TITLES = {"model": "model", "data": "data", "optim": "optimizer", "lr_schedule": "learning-rate schedule",
           "delay": "delay", "parallel": "pipeline", "run": "run"}


def _int_or_list(text: str):
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


def _number(kind):
    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
    parse.__name__ = kind.__name__
    return parse


# The annotation (a string: ``from __future__ import annotations``) decides the parser.
_PARSERS = {"int": _number(int), "float": _number(float), "bool": _bool, "str": str,
            "int | list[int]": _int_or_list, "str | list[str]": str}


def _parser_for(annotation: str):
    base = annotation.replace(" | None", "")
    if base not in _PARSERS:
        raise TypeError(f"no flag parser for a field of type {annotation!r}")
    return _PARSERS[base]


def add_config_flags(parser: argparse.ArgumentParser, exclude: tuple[str, ...] = (),
                     only: tuple[str, ...] | None = None, title: str | None = None) -> None:
    """Add a flag for every config field not in ``exclude`` (and in ``only``, if given); ``title``
    puts them in one argument group instead of one per section."""
    groups = {sec: parser.add_argument_group(title or _TITLES[sec]) for sec in SECTIONS} if title is None else \
        dict.fromkeys(SECTIONS, parser.add_argument_group(title))
    for name, (sec, f) in leaf_fields().items():
        if name in exclude or only is not None and name not in only:
            continue
        meta = f.metadata
        default = f.default if f.default is not MISSING else f.default_factory()
        help_text = meta["help"] + ("" if default is None else f" (default {default})")
        kw = {"dest": name, "default": None, "help": help_text}
        if "choices" in meta:  # shown here, checked by the config (one error path)
            kw["metavar"] = "{" + ",".join(meta["choices"]) + "}"
        if "nargs" in meta:
            kw["nargs"] = meta["nargs"]
            kw["metavar"] = "PATH"
        if f.type.replace(" | None", "") == "bool":
            kw["metavar"] = "BOOL"
        kw["type"] = _parser_for(f.type)
        flags = ["--" + name.replace("_", "-"), *meta.get("aliases", ())]
        groups[sec].add_argument(*flags, **kw)


def given_fields(args: argparse.Namespace, only: tuple[str, ...] | None = None) -> dict:
    """``{field: value}`` of the config flags that were given (of ``only``, where the command
    added only those: its other options may share a field's name)."""
    given = {}
    for name in (leaf_fields() if only is None else only):
        val = getattr(args, name, None)
        if val is not None:
            given[name] = val[0] if name == "data" and len(val) == 1 else val
    return given


def config_from_args(args: argparse.Namespace, base: dict | None = None) -> Config:
    """The config of ``base`` (a saved ``config.json``, or nothing) with the flags that were given."""
    return Config.from_dict(base, **given_fields(args))


def reject_changes_on_resume(args: argparse.Namespace, folder) -> None:
    """``--resume DIR`` continues the run in its own folder."""
    from pathlib import Path

    if getattr(args, "out", None) and Path(args.out).resolve() != Path(folder).resolve():
        raise UsageError("--resume continues the run in its own folder; drop --out")
