"""`delaylab reproduce ...` (filled in by the reproduce issue)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("reproduce", help="(not yet available)")
    p.set_defaults(func=lambda args: p.error("not implemented yet"))
