"""Batched optimizer runs on the toy problems, through :mod:`delaylab.optim`.

One :func:`run` advances S seeds at once: the variable is a float64 tensor ``(S, *shape)``
(or several row/coordinate blocks of it, one param group each), every call of the optimizer
gets a fresh stochastic gradient of the current weights, and the delay, the fill and the
corrections are all :class:`delaylab.optim.Delayed`'s (nothing here re-implements them).

What is measured: for the T iterates ``x_0 .. x_{T-1}`` that precede the T updates (the
iterates Theorem 1 averages over), the exact dual norm ``||grad f(x_t)||_*`` of the true
gradient in each requested norm, and ``f(x_t)``. With a delay, T updates take T + tau calls
(Delayed's fill), so the first tau calls leave x_0 in place and are not counted twice.

:func:`run` steps the registry's methods on one batched tensor ``(S, *shape)``;
:func:`run_optimizer` steps any torch optimizer on S tensors of shape ``shape``; both go through
one loop (``_drive``). A seed that blows up (:data:`DIVERGED`) is measured as inf from then on.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from delaylab.errors import ConfigError
from delaylab.optim import CombinedOptimizer, Delayed, LMOMomentum, corrections, primal_norm
from delaylab.optim.lmo import dual_norm
from delaylab.toy.problems import Problem


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    norm: str | None  # the LMO norm; None for the linear-in-gradient methods

    @property
    def measure_norm(self) -> str:
        """The norm the method's own guarantee speaks about (l2 for SGD-M and Adam)."""
        return self.norm or "l2"


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("lmo-spectral", "LMOMomentum, spectral ball (Muon, exact polar factor)", "spectral"),
        Method("lmo-sign", "LMOMomentum, l_inf ball (Signum / sign descent)", "sign"),
        Method("lmo-l2", "LMOMomentum, l2 ball (normalized SGD with momentum)", "l2"),
        Method("sgdm", "torch SGD with (heavy-ball) momentum", None),
        Method("adam", "torch Adam, betas = (beta, 0.999)", None),
    )
}
ADAM_BETA2 = 0.999


def sgdm_lr(eta: float, beta: float) -> float:
    """torch SGD's lr for the EMA-momentum step ``eta`` of the theory (Theorem 4)."""
    return eta * (1.0 - beta)


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError(f"unknown method {name!r}; expected one of {', '.join(METHODS)}") from None


@dataclass
class Trajectory:
    """Per-iterate measurements of one batched run (tensors ``(T, S)``, float64)."""

    grad_norm: dict[str, torch.Tensor]
    value: torch.Tensor
    final_value: torch.Tensor  # f(x_T), (S,)
    direction_change: torch.Tensor | None  # ||D_t - D_{t-1}|| of the inner LMO directions
    config: dict = field(default_factory=dict)
    diverged: torch.Tensor | None = None  # (S,) bool: the seed's iterate blew up (see DIVERGED)

    @property
    def steps(self) -> int:
        return int(self.value.shape[0])

    def mean_grad_norm(self, norm: str) -> torch.Tensor:
        """``(1/T) sum_t ||grad f(x_t)||_*`` per seed, shape (S,)."""
        return self.grad_norm[norm].mean(dim=0)

    def at_gradient_points(self, norm: str, tau: int) -> torch.Tensor:
        """``||grad f(x_{max(t - tau, 0)})||_*`` for t < T: the norms at the points where the
        applied gradients were taken (the metric of the EF and SGD-M bounds), shape (T, S)."""
        idx = (torch.arange(self.steps) - tau).clamp(min=0)
        return self.grad_norm[norm][idx]

    def delta_bar(self) -> torch.Tensor:
        """Mean direction drift ``(1/T) sum_{t<T} ||D_t - D_{t-1}||`` (D_{-1} = 0) per seed.

        It sums every term of Assumption A5's mean (and one more), so it is an upper estimate.
        """
        if self.direction_change is None:
            raise ConfigError("direction drift is recorded for single-block LMO runs only")
        return self.direction_change.mean(dim=0)


