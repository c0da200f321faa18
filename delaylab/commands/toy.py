"""`delaylab toy ...` (filled in by the toy issue)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("toy", help="(not yet available)")
    p.set_defaults(func=lambda args: p.error("not implemented yet"))
