"""Helpers shared by every command: JSON output, run directories, argument checks."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Callable

from delaylab._io import dumps, jsonable, write_json  # noqa: F401  (re-exported for commands)
from delaylab.errors import ConfigError


# The exit codes of a training command (`llm train`, `llm pipeline`), shown in their --help.
EXIT_CODES = (
    "exit codes: 0 finished (or stopped at --stop-at); 1 the run failed (a diverged loss, a failed rank, a write "
    "that failed once the run had started), its last good checkpoint kept; 2 bad input, found before anything ran "
    "or was written; 75 preempted: SIGTERM, SIGUSR1 or SIGINT stopped it after the updates in flight with a "
    "checkpoint on every rank, and --resume DIR continues exactly; 128+N: a second signal N, a second or more after "
    "the first, stopped it at once, the last good checkpoint kept."
)


class UsageError(ConfigError):
    """Bad command-line input: reported as one line on stderr, exit code 2."""


def emit(result: dict, as_json: bool, render: Callable[[dict], str] | None = None) -> None:
    """Print ``result``: exactly one JSON object with ``--json``, else ``render(result)``."""
    if as_json:
        sys.stdout.write(dumps(result) + "\n")
    else:
        sys.stdout.write((render(result) if render else dumps(result, indent=2)) + "\n")
    sys.stdout.flush()


def finished_already(cfg, folder, as_json: bool, render: Callable[[dict], str], report: bool = True) -> bool:
    """``--resume`` of a run that already finished: one line on stderr and its summary (``--json``: the
    JSON object), before any process starts; True where that was the case (``report``: this process
    prints; under torchrun only the rank that reports does)."""
    from delaylab.llm.run.folder import TrainFolder

    done = TrainFolder(cfg, folder).finished_run()
    if done is None:
        return False
    if report:
        print(f"delaylab: {folder} holds a finished run ({done['steps']} of {cfg.run.steps} updates): nothing to "
              f"resume", file=sys.stderr, flush=True)
        emit(done, as_json, render)
    return True


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print exactly one JSON object on stdout")


def positive_float(text: str) -> float:
    try:
        val = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (val > 0 and math.isfinite(val)):
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return val


def nonneg_int(text: str) -> int:
    try:
        val = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if val < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {val}")
    return val


def positive_int(text: str) -> int:
    val = nonneg_int(text)
    if val < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {val}")
    return val


def unit_interval(text: str) -> float:
    """A momentum-like value in [0, 1)."""
    try:
        val = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 <= val < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return val


def csv_list(kind: Callable[[str], Any]) -> Callable[[str], list]:
    """argparse type for comma-separated lists, each item checked by ``kind``."""

    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        return [kind(t) for t in items]

    return parse


class OneLineParser(argparse.ArgumentParser):
    """argparse errors as one line on stderr (no usage block), exit code 2, like any bad input.

    ``add_subparsers`` builds subparsers of the parent's class, so setting it on the top-level
    parser covers every subcommand.
    """

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")
