"""The inner step with the correctors' ``before`` / ``after`` hooks around each parameter's update.

``plan`` maps ``id(group)`` to ``(update, correctors)`` for the groups whose update some
corrector wraps; the other groups are stepped plainly. Two paths with the same result:

- :func:`whole_model`, for any inner optimizer: every ``before``, one inner step, every ``after``
  (each corrector's group form: EF's is a few ``torch._foreach_*`` launches per group, the path
  taken on an accelerator);
- :func:`per_parameter`: the inner stepped one parameter at a time, each between its own hooks,
  so that a snapshot is one parameter (reusing the memory the previous one of that shape freed,
  :class:`~delaylab.optim.corrector.Spare`) and its extra passes run on memory still in cache.
  Taken when a corrector in the plan asks for it (``Corrector.per_parameter``: EF) and
  :func:`can_step_per_parameter` allows it; bit for bit the whole-model step (tested).
"""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from delaylab.optim.capabilities import leaves, steps_per_parameter
from delaylab.optim.corrector import Spare


def can_step_per_parameter(inner: Optimizer, param_groups, plan: dict) -> bool:
    """Whether :func:`per_parameter` equals :func:`whole_model` here.

    That needs leaf optimizers that declare the capability (see
    :mod:`delaylab.optim.capabilities`), no step hooks (they would fire once per parameter)
    and parameters on the CPU, where the snapshot stays in cache; on an accelerator it would
    split foreach/fused kernels.
    """
    if _global_optimizer_pre_hooks or _global_optimizer_post_hooks:
        return False
    for leaf in leaves(inner):
        if not steps_per_parameter(leaf):
            return False
        if leaf._optimizer_step_pre_hooks or leaf._optimizer_step_post_hooks:
            return False
    return all(p.device.type == "cpu" for g in param_groups if id(g) in plan for p in g["params"])


def whole_model(inner: Optimizer, param_groups, plan: dict, state) -> None:
    """Each corrector's group hooks (``before_all`` / ``after_all``) around one inner step. A
    parameter's correctors still act in the list's order, and each acts on its own parameters
    only, so running them group by group is running them parameter by parameter."""
    spare = Spare(keep=False)
    wrapped = []  # (params, their states, update, correctors, each corrector's tokens)
    for g in param_groups:
        if id(g) in plan:
            update, hooked = plan[id(g)]
            params = [p for p in g["params"] if p.grad is not None]
            states = [state[p] for p in params]
            wrapped.append((params, states, update, hooked, [c.before_all(params, states, update, spare)
                                                             for c in hooked]))
    inner.step()
    for params, states, update, hooked, tokens in wrapped:
        for c, toks in zip(hooked, tokens):
            c.after_all(params, states, update, toks, spare)


def per_parameter(inner: Optimizer, plan: dict, state) -> None:
    spare = Spare()
    for leaf in leaves(inner):
        groups = leaf.param_groups
        saved = [g["params"] for g in groups]
        try:
            # Groups without hooks first, in one ordinary step.
            for g, params in zip(groups, saved):
                g["params"] = [] if id(g) in plan else params
            if any(g["params"] for g in groups):
                leaf.step()
            for g in groups:
                g["params"] = []
            for g, params in zip(groups, saved):
                if id(g) not in plan:
                    continue
                update, hooked = plan[id(g)]
                for p in params:
                    if p.grad is None:
                        continue
                    st = state[p]
                    toks = [c.before(p, st, update, spare) for c in hooked]
                    g["params"] = [p]
                    leaf.step()
                    _after(p, st, update, hooked, toks, spare)
                g["params"] = []
        finally:
            for g, params in zip(groups, saved):
                g["params"] = params


def _after(p, st, update, hooked, toks, spare) -> None:
    for c, tok in zip(hooked, toks):
        c.after(p, st, update, tok, spare)
