"""`delaylab llm pipeline ...` (filled in by the pipeline issue); registered by commands/llm.py."""

from __future__ import annotations


def register(llm_sub) -> None:
    p = llm_sub.add_parser("pipeline", help="(not yet available)")
    p.set_defaults(func=lambda args: p.error("not implemented yet"))
