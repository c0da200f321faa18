"""Delayed: make any torch optimizer see stale gradients, exactly as PipeDream-2BW does."""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import torch
from torch.optim import Optimizer
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from delaylab.optim._closure import closure_loss
from delaylab.optim.factory import CombinedOptimizer
from delaylab.optim.lmo_momentum import LMOMomentum

CORRECTIONS = ("none", "ef", "dc-asgd")
# Optimizers whose step on a subset of parameters equals their step on all of them restricted
# to that subset (per-parameter state and step counters; no group-level statistics).
_PER_PARAM_SAFE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Muon, LMOMomentum)


def _leaves(opt: Optimizer) -> list[Optimizer]:
    """The optimizers that ``opt.step()`` steps. Only a CombinedOptimizer is opened: its step is
    exactly its children's steps, whereas a wrapper (a nested ``Delayed``) adds its own logic."""
    if isinstance(opt, CombinedOptimizer):
        return [leaf for child in opt.optimizers for leaf in _leaves(child)]
    return [opt]


def _per_group(value, n: int, name: str) -> list[int]:
    values = [value] * n if isinstance(value, int) else list(value)
    if len(values) != n:
        raise ValueError(f"{name} has {len(values)} entries but the optimizer has {n} param groups")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an integer >= 0 (or a list of them), got {v!r}")
    return values


