"""Delayed: make any torch optimizer see stale gradients, exactly as PipeDream-2BW does."""

from __future__ import annotations

import copy
import warnings
from collections import defaultdict
from contextlib import contextmanager
from typing import Sequence

import torch
from torch.optim import Optimizer

from delaylab.errors import ConfigError
from delaylab.optim import inner_step
from delaylab.optim._closure import closure_loss
from delaylab.optim.corrections import CORRECTORS, build
from delaylab.optim.corrector import Corrector, Update, overrides
from delaylab.optim.queue import DelayDistribution, DelayQueue, check_count, common, per_group

# The fields of a state_dict saved before correctors were objects that configure them, and the
# corrector keyword each one was (read by upgrade_state_dict alone).
_OLD_FIELDS = {"dc_lambda": "dc_lambda", "ef_dtype": "ef_dtype", "ef_lags": "ef_lag"}


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

    **Variable delays.** ``delay`` may be a :class:`~delaylab.optim.queue.DelayDistribution`
    (a list cycled, or i.i.d. uniform on ``{lo..hi}``): update ``k`` uses batch ``k`` taken at the
    weights of update ``max(s, k - tau_k)`` (``s``: the start of the delayed phase), every gradient
    applied once, as its own update, in that order (the asynchronous-SGD model, see the class).
    There is no queue and no fill: one call is one update, and the wrapper keeps the last
    ``max tau_k`` weight versions (one more with prediction or look-ahead) instead of ``tau``
    gradients. The forward/backward must then run inside :meth:`predicted_weights`, which puts the
    weights at that version (``Trainer`` does; :meth:`step` raises otherwise, and runs a closure
    there itself). A constant ``cycle:tau`` equals ``delay=tau`` bit for bit (tested). Correctors:
    EF takes one constant lag, the distribution's mean (its ``lag`` overrides it), because
    only a constant lag keeps ``x_k = w_k - l u_{k-1}`` with ``w`` the undelayed sequence
    (docs/correctors.md, "Variable delays"); prediction extrapolates by the update's own wait
    ``k - max(s, k - tau_k)`` from the version's last step ``x_{v-1} - x_v``; damping divides by
    ``1 + c tau_k``; DC-ASGD (which snapshots weights beside queued gradients) is refused.

    **Corrections.** ``corrections`` is a list of correctors, optax-style: names (``["ef",
    "damp"]``), a comma string (``"ef,damp"``) or corrector objects (``ErrorFeedback(dtype=
    "bfloat16")``, ``LrDamping(0.5)``); ``"none"`` is the empty list. The names, the valid lists
    (at most one corrector per target: gradient, update, lr) and the formulas are in
    :mod:`delaylab.optim.corrections` and docs/correctors.md. A name is its corrector at its
    defaults; configure one by passing the object (the run config makes them once:
    :meth:`delaylab.llm.config.Config.correctors`). The former keywords (``correction=``,
    ``ef_dtype=``, ``damping=``, ...) go through :func:`with_keywords`, deprecated. Each corrector
    holds its own configuration; what it keeps per parameter lives in :attr:`state`, so it is saved, loaded
    and re-targeted with the optimizer, and :meth:`corrector_bytes` counts it.

    **Order.** On each call the correctors act at four fixed points, whatever the order of the
    list, and within one point in the registry's order (ef, dc-asgd, dc-asgd-a, predict,
    lookahead, damp):

    1. :meth:`predicted_weights` (around the caller's forward/backward): the weights move to
       each corrector's gradient point (predict, lookahead) and come back bit for bit;
    2. the queue: on a push something is kept beside the gradient, on a pop the stale gradient
       is corrected (DC-ASGD), so the inner sees the corrected gradient;
    3. the lr of a delayed update (damping), restored after the update;
    4. around the inner step: error feedback rewrites the update the inner made (at the damped
       lr), then prediction records ``u_last``, the displacement actually applied (EF's too).

    Each point acts on what the earlier ones produced: a gradient is taken, queued, corrected,
    applied at an lr, and the applied step is rewritten and then recorded. Prediction records
    the applied displacement, not the inner's ``u``, because it predicts where the weights will
    be, and they move by what is applied.

    **Phases.** Updates ``k < sync_start`` and ``k >= total_steps - sync_cooldown`` are
    undelayed (the correctors act in delayed phases only; prediction keeps recording
    ``u_last``). Entering a delayed phase costs a fill of ``tau`` calls (a pipeline restarting
    its warm-up); entering the cooldown drops the queued stale gradients. With ``total_steps``
    set, a group that has made ``total_steps`` updates ignores further calls.

    **Pieces.** The wrapper composes a :class:`~delaylab.optim.queue.DelayQueue` (counters,
    phases, the queued gradients), the correctors (:mod:`delaylab.optim.corrector`, the
    protocol) and :mod:`delaylab.optim.inner_step`; it knows no concrete inner or corrector
    class. The inner is stepped one parameter at a time around the correctors' hooks when one of
    them asks for it (EF) and every leaf declares that capability
    (:mod:`delaylab.optim.capabilities`), and as a whole otherwise.

    ``delay=0`` without corrections calls ``inner.step()`` and nothing else, so it is the inner
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
        corrections: str | Sequence[str | Corrector] = (),
        *,
        sync_start: int = 0,
        sync_cooldown: int = 0,
        total_steps: int | None = None,
    ):
        if not isinstance(inner, Optimizer):
            raise TypeError(f"inner must be a torch.optim.Optimizer, got {type(inner).__name__}")
        self.dist = delay if isinstance(delay, DelayDistribution) else None
        n = len(inner.param_groups)
        # A distribution keeps weight versions, not a queue: the queue's delays are 0, and the
        # correctors are bound to the mean (EF's lag).
        delays = [0] * n if self.dist is not None else per_group(delay, n, "delay")
        self.correctors: list[Corrector] = [copy.copy(c) for c in build(corrections or ())]
        queued = [c for c in self.correctors if overrides(c, "on_push", "on_pop", "on_drop")]
        if self.dist is not None and queued:
            raise ConfigError(f"correction {queued[0].name} keeps weights beside queued gradients: it is not "
                              f"defined for a delay distribution (use ef, predict, lookahead or damp)")
        for c in self.correctors:
            c.bind([self._nominal] * n if self.dist is not None else list(delays))
        self._droppers = [c for c in self.correctors if overrides(c, "discards")]
        if self._droppers and self.dist is None:
            raise ConfigError(f"correction {self._droppers[0].name} discards gradients by their delay: it needs a delay "
                              f"distribution (under a constant delay every gradient has the same age)")
        self._shifters = [c for c in self.correctors if overrides(c, "weight_shift")]
        self._scalers = [c for c in self.correctors if overrides(c, "scale_lr")]
        self._wrappers = [c for c in self.correctors if overrides(c, "wraps")]
        self.queue = DelayQueue(
            delays, sync_start=sync_start, sync_cooldown=sync_cooldown, total_steps=total_steps,
            companions=queued,
        )
        self.inner = inner
        # Registers nothing itself (see add_param_group) and shares the inner's defaults, so
        # that schedulers which look for "momentum"/"betas" there (OneCycleLR) find them.
        super().__init__(inner.param_groups, inner.defaults)
        # One list of group dicts for both, so schedulers attached here drive the inner.
        self.param_groups = inner.param_groups
        self.updated = False
        self._taken_at: int | None = None  # with a distribution: the update whose gradient point was set
        # With a distribution: the delays drawn so far, one per call (tau_c = dist(c)); equal to the
        # update count unless a staleness threshold discarded some calls' gradients.
        self._draws = 0

    @property
    def _nominal(self):
        """A distribution's mean delay, an int when it is one (EF's default lag)."""
        m = self.dist.mean
        return int(m) if m == int(m) else m

    # -- configuration and counters ---------------------------------------------------------
    @property
    def correction(self) -> str:
        """The correctors' names, comma-separated in the order they apply, or ``"none"``."""
        return ",".join(c.name for c in self.correctors) or "none"

    def corrector(self, name: str) -> Corrector | None:
        return next((c for c in self.correctors if c.name == name), None)

    @property
    def ef_lags(self) -> list[int]:
        """EF's lag per group (without EF: the delays, the lags it would take)."""
        ef = self.corrector("ef")
        return list(ef.lags) if ef is not None else list(self.delays)

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
    def num_updates(self) -> int:
        """Updates made by the slowest group (all groups agree unless delays differ)."""
        return min(self.queue.updates)

    @property
    def group_updates(self) -> list[int]:
        return list(self.queue.updates)

    def __repr__(self) -> str:
        delay = self.delays[0] if len(set(self.delays)) == 1 else self.delays
        delay = self.dist.spec if self.dist is not None else delay
        return f"Delayed({type(self.inner).__name__}, delay={delay}, corrections={self.correction!r})"

    def add_param_group(self, param_group: dict, *, delay: int | None = None, **options) -> None:
        """Add a group to the inner optimizer, with its own queue.

        Its delay is ``delay``, by default the wrapper's (which must then be one for all
        groups); ``options`` go to the correctors that read them (EF: ``ef_lag``, by default
        what the other groups use). Its updates are counted from 0.
        """
        if any(param_group is g for g in self.inner.param_groups):
            return  # Optimizer.__init__ registering one of the inner's groups: ours already
        known = sorted({o for e in CORRECTORS.values() for o in e.factory.group_options})
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise TypeError(f"unexpected keyword {unknown[0]!r} (the correctors read: {', '.join(known)})")
        if self.dist is not None and delay is not None:
            raise ConfigError("a group of a Delayed with a delay distribution follows the distribution: give no delay")
        if self.dist is not None and any(self.queue.updates):
            raise ConfigError("with a delay distribution every group shares one update count: add groups before "
                              "the first step")
        delay = common(self.delays, "delay") if delay is None else check_count("delay", delay)
        self.inner.add_param_group(param_group)
        self.param_groups = self.inner.param_groups  # a CombinedOptimizer keeps its list
        self.queue.add_group(delay)
        for c in self.correctors:
            c.add_group(self._nominal if self.dist is not None else delay,
                        **{k: v for k, v in options.items() if k in c.group_options})

    # -- the step -----------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        if self.dist is not None:
            return self._step_varying(closure)
        loss = closure_loss(closure)
        if self.queue.plain and not self.correctors:
            self.inner.step()  # plain inner optimizer, bit for bit
            self.queue.updates = [k + 1 for k in self.queue.updates]
            self.updated = True
            return loss
        self._update(lambda gi, group: self.queue.advance(gi, group["params"], self.state))  # 2. push, pop
        return loss

    @torch.no_grad()
    def flush(self) -> bool:
        """One more update per group with its oldest queued gradient (the end of training, as a
        pipeline drains its last batches; or a checkpoint that must hold no queue); True if there
        was one. Call it until it returns False; the next :meth:`step` fills the queue anew."""
        return self._update(lambda gi, group: self.queue.release(gi, group["params"], self.state))

    def _update(self, advance) -> bool:
        """``advance(gi, group)`` per group (None: no update), then one inner step for the groups that
        update; the others' ``p.grad`` (queued, not applied) is kept from it and left in place."""
        updates: list[tuple[dict, Update]] = []  # the groups that update on this call
        idle = []
        for gi, group in enumerate(self.param_groups):
            delayed = advance(gi, group)
            if delayed is not None:
                updates.append((group, Update(gi, self.delays[gi], delayed, group)))
            else:
                idle += [(p, p.grad) for p in group["params"] if p.grad is not None]
        self.updated = bool(updates)
        if updates:
            try:
                for p, _ in idle:
                    p.grad = None
                with self._scaled_lrs(updates):  # 3.
                    self._inner_step(updates)  # 4.
            finally:
                for p, g in idle:  # the same tensor: a caller's static gradient buffer stays in place
                    p.grad = g
        return self.updated

    def _step_varying(self, closure):
        """One call with a delay distribution: one update, its gradient taken at ``max(s, k - tau_k)``."""
        k = self.queue.updates[0]  # every group follows the one distribution: the same count
        if closure is not None:
            with self.predicted_weights():
                loss = closure_loss(closure)
        else:
            loss = None
        if self._taken_at != k and self.queue.ahead(0) is not None:
            raise ConfigError("with a delay distribution the gradient is taken at stale weights: run the "
                              "forward/backward inside `with opt.predicted_weights():` (the trainer does)")
        self._taken_at = None
        tau = self._tau(k)
        if self.queue.ahead(0) is not None:
            self._draws += 1
            if any(c.discards(Update(0, tau, self.queue.delayed_phase(k))) for c in self._droppers):
                self.updated = False  # the gradient is discarded: no update, nothing changes
                return loss
        keep = self.dist.max + (1 if self._shifters else 0)  # versions the next gradient points need
        updates: list[tuple[dict, Update]] = []
        for gi, group in enumerate(self.param_groups):
            delayed = self.queue.advance(gi, group["params"], self.state)  # counts, phases; queues nothing
            if delayed is None:
                continue
            updates.append((group, Update(gi, tau, delayed, group)))
            for p in group["params"] if keep else ():  # x_k, before update k: a future gradient point
                versions = self.state[p].setdefault("versions", [])
                versions.append(versions.pop(0).copy_(p) if len(versions) == keep else p.detach().clone())
        self.updated = bool(updates)
        if updates:
            with self._scaled_lrs(updates):
                self._inner_step(updates)
        return loss

    def _tau(self, k: int) -> int:
        """The delay of the next call's gradient (update ``k`` if it is applied): the distribution's draw
        for that call in a delayed phase, else 0. Without discards the draw index is ``k``."""
        return self.dist(self._draws) if self.queue.delayed_phase(k) else 0

    @contextmanager
    def _scaled_lrs(self, updates: list[tuple[dict, Update]]):
        """Each updating group's lr as the correctors scale it, the group's own lr afterwards."""
        scaled = updates if self._scalers else []
        saved = [(g, g["lr"]) for g, _ in scaled]
        try:
            for g, u in scaled:
                for c in self._scalers:
                    g["lr"] = c.scale_lr(g["lr"], u)
            yield
        finally:
            for g, lr in saved:
                g["lr"] = lr

    def _inner_step(self, updates: list[tuple[dict, Update]]) -> None:
        plan = {}  # id(group) -> (update, the correctors around it)
        # Under a distribution prediction reads u_last off the weight versions: nothing to record.
        wrappers = [c for c in self._wrappers if self.dist is None or c not in self._shifters]
        for g, u in updates:
            hooked = [c for c in wrappers if c.wraps(u)]
            if hooked:
                plan[id(g)] = (u, hooked)
        if not plan:
            self.inner.step()
        elif any(c.per_parameter for _, hooked in plan.values() for c in hooked) and self._steps_per_param(plan):
            self._ef_step_per_param(plan)
        else:
            inner_step.whole_model(self.inner, self.param_groups, plan, self.state)

    # The two paths are methods so that tests and benchmarks can pin one of them (the names
    # are from when EF was the one corrector around the inner step).
    def _steps_per_param(self, plan) -> bool:
        return inner_step.can_step_per_parameter(self.inner, self.param_groups, plan)

    def _ef_step_per_param(self, plan) -> None:
        inner_step.per_parameter(self.inner, plan, self.state)

    @contextmanager
    def predicted_weights(self):
        """Run the next call's forward/backward inside: the weights are at the correctors'
        gradient point there (``x - c u_last`` with ``"predict"`` or ``"lookahead"``, see
        :mod:`~delaylab.optim.prediction`) and come back bit for bit on exit; without such a
        corrector it does nothing."""
        saved = []
        try:
            with torch.no_grad():
                for p, base, moves in (self._stale_points() if self.dist is not None else
                                       ((p, None, m) for p, m in self._shifts())):
                    saved.append((p, p.detach().clone()))
                    if base is not None:
                        p.copy_(base)
                    for t, alpha in moves:
                        p.sub_(t, alpha=alpha)
            yield
        finally:
            with torch.no_grad():
                for p, x in saved:
                    p.copy_(x)

    def _shifts(self) -> list[tuple[torch.Tensor, list[tuple[torch.Tensor, float]]]]:
        """``(p, [(t, alpha), ...])``: where each parameter's next gradient is taken, ``p - sum alpha t``."""
        shifts = []
        for gi, group in enumerate(self.param_groups if self._shifters else []):
            ahead = self.queue.ahead(gi)
            if ahead is None:  # the group is done
                continue
            update = Update(gi, self.delays[gi], self.queue.delayed_phase(self.queue.updates[gi]), group)
            for p in group["params"]:
                st = self.state.get(p)
                moves = [m for c in self._shifters if st and (m := c.weight_shift(st, update, ahead))]
                if moves:
                    shifts.append((p, moves))
        return shifts

    def _stale_points(self):
        """With a distribution: ``(p, x_v or None, moves)`` for update ``k``'s gradient point,
        ``v = max(s, k - tau_k)``, shifted by prediction / look-ahead along the version's last step
        ``x_{v-1} - x_v`` (what ``u_last`` was then) by the update's wait ``k - v``."""
        k = self.queue.updates[0]
        if self.queue.ahead(0) is None:  # finished: ignored calls
            return
        self._taken_at = k
        tau = self._tau(k)
        v = max(self.sync_start if self.queue.delayed_phase(k) else k, k - tau)

        def version(p, j):  # x_j, j <= k (None before x_0)
            return p if j == k else self.state[p]["versions"][j - k] if j >= 0 else None

        for gi, group in enumerate(self.param_groups):
            update = Update(gi, tau, self.queue.delayed_phase(k), group)
            for p in group["params"]:
                base = version(p, v)
                prev = version(p, v - 1) if self._shifters else None
                st = {"u_last": prev - base} if prev is not None else {}
                moves = [m for c in self._shifters if (m := c.weight_shift(st, update, k - v))]
                if v != k or moves:
                    yield p, (None if v == k else base), moves

    def corrector_bytes(self) -> int:
        """Bytes the correctors hold across steps (EF buffer, DC-ASGD snapshots and mean
        square, ``u_last``), on this process; the delay queue's gradients are not counted."""
        keys, total = {k for c in self.correctors for k in c.keys}, 0
        for st in self.state.values():
            for key in keys:
                v = st.get(key)
                for t in (v if isinstance(v, list) else [v]):
                    if t is not None:
                        t = getattr(t, "_local_tensor", t)  # an FSDP2 shard: its local bytes
                        total += t.numel() * t.element_size()
        return total

    # -- state ---------------------------------------------------------------------------------
    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.param_groups for p in g["params"]]

    def _config(self) -> dict:
        return {
            "delays": list(self.delays),
            "delay_dist": None if self.dist is None else self.dist.hyper(),
            "corrections": {c.name: c.hyper() for c in self.correctors},
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
                "updates": list(self.queue.updates),
                "queued": list(self.queue.queued),
                # a distribution's generator is counter-based: its whole state, tau_k = f(seed, k)
                "delay_rng": None if self.dist is None else {"seed": self.dist.seed, "draws": self._draws},
                "updated": self.updated,
                "buffers": buffers,
            },
        }

    def load_state_dict(self, state_dict: dict) -> None:
        try:
            inner_sd, ours = state_dict["inner"], state_dict["delayed"]
        except (KeyError, TypeError):
            raise ConfigError("not a Delayed state_dict (expected keys 'inner' and 'delayed')") from None
        if "corrections" not in ours:
            raise ConfigError("a Delayed state_dict of the one-correction format (saved before correctors were "
                              "objects): load upgrade_state_dict(state_dict)")
        saved = {k: ours.get(k) for k in self._config()}
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
        self.queue.updates = list(ours["updates"])
        self.queue.queued = list(ours["queued"])
        self.updated = ours["updated"]
        self._taken_at = None
        self._draws = (ours.get("delay_rng") or {}).get("draws", min(self.queue.updates, default=0))

    def children(self) -> list[Optimizer]:
        return [self.inner]

    # Optimizer pickles only defaults/state/param_groups; a wrapper needs all of itself.
    def __getstate__(self) -> dict:
        return self.__dict__.copy()

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


