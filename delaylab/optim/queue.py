"""DelayQueue: per param group, which call updates, with which queued gradient, in which phase.

Group ``g`` has a delay ``tau_g``. In a delayed phase its first ``tau_g`` calls only push the
current gradient (a fill: no update); afterwards each call pushes the new gradient and pops
the one pushed ``tau_g`` calls earlier into ``p.grad``. Updates ``k < sync_start`` and
``k >= total_steps - sync_cooldown`` are undelayed; leaving a delayed phase drops the queue,
entering one costs a new fill. With ``total_steps`` set, a group that has made
``total_steps`` updates ignores further calls.

The queued gradients live in the owner's per-parameter state (``state[p]["queue"]``), so
they are saved, loaded and re-targeted with it. The queue owns them: a push copies ``p.grad``,
a pop copies the stale gradient back into ``p.grad`` in place, and ``p.grad`` itself is never
replaced. Whatever writes the next gradient into the same storage (DDP's
``gradient_as_bucket_view``, a CUDA graph's replay, ``zero_grad(set_to_none=False)``) therefore
cannot change a queued gradient, and a CUDA graph's static gradient buffers stay the ones the
optimizer reads. The cost: one copy in and one copy out per parameter per update, and one
parameter-sized temporary at a time (the new gradient is copied before the stale one overwrites it). ``companions`` (correctors: DC-ASGD) may keep
something next to each queued gradient: in their order, each is told ``on_push(p, st)`` on a
push, ``on_pop(p, st, g)`` on a pop (returning the gradient to use) and ``on_drop(st)`` when
the queue is dropped.
"""

from __future__ import annotations

from typing import Sequence

import torch

from delaylab.errors import ConfigError


def per_group(value: int | Sequence[int], n: int, name: str) -> list[int]:
    """``value`` for each of ``n`` groups: an int for all, or a list with one entry each."""
    values = [value] * n if isinstance(value, int) else list(value)
    if len(values) != n:
        raise ConfigError(f"{name} has {len(values)} entries but the optimizer has {n} param groups")
    for v in values:
        check_count(name, v)
    return values


