"""The optimizer core shared by toy and llm, as small pieces that compose.

- :mod:`delaylab.optim.lmo`: LMO maps and (dual) norms (spectral, sign, l2).
- :class:`LMOMomentum` (:mod:`~delaylab.optim.lmo_momentum`): momentum + LMO, the method the
  theory analyses.
- :class:`CombinedOptimizer` (:mod:`~delaylab.optim.combined`): several optimizers over disjoint
  parameters as one.
- :func:`build_optimizer` (:mod:`~delaylab.optim.registry`): the paper's optimizers by name.
- :class:`Delayed` (:mod:`~delaylab.optim.delayed`): stale gradients for any torch optimizer, with
  PipeDream-2BW's start-up convention. It composes
  :class:`~delaylab.optim.queue.DelayQueue` (tau, per-group tau, sync start / cooldown),
  :mod:`~delaylab.optim.error_feedback` (EF, its buffer optionally bf16),
  :mod:`~delaylab.optim.dc_asgd` (DC-ASGD, DC-ASGD-a), :mod:`~delaylab.optim.prediction`
  (weight prediction, Nesterov-style look-ahead) and :mod:`~delaylab.optim.damping` (lr damping).
- :mod:`delaylab.optim.capabilities`: what a wrapper may ask of an optimizer without knowing
  its class (``leaves()``, whether it steps one parameter at a time).

Re-targeting an optimizer at another weight slot belongs to the pipeline
(:mod:`delaylab.llm.pipeline.retarget`). This package imports nothing from toy or llm.
"""

from delaylab.optim.capabilities import register_per_parameter
from delaylab.optim.combined import CombinedOptimizer
from delaylab.optim.delayed import CORRECTIONS, Delayed
from delaylab.optim.lmo import NORMS, dual_norm, lmo, newton_schulz, primal_norm
from delaylab.optim.lmo_momentum import LMOMomentum
from delaylab.optim.registry import DEFAULTS, OPTIMIZERS, build_optimizer

__all__ = [
    "CORRECTIONS",
    "DEFAULTS",
    "NORMS",
    "OPTIMIZERS",
    "CombinedOptimizer",
    "Delayed",
    "LMOMomentum",
    "build_optimizer",
    "dual_norm",
    "lmo",
    "newton_schulz",
    "primal_norm",
    "register_per_parameter",
]
