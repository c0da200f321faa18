"""``DelayedOptimizersContainer`` and ``DelayedLRSchedulersContainer`` for torchtitan 0.3.0.

The container builds torchtitan's optimizers (its ``param_groups`` patterns, implementation and
factories) and wraps each in :class:`delaylab.optim.Delayed`. What wrapping alone gets wrong
there, and what this module does about it:

1. torchtitan's ``init_optim_state`` materializes optimizer state with a zero-gradient, zero-lr
   ``step()`` before saving or loading; on a ``Delayed`` that step would enter the delay queue.
   Here it runs on the inner optimizer only; when that state did not exist yet (a checkpoint
   inside the queue's fill) it is a placeholder, marked in the checkpoint and dropped before the
   next update, so the inner optimizer's step count is not advanced by a checkpoint.
2. ``get_flat_optim_state_dict(Delayed)`` raises ``KeyError: 'param_groups'``: DCP gets the inner
   optimizers' own FQN-keyed state, and the delay state under its own keys,
   ``delayed.<fqn>.<buffer>[.<slot>]`` (queued gradients, EF buffer, ...) and
   ``delayed.<fqn>.group`` (updates, queued, delay), in slots that exist whatever the queue holds,
   so a fresh process's state dict is a complete template for DCP's load.
3. The LR scheduler steps once per call; with a delay it would run ``tau`` updates ahead.
   :class:`DelayedLRSchedulersContainer` sets each param group's lr from its own update count.
4. A call that releases no gradient (an asynchronous schedule's fill call, ``Schedule2BW``'s first
   batch) is not an update: the container skips it. Under delaylab's ``pipelining_fn`` the schedule
   says so itself (``released``; it leaves zero gradients then, see ``zero_fill``); otherwise a call
   with no gradient at all is a fill.

Per-stage delays (``stage_delays``, PipeDream's ``[P-1, ..., 0]``): with pipeline parallelism
each model part carries its stage index (:data:`STAGE_ATTR`, set by this package's
``pipelining_fn``); without it, the single model is split into ``len(stage_delays)`` virtual
stages by torchtitan's own pipeline split, one param group per stage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torchtitan.components.optimizer import LRSchedulersContainer, OptimizersContainer
from torchtitan.components.optimizer.utils import (
    get_flat_optim_state_dict,
    init_optim_state,
    load_flat_optim_state_dict,
)

from delaylab.errors import ConfigError
from delaylab.optim import Delayed
from delaylab.optim import corrections as registry

__all__ = ["DelayedOptimizersContainer", "DelayedLRSchedulersContainer", "STAGE_ATTR", "SCHEDULE_ATTR"]

STAGE_ATTR = "_delaylab_stage"  # a model part's pipeline stage index (set by delaylab's pipelining_fn)
SCHEDULE_ATTR = "_delaylab_schedule"  # a model part's asynchronous schedule (Schedule2BW), when it has one
PER_QUEUED = ("queue", "snapshots")  # per-parameter buffers with one entry per queued gradient


class DelayedOptimizersContainer(OptimizersContainer):
    """torchtitan's optimizers, each seeing the gradient of ``delay`` steps ago (see the module)."""

    @dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        delay: int = 1
        """Updates by which every gradient is late (PipeDream-2BW: 1). 0 with a pipeline schedule
        that delays by itself (Schedule2BW), where EF still applies at ef_lag."""

        stage_delays: list[int] = field(default_factory=list)
        """One delay per pipeline stage (PipeDream: P-1-s); overrides delay when given."""

        correction: str = "none"
        """none, or a comma list of ef (error feedback), dc-asgd, dc-asgd-a, damp (delaylab.optim.Delayed;
        any valid combination, e.g. ef,damp)."""

        corrections: list[str] = field(default_factory=list)
        """The same as a list (give one of the two)."""

        ef_lag: int | None = None
        """EF's lag (default: the delay); 1 with delay 0 under Schedule2BW."""

        ef_dtype: str = "float32"
        """dtype of EF's buffer: float32 (the parameters' own) or bfloat16 (half the bytes)."""

    def __init__(self, config: Config, *, model_parts: list[nn.Module]) -> None:
        self._corrections = _check(config)
        self._stage_delays = list(config.stage_delays)
        self._virtual = None  # module-name prefixes per virtual stage (one untagged model part)
        tagged = [getattr(m, STAGE_ATTR, None) for m in model_parts]
        if self._stage_delays and any(t is None for t in tagged):
            if len(model_parts) != 1:
                raise ConfigError("stage_delays with pipeline parallelism needs delaylab's pipelining_fn "
                                  "(the model parts carry no stage index)")
            self._virtual = _virtual_stages(model_parts[0], len(self._stage_delays))
        if self._stage_delays and all(t is not None for t in tagged):
            for t in tagged:
                if t >= len(self._stage_delays):
                    raise ConfigError(f"stage_delays has {len(self._stage_delays)} entries, the model part of "
                                      f"stage {t} has none")
        self._schedules = [s for m in model_parts if (s := getattr(m, SCHEDULE_ATTR, None)) is not None]
        super().__init__(config, model_parts=model_parts)
        part_of = {id(p): i for i, m in enumerate(model_parts) for p in m.parameters()}
        # The correctors made once from the config (each Delayed binds its own copy).
        correctors = registry.build(self._corrections, ef_dtype=config.ef_dtype, ef_lag=config.ef_lag)
        self.optimizers = [
            Delayed(opt, delay=[self._group_delay(g, tagged[part_of[id(g["params"][0])]], config.delay)
                                for g in opt.param_groups],
                    corrections=correctors)
            for opt in self.optimizers
        ]
        self.updated = False  # whether the last step() made an update (for the LR schedule)
        self._placeholders: set[int] = set()  # id(inner) whose state only serves a checkpoint

    # -- the virtual stages of one model (PipeDream simulated without pipeline parallelism) -----
    def _build_param_groups(self, model, param_group_configs, impl_kwargs):
        groups, patterns = OptimizersContainer._build_param_groups(model, param_group_configs, impl_kwargs)
        if self._virtual is None:
            return groups, patterns
        for name in groups:  # one group per (pattern, stage), so that each has one delay
            split_groups, split_patterns = [], []
            for group, pattern in zip(groups[name], patterns[name]):
                by_stage: dict[int, dict] = {}
                for p, fqn in zip(group["params"], group["param_names"]):
                    g = by_stage.setdefault(self._stage_of(fqn), {**group, "params": [], "param_names": []})
                    g["params"].append(p)
                    g["param_names"].append(fqn)
                split_groups += [by_stage[s] for s in sorted(by_stage)]
                split_patterns += [pattern] * len(by_stage)
            groups[name], patterns[name] = split_groups, split_patterns
        return groups, patterns

    def _stage_of(self, fqn: str) -> int:
        for s, names in enumerate(self._virtual):
            if any(fqn == n or fqn.startswith(n + ".") for n in names):
                return s
        raise ConfigError(f"parameter {fqn} is in none of torchtitan's pipeline stages {self._virtual}")

    def _group_delay(self, group: dict, stage: int | None, delay: int) -> int:
        if not self._stage_delays:
            return delay
        if stage is None:  # virtual stages: the group's parameters all sit in one
            stage = self._stage_of(group["param_names"][0])
        return self._stage_delays[stage]

    # -- the step ---------------------------------------------------------------------------------
    def step(self, closure=None) -> None:
        assert closure is None, "DelayedOptimizersContainer does not support closures"
        self._drop_placeholders()
        if self._schedules:
            fill = not any(s.released for s in self._schedules)
        else:
            fill = not any(p.grad is not None for d in self.optimizers for g in d.param_groups for p in g["params"])
        if fill:  # a pipeline's fill: not an update
            self.updated = False
            return None
        for d in self.optimizers:
            d.step()
        self.updated = any(d.updated for d in self.optimizers)
        return None

    def flush(self) -> bool:
        """One more update per optimizer with its oldest queued gradient (``Delayed.flush``): the end
        of training applies what the simulated pipeline still holds, as a drained pipeline does."""
        self._drop_placeholders()
        for d in self.optimizers:
            d.flush()
        self.updated = any(d.updated for d in self.optimizers)
        return self.updated

    # -- DCP state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for d in self.optimizers:
            self._materialize(d.inner)
            out.update(get_flat_optim_state_dict(d.inner))
            out.update(_delay_state(d, placeholder=id(d.inner) in self._placeholders))
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for d in self.optimizers:
            self._materialize(d.inner)
            load_flat_optim_state_dict(d.inner, state_dict)
            d.param_groups = d.inner.param_groups  # torch's load_state_dict made new group dicts
            self._placeholders.discard(id(d.inner))
            if _load_delay_state(d, state_dict):  # the inner state was a placeholder when saved
                self._placeholders.add(id(d.inner))
        self._drop_placeholders()

    def _materialize(self, inner: torch.optim.Optimizer) -> None:
        """torchtitan's ``init_optim_state`` on the inner optimizer, whatever ``.grad`` holds now."""
        if inner.state:
            return
        params = [p for g in inner.param_groups for p in g["params"]]
        grads = [p.grad for p in params]
        for p in params:
            p.grad = None
        try:
            init_optim_state(inner)
        finally:
            for p, g in zip(params, grads):
                p.grad = g
        self._placeholders.add(id(inner))

    def _drop_placeholders(self) -> None:
        for d in self.optimizers:
            if id(d.inner) in self._placeholders:
                d.inner.state.clear()
        self._placeholders.clear()


