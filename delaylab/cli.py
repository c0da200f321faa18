"""`delaylab theory|toy|llm|reproduce|predict|demo ...`: the command line.

Each area registers its subcommands from ``delaylab.commands.<area>``. Library code reports
bad input and failed runs as a :class:`delaylab.errors.DelaylabError`; here, and only here, that
becomes one line on stderr and the error's exit code (2 for bad input). Set ``DELAYLAB_DEBUG=1``
to see the traceback instead.
"""

from __future__ import annotations

import argparse
import os
import sys

from delaylab import __version__
from delaylab.commands import demo, llm, predict, reproduce, theory, toy
from delaylab.commands._common import OneLineParser
from delaylab.errors import DelaylabError


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="delaylab",
        description="Theory and experiments for training under a one-step gradient delay "
        "(PipeDream-2BW): bounds, toy rate checks, GPT runs and a real 2BW pipeline.",
    )
    parser.add_argument("--version", action="version", version=f"delaylab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for area in (theory, toy, llm, reproduce, predict, demo):
        area.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return exit_code_of(lambda: args.func(args))


def exit_code_of(run) -> int:
    """Call ``run()``; a :class:`DelaylabError` becomes one line on stderr and its exit code."""
    try:
        return int(run() or 0)
    except DelaylabError as err:
        if os.environ.get("DELAYLAB_DEBUG"):
            raise
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"delaylab: {err.label}: {msg}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("delaylab: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