def with_keywords(inner: Optimizer, delay=1, corrections=(), *, correction=None, sync_start: int = 0,
                  sync_cooldown: int = 0, total_steps: int | None = None, **keywords) -> Delayed:
    """Deprecated: ``Delayed`` as it was called before correctors were objects: the corrections
    under their former name ``correction=`` and each corrector's configuration as a keyword of the
    wrapper (``dc_lambda``, ``dc_lambda0``, ``dc_ms_decay``, ``lookahead_momentum``, ``damping``,
    ``ef_dtype``, ``ef_lag``; :data:`delaylab.optim.corrector.Corrector.keywords`). The same
    optimizer as ``Delayed(inner, delay, [the corrector objects], ...)``."""
    warnings.warn("Delayed's correction= and corrector keywords (ef_dtype=, damping=, ...) are deprecated: pass "
                  "corrector objects, e.g. Delayed(inner, 1, [ErrorFeedback(dtype='bfloat16')])",
                  DeprecationWarning, stacklevel=2)
    if correction is not None:
        if corrections:
            raise ConfigError("give corrections= or its former name correction=, not both")
        corrections = correction
    return Delayed(inner, delay, build(corrections or (), **keywords), sync_start=sync_start,
                   sync_cooldown=sync_cooldown, total_steps=total_steps)


def upgrade_state_dict(state_dict: dict) -> dict:
    """Deprecated: a Delayed state_dict saved with one ``correction`` name (before correctors were
    objects) in today's format, its correctors configured as that version's constructor built them;
    a state_dict of today's format is returned as it is."""
    ours = state_dict["delayed"]
    if "corrections" in ours:
        return state_dict
    warnings.warn("a Delayed state_dict of the one-correction format: save it again to drop this conversion",
                  DeprecationWarning, stacklevel=2)
    keywords = {**{new: ours.get(old) for old, new in _OLD_FIELDS.items()}, **ours.get("hyper", {})}
    correctors = build(ours["correction"], **keywords)
    for c in correctors:
        c.bind(list(ours["delays"]))
    kept = {k: v for k, v in ours.items() if k not in ("correction", "hyper", *_OLD_FIELDS)}
    return {**state_dict, "delayed": {**kept, "delay_dist": None, "corrections": {c.name: c.hyper() for c in correctors}}}