def _inner(method: Method, params: list[torch.Tensor], lr: float, beta: float):
    groups = [{"params": [p]} for p in params]
    if method.norm is not None:
        return LMOMomentum(groups, lr=lr, beta=beta, norm=method.norm, batch_dims=1, method="svd")
    if method.name == "sgdm":
        # torch's buffer b = beta b + g is 1/(1-beta) times the EMA m = beta m + (1-beta) g
        # started at m_{-1} = 0, so lr is the theory's eta times (1 - beta); see sgdm_lr.
        return torch.optim.SGD(groups, lr=lr, momentum=beta)
    return torch.optim.Adam(groups, lr=lr, betas=(beta, ADAM_BETA2))


def _check(problem: Problem, method: Method, lr, beta, steps, seeds, delays, norms) -> None:
    if not (lr > 0 and math.isfinite(lr)):
        raise ConfigError(f"lr must be a finite number > 0, got {lr}")
    if not 0.0 <= beta < 1.0:
        raise ConfigError(f"beta must be in [0, 1), got {beta}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps (T) must be an integer >= 1, got {steps!r}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ConfigError(f"seeds must be an integer >= 1, got {seeds!r}")
    if method.norm is not None:
        problem.check_norm(method.norm)
    for n in norms:
        problem.check_norm(n)
    if not delays or len(delays) > problem.shape[0]:
        raise ConfigError(f"need between 1 and {problem.shape[0]} delay blocks, got {len(delays)}")


def run(
    problem: Problem,
    method: str,
    *,
    lr: float,
    beta: float,
    steps: int,
    seeds: int = 8,
    seed: int = 0,
    delay: int | Sequence[int] = 0,
    correction: str = "none",
    norms: Sequence[str] | None = None,
    dc_lambda: float | None = None,
    directions: bool | None = None,
) -> Trajectory:
    """Run ``method`` for ``steps`` updates on ``seeds`` independent copies of ``problem``.

    ``delay`` is a tau for the whole variable, or a list of taus: the variable is then split
    into ``len(delay)`` blocks along its first axis (coordinates of a vector, rows of a
    matrix), one param group each, and block l sees gradients ``delay[l]`` steps old
    (the original PipeDream's stage-dependent delay). For the LMO methods a split changes
    the geometry to the product of the blocks' balls, except for the sign (l_inf) LMO.
    ``correction`` is Delayed's (``"none"``, ``"ef"``, ``"dc-asgd"``). ``norms`` are the
    dual norms recorded (default: the method's own). ``directions`` records the drift of the
    inner LMO directions (default: for EF runs, whose bound needs it). Raises ValueError on
    bad input.
    """
    m = get_method(method)
    delays = [int(delay)] if isinstance(delay, int) else [int(d) for d in delay]
    norms = tuple(norms) if norms is not None else (m.measure_norm,)
    _check(problem, m, lr, beta, steps, seeds, delays, norms)

    x0 = problem.initial_point(seeds)
    blocks = len(delays)
    params = [b.clone() for b in torch.tensor_split(x0, blocks, dim=1)] if blocks > 1 else [x0]
    extra = {} if dc_lambda is None else {"dc_lambda": dc_lambda}
    opt = Delayed(_inner(m, params, lr, beta), delay=delays, corrections=corrections.build(correction, **extra),
                  total_steps=steps)
    if directions is None:
        directions = correction == "ef"
    track = m.norm if directions and blocks == 1 else None
    # Block l is param group l, so its own update counter says when it has a new iterate.
    layout = _Layout(
        params=params,
        units=lambda: [p.detach().clone() for p in params],
        counts=lambda: opt.group_updates,
        join=lambda xs: xs[0] if blocks == 1 else torch.cat(xs, dim=1),
        current=lambda: params[0] if blocks == 1 else torch.cat(params, dim=1),
        split=(lambda g: [g]) if blocks == 1 else (lambda g: [b.contiguous() for b in torch.tensor_split(g, blocks, dim=1)]),
    )
    lag = delays[0] if correction == "ef" else 0
    traj = _drive(problem, opt, layout, x0, steps=steps, seed=seed, norms=norms, track=track, lr=lr, lag=lag)
    traj.config = dict(
        problem=problem.name,
        method=method,
        lr=lr,
        beta=beta,
        steps=steps,
        seeds=seeds,
        seed=seed,
        delay=delays[0] if blocks == 1 else delays,
        correction=correction,
    )
    return traj


OptimizerFactory = Callable[[list], torch.optim.Optimizer]
"""``make_optimizer(params) -> torch.optim.Optimizer``: any torch optimizer over a list of tensors."""


def build(make_optimizer: OptimizerFactory, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """``make_optimizer(params)``, checked: a ConfigError if it raises or returns no Optimizer."""
    name = getattr(make_optimizer, "__qualname__", None) or repr(make_optimizer)
    try:
        opt = make_optimizer(params)
    except Exception as err:  # the user's code: report what it said, in one line
        raise ConfigError(f"optimizer factory {name} failed on parameters of shape "
                          f"{tuple(params[0].shape)}: {type(err).__name__}: {err}") from err
    if not isinstance(opt, torch.optim.Optimizer):
        raise ConfigError(f"optimizer factory {name} returned {type(opt).__name__}, "
                          "not a torch.optim.Optimizer")
    return opt


def scale_lr(opt: torch.optim.Optimizer, scale: float) -> float:
    """Multiply every group's lr by ``scale`` (keeping their ratios); returns group 0's new lr."""
    for g in opt.param_groups:
        g["lr"] = g["lr"] * scale
    return float(opt.param_groups[0]["lr"])


def run_optimizer(
    problem: Problem,
    make_optimizer: OptimizerFactory,
    *,
    steps: int,
    lr_scale: float = 1.0,
    lr: float | None = None,
    seeds: int = 8,
    seed: int = 0,
    delay: int = 0,
    correction: str = "none",
    norms: Sequence[str] = ("l2",),
    per_seed_optimizers: bool = False,
    direction_norm: str | None = None,
) -> Trajectory:
    """:func:`run` for any torch optimizer: one parameter per seed, shape ``problem.shape``.

    ``make_optimizer(params)`` gets the S per-seed tensors (so per-parameter optimizers such as
    ``torch.optim.Muon``, which want 2-D parameters, see ordinary matrices); every group's lr
    is then multiplied by ``lr_scale`` (or set to ``lr``, if given). The seeds are independent runs only if the optimizer
    treats its parameters independently; one with group-level statistics (a global norm, a
    shared trust ratio) couples them, and ``per_seed_optimizers=True`` then builds one
    optimizer per seed (a :class:`~delaylab.optim.CombinedOptimizer`), at S times the Python
    cost per step. ``direction_norm``: record the drift of ``D_t = (x_{t+1} - x_t)/lr`` in
    that norm, for an optimizer that declares itself an LMO method (the EF bound needs it).
    The noise, the delay and the measurements are :func:`run`'s, so a registry method built
    by a factory gives :func:`run`'s numbers (tests/toy/test_profile.py).
    """
    for name, v in (("lr_scale", lr_scale), ("lr", 1.0 if lr is None else lr)):
        if not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"{name} must be a finite number > 0, got {v}")
    for n in norms:
        problem.check_norm(n)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps (T) must be an integer >= 1, got {steps!r}")
    x0 = problem.initial_point(seeds)
    params = [x.clone() for x in x0.unbind(0)]
    if per_seed_optimizers:
        inner = CombinedOptimizer([build(make_optimizer, [p]) for p in params])
    else:
        inner = build(make_optimizer, params)
    if lr is not None:
        for g in inner.param_groups:
            g["lr"] = lr
    lr = scale_lr(inner, lr_scale)
    opt = Delayed(inner, delay=int(delay), corrections=correction, total_steps=steps)
    # All groups share one delay, so they update together: one unit, the stacked seeds.
    layout = _Layout(
        params=params,
        units=lambda: [torch.stack([p.detach() for p in params])],
        counts=lambda: [opt.num_updates],
        join=lambda xs: xs[0],
        current=lambda: torch.stack(params),
        split=lambda g: list(g.unbind(0)),
    )
    lag = int(delay) if correction == "ef" else 0
    traj = _drive(problem, opt, layout, x0, steps=steps, seed=seed, norms=tuple(norms), track=direction_norm,
                  lr=lr, lag=lag)
    name = getattr(make_optimizer, "__qualname__", None) or type(inner).__name__
    traj.config = dict(problem=problem.name, method=name, lr=lr, lr_scale=lr_scale, steps=steps, seeds=seeds,
                       seed=seed, delay=int(delay), correction=correction)
    return traj


DIVERGED = 1e6
"""A seed whose iterate has an entry above DIVERGED * max(1, max|x0|) (or a NaN) has diverged:
from then on it is measured as inf and evaluated at x0, so the problem never sees overflow."""


@dataclass
class _Layout:
    """How the optimizer's tensors map to the variable ``x`` of shape ``(S, *shape)``."""

    params: list[torch.Tensor]  # what the optimizer steps
    units: Callable[[], list[torch.Tensor]]  # copies of the parts whose iterates are tracked
    counts: Callable[[], list[int]]  # updates made so far, per unit
    join: Callable[[list[torch.Tensor]], torch.Tensor]  # units -> x
    current: Callable[[], torch.Tensor]  # the weights now, (S, *shape): blocks may run ahead of x
    split: Callable[[torch.Tensor], list[torch.Tensor]]  # gradient (S, *shape) -> one per param


def _safe(x: torch.Tensor, x0: torch.Tensor, diverged: torch.Tensor) -> torch.Tensor:
    """x with the diverged seeds put back at x0 (their measurements are inf anyway)."""
    if not diverged.any():
        return x
    return torch.where(diverged.view(-1, *[1] * (x.ndim - 1)), x0, x)


def _drive(problem: Problem, opt: Delayed, layout: _Layout, x0: torch.Tensor, *, steps: int, seed: int,
           norms: tuple[str, ...], track: str | None, lr: float, lag: int) -> Trajectory:
    """The measuring loop shared by :func:`run` and :func:`run_optimizer` (module docstring)."""
    seeds = x0.shape[0]
    gen = torch.Generator().manual_seed(seed)
    grad_norm = {n: torch.empty(steps, seeds, dtype=x0.dtype) for n in norms}
    value = torch.empty(steps, seeds, dtype=x0.dtype)
    # Directions D_t, read back from the iterates (one unit only): plain and delayed
    # x_{t+1} = x_t + lr D_t; EF with lag l: x_{t+1} = x_t + lr ((l+1) D_t - l D_{t-1}).
    change = torch.empty(steps, seeds, dtype=x0.dtype) if track else None
    prev_x, prev_d = None, torch.zeros_like(x0)
    limit = DIVERGED * max(1.0, float(x0.abs().max()))
    diverged = torch.zeros(seeds, dtype=torch.bool)
    single = len(layout.counts()) == 1

    # history[l][j] is unit l after (recorded + j) of its own updates; blocks with shorter
    # delays run ahead, so x_t is assembled once every unit has made t updates. With one
    # unit the newest iterate is always the current weights, whose true gradient the
    # oracle reuses (``current``).
    history = [deque([u]) for u in layout.units()]
    recorded, final, current = 0, None, None

    while final is None:
        while all(history):
            x = layout.join([h[0] for h in history])
            if track and prev_x is not None:
                d = ((x - prev_x) / lr + lag * prev_d) / (lag + 1)
                change[recorded - 1] = primal_norm(d - prev_d, track, batch_dims=1)
                prev_d = d
            prev_x = x
            for h in history:
                h.popleft()
            diverged |= ~(x.abs().flatten(1).amax(dim=1) <= limit)  # NaN compares False
            x_eval = _safe(x, x0, diverged)
            if recorded == steps:
                final = problem.value(x_eval).masked_fill(diverged, math.inf)
                break
            f, g = problem.value_and_grad(x_eval)
            if single:
                current = g
            for n in norms:
                grad_norm[n][recorded] = dual_norm(g, n, batch_dims=1).masked_fill(diverged, math.inf)
            value[recorded] = f.masked_fill(diverged, math.inf)
            recorded += 1
        if final is not None:
            break
        before = layout.counts()
        g = problem.sample_grad(_safe(layout.current(), x0, diverged), gen, grad=current)
        for p, gp in zip(layout.params, layout.split(g)):
            p.grad = gp
        opt.step()
        after = layout.counts()
        if after != before:
            for h, u, b, a in zip(history, layout.units(), before, after):
                if a > b:
                    h.append(u)
                    current = None
        for p in layout.params:
            p.grad = None

    return Trajectory(grad_norm, value, final, change, diverged=diverged)
