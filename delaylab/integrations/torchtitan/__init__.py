"""The gradient delay inside torchtitan 0.3.0 (the ``titan`` extra). See docs/torchtitan.md.

- :class:`DelayedOptimizersContainer`: torchtitan's ``OptimizersContainer`` whose optimizers are
  ``delaylab.optim.Delayed`` wrappers (a delay, or one delay per pipeline stage, any list of correctors,
  the EF buffer's dtype), with their delay queues and corrector buffers in the DCP checkpoint.
- :class:`DelayedLRSchedulersContainer`: the LR schedule indexed by updates, not by calls.
- :func:`pipelining_fn`: torchtitan's ``pipeline_llm``, plus ``Schedule2BW`` / ``SchedulePipeDream``
  when ``--parallelism.pipeline_parallel_schedule`` names them.
- :mod:`~delaylab.integrations.torchtitan.config_registry`: ``--module delaylab.integrations.torchtitan``.

Names are imported on first use, so importing this package does not import torchtitan.
"""

from __future__ import annotations

__all__ = ["DelayedOptimizersContainer", "DelayedLRSchedulersContainer", "pipelining_fn", "STAGE_ATTR"]

_HOME = {"DelayedOptimizersContainer": "optimizer", "DelayedLRSchedulersContainer": "optimizer",
         "STAGE_ATTR": "optimizer", "pipelining_fn": "pipeline"}


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    from delaylab.errors import MissingExtra, install_hint

    try:
        module = importlib.import_module(f"{__name__}.{_HOME[name]}")
    except ModuleNotFoundError as err:
        if err.name and err.name.split(".")[0] in ("torchtitan", "triton"):
            raise MissingExtra(f"{name} needs torchtitan: {install_hint('titan')} ({err.name} is missing)") from None
        raise
    return getattr(module, name)
