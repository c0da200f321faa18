r"""Error feedback at the update level, around one step of any inner optimizer.

With ``u_k`` the inner optimizer's update from the stale gradient and lag ``l``,
``x_{k+1} = x_k - (l+1) u_k + l u_{k-1}`` (``u_{-1} = 0``). Across steps it keeps one
parameter-sized buffer, the last ``u`` (``state[p]["ef_buffer"]``); a snapshot of the
weights before the inner step exists only during :func:`step`.

``dtype`` (default: the parameter's) stores the buffer in a lower precision, e.g. bfloat16:
half the bytes, and the update uses the rounded ``u_{k-1}`` (``u_k`` itself is exact). The
paper lists EF's extra model copy as its memory cost; this halves it.

``ef_lags`` maps ``id(group)`` to the lag of each group that updates with EF on this call;
the other groups are stepped plainly.
"""

from __future__ import annotations

import torch
from torch.optim import Optimizer
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from delaylab.optim.capabilities import leaves, steps_per_parameter


KEYS = ("ef_buffer",)  # what EF holds across steps


def feedback(p: torch.Tensor, u: torch.Tensor, lag: int, st: dict,
             dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """EF for one parameter: ``x <- x_new + lag * (u_prev - u)`` with ``u = x_before - x_new``.

    ``u`` holds ``x_before`` on entry; it becomes the new buffer (a ``dtype`` copy of it when
    ``dtype`` differs). Returns a tensor of ``u``'s shape and dtype whose memory the caller
    may reuse, or None.
    """
    u.sub_(p)
    prev = st.get("ef_buffer")
    if prev is None:  # u_{-1} = 0
        p.sub_(u, alpha=lag)
    elif prev.dtype == u.dtype:
        p.add_(prev.sub_(u), alpha=lag)
    else:  # a low-precision buffer: widen it, then the same update
        p.add_(prev.to(u.dtype).sub_(u), alpha=lag)
    if dtype is None or dtype == u.dtype:
        st["ef_buffer"] = u
        return prev if prev is None or prev.dtype == u.dtype else None
    st["ef_buffer"] = u.to(dtype)
    return u


def can_step_per_parameter(inner: Optimizer, param_groups, ef_lags: dict[int, int]) -> bool:
    """Whether :func:`step_per_parameter` equals :func:`step_whole_model` here.

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
    return all(p.device.type == "cpu" for g in param_groups if id(g) in ef_lags for p in g["params"])


def step_whole_model(inner: Optimizer, param_groups, ef_lags: dict[int, int], state,
                     dtype: torch.dtype | None = None) -> None:
    """Snapshot every EF parameter, one inner step, then the feedback: works for any inner."""
    ef_params = [
        (ef_lags[id(g)], p) for g in param_groups if id(g) in ef_lags
        for p in g["params"] if p.grad is not None
    ]
    before = [p.detach().clone() for _, p in ef_params]
    inner.step()
    for (lag, p), u in zip(ef_params, before):
        feedback(p, u, lag, state[p], dtype)


def step_per_parameter(inner: Optimizer, ef_lags: dict[int, int], state,
                       dtype: torch.dtype | None = None) -> None:
    """The inner step and EF, one parameter at a time; equal to :func:`step_whole_model`.

    The snapshot of ``x_before`` is one parameter, not the model, and lives in the buffer
    the previous parameter of the same shape just freed, so the step allocates almost
    nothing and its four extra passes run on memory that is still in cache.
    """
    spare: dict[tuple, torch.Tensor] = {}
    for leaf in leaves(inner):
        groups = leaf.param_groups
        saved = [g["params"] for g in groups]
        try:
            # Groups without EF first, in one ordinary step.
            for g, params in zip(groups, saved):
                g["params"] = [] if id(g) in ef_lags else params
            if any(g["params"] for g in groups):
                leaf.step()
            for g in groups:
                g["params"] = []
            for g, params in zip(groups, saved):
                if id(g) not in ef_lags:
                    continue
                for p in params:
                    if p.grad is None:
                        continue
                    key = (p.shape, p.dtype)
                    u = spare.pop(key).copy_(p) if key in spare else p.detach().clone()
                    g["params"] = [p]
                    leaf.step()
                    prev = feedback(p, u, ef_lags[id(g)], state[p], dtype)
                    if prev is not None:
                        spare[key] = prev
                g["params"] = []
        finally:
            for g, params in zip(groups, saved):
                g["params"] = params
