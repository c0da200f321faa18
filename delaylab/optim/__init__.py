"""The optimizer core shared by toy and llm.

- :mod:`delaylab.optim.lmo`: LMO maps and (dual) norms (spectral, sign, l2).
- :class:`LMOMomentum`: momentum + LMO, the method the theory analyses.
- :class:`Delayed`: stale gradients for any torch optimizer (tau, per-group tau, EF, DC-ASGD,
  sync start / cooldown), with PipeDream-2BW's start-up convention.
- :func:`build_optimizer`: the paper's optimizers by name; :func:`retarget` for weight slots.
"""

from delaylab.optim.delayed import CORRECTIONS, Delayed
from delaylab.optim.factory import DEFAULTS, OPTIMIZERS, CombinedOptimizer, build_optimizer, retarget
from delaylab.optim.lmo import NORMS, dual_norm, lmo, newton_schulz, primal_norm
from delaylab.optim.lmo_momentum import LMOMomentum

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
    "retarget",
]
