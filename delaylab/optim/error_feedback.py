r"""Error feedback at the update level, around one step of any inner optimizer.

With ``u_k`` the inner optimizer's update from the stale gradient and lag ``l``,
``x_{k+1} = x_k - (l+1) u_k + l u_{k-1}`` (``u_{-1} = 0``). Across steps it keeps one
parameter-sized buffer, the last ``u`` (``state[p]["ef_buffer"]``); a snapshot of the
weights before the inner step exists only during the step.

``dtype`` (default: the parameter's) stores the buffer in a lower precision, e.g. bfloat16:
half the bytes, and the update uses the rounded ``u_{k-1}`` (``u_k`` itself is exact). The
paper lists EF's extra model copy as its memory cost; this halves it.

``lag`` (default: each group's delay) is how stale the gradients are: a pipeline stage, whose
gradients arrive stale, runs EF at delay 0 with its lag. It acts on updates in a delayed phase.
Under a delay distribution the default lag is the distribution's mean, constant over the run
(possibly not an integer): only a constant lag keeps ``x_k = w_k - l u_{k-1}``, ``w`` the
undelayed sequence (docs/correctors.md, "Variable delays").
With damping, ``u_k`` is the update the inner makes at the damped lr.
"""

from __future__ import annotations

from typing import Sequence

import torch

from delaylab.errors import ConfigError
from delaylab.optim.corrector import Corrector, Spare, Update
from delaylab.optim.queue import check_count, common, per_group

DTYPES = {None: None, "float32": None, "bfloat16": torch.bfloat16}  # float32: the params' own


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


def feedback_all(ps: list[torch.Tensor], us: list[torch.Tensor], lag: int, states: list[dict],
                 dtype: torch.dtype | None = None) -> None:
    """:func:`feedback` for a list of parameters with ``torch._foreach_*``: the same operations in
    the same order on every element, so the same bits (a few kernel launches on a GPU where the
    per-parameter loop makes a few per parameter)."""
    torch._foreach_sub_(us, ps)
    first, same, low = [], [], []  # indices by the kind of buffer held: none, the params' dtype, lower
    for i, (u, st) in enumerate(zip(us, states)):
        prev = st.get("ef_buffer")
        (first if prev is None else same if prev.dtype == u.dtype else low).append(i)
    if first:  # u_{-1} = 0
        torch._foreach_sub_([ps[i] for i in first], [us[i] for i in first], alpha=lag)
    if same:
        prevs = [states[i]["ef_buffer"] for i in same]
        torch._foreach_sub_(prevs, [us[i] for i in same])
        torch._foreach_add_([ps[i] for i in same], prevs, alpha=lag)
    if low:  # widen the low-precision buffers, then the same update
        wide = [torch.empty_like(us[i]) for i in low]
        torch._foreach_copy_(wide, [states[i]["ef_buffer"] for i in low])
        torch._foreach_sub_(wide, [us[i] for i in low])
        torch._foreach_add_([ps[i] for i in low], wide, alpha=lag)
    for i, (u, st) in enumerate(zip(us, states)):
        if dtype is None or dtype == u.dtype:
            st["ef_buffer"] = u
    if dtype is not None:
        keep = [i for i, u in enumerate(us) if u.dtype != dtype]
        # the rounded copy goes into the old low-precision buffer where there is one (copy_ rounds as .to does)
        bufs = [states[i]["ef_buffer"] if i in low else torch.empty_like(us[i], dtype=dtype) for i in keep]
        torch._foreach_copy_(bufs, [us[i] for i in keep])
        for i, buf in zip(keep, bufs):
            states[i]["ef_buffer"] = buf


class ErrorFeedback(Corrector):
    name = "ef"
    keys = ("ef_buffer",)
    keywords = {"ef_dtype": "dtype", "ef_lag": "lag"}
    group_options = ("ef_lag",)
    per_parameter = True  # measured: README "Speed"

    def __init__(self, dtype: str | None = None, lag: int | Sequence[int] | None = None):
        if dtype not in DTYPES:
            raise ConfigError(f"ef_dtype must be float32 or bfloat16, got {dtype!r}")
        self.dtype = dtype or "float32"
        self.lag = lag  # None: each group's delay
        self.lags: list[int] = []

    def hyper(self) -> dict:
        return {"dtype": self.dtype, "lags": list(self.lags)}

    def bind(self, delays: list[int]) -> None:
        self.lags = list(delays) if self.lag is None else per_group(self.lag, len(delays), "ef_lag")

    def add_group(self, tau: int, ef_lag: int | None = None) -> None:
        """The group's lag is ``ef_lag``, by default what the others use (their delay, unless
        ``lag`` was given)."""
        if ef_lag is None:
            ef_lag = tau if self.lag is None else common(self.lags, "ef_lag")
        # a real lag only from a delay distribution's mean (Delayed binds it); given ones are integers
        self.lags.append(ef_lag if isinstance(ef_lag, float) and ef_lag >= 0 else check_count("ef_lag", ef_lag))

    def wraps(self, update: Update) -> bool:
        return update.delayed and self.lags[update.group] > 0

    def before(self, p, st, update, spare: Spare) -> torch.Tensor:
        return spare.copy_of(p)

    def after(self, p, st, update, x_before, spare: Spare) -> None:
        free = feedback(p, x_before, self.lags[update.group], st, DTYPES[self.dtype])
        if free is not None:
            spare.give(free)

    # FSDP2's DTensor shards keep the per-parameter hooks (DTensor ops, DTensor buffers in the checkpoint).
    def before_all(self, params, states, update, spare: Spare) -> list:
        if any(hasattr(p, "_local_tensor") for p in params):
            return super().before_all(params, states, update, spare)
        snapshots = [torch.empty_like(p) for p in params]
        torch._foreach_copy_(snapshots, [p.detach() for p in params])
        return snapshots

    def after_all(self, params, states, update, snapshots, spare: Spare) -> None:
        if any(hasattr(p, "_local_tensor") for p in params):
            return super().after_all(params, states, update, snapshots, spare)
        feedback_all([p.detach() for p in params], snapshots, self.lags[update.group], states, DTYPES[self.dtype])
