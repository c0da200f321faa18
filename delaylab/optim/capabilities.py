"""What a wrapper may ask of an optimizer without knowing its class.

- **Leaves.** A container whose ``step()`` is exactly its children's steps
  (:class:`~delaylab.optim.CombinedOptimizer`) has a ``leaves()`` method that returns those
  optimizers, flattened. Anything else is its own leaf: a wrapper such as ``Delayed`` adds
  logic around its inner's step, so it must not be opened.
- **Steps per parameter.** Stepping the optimizer on a subset of its parameters gives the
  whole step restricted to that subset (per-parameter state and step counters, no statistics
  shared across parameters). Our classes declare it with the class attribute
  ``steps_per_parameter = True``; classes we do not own are recorded with
  :func:`register_per_parameter`. Both hold for the exact class only: a subclass may change
  ``step``, so it has to declare it again.
"""

from __future__ import annotations

import torch
from torch.optim import Optimizer

_PER_PARAMETER: set[type] = set()


def register_per_parameter(cls: type) -> type:
    """Record that ``cls`` (exactly, not its subclasses) steps one parameter at a time."""
    if not (isinstance(cls, type) and issubclass(cls, Optimizer)):
        raise TypeError(f"expected a torch.optim.Optimizer subclass, got {cls!r}")
    _PER_PARAMETER.add(cls)
    return cls


def steps_per_parameter(opt: Optimizer) -> bool:
    cls = type(opt)
    return cls in _PER_PARAMETER or vars(cls).get("steps_per_parameter", False) is True


def leaves(opt: Optimizer) -> list[Optimizer]:
    """The optimizers whose steps make up ``opt.step()``: ``opt.leaves()``, else ``[opt]``."""
    opener = getattr(opt, "leaves", None)
    return list(opener()) if callable(opener) else [opt]


# torch's single-tensor and foreach kernels keep all state per parameter (step counts too).
for _cls in (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Muon):
    register_per_parameter(_cls)
