"""`delaylab theory ...` (filled in by the theory issue)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("theory", help="(not yet available)")
    p.set_defaults(func=lambda args: p.error("not implemented yet"))
