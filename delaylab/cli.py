"""`delaylab theory|toy|llm|reproduce|demo ...`: the command line.

Each area registers its subcommands from ``delaylab.commands.<area>``. Library code reports
bad input as ``ValueError`` (or ``FileNotFoundError``); here that becomes a one-line error on
stderr and exit code 2. Set ``DELAYLAB_DEBUG=1`` to see the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys

from delaylab import __version__
from delaylab.commands import demo, llm, reproduce, theory, toy
from delaylab.commands._common import OneLineParser, UsageError


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="delaylab",
        description="Theory and experiments for training under a one-step gradient delay "
        "(PipeDream-2BW): bounds, toy rate checks, GPT runs and a real 2BW pipeline.",
    )
    parser.add_argument("--version", action="version", version=f"delaylab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for area in (theory, toy, llm, reproduce, demo):
        area.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (UsageError, ValueError, FileNotFoundError, ImportError) as err:
        if os.environ.get("DELAYLAB_DEBUG"):
            raise
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"delaylab: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("delaylab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