class DelayedLRSchedulersContainer(LRSchedulersContainer):
    """torchtitan's warmup/stable/decay schedule, indexed by updates: each param group's lr is
    ``initial_lr * lr_lambda(updates made by that group)`` (the simulator's rule)."""

    @dataclass(kw_only=True, slots=True)
    class Config(LRSchedulersContainer.Config):
        def build(self, *, optimizers, training_steps):
            if not isinstance(optimizers, DelayedOptimizersContainer):
                raise ConfigError("DelayedLRSchedulersContainer needs DelayedOptimizersContainer's optimizers")
            plain = LRSchedulersContainer.Config.build(self, optimizers=optimizers, training_steps=training_steps)
            return DelayedLRSchedulersContainer(plain.schedulers)

    def __init__(self, schedulers: list) -> None:  # noqa: D107 - built by Config.build from torchtitan's
        self.schedulers = schedulers

    def step(self) -> None:
        for sched in self.schedulers:
            _set_lrs(sched)

    # load_state_dict: torchtitan's (``last_epoch``; DCP loads it before the optimizers, whose
    # param groups bring each group's lr back).


def _set_lrs(sched) -> None:
    opt = sched.optimizer
    updates = opt.group_updates
    for g, k, lam in zip(opt.param_groups, updates, sched.lr_lambdas):
        g["lr"] = g["initial_lr"] * lam(k)
    sched.last_epoch = min(updates)
    sched._last_lr = [g["lr"] for g in opt.param_groups]


