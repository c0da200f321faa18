"""`delaylab demo`: the main job on built-in data (what `make demo` runs)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("demo", help="run the main comparison on built-in data")
    p.add_argument("--out", default="runs/demo", help="output directory")
    p.set_defaults(func=lambda args: p.error("not implemented yet"))