class Delayed(Optimizer):
    r"""Wrap ``inner`` so that every update uses the gradient of ``delay`` steps ago.

    **Semantics.** Call ``c`` of :meth:`step` finds in ``p.grad`` the gradient of batch ``c``
    at the current weights. In a delayed phase the first ``tau`` calls only fill a queue (no
    update; :attr:`updated` is False); afterwards every call makes one inner update with the
    gradient queued ``tau`` calls earlier. Update ``k`` therefore uses batch ``k`` evaluated at
    the weights of ``max(0, k - tau)`` updates:

    .. math:: x_{k+1} = x_k - u_k(\nabla f(x_{k-\tau}; \xi_k)), \qquad x_{-j} := x_0,

    which is the start-up of a real PipeDream-2BW pipeline: batch b runs on weight version
    V_{b-1} with V_{-1} = V_0, so batches 0 and 1 both see V_0. ``T`` updates take ``T + tau``
    calls; the last ``tau`` queued gradients are never applied. Index learning-rate schedules
    by update (step the scheduler only when :attr:`updated`), never by call.

    ``delay`` may be a list with one ``tau`` per inner param group, to model the original
    PipeDream's stage-dependent delay: each group fills its own queue, so group ``g``'s update
    ``k`` uses batch ``k`` taken where every group ``h`` had made ``max(0, k - tau_h)`` updates.

    **Corrections** (``u`` is the inner optimizer's update from the stale gradient):

    * ``"ef"`` (error feedback, update level): ``x_{k+1} = x_k - (l+1) u_k + l u_{k-1}``, with lag
      ``l = ef_lag`` (default: the group's delay; ``u_{-1} = 0``). For ``l = 1`` this is
      ``x_{t+1} = x_t - 2 u_{t-1}(g_{t-1}) + u_{t-2}(g_{t-2})`` in the paper's indexing. It keeps
      one parameter-sized buffer (the last ``u``) across steps; a second one exists only inside
      :meth:`step`. A pipeline stage, whose gradients are stale already, uses ``delay=0, ef_lag=1``.
    * ``"dc-asgd"`` (Zheng et al. 2017, "Asynchronous SGD with Delay Compensation"):
      ``g <- g + lambda g * g * (x_now - x_stale)``, which keeps a copy of the weights next to
      each queued gradient.

    **Phases.** Updates ``k < sync_start`` and ``k >= total_steps - sync_cooldown`` are
    undelayed. Entering a delayed phase costs a fill of ``tau`` calls (a pipeline restarting
    its warm-up); entering the cooldown drops the queued stale gradients. With ``total_steps``
    set, a group that has made ``total_steps`` updates ignores further calls.

    ``delay=0, correction="none"`` calls ``inner.step()`` and nothing else, so it is the inner
    optimizer bit for bit. ``param_groups`` are the inner's own dicts, so LR schedulers attached
    to the wrapper drive the inner learning rates. After :meth:`step`, ``p.grad`` holds the
    gradient that was applied (the queue swaps tensors instead of copying them), or ``None``
    after a fill call.
    """

    def __init__(
        self,
        inner: Optimizer,
        delay: int | Sequence[int] = 1,
        correction: str = "none",
        *,
        dc_lambda: float = 0.04,
        sync_start: int = 0,
        sync_cooldown: int = 0,
        total_steps: int | None = None,
        ef_lag: int | Sequence[int] | None = None,
    ):
        if not isinstance(inner, Optimizer):
            raise TypeError(f"inner must be a torch.optim.Optimizer, got {type(inner).__name__}")
        n = len(inner.param_groups)
        self.delays = _per_group(delay, n, "delay")
        if correction not in CORRECTIONS:
            raise ValueError(f"unknown correction {correction!r}; expected one of {', '.join(CORRECTIONS)}")
        self.correction = correction
        self.ef_lags = self.delays if ef_lag is None else _per_group(ef_lag, n, "ef_lag")
        if not dc_lambda >= 0:
            raise ValueError(f"dc_lambda must be >= 0, got {dc_lambda}")
        self.dc_lambda = float(dc_lambda)
        for name, v in (("sync_start", sync_start), ("sync_cooldown", sync_cooldown)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if total_steps is not None and (not isinstance(total_steps, int) or total_steps < 1):
            raise ValueError(f"total_steps must be an integer >= 1, got {total_steps!r}")
        if sync_cooldown and total_steps is None:
            raise ValueError("sync_cooldown needs total_steps (the cooldown is the last K of them)")
        self.sync_start, self.sync_cooldown, self.total_steps = sync_start, sync_cooldown, total_steps
        self.inner = inner
        # Registers the inner's group dicts themselves (add_param_group keeps the dict), so
        # schedulers see one set of groups; then share the list too.
        super().__init__(inner.param_groups, {})
        self.param_groups = inner.param_groups
        self._updates = [0] * n
        self._queued = [0] * n
        self.updated = False

    # -- counters ---------------------------------------------------------------------------
    @property
    def num_updates(self) -> int:
        """Updates made by the slowest group (all groups agree unless delays differ)."""
        return min(self._updates)

    @property
    def group_updates(self) -> list[int]:
        return list(self._updates)

    def _delay_phase(self, k: int) -> bool:
        if k < self.sync_start:
            return False
        return not (self.sync_cooldown and k >= self.total_steps - self.sync_cooldown)

    def __repr__(self) -> str:
        delay = self.delays[0] if len(set(self.delays)) == 1 else self.delays
        return f"Delayed({type(self.inner).__name__}, delay={delay}, correction={self.correction!r})"

    # -- the step -----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        plain = not any(self.delays) and not (self.correction == "ef" and any(self.ef_lags))
        if plain and self.total_steps is None:
            self.inner.step()  # plain inner optimizer, bit for bit
            self._updates = [k + 1 for k in self._updates]
            self.updated = True
            return loss

        ef_lags: dict[int, int] = {}  # id(group) -> EF lag, for groups that update with EF now
        any_update = False
        for gi, group in enumerate(self.param_groups):
            k = self._updates[gi]
            if self.total_steps is not None and k >= self.total_steps:
                self._clear_grads(group)
                continue
            delayed = self._delay_phase(k)
            tau = self.delays[gi] if delayed else 0
            if not delayed and self._queued[gi]:
                self._drop_queue(group)
                self._queued[gi] = 0
            if tau:
                self._push(group)
                self._queued[gi] += 1
                if self._queued[gi] <= tau:  # filling: nothing to apply yet
                    continue
                self._pop(group)
                self._queued[gi] -= 1
            self._updates[gi] += 1
            any_update = True
            lag = self.ef_lags[gi] if delayed and self.correction == "ef" else 0
            if lag:
                ef_lags[id(group)] = lag

        self.updated = any_update
        if not any_update:
            return loss
        if not ef_lags:
            self.inner.step()
        elif self._steps_per_param(ef_lags):
            self._ef_step_per_param(ef_lags)
        else:
            ef_params = [
                (ef_lags[id(g)], p) for g in self.param_groups if id(g) in ef_lags
                for p in g["params"] if p.grad is not None
            ]
            before = [p.detach().clone() for _, p in ef_params]
            self.inner.step()
            for (lag, p), u in zip(ef_params, before):
                self._feedback(p, u, lag)
        return loss

    def _push(self, group) -> None:
        dc = self.correction == "dc-asgd"
        for p in group["params"]:
            st = self.state[p]
            st.setdefault("queue", []).append(p.grad)
            if dc:
                st.setdefault("snapshots", []).append(p.detach().clone())
            p.grad = None

    def _pop(self, group) -> None:
        dc = self.correction == "dc-asgd"
        for p in group["params"]:
            st = self.state[p]
            g = st["queue"].pop(0)
            if dc:
                stale = st["snapshots"].pop(0)
                if g is not None and self.dc_lambda:
                    # g(x_now) ~ g(x_stale) + lambda * g * g * (x_now - x_stale)
                    g.addcmul_(g * g, p - stale, value=self.dc_lambda)
            p.grad = g

    def _drop_queue(self, group) -> None:
        for p in group["params"]:
            st = self.state[p]
            st.pop("queue", None)
            st.pop("snapshots", None)

    @staticmethod
    def _clear_grads(group) -> None:
        for p in group["params"]:
            p.grad = None

    def _feedback(self, p: torch.Tensor, u: torch.Tensor, lag: int) -> torch.Tensor | None:
        """EF for one parameter: ``x <- x_new + lag * (u_prev - u)`` with ``u = x_before - x_new``.

        ``u`` holds ``x_before`` on entry and becomes the new buffer; returns the old buffer,
        whose memory the caller may reuse.
        """
        u.sub_(p)
        st = self.state[p]
        prev = st.get("ef_buffer")
        if prev is None:  # u_{-1} = 0
            p.sub_(u, alpha=lag)
        else:
            p.add_(prev.sub_(u), alpha=lag)
        st["ef_buffer"] = u
        return prev

    def _steps_per_param(self, ef_lags) -> bool:
        """Whether EF may step the inner optimizer one parameter at a time.

        That needs a leaf optimizer whose update of a parameter depends on nothing but that
        parameter's gradient and state (the exact torch and delaylab classes below, with no
        step hooks, which would fire per call) and parameters on the CPU, where it keeps the
        snapshot in cache; on an accelerator it would split foreach/fused kernels.
        """
        if _global_optimizer_pre_hooks or _global_optimizer_post_hooks:
            return False
        for leaf in _leaves(self.inner):
            if type(leaf) not in _PER_PARAM_SAFE:
                return False
            if leaf._optimizer_step_pre_hooks or leaf._optimizer_step_post_hooks:
                return False
        return all(
            p.device.type == "cpu" for g in self.param_groups if id(g) in ef_lags for p in g["params"]
        )

    def _ef_step_per_param(self, ef_lags) -> None:
        """The inner step and EF, one parameter at a time; equal to the whole-model path.

        The snapshot of ``x_before`` is one parameter, not the model, and lives in the buffer
        the previous parameter of the same shape just freed, so the step allocates almost
        nothing and its four extra passes run on memory that is still in cache.
        """
        spare: dict[tuple, torch.Tensor] = {}
        for leaf in _leaves(self.inner):
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
                        prev = self._feedback(p, u, ef_lags[id(g)])
                        if prev is not None:
                            spare[key] = prev
                    g["params"] = []
            finally:
                for g, params in zip(groups, saved):
                    g["params"] = params

    # -- state ---------------------------------------------------------------------------------
    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def _config(self) -> dict:
        return {
            "delays": list(self.delays),
            "correction": self.correction,
            "ef_lags": list(self.ef_lags),
            "sync_start": self.sync_start,
            "sync_cooldown": self.sync_cooldown,
            "total_steps": self.total_steps,
        }

    def state_dict(self) -> dict:
        buffers = {}
        for i, p in enumerate(self._params()):
            st = self.state.get(p)
            if st:
                buffers[i] = {key: (list(v) if isinstance(v, list) else v) for key, v in st.items()}
        return {
            "inner": self.inner.state_dict(),
            "delayed": {
                **self._config(),
                "dc_lambda": self.dc_lambda,
                "updates": list(self._updates),
                "queued": list(self._queued),
                "updated": self.updated,
                "buffers": buffers,
            },
        }

    def load_state_dict(self, state_dict: dict) -> None:
        try:
            inner_sd, ours = state_dict["inner"], state_dict["delayed"]
        except (KeyError, TypeError):
            raise ValueError("not a Delayed state_dict (expected keys 'inner' and 'delayed')") from None
        saved = {k: ours[k] for k in self._config()}
        if saved != self._config():
            raise ValueError(f"state_dict was saved with {saved}, but this wrapper has {self._config()}")
        self.inner.load_state_dict(inner_sd)
        self.param_groups = self.inner.param_groups  # load_state_dict replaced the group dicts
        params = self._params()
        self.state = defaultdict(dict)
        for i, st in ours["buffers"].items():
            p = params[int(i)]
            # Keep the saved dtype: torch casts optimizer state to the param dtype on load,
            # which must not happen to fp32 buffers of low-precision params.
            move = lambda t: None if t is None else t.to(device=p.device)  # noqa: E731
            self.state[p] = {
                key: ([move(t) for t in v] if isinstance(v, list) else move(v)) for key, v in st.items()
            }
        self.dc_lambda = ours["dc_lambda"]
        self._updates = list(ours["updates"])
        self._queued = list(ours["queued"])
        self.updated = ours["updated"]

    def children(self) -> list[Optimizer]:
        return [self.inner]

    # Optimizer pickles only defaults/state/param_groups; a wrapper needs all of itself.
    def __getstate__(self) -> dict:
        return self.__dict__.copy()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
