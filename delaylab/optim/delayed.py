"""Delayed: make any torch optimizer see stale gradients, exactly as PipeDream-2BW does."""

from __future__ import annotations

from collections import defaultdict
from contextlib import ExitStack, contextmanager
from typing import Sequence

import torch
from torch.optim import Optimizer

from delaylab.errors import ConfigError
from delaylab.optim import error_feedback
from delaylab.optim._closure import closure_loss
from delaylab.optim.damping import LrDamping
from delaylab.optim.dc_asgd import DCASGD, DCASGDAdaptive
from delaylab.optim.prediction import Extrapolation
from delaylab.optim.queue import DelayQueue, check_count, per_group

CORRECTIONS = ("none", "ef", "dc-asgd", "dc-asgd-a", "predict", "lookahead", "damp")
# What each correction keeps in a parameter's state across steps.
HELD = {"none": (), "ef": error_feedback.KEYS, "dc-asgd": DCASGD.keys, "dc-asgd-a": DCASGDAdaptive.keys,
        "predict": Extrapolation.keys, "lookahead": Extrapolation.keys, "damp": LrDamping.keys}
EF_DTYPES = {None: None, "float32": None, "bfloat16": torch.bfloat16}  # float32: the params' own


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
      ``ef_dtype="bfloat16"`` keeps that buffer in bf16 (half its bytes; the update then uses
      the rounded ``u_{k-1}``).
    * ``"dc-asgd"`` (Zheng et al. 2017, "Asynchronous SGD with Delay Compensation"):
      ``g <- g + lambda g * g * (x_now - x_stale)``, which keeps a copy of the weights next to
      each queued gradient. ``"dc-asgd-a"``, its adaptive form: ``lambda`` becomes
      ``dc_lambda0 / sqrt(s + 1e-7)`` with ``s`` an EMA (factor ``dc_ms_decay``) of ``g * g``.
    * ``"predict"`` (weight prediction, SpecTrain): the gradient is taken at
      ``x - a u_last``, ``u_last`` the last applied update and ``a`` the updates the gradient
      will wait for (``tau`` once the queue is full); ``"lookahead"`` (Nesterov-style, after
      Ajanthan et al. 2025): at ``x - gamma u_last``, ``gamma = lookahead_momentum``. The caller
      runs its forward/backward inside :meth:`predicted_weights`.
    * ``"damp"``: a delayed update uses ``lr / (1 + damping * tau)``.

    Each lives in its own module (:mod:`~delaylab.optim.dc_asgd`,
    :mod:`~delaylab.optim.prediction`, :mod:`~delaylab.optim.damping`) with its formula;
    :meth:`corrector_bytes` counts what the correction holds across steps.

    **Phases.** Updates ``k < sync_start`` and ``k >= total_steps - sync_cooldown`` are
    undelayed. Entering a delayed phase costs a fill of ``tau`` calls (a pipeline restarting
    its warm-up); entering the cooldown drops the queued stale gradients. With ``total_steps``
    set, a group that has made ``total_steps`` updates ignores further calls.

    **Pieces.** The wrapper composes a :class:`~delaylab.optim.queue.DelayQueue` (counters,
    phases, the queued gradients), :mod:`~delaylab.optim.error_feedback` and
    :class:`~delaylab.optim.dc_asgd.DCASGD`; it knows no concrete inner class. EF steps the
    inner one parameter at a time when every leaf declares that capability
    (:mod:`delaylab.optim.capabilities`), and the whole model at once otherwise.

    ``delay=0, correction="none"`` calls ``inner.step()`` and nothing else, so it is the inner
    optimizer bit for bit. ``param_groups`` and ``defaults`` are the inner's own, so LR schedulers
    attached to the wrapper drive the inner learning rates; :meth:`add_param_group` adds to the
    inner and gives the group its own queue. After :meth:`step`, ``p.grad`` holds the
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
        dc_lambda0: float = 2.0,
        dc_ms_decay: float = 0.95,
        lookahead_momentum: float = 0.99,
        damping: float = 1.0,
        ef_dtype: str | None = None,
        sync_start: int = 0,
        sync_cooldown: int = 0,
        total_steps: int | None = None,
        ef_lag: int | Sequence[int] | None = None,
    ):
        if not isinstance(inner, Optimizer):
            raise TypeError(f"inner must be a torch.optim.Optimizer, got {type(inner).__name__}")
        n = len(inner.param_groups)
        delays = per_group(delay, n, "delay")
        if correction not in CORRECTIONS:
            raise ConfigError(f"unknown correction {correction!r}; expected one of {', '.join(CORRECTIONS)}")
        self.correction = correction
        self._ef_lag_follows_delay = ef_lag is None
        self.ef_lags = list(delays) if ef_lag is None else per_group(ef_lag, n, "ef_lag")
        if ef_dtype not in EF_DTYPES:
            raise ConfigError(f"ef_dtype must be float32 or bfloat16, got {ef_dtype!r}")
        self.ef_dtype = ef_dtype or "float32"
        # Every unit is built (so bad hyperparameters fail here), the correction's one is used.
        self._dc = DCASGD(dc_lambda)
        self._dca = DCASGDAdaptive(dc_lambda0, dc_ms_decay)
        self._damping = LrDamping(damping)
        extrapolates = correction in ("predict", "lookahead")
        extrapolation = Extrapolation(correction if extrapolates else "lookahead", lookahead_momentum)
        self._ex = extrapolation
        self._extrapolation = extrapolation if extrapolates else None
        companion = {"dc-asgd": self._dc, "dc-asgd-a": self._dca}.get(correction)
        self.queue = DelayQueue(
            delays, sync_start=sync_start, sync_cooldown=sync_cooldown, total_steps=total_steps,
            companion=companion,
        )
        self.inner = inner
        # Registers nothing itself (see add_param_group) and shares the inner's defaults, so
        # that schedulers which look for "momentum"/"betas" there (OneCycleLR) find them.
        super().__init__(inner.param_groups, inner.defaults)
        # One list of group dicts for both, so schedulers attached here drive the inner.
        self.param_groups = inner.param_groups
        self.updated = False

    # -- configuration and counters ---------------------------------------------------------
    @property
    def delays(self) -> list[int]:
        return self.queue.delays

    @property
    def sync_start(self) -> int:
        return self.queue.sync_start

    @property
    def sync_cooldown(self) -> int:
        return self.queue.sync_cooldown

    @property
    def total_steps(self) -> int | None:
        return self.queue.total_steps

    @property
    def dc_lambda(self) -> float:
        return self._dc.dc_lambda

    @property
    def num_updates(self) -> int:
        """Updates made by the slowest group (all groups agree unless delays differ)."""
        return min(self.queue.updates)

    @property
    def group_updates(self) -> list[int]:
        return list(self.queue.updates)

    def __repr__(self) -> str:
        delay = self.delays[0] if len(set(self.delays)) == 1 else self.delays
        return f"Delayed({type(self.inner).__name__}, delay={delay}, correction={self.correction!r})"

    def add_param_group(self, param_group: dict, *, delay: int | None = None, ef_lag: int | None = None) -> None:
        """Add a group to the inner optimizer, with its own queue.

        Its delay is ``delay``, by default the wrapper's (which must then be one for all
        groups); its EF lag is ``ef_lag``, by default what the other groups use (their delay,
        unless ``ef_lag`` was given to the constructor). Its updates are counted from 0.
        """
        if any(param_group is g for g in self.inner.param_groups):
            return  # Optimizer.__init__ registering one of the inner's groups: ours already
        delay = _common(self.delays, "delay") if delay is None else check_count("delay", delay)
        if ef_lag is None:
            ef_lag = delay if self._ef_lag_follows_delay else _common(self.ef_lags, "ef_lag")
        check_count("ef_lag", ef_lag)
        self.inner.add_param_group(param_group)
        self.param_groups = self.inner.param_groups  # a CombinedOptimizer keeps its list
        self.queue.add_group(delay)
        self.ef_lags.append(ef_lag)

    # -- the step -----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = closure_loss(closure)
        if self.queue.plain and not (self.correction == "ef" and any(self.ef_lags)):
            self.inner.step()  # plain inner optimizer, bit for bit
            self.queue.updates = [k + 1 for k in self.queue.updates]
            self.updated = True
            return loss

        ef_lags: dict[int, int] = {}  # id(group) -> EF lag, for groups that update with EF now
        updating: list[tuple[dict, int]] = []  # (group, tau of this update: 0 when undelayed)
        for gi, group in enumerate(self.param_groups):
            delayed = self.queue.advance(gi, group["params"], self.state)
            if delayed is None:
                continue
            updating.append((group, self.delays[gi] if delayed else 0))
            lag = self.ef_lags[gi] if delayed and self.correction == "ef" else 0
            if lag:
                ef_lags[id(group)] = lag

        self.updated = bool(updating)
        if not updating:
            return loss
        with self._around_inner_step(updating):
            if not ef_lags:
                self.inner.step()
            elif self._steps_per_param(ef_lags):
                self._ef_step_per_param(ef_lags)
            else:
                error_feedback.step_whole_model(self.inner, self.param_groups, ef_lags, self.state,
                                                EF_DTYPES[self.ef_dtype])
        return loss

    @contextmanager
    def _around_inner_step(self, updating: list[tuple[dict, int]]):
        """What damping and extrapolation do around the inner step (nothing for the others)."""
        with ExitStack() as stack:
            if self.correction == "damp":
                stack.enter_context(self._damping.damped([(g, tau) for g, tau in updating if tau]))
            before = None
            if self._extrapolation is not None:  # u_last of every update, sync ones too
                before = self._extrapolation.before_step(p for g, _ in updating for p in g["params"])
            yield
            if before is not None:
                self._extrapolation.after_step(before, self.state)

    @contextmanager
    def predicted_weights(self):
        """Run the next call's forward/backward inside: with ``"predict"`` or ``"lookahead"`` the
        weights are ``x - c u_last`` there (see :mod:`~delaylab.optim.prediction`) and come back
        bit for bit on exit; with any other correction it does nothing."""
        ex = self._extrapolation
        shifts = []
        if ex is not None:
            for gi, group in enumerate(self.param_groups):
                ahead = self.queue.ahead(gi)
                if ahead is None or not self.queue.delayed_phase(self.queue.updates[gi]):
                    continue
                c = ex.coefficient(self.delays[gi], ahead)
                if not c:
                    continue
                for p in group["params"]:
                    u = self.state[p].get("u_last") if p in self.state else None
                    if u is not None:
                        shifts.append((p, u, c))
        with Extrapolation.shifted(shifts):
            yield

    def corrector_bytes(self) -> int:
        """Bytes the correction holds across steps (EF buffer, DC-ASGD snapshots and mean
        square, ``u_last``), on this process; the delay queue's gradients are not counted."""
        keys, total = HELD[self.correction], 0
        for st in self.state.values():
            for key in keys:
                v = st.get(key)
                for t in (v if isinstance(v, list) else [v]):
                    if t is not None:
                        t = getattr(t, "_local_tensor", t)  # an FSDP2 shard: its local bytes
                        total += t.numel() * t.element_size()
        return total

    # The two EF paths are methods so that tests and benchmarks can pin one of them.
    def _steps_per_param(self, ef_lags) -> bool:
        return error_feedback.can_step_per_parameter(self.inner, self.param_groups, ef_lags)

    def _ef_step_per_param(self, ef_lags) -> None:
        error_feedback.step_per_parameter(self.inner, ef_lags, self.state, EF_DTYPES[self.ef_dtype])

    # -- state ---------------------------------------------------------------------------------
    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def _config(self) -> dict:
        return {
            "delays": list(self.delays),
            "correction": self.correction,
            "ef_lags": list(self.ef_lags),
            "ef_dtype": self.ef_dtype,
            "sync_start": self.sync_start,
            "sync_cooldown": self.sync_cooldown,
            "total_steps": self.total_steps,
        }

    def _hyper(self) -> dict:
        return {"dc_lambda0": self._dca.dc_lambda, "dc_ms_decay": self._dca.ms_decay, "damping": self._damping.c,
                "lookahead_momentum": self._ex.gamma}

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
                "hyper": self._hyper(),
                "updates": list(self.queue.updates),
                "queued": list(self.queue.queued),
                "updated": self.updated,
                "buffers": buffers,
            },
        }

    def load_state_dict(self, state_dict: dict) -> None:
        try:
            inner_sd, ours = state_dict["inner"], state_dict["delayed"]
        except (KeyError, TypeError):
            raise ConfigError("not a Delayed state_dict (expected keys 'inner' and 'delayed')") from None
        saved = {k: ours.get(k, "float32") if k == "ef_dtype" else ours[k] for k in self._config()}  # older: no ef_dtype
        if saved != self._config():
            raise ConfigError(f"state_dict was saved with {saved}, but this wrapper has {self._config()}")
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
        self._dc.dc_lambda = ours["dc_lambda"]
        if "hyper" in ours:  # saved by a version that had the other correctors
            h = ours["hyper"]
            self._dca.dc_lambda, self._dca.ms_decay, self._damping.c = h["dc_lambda0"], h["dc_ms_decay"], h["damping"]
            self._ex.gamma = h["lookahead_momentum"]
        self.queue.updates = list(ours["updates"])
        self.queue.queued = list(ours["queued"])
        self.updated = ours["updated"]

    def children(self) -> list[Optimizer]:
        return [self.inner]

    # Optimizer pickles only defaults/state/param_groups; a wrapper needs all of itself.
    def __getstate__(self) -> dict:
        return self.__dict__.copy()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


def _common(values: list[int], name: str) -> int:
    if len(set(values)) != 1:
        raise ConfigError(f"the param groups have different {name}s {values}; pass {name}= for the new group")
    return values[0]