# -- configuration -------------------------------------------------------------------------------
# Correctors that move the weights the forward runs at: they need the forward inside
# ``Delayed.predicted_weights()``, i.e. a torchtitan Trainer subclass, which this module is not.
SHIFTS_THE_FORWARD = ("predict", "lookahead")


def _check(config) -> tuple[str, ...]:
    """The corrector names (the registry's order); a one-line error for an invalid list."""
    if config.corrections and config.correction != "none":
        raise ConfigError("give correction or corrections, not both")
    names = registry.parse(list(config.corrections) or config.correction)
    shifting = [n for n in names if n in SHIFTS_THE_FORWARD]
    if shifting:
        raise ConfigError(f"correction {shifting[0]!r} is not available here: it moves the forward's weights "
                          f"(a Trainer subclass); choose from "
                          f"{', '.join(n for n in registry.NAMES if n not in SHIFTS_THE_FORWARD)}")
    if config.ef_dtype not in ("float32", "bfloat16"):
        raise ConfigError(f"ef_dtype must be float32 or bfloat16, got {config.ef_dtype!r}")
    for tau in [config.delay, *config.stage_delays] + ([] if config.ef_lag is None else [config.ef_lag]):
        if isinstance(tau, bool) or not isinstance(tau, int) or tau < 0:
            raise ConfigError(f"delays and ef_lag must be integers >= 0, got {tau!r}")
    return names