def check_count(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ConfigError(f"{name} must be an integer >= 0 (or a list of them), got {v!r}")
    return v


def common(values: list[int], name: str) -> int:
    """The one value all groups share, for a new group that does not give its own."""
    if len(set(values)) != 1:
        raise ConfigError(f"the param groups have different {name}s {values}; pass {name}= for the new group")
    return values[0]


class DelayQueue:
    def __init__(
        self,
        delays: list[int],
        *,
        sync_start: int = 0,
        sync_cooldown: int = 0,
        total_steps: int | None = None,
        companions: Sequence = (),
    ):
        for name, v in (("sync_start", sync_start), ("sync_cooldown", sync_cooldown)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {v!r}")
        if total_steps is not None and (not isinstance(total_steps, int) or total_steps < 1):
            raise ConfigError(f"total_steps must be an integer >= 1, got {total_steps!r}")
        if sync_cooldown and total_steps is None:
            raise ConfigError("sync_cooldown needs total_steps (the cooldown is the last K of them)")
        self.delays = list(delays)
        self.sync_start, self.sync_cooldown, self.total_steps = sync_start, sync_cooldown, total_steps
        self.companions = tuple(companions)
        self.updates = [0] * len(self.delays)  # updates made, per group
        self.queued = [0] * len(self.delays)  # gradients waiting, per group

    def add_group(self, tau: int) -> None:
        self.delays.append(check_count("delay", tau))
        self.updates.append(0)
        self.queued.append(0)

    @property
    def plain(self) -> bool:
        """No delay and no step budget: every call is one update with the current gradient."""
        return not any(self.delays) and self.total_steps is None

    def delayed_phase(self, k: int) -> bool:
        """Whether update ``k`` (of a group) is made with the group's delay."""
        if k < self.sync_start:
            return False
        return not (self.sync_cooldown and k >= self.total_steps - self.sync_cooldown)

    def ahead(self, gi: int) -> int | None:
        """Updates the gradient of group ``gi``'s next call waits for before it is applied
        (``tau`` once the queue is full, fewer while it fills, 0 undelayed); None when the
        group is finished. What weight prediction extrapolates by."""
        k = self.updates[gi]
        if self.total_steps is not None and k >= self.total_steps:
            return None
        return min(self.queued[gi], self.delays[gi]) if self.delayed_phase(k) else 0

    def advance(self, gi: int, params: list[torch.Tensor], state) -> bool | None:
        """One call for group ``gi``: fill, or leave in ``p.grad`` the gradient to apply now.

        Returns None when the group makes no update on this call (``p.grad`` then still holds the
        new gradient, a copy of which is queued: the caller keeps it from the inner step), else
        whether its update is in a delayed phase (a correction applies only there).
        """
        k = self.updates[gi]
        if self.total_steps is not None and k >= self.total_steps:
            return None
        delayed = self.delayed_phase(k)
        tau = self.delays[gi] if delayed else 0
        if not delayed and self.queued[gi]:
            self._drop(params, state)
            self.queued[gi] = 0
        if tau:
            self.queued[gi] += 1
            if self.queued[gi] <= tau:  # filling: nothing to apply yet
                for p in params:
                    self._push(p, state[p])
                return None
            for p in params:  # one parameter at a time: one parameter-sized temporary at most
                self._push(p, state[p])
                self._pop(p, state[p])
            self.queued[gi] -= 1
        self.updates[gi] += 1
        return delayed

    def release(self, gi: int, params: list[torch.Tensor], state) -> bool | None:
        """Leave group ``gi``'s oldest queued gradient in ``p.grad`` as one more update (a drain);
        None when nothing is queued (or the group is finished), else whether the update is delayed."""
        k = self.updates[gi]
        if not self.queued[gi] or (self.total_steps is not None and k >= self.total_steps):
            return None
        for p in params:
            self._pop(p, state[p])
        self.queued[gi] -= 1
        self.updates[gi] += 1
        return self.delayed_phase(k)

    def _push(self, p: torch.Tensor, st: dict) -> None:
        st.setdefault("queue", []).append(None if p.grad is None else p.grad.detach().clone())
        for c in self.companions:
            c.on_push(p, st)

    def _pop(self, p: torch.Tensor, st: dict) -> None:
        g = st["queue"].pop(0)
        for c in self.companions:
            g = c.on_pop(p, st, g)
        if g is None:  # the parameter had no gradient on that call
            p.grad = None
        elif p.grad is not None and p.grad.shape == g.shape and p.grad.dtype == g.dtype:
            p.grad.copy_(g)  # in place: the caller's gradient buffer stays the one it reads
        else:
            p.grad = g

    def _drop(self, params, state) -> None:
        for p in params:
            st = state[p]
            st.pop("queue", None)
            for c in self.companions:
                c.on_drop(st)


class DelayDistribution:
    r"""A delay that varies from update to update: update ``k`` uses the gradient of batch ``k``
    taken at the weights of update ``k - tau_k``,

    .. math:: x_{k+1} = x_k - u_k(\nabla f(x_{\max(s, k - \tau_k)}; \xi_k)),

    the bounded-delay model of asynchronous SGD (Agarwal & Duchi 2011, "Distributed Delayed
    Stochastic Optimization", NeurIPS; Lian et al. 2015, "Asynchronous Parallel Stochastic Gradient
    for Nonconvex Optimization", NeurIPS): a parameter server applies every gradient it receives as
    its own update, in the order they arrive (Dean et al. 2012, Downpour SGD), so none is dropped
    or merged with another, and one computed on older weights may arrive after one computed on
    newer weights (``tau_{k+1} > tau_k + 1``). ``s`` is the start of the delayed phase (0 without a
    sync start), as for a constant delay (``x_{-j} := x_0``). With every ``tau_k = tau`` this is
    ``Delayed(delay=tau)`` exactly.

    * ``cycle:A,B,...`` -- ``tau_k = [A, B, ...][k mod n]``;
    * ``uniform:K`` or ``uniform:LO-HI`` -- ``tau_k`` i.i.d. uniform on ``{0..K}`` (``{LO..HI}``),
      drawn from a counter-based generator: ``tau_k`` is a pure function of ``(seed, k)`` (numpy's
      ``SeedSequence``, on a stream of its own), so the generator's whole state is its seed and the
      number of draws, which the state_dict holds (resume is exact; data-parallel replicas agree
      without talking).
    """

    KINDS = ("cycle", "uniform")
    _STREAM = 0x64656C6179  # "delay": a stream apart from the data's (seed, batch) windows

    def __init__(self, kind: str, values: Sequence[int], seed: int = 0):
        if kind not in self.KINDS:
            raise ConfigError(f"unknown delay distribution {kind!r} (choose from {', '.join(self.KINDS)})")
        values = [check_count("a delay of the distribution", v) for v in values]
        if not values or (kind == "uniform" and (len(values) != 2 or values[0] > values[1])):
            raise ConfigError(f"a {kind} delay needs {'LO <= HI' if kind == 'uniform' else 'at least one delay'}, "
                              f"got {values}")
        self.kind, self.values, self.seed = kind, list(values), check_count("the delay seed", seed)

    @classmethod
    def parse(cls, spec: str, seed: int = 0) -> "DelayDistribution":
        """``cycle:1,3`` / ``uniform:4`` / ``uniform:1-3``; a malformed spec is a one-line ConfigError."""
        kind, _, rest = str(spec).partition(":")
        try:
            if kind == "uniform":
                lo, _, hi = rest.partition("-")
                values = [0, int(lo)] if not hi else [int(lo), int(hi)]
            else:
                values = [int(v) for v in rest.split(",")]
        except ValueError:
            raise ConfigError(f"delay distribution {spec!r}: expected cycle:A,B,... or uniform:K or "
                              f"uniform:LO-HI with integers >= 0") from None
        return cls(kind, values, seed)

    @property
    def spec(self) -> str:
        if self.kind == "uniform":
            return f"uniform:{self.values[0]}-{self.values[1]}"
        return "cycle:" + ",".join(map(str, self.values))

    @property
    def max(self) -> int:
        return max(self.values)

    @property
    def mean(self) -> float:
        return (self.values[0] + self.values[1]) / 2 if self.kind == "uniform" else sum(self.values) / len(self.values)

    def __call__(self, k: int) -> int:
        """``tau_k``, the delay of update ``k``."""
        if self.kind == "cycle":
            return self.values[k % len(self.values)]
        import numpy as np

        lo, hi = self.values
        return int(np.random.default_rng([self.seed, k, self._STREAM]).integers(lo, hi + 1))

    def hyper(self) -> dict:
        return {"spec": self.spec, "seed": self.seed}

    def __repr__(self) -> str:
        return f"DelayDistribution({self.spec!r}, seed={self.seed})"
