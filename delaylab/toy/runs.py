"""Batched optimizer runs on the toy problems, through :mod:`delaylab.optim`.

One :func:`run` advances S seeds at once: the variable is a float64 tensor ``(S, *shape)``
(or several row/coordinate blocks of it, one param group each), every call of the optimizer
gets a fresh stochastic gradient of the current weights, and the delay, the fill and the
corrections are all :class:`delaylab.optim.Delayed`'s (nothing here re-implements them).

What is measured: for the T iterates ``x_0 .. x_{T-1}`` that precede the T updates (the
iterates Theorem 1 averages over), the exact dual norm ``||grad f(x_t)||_*`` of the true
gradient in each requested norm, and ``f(x_t)``. With a delay, T updates take T + tau calls
(Delayed's fill), so the first tau calls leave x_0 in place and are not counted twice.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

import torch

from delaylab.optim import Delayed, LMOMomentum, primal_norm
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
        raise ValueError(f"unknown method {name!r}; expected one of {', '.join(METHODS)}") from None


@dataclass
class Trajectory:
    """Per-iterate measurements of one batched run (tensors ``(T, S)``, float64)."""

    grad_norm: dict[str, torch.Tensor]
    value: torch.Tensor
    final_value: torch.Tensor  # f(x_T), (S,)
    direction_change: torch.Tensor | None  # ||D_t - D_{t-1}|| of the inner LMO directions
    config: dict = field(default_factory=dict)

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
            raise ValueError("direction drift is recorded for single-block LMO runs only")
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
        raise ValueError(f"lr must be a finite number > 0, got {lr}")
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta must be in [0, 1), got {beta}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps (T) must be an integer >= 1, got {steps!r}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"seeds must be an integer >= 1, got {seeds!r}")
    if method.norm is not None:
        problem.check_norm(method.norm)
    for n in norms:
        problem.check_norm(n)
    if not delays or len(delays) > problem.shape[0]:
        raise ValueError(f"need between 1 and {problem.shape[0]} delay blocks, got {len(delays)}")


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
    opt = Delayed(_inner(m, params, lr, beta), delay=delays, correction=correction, total_steps=steps, **extra)
    gen = torch.Generator().manual_seed(seed)

    grad_norm = {n: torch.empty(steps, seeds, dtype=x0.dtype) for n in norms}
    value = torch.empty(steps, seeds, dtype=x0.dtype)
    # Directions D_t of the inner LMO, read back from the iterates (single block only): plain
    # and delayed x_{t+1} = x_t + lr D_t; EF with lag l: x_{t+1} = x_t + lr ((l+1) D_t - l D_{t-1}).
    if directions is None:
        directions = correction == "ef"
    track = bool(directions) and m.norm is not None and blocks == 1
    lag = delays[0] if correction == "ef" else 0
    change = torch.empty(steps, seeds, dtype=x0.dtype) if track else None
    prev_x, prev_d = None, torch.zeros_like(x0)

    # history[l][j] is block l after (recorded + j) of its own updates; blocks with shorter
    # delays run ahead, so x_t is assembled once every block has made t updates. With one
    # block the newest iterate is always the current weights, whose true gradient the
    # oracle reuses (``current``).
    history = [deque([p.detach().clone()]) for p in params]
    recorded, final, current = 0, None, None

    while final is None:
        while all(history):
            x = history[0][0] if blocks == 1 else torch.cat([h[0] for h in history], dim=1)
            if track and prev_x is not None:
                d = ((x - prev_x) / lr + lag * prev_d) / (lag + 1)
                change[recorded - 1] = primal_norm(d - prev_d, m.norm, batch_dims=1)
                prev_d = d
            prev_x = x
            for h in history:
                h.popleft()
            if recorded == steps:
                final = problem.value(x)
                break
            f, g = problem.value_and_grad(x)
            if blocks == 1:
                current = g
            for n in norms:
                grad_norm[n][recorded] = dual_norm(g, n, batch_dims=1)
            value[recorded] = f
            recorded += 1
        if final is not None:
            break
        before = opt.group_updates
        x = params[0] if blocks == 1 else torch.cat(params, dim=1)
        g = problem.sample_grad(x, gen, grad=current)
        parts = [g] if blocks == 1 else [b.contiguous() for b in torch.tensor_split(g, blocks, dim=1)]
        for p, gp in zip(params, parts):
            p.grad = gp
        opt.step()
        for p, h, b, a in zip(params, history, before, opt.group_updates):
            if a > b:
                h.append(p.detach().clone())
                current = None
            p.grad = None

    config = dict(
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
    return Trajectory(grad_norm, value, final, change, config)
