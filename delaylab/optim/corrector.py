r"""The protocol every delay corrector implements: hooks at fixed points of ``Delayed.step``.

A corrector is a small object that holds its own configuration (its hyperparameters, and what
it derives from the param groups' delays); what it keeps per parameter across steps lives in
the wrapper's ``state[p]`` (under its :attr:`Corrector.keys`), so that it is saved, loaded and
re-targeted with the optimizer. Every hook here is a no-op: a corrector overrides the ones it
needs. In the order :class:`~delaylab.optim.delayed.Delayed` calls them on one call:

1. the gradient point (:meth:`~Corrector.weight_shift`): inside ``predicted_weights()``, the
   forward/backward runs at ``x - alpha t`` (weight prediction, look-ahead);
2. the queue (:meth:`~Corrector.on_push`, :meth:`~Corrector.on_pop`,
   :meth:`~Corrector.on_drop`): something kept beside each queued gradient, and the popped
   gradient corrected (DC-ASGD); under a delay distribution, :meth:`~Corrector.discards`: a
   gradient too stale is not applied (the staleness threshold);
3. the lr (:meth:`~Corrector.scale_lr`): the lr the inner step runs with (damping);
4. around the inner step, per parameter (:meth:`~Corrector.wraps`, :meth:`~Corrector.before`,
   :meth:`~Corrector.after`, or their group forms :meth:`~Corrector.before_all`,
   :meth:`~Corrector.after_all`): error feedback's feedback, prediction's record of ``u_last``.

Within one hook point the correctors run in the registry's order
(:mod:`delaylab.optim.corrections`).
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import torch


class Update(NamedTuple):
    """A param group's update, as the hooks see it."""

    group: int  # the param group's index
    tau: int  # the group's delay
    delayed: bool  # made in a delayed phase (False in a sync start / cooldown)
    param_group: dict | None = None  # the group's dict (its lr and momentum), where the wrapper gives it


class Corrector:
    name: ClassVar[str] = ""  # its registry name
    keys: ClassVar[tuple[str, ...]] = ()  # what it keeps in ``state[p]`` across steps
    # The config's field name -> this class's constructor parameter: how the run config makes the
    # corrector (``Config.correctors``), and the deprecated ``delayed.with_keywords`` adapter.
    keywords: ClassVar[dict[str, str]] = {}
    group_options: ClassVar[tuple[str, ...]] = ()  # keywords it reads in ``add_param_group``
    # Whether its before/after hooks are worth stepping the inner one parameter at a time for
    # (a snapshot that stays in cache, against one more inner call per parameter).
    per_parameter: ClassVar[bool] = False

    def hyper(self) -> dict:
        """Its configuration, saved in the state_dict (a load must find the same)."""
        return {}

    def bind(self, delays: list[int]) -> None:
        """Called once by the wrapper, with the delay of each param group."""

    def add_group(self, tau: int, **options) -> None:
        """A param group with delay ``tau`` joined the wrapper."""

    # 1. the gradient point
    def weight_shift(self, st: dict, update: Update, ahead: int) -> tuple[torch.Tensor, float] | None:
        """``(t, alpha)``: the next forward/backward runs at ``x - alpha t``; ``update`` is the
        group's next update, ``ahead`` the updates its gradient will wait for."""
        return None

    # 2. the queue (under a delay distribution, where nothing is queued: whether a gradient is used)
    def discards(self, update: Update) -> bool:
        """Whether the gradient of this call is discarded: no update is made with it (a staleness
        threshold). Called only under a delay distribution, with the call's delay as ``tau``."""
        return False

    def on_push(self, p: torch.Tensor, st: dict) -> None:
        """``p.grad`` is about to be queued."""

    def on_pop(self, p: torch.Tensor, st: dict, g: torch.Tensor | None) -> torch.Tensor | None:
        """The queued gradient ``g`` is about to be applied: the gradient to apply instead."""
        return g

    def on_drop(self, st: dict) -> None:
        """The queue was dropped (a sync phase begins)."""

    # 3. the lr
    def scale_lr(self, lr, update: Update):
        """The lr the inner step uses for this update (restored afterwards)."""
        return lr

    # 4. around the inner step
    def wraps(self, update: Update) -> bool:
        """Whether :meth:`before` / :meth:`after` act on this update's parameters."""
        return False

    def before(self, p: torch.Tensor, st: dict, update: Update, spare: Spare) -> Any:
        """Before the inner step changes ``p``; what it returns comes back to :meth:`after`."""

    def after(self, p: torch.Tensor, st: dict, update: Update, token: Any, spare: Spare) -> None:
        """After the inner step (and the earlier correctors' :meth:`after`) changed ``p``."""

    # The same two hooks over a param group's parameters at once (the whole-model step): by default
    # one call per parameter; a corrector may do them with torch._foreach_* (a few kernel launches
    # for the group instead of a few per parameter), with the per-parameter result bit for bit.
    def before_all(self, params: list[torch.Tensor], states: list[dict], update: Update, spare: Spare) -> list:
        return [self.before(p, st, update, spare) for p, st in zip(params, states)]

    def after_all(self, params: list[torch.Tensor], states: list[dict], update: Update, tokens: list,
                  spare: Spare) -> None:
        for p, st, tok in zip(params, states, tokens):
            self.after(p, st, update, tok, spare)


def overrides(corrector: Corrector, *hooks: str) -> bool:
    """Whether ``corrector`` overrides any of ``hooks`` (the wrapper calls only those)."""
    return any(getattr(type(corrector), h) is not getattr(Corrector, h) for h in hooks)


class Spare:
    """Parameter-sized buffers freed during one step, reused for the next copy of that shape: on
    the per-parameter path a snapshot then costs no allocation and stays in cache. ``keep=False``
    (the whole-model path, whose copies are all made before anything is freed) keeps nothing."""

    def __init__(self, keep: bool = True):
        self.keep = keep
        self._free: dict[tuple, torch.Tensor] = {}

    def copy_of(self, p: torch.Tensor) -> torch.Tensor:
        t = self._free.pop((p.shape, p.dtype, p.device), None)
        return p.detach().clone() if t is None else t.copy_(p)

    def give(self, t: torch.Tensor) -> None:
        if self.keep:
            self._free[(t.shape, t.dtype, t.device)] = t
