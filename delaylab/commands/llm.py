"""`delaylab llm ...` (filled in by the llm issue)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("llm", help="(not yet available)")
    p.set_defaults(func=lambda args: p.error("not implemented yet"))
