"""CombinedOptimizer: several optimizers over disjoint parameters, as one torch Optimizer."""

from __future__ import annotations

import torch
from torch.optim import Optimizer

from delaylab.errors import ConfigError
from delaylab.optim._closure import closure_loss
from delaylab.optim.capabilities import leaves


class CombinedOptimizer(Optimizer):
    """Several optimizers over disjoint parameters, stepped together as one ``Optimizer``.

    ``param_groups`` is the concatenation of the children's own group dicts (so one LR
    scheduler drives all of them); state lives in the children. ``defaults`` holds the keys
    that every child has (values from the first child): schedulers test it for ``momentum``
    or ``betas`` before they cycle them, which works only if every group has that key.
    :meth:`add_param_group` gives the group to the child named by its ``"optimizer"`` key
    (an index), which may be left out when there is one child.
    """

    def __init__(self, optimizers: list[Optimizer]):
        if not optimizers:
            raise ConfigError("CombinedOptimizer needs at least one optimizer")
        self.optimizers = list(optimizers)
        first, *rest = (o.defaults for o in self.optimizers)
        defaults = {k: v for k, v in first.items() if all(k in d for d in rest)}
        super().__init__([g for o in self.optimizers for g in o.param_groups], defaults)
        self._realias()

    def _realias(self) -> None:
        # In place, so that a wrapper sharing this list (Delayed) sees the change too.
        self.param_groups[:] = [g for o in self.optimizers for g in o.param_groups]

    def add_param_group(self, param_group: dict) -> None:
        if any(param_group is g for o in self.optimizers for g in o.param_groups):
            return  # Optimizer.__init__ registering a child's own group: in place already
        index = param_group.pop("optimizer", None)
        if index is None and len(self.optimizers) == 1:
            index = 0
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.optimizers):
            raise ConfigError(
                f"CombinedOptimizer has {len(self.optimizers)} optimizers ({self!r}); name the one "
                f"that takes the new group with the key 'optimizer' (an index), got {index!r}"
            )
        self.optimizers[index].add_param_group(param_group)
        self._realias()

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        for opt in self.optimizers:
            opt.step()
        return loss

    def state_dict(self) -> dict:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict.get("optimizers") if isinstance(state_dict, dict) else None
        if saved is None or len(saved) != len(self.optimizers):
            raise ConfigError("state_dict does not match this CombinedOptimizer's children")
        for opt, sd in zip(self.optimizers, saved):
            opt.load_state_dict(sd)
        self._realias()  # a torch optimizer's load_state_dict replaces its group dicts

    def leaves(self) -> list[Optimizer]:
        """The step is exactly the children's steps (see :mod:`delaylab.optim.capabilities`)."""
        return [leaf for child in self.optimizers for leaf in leaves(child)]

    def children(self) -> list[Optimizer]:
        return list(self.optimizers)

    def __getstate__(self) -> dict:
        return self.__dict__.copy()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return "CombinedOptimizer(" + ", ".join(type(o).__name__ for o in self.optimizers) + ")"
