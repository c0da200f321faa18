"""Helpers shared by every command: JSON output, run directories, argument checks."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable


class UsageError(ValueError):
    """Bad input from the user: reported as one line on stderr, exit code 2."""


def jsonable(obj: Any) -> Any:
    """Plain-JSON version of ``obj``: numpy/torch scalars become numbers, non-finite floats null.

    JSON has no NaN or infinity; ``null`` is the honest encoding of "no finite value".
    """
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy / torch
        return jsonable(obj.tolist())
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    try:
        val = float(obj)
    except (TypeError, ValueError):
        return str(obj)
    return val if math.isfinite(val) else None


def dumps(obj: Any, **kw) -> str:
    return json.dumps(jsonable(obj), allow_nan=False, **kw)


def emit(result: dict, as_json: bool, render: Callable[[dict], str] | None = None) -> None:
    """Print ``result``: exactly one JSON object with ``--json``, else ``render(result)``."""
    if as_json:
        sys.stdout.write(dumps(result) + "\n")
    else:
        sys.stdout.write((render(result) if render else dumps(result, indent=2)) + "\n")
    sys.stdout.flush()


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON atomically (temp file + rename) so a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


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


def one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Report bad arguments of ``parser`` in one line on stderr (no usage block), exit code 2."""

    def error(message: str):
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    parser.error = error
