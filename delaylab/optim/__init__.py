"""The optimizer core shared by toy and llm, as small pieces that compose.

- :mod:`delaylab.optim.lmo`: LMO maps and (dual) norms (spectral, sign, l2).
- :class:`LMOMomentum` (:mod:`~delaylab.optim.lmo_momentum`): momentum + LMO, the method the
  theory analyses.
- :class:`CombinedOptimizer` (:mod:`~delaylab.optim.combined`): several optimizers over disjoint
  parameters as one.
- :func:`build_optimizer` (:mod:`~delaylab.optim.registry`): the paper's optimizers by name, and
  :class:`RotatedAdam` (:mod:`~delaylab.optim.rotated_adam`, basis rotation: Adam in the eigenbasis of
  the gradient's Kronecker factors).
- :class:`Delayed` (:mod:`~delaylab.optim.delayed`): stale gradients for any torch optimizer, with
  PipeDream-2BW's start-up convention. It composes
  :class:`~delaylab.optim.queue.DelayQueue` (tau, per-group tau, sync start / cooldown), or a
  :class:`~delaylab.optim.queue.DelayDistribution` (a delay per update: a list cycled, uniform), and any
  list of correctors, each a :class:`~delaylab.optim.corrector.Corrector` in its own module:
  :mod:`~delaylab.optim.error_feedback` (EF, its buffer optionally bf16),
  :mod:`~delaylab.optim.dc_asgd` (DC-ASGD, DC-ASGD-a), :mod:`~delaylab.optim.prediction`
  (weight prediction, Nesterov-style look-ahead) and :mod:`~delaylab.optim.damping` (lr damping),
  named in the registry :mod:`~delaylab.optim.corrections`.
- :mod:`delaylab.optim.capabilities`: what a wrapper may ask of an optimizer without knowing
  its class (``leaves()``, whether it steps one parameter at a time).

Re-targeting an optimizer at another weight slot belongs to the pipeline
(:mod:`delaylab.llm.pipeline.retarget`). This package imports nothing from toy or llm. Its
names load on first use, so that the correctors' registry (``delaylab.optim.corrections``)
can be read without importing torch (the config and the command line do); the LMO map itself
is ``delaylab.optim.lmo.lmo`` (``delaylab.optim.lmo`` is its module).
"""

import importlib

_WHERE = {
    "register_per_parameter": "capabilities", "CombinedOptimizer": "combined", "CORRECTIONS": "corrections",
    "Delayed": "delayed", "DelayDistribution": "queue", "NORMS": "lmo", "dual_norm": "lmo", "newton_schulz": "lmo",
    "primal_norm": "lmo", "LMOMomentum": "lmo_momentum", "DEFAULTS": "registry", "OPTIMIZERS": "registry",
    "build_optimizer": "registry", "RotatedAdam": "rotated_adam",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'delaylab.optim' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"delaylab.optim.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
