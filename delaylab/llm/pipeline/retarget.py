"""retarget: point a stage's optimizer at the weight-version slot that holds the current weights."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.optim import Optimizer
from delaylab.errors import ConfigError


def retarget(optimizer: Optimizer, new_params: list[torch.Tensor]) -> None:
    """Point ``optimizer`` (and every optimizer inside it) at ``new_params``, keeping all state.

    ``new_params`` replaces the optimizer's parameters in order (group by group). Per-parameter
    state is re-keyed at every level (a :class:`Delayed` wrapper, a :class:`CombinedOptimizer`,
    the torch optimizers inside: each optimizer's ``children()``, where it has that method), so a pipeline stage can step whichever weight-version slot
    holds the current weights.
    """
    old = [p for g in optimizer.param_groups for p in g["params"]]
    if len(old) != len(new_params):
        raise ConfigError(f"optimizer has {len(old)} params, got {len(new_params)}")
    for a, b in zip(old, new_params):
        if a.shape != b.shape:
            raise ConfigError(f"shape mismatch in retarget: {tuple(a.shape)} vs {tuple(b.shape)}")
    mapping = {id(a): b for a, b in zip(old, new_params)}

    def visit(opt: Optimizer) -> None:
        children = opt.children() if hasattr(opt, "children") else []
        for child in children:
            visit(child)
        for group in opt.param_groups:  # group dicts may be shared between levels: map by id
            group["params"] = [mapping.get(id(p), p) for p in group["params"]]
        moved = defaultdict(dict)
        for p, st in opt.state.items():
            moved[mapping.get(id(p), p)] = st
        opt.state = moved

    visit(optimizer)
