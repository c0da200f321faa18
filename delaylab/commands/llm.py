"""`delaylab llm train|sweep|pipeline ...` (train/sweep: the llm issue; pipeline: the pipeline issue)."""

from __future__ import annotations

from delaylab.commands import pipeline


def register(sub) -> None:
    p = sub.add_parser("llm", help="GPT pretraining: sync vs delayed vs mitigations")
    llm_sub = p.add_subparsers(dest="llm_command", metavar="LLM_COMMAND", required=True)
    pipeline.register(llm_sub)