def _virtual_stages(model: nn.Module, stages: int) -> list[list[str]]:
    """Module names per stage, as torchtitan's pipeline split would assign them."""
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    layers = {m.group(1) for name, _ in model.named_parameters() if (m := re.match(r"layers\.(\d+)\.", name))}
    try:
        return _generate_llm_fqn_per_model_part(stages, len(layers))
    except ValueError as err:  # torchtitan's own check (e.g. more stages than layers)
        raise ConfigError(f"stage_delays: {err}") from None


# -- the delay state as flat DCP keys --------------------------------------------------------------
def _layout(d: Delayed, gi: int, p: torch.Tensor):
    """``(buffer, slots, dtype)`` of what ``d`` may hold for parameter ``p`` of group ``gi``."""
    ef = d.corrector("ef")
    tau = d.delays[gi]
    ef = torch.bfloat16 if ef is not None and ef.dtype == "bfloat16" else p.dtype
    for key in ("queue", *(k for c in d.correctors for k in c.keys)):
        yield key, (tau if key in PER_QUEUED else 1), (ef if key == "ef_buffer" else p.dtype)


def _params(d: Delayed):
    for gi, g in enumerate(d.param_groups):
        for p, fqn in zip(g["params"], g["param_names"]):
            yield gi, g, p, fqn


def _delay_state(d: Delayed, placeholder: bool) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for gi, g, p, fqn in _params(d):
        st = d.state.get(p, {})
        known = {key for key, _, _ in _layout(d, gi, p)}
        if set(st) - known:
            raise RuntimeError(f"Delayed holds {sorted(set(st) - known)} for {fqn}, which the checkpoint layout "
                               "does not know; extend _layout")
        for key, slots, dtype in _layout(d, gi, p):
            held = st.get(key)
            held = held if isinstance(held, list) else [held]
            present = [i < len(held) and held[i] is not None for i in range(slots)]
            for i in range(slots):
                name = f"delayed.{fqn}.{key}" + (f".{i}" if key in PER_QUEUED else "")
                out[name] = held[i] if present[i] else torch.zeros_like(p, dtype=dtype)
            out[f"delayed.{fqn}.{key}.present"] = torch.tensor(present, dtype=torch.uint8)
        if p is g["params"][0]:
            out[f"delayed.{fqn}.group"] = torch.tensor(
                [d.queue.updates[gi], d.queue.queued[gi], d.delays[gi], int(d.updated), int(placeholder)])
    return out


def _load_delay_state(d: Delayed, flat: dict[str, Any]) -> bool:
    """Restore ``d``'s queue, buffers and counters from ``flat``; whether the inner state was a placeholder."""
    placeholder = False
    for gi, g, p, fqn in _params(d):
        st: dict[str, Any] = {}
        for key, slots, _ in _layout(d, gi, p):
            present = flat[f"delayed.{fqn}.{key}.present"].tolist()
            vals = [flat[f"delayed.{fqn}.{key}" + (f".{i}" if key in PER_QUEUED else "")] if present[i] else None
                    for i in range(slots)]
            if key in PER_QUEUED:  # as many entries as the group has queued gradients
                n = int(flat[f"delayed.{g['param_names'][0]}.group"][1])
                if n:
                    st[key] = vals[:n]
            elif present[0]:
                st[key] = vals[0]
        if st:
            d.state[p] = st
        else:
            d.state.pop(p, None)
        if p is g["params"][0]:
            updates, queued, delay, updated, ph = (int(v) for v in flat[f"delayed.{fqn}.group"].tolist())
            if delay != d.delays[gi]:
                raise ConfigError(f"the checkpoint's delay for {fqn} is {delay}, this run's is {d.delays[gi]}")
            d.queue.updates[gi], d.queue.queued[gi], d.updated = updates, queued, bool(updated)
            placeholder = placeholder or bool(ph)
    return placeholder
