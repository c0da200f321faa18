r"""The noisy quadratic model (NQM) under a gradient delay: expected loss curves, exactly.

Zhang et al. 2019, "Which Algorithmic Choices Matter at Which Batch Sizes? Insights From a
Noisy Quadratic Model", arXiv:1907.04164. The loss is

.. math:: L(x) = \sum_i w_i h_i x_i^2 / 2,

one node ``i`` per eigendirection (or per bin of a spectral density: ``w_i`` directions with
curvature ``h_i``), the stochastic gradient ``h_i x_i + xi_i`` with ``Var xi_i = c_i / B``,
independent across steps. For every method that is linear in the gradients (SGD, heavy ball,
EMA momentum, a fixed diagonal preconditioner ``p_i`` as the NQM's model of Adam, decoupled
weight decay) and every linear correction (EF at lag ``l``, weight prediction, lr damping),
each direction is a linear system driven by noise, with the state

``s_t = (x_t, y_{t-1}, ..., y_{t-tau}, m_{t-1})``   (tau + 2 numbers),

``y_s`` the point gradient ``s`` was taken at (``x_s``, or the predicted weights). So
``s_{t+1} = A_t s_t + b_t xi_t`` and its second moment ``S_{t+1} = A_t S_t A_t^T + (c/B) b_t b_t^T``
is exact: :func:`expected_loss`. A random delay drawn afresh each step (independent of
everything else) averages ``A_t S A_t^T`` over its distribution, still exact. At a constant lr
the stationary ``S`` solves the discrete Lyapunov equation ``S = A S A^T + Q`` (scipy):
:func:`stationary_loss`. The noiseless part is the recursion of :mod:`delaylab.theory.stability`
(its characteristic polynomial is ``det(zI - A)``): :func:`max_stable` finds the same limits.

One step ``t`` (the delay queue of :mod:`delaylab.optim.queue`: the first ``tau`` calls only
fill it, no update), with ``a_t = lr_t p_i / (1 + damping tau)`` and ``c_g`` = 1 (heavy ball) or
``1 - beta`` (EMA, Adam)::

    y_t     = x_t - k a_{t-1} m_{t-1}                 k = tau with prediction, else 0
    g_t     = h y_{t-tau} + xi_t
    m_t     = beta m_{t-1} + c_g g_t
    x_{t+1} = (1 - lr_t wd) x_t - (l+1) a_t m_t + l a_{t-1} m_{t-1}     l = EF's lag, else 0

Methods that are not linear (sign descent, AdamW with its running second moment, Muon's
orthogonalized step on a matrix-shaped quadratic) have no closed recursion: :func:`monte_carlo`
simulates them (and, as the independent check of the recursion, the linear ones) over many
runs and returns the mean loss with its standard error.

This module imports no other delaylab package (``delaylab.errors`` aside).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from delaylab.errors import ConfigError, MissingFile

SPECTRUM_FORMAT = "delaylab-spectrum-1"  # what `delaylab llm spectrum` writes (delaylab.llm.spectrum)

LINEAR = ("sgd", "heavyball", "ema", "adam")  # adam: EMA momentum with the fixed diagonal preconditioner p
NONLINEAR = ("sign", "adamw", "muon")
SCHEDULES = ("constant", "cosine", "wsd")
DIVERGED = 100.0  # an expected loss this many times its start is reported as diverged (no run survives it), not printed


@dataclass
class Spectrum:
    """Nodes of the quadratic: curvature ``h``, multiplicity ``w``, noise ``c`` (per example) and
    ``x0sq = E[x_0^2]`` per node; ``p`` the fixed diagonal preconditioner (1: none)."""

    h: np.ndarray
    c: np.ndarray
    x0sq: np.ndarray
    w: np.ndarray = None
    p: np.ndarray = None

    def __post_init__(self):
        self.h = np.atleast_1d(np.asarray(self.h, dtype=float))
        n = self.h.size

        def full(v, default):
            return np.broadcast_to(np.asarray(default if v is None else v, dtype=float), (n,)).copy()

        self.c, self.x0sq = full(self.c, 0.0), full(self.x0sq, 0.0)
        self.w, self.p = full(self.w, 1.0), full(self.p, 1.0)
        for name in ("h", "c", "x0sq", "w", "p"):
            v = getattr(self, name)
            if not np.all(np.isfinite(v)) or np.any(v < 0):
                raise ConfigError(f"spectrum {name} must be finite and >= 0")

    def loss(self, xsq: np.ndarray) -> np.ndarray:
        """sum_i w_i h_i E[x_i^2] / 2 along the last axis."""
        return 0.5 * np.sum(self.w * self.h * xsq, axis=-1)


def lr_factors(steps: int, schedule: str = "cosine", warmup: int | None = None, min_lr_ratio: float = 0.1,
               wsd_decay: float = 0.2) -> np.ndarray:
    """Multiplier of the peak lr at each update: the formula of ``delaylab.llm.config.lr_factor``
    (linear warmup, default 5% of steps, then cosine / WSD / constant), repeated here because
    theory imports nothing of llm (a test holds the two equal)."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"unknown lr schedule {schedule!r}; choose from {', '.join(SCHEDULES)}")
    if int(steps) != steps or steps < 1:
        raise ConfigError(f"steps must be an integer >= 1, got {steps}")
    if not (0.0 <= min_lr_ratio <= 1.0) or not (0.0 < wsd_decay <= 1.0):
        raise ConfigError(f"min_lr_ratio must be in [0, 1] and wsd_decay in (0, 1], got {min_lr_ratio}, {wsd_decay}")
    warmup = steps // 20 if warmup is None else int(warmup)
    if not 0 <= warmup <= steps:
        raise ConfigError(f"warmup must be in [0, steps], got {warmup}")
    out = np.empty(steps)
    for k in range(steps):
        if k < warmup:
            out[k] = (k + 1) / warmup
        elif schedule == "constant":
            out[k] = 1.0
        elif schedule == "cosine":
            progress = (k - warmup) / max(1, steps - 1 - warmup)
            out[k] = min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        else:
            decay = max(1, round(wsd_decay * steps))
            start = steps - decay
            out[k] = 1.0 if k < start else 1.0 - (1 - min_lr_ratio) * (k - start + 1) / decay
    return out


@dataclass
class Method:
    """A linear method and its corrections.

    ``name``: sgd (beta 0), heavyball (m = beta m + g), ema (m = beta m + (1-beta) g) or adam
    (ema with the spectrum's preconditioner p). ``delay``: an int, or a dict {tau: probability}
    for a delay drawn afresh each step. ``ef``: EF's lag (None: no EF; default lag = the delay).
    ``predict``: weight prediction by the delay; ``damping``: lr / (1 + damping tau)."""

    name: str = "ema"
    beta: float = 0.9
    delay: int | dict = 0
    ef: float | None = None
    predict: bool = False
    damping: float = 0.0
    weight_decay: float = 0.0
    sync_start: int = 0
    sync_cooldown: int = 0
    delays: dict = field(init=False, repr=False)

    def __post_init__(self):
        if self.name not in LINEAR + NONLINEAR:
            raise ConfigError(f"unknown method {self.name!r}; choose from {', '.join(LINEAR + NONLINEAR)}")
        if not (0.0 <= self.beta < 1.0):
            raise ConfigError(f"beta must be in [0, 1), got {self.beta}")
        if self.name == "sgd" and self.beta != 0:
            raise ConfigError("sgd has no momentum: beta = 0 (or heavyball / ema)")
        d = self.delay if isinstance(self.delay, dict) else {self.delay: 1.0}
        for tau, prob in d.items():
            if isinstance(tau, bool) or int(tau) != tau or tau < 0:
                raise ConfigError(f"delay must be an integer >= 0, got {tau!r}")
            if not prob >= 0:
                raise ConfigError(f"delay probabilities must be >= 0, got {prob}")
        total = sum(d.values())
        if not abs(total - 1.0) < 1e-9:
            raise ConfigError(f"delay probabilities must sum to 1, got {total}")
        self.delays = {int(t): float(p) for t, p in d.items() if p > 0}
        if self.ef is not None and not self.ef >= 0:
            raise ConfigError(f"EF lag must be >= 0, got {self.ef}")
        if not self.damping >= 0 or not self.weight_decay >= 0:
            raise ConfigError("damping and weight decay must be >= 0")
        if self.sync_start < 0 or self.sync_cooldown < 0:
            raise ConfigError("sync_start and sync_cooldown must be >= 0")

    def phases(self, steps: int) -> list[tuple[bool, bool]]:
        """(delayed phase, updates) per call: the queue's rules (delaylab.optim.queue): calls
        ``k < sync_start`` and ``k >= steps - sync_cooldown`` are undelayed; entering a delayed
        phase costs a fill of ``tau`` calls that make no update (fixed delays only)."""
        out, start = [], None
        for t in range(steps):
            delayed = self.tau_max > 0 and self.sync_start <= t < steps - self.sync_cooldown
            if delayed and start is None:
                start = t
            if not delayed:
                start = None
            fill = delayed and len(self.delays) == 1 and t - start < self.tau_max
            out.append((delayed, not fill))
        return out

    @property
    def tau_max(self) -> int:
        return max(self.delays)

    @property
    def tau_mean(self) -> float:
        return sum(t * p for t, p in self.delays.items())

    @property
    def grad_weight(self) -> float:
        return 1.0 - self.beta if self.name in ("ema", "adam", "sign", "adamw", "muon") else 1.0

    @property
    def lag(self) -> float:
        return 0.0 if self.ef is None else float(self.ef)


def _damp(method: Method, delayed: bool) -> float:
    tau = method.tau_mean if delayed else 0.0
    return 1.0 / (1.0 + method.damping * tau) if tau > 0 else 1.0


def _transitions(spec: Spectrum, method: Method, lr_prev: float, lr: float, updating: bool, delayed: bool = True):
    """[(prob, A)] with A of shape (n, k, k), and b of shape (n, k), for one step (see module doc).

    ``updating`` False: a fill call of the delay queue (push y_t only); ``delayed`` False: a
    synchronous call (sync start / cooldown: no delay, no correction). ``lr_prev``: the
    (damped) lr of the last update made, the one u_{t-1} = lr_prev p m_{t-1} was made with."""
    n, K = spec.h.size, method.tau_max
    k = K + 2
    iX, iM = 0, K + 1
    q = lambda j: j  # noqa: E731  queue slot of y_{t-j}, j = 1..K
    tau_eff = method.tau_mean if delayed else 0.0
    p = spec.p if method.name == "adam" else np.ones(n)
    a_prev, a = lr_prev * p, lr * p * _damp(method, delayed)
    kp = tau_eff if (method.predict and tau_eff > 0) else 0.0
    lag = method.lag if tau_eff > 0 else 0.0
    cg = method.grad_weight
    y = np.zeros((n, k))
    y[:, iX] = 1.0
    y[:, iM] -= kp * a_prev
    out = []
    for tau, prob in (method.delays.items() if delayed else [(0, 1.0)]):
        A = np.zeros((n, k, k))
        b = np.zeros((n, k))
        for j in range(K, 1, -1):  # the queue shifts: y_{t-j} <- y_{t-j+1}
            A[:, q(j), q(j - 1)] = 1.0
        if K:
            A[:, q(1)] = y
        if not updating:
            A[:, iX, iX] = 1.0
            A[:, iM, iM] = 1.0
            out.append((prob, A, b))
            continue
        src = y if tau == 0 else np.eye(k)[q(tau)][None, :].repeat(n, 0)
        g = spec.h[:, None] * src
        m = cg * g
        m[:, iM] += method.beta
        A[:, iM] = m
        A[:, iX] = -(lag + 1) * a[:, None] * m
        A[:, iX, iX] += 1.0 - lr * method.weight_decay
        A[:, iX, iM] += lag * a_prev
        b[:, iM] = cg
        b[:, iX] = -(lag + 1) * a * cg
        out.append((prob, A, b))
    return out


def _check_linear(method: Method) -> None:
    if method.name not in LINEAR:
        raise ConfigError(f"{method.name} is not linear in the gradients: use monte_carlo (no exact recursion)")


def expected_loss(spec: Spectrum, method: Method, lrs, batch: int = 1, per_node: bool = False):
    """E[L(x_t)] for t = 0..T (``lrs``: the lr of each of the T calls), exact.

    ``per_node``: also return E[x_t^2] per node, shape (T+1, n)."""
    _check_linear(method)
    lrs = np.asarray(lrs, dtype=float)
    if batch < 1:
        raise ConfigError(f"batch must be >= 1, got {batch}")
    n, K = spec.h.size, method.tau_max
    k = K + 2
    v = np.zeros(k)
    v[: K + 1] = 1.0  # x_0 and the (unused until filled) queue
    v[K + 1] = 0.0
    S = spec.x0sq[:, None, None] * np.outer(v, v)[None]
    xsq = np.empty((lrs.size + 1, n))
    xsq[0] = S[:, 0, 0]
    noise = spec.c / batch
    lr_prev = 0.0
    for t, (lr, (delayed, updating)) in enumerate(zip(lrs, method.phases(lrs.size))):
        new = np.zeros_like(S)
        for prob, A, b in _transitions(spec, method, lr_prev, lr, updating, delayed):
            new += prob * (np.einsum("nij,njk,nlk->nil", A, S, A) + noise[:, None, None] * b[:, :, None] * b[:, None, :])
        S = new
        if updating:
            lr_prev = lr * _damp(method, delayed)
        xsq[t + 1] = S[:, 0, 0]
        if not np.all(np.isfinite(S[:, 0, 0])):
            xsq[t + 1:] = np.inf
            break
    loss = spec.loss(xsq)
    return (loss, xsq) if per_node else loss


def diverged(loss: np.ndarray, start: float) -> bool:
    """True where the predicted loss left any meaningful range (inf, NaN, or DIVERGED x the start)."""
    end = float(np.asarray(loss)[-1])
    return not math.isfinite(end) or end > DIVERGED * max(start, 1e-300)


def stationary_loss(spec: Spectrum, method: Method, lr: float, batch: int = 1) -> float:
    """lim_t E[L(x_t)] at a constant lr, by a Lyapunov solve per node (scipy); inf where unstable."""
    from scipy.linalg import solve_discrete_lyapunov

    _check_linear(method)
    if method.weight_decay:
        raise ConfigError("stationary_loss: weight decay moves the minimum; none here")
    trans = _transitions(spec, method, lr * _damp(method, True), lr, True)
    n = spec.h.size
    xsq = np.zeros(n)
    for i in range(n):
        if spec.h[i] == 0:  # a flat direction never moves and adds nothing to the loss
            continue
        if len(trans) == 1:
            _, A, b = trans[0]
            if np.max(np.abs(np.linalg.eigvals(A[i]))) >= 1.0:
                return math.inf
            Q = spec.c[i] / batch * np.outer(b[i], b[i])
            xsq[i] = solve_discrete_lyapunov(A[i], Q)[0, 0]
        else:  # a random delay: vec S = sum_j p_j (A_j kron A_j) vec S + vec Q
            k = trans[0][1].shape[1]
            T = sum(p * np.kron(A[i], A[i]) for p, A, _ in trans)
            if np.max(np.abs(np.linalg.eigvals(T))) >= 1.0:
                return math.inf
            Q = spec.c[i] / batch * np.outer(trans[0][2][i], trans[0][2][i])
            xsq[i] = np.linalg.solve(np.eye(k * k) - T, Q.ravel()).reshape(k, k)[0, 0]
    return float(spec.loss(xsq))


def spectral_radius(method: Method, eta_h: float) -> float:
    """Largest |eigenvalue| of the noiseless A at lr * h = eta_h (one node, constant lr)."""
    _check_linear(method)
    spec = Spectrum(h=[1.0], c=[0.0], x0sq=[1.0])
    (_, A, _), = _transitions(spec, method, eta_h * _damp(method, True), eta_h, True)
    return float(np.max(np.abs(np.linalg.eigvals(A[0]))))


def max_stable(method: Method, rtol: float = 1e-12) -> float:
    """The largest eta*h with every smaller one stable (spectral radius of A < 1): geometric scan, bisection.

    Compare :func:`delaylab.theory.stability.max_stable` (Schur-Cohn on the characteristic polynomial)."""
    if len(method.delays) != 1:
        raise ConfigError("max_stable: one fixed delay (the stability module has no random delays)")
    stable = lambda x: spectral_radius(method, x) < 1.0  # noqa: E731
    lo, hi = 1e-9, 1e-9 * 1.05
    if not stable(lo):
        return 0.0
    while stable(hi):
        lo, hi = hi, hi * 1.05
        if hi > 1e6:
            return math.inf
    while hi - lo > rtol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if stable(mid) else (lo, mid)
    return lo


# ----------------------------------------------------------------------------- Monte Carlo


def _orth(M, steps: int = 5):
    """Muon's orthogonalization of each matrix in the batch: torch.optim.Muon's quintic
    Newton-Schulz iteration (5 steps, its coefficients), which maps the singular values to
    about 0.7..1.2 rather than exactly 1 (what the real optimizer does), in float64; 50x cheaper
    than an SVD here."""
    a, b, c = 3.4445, -4.7750, 2.0315
    wide = M.shape[-2] > M.shape[-1]
    X = np.swapaxes(M, -1, -2) if wide else M
    X = X / (np.linalg.norm(X, axis=(-2, -1), keepdims=True) + 1e-7)
    for _ in range(steps):
        A = X @ np.swapaxes(X, -1, -2)
        X = a * X + (b * A + c * A @ A) @ X
    return np.swapaxes(X, -1, -2) if wide else X


def monte_carlo(spec: Spectrum, method: Method, lrs, batch: int = 1, runs: int = 10000, seed: int = 0,
                shape: tuple[int, int] | None = None, eps: float = 1e-8, beta2: float = 0.999, nesterov: bool = False,
                chunk: int = 20000):
    """Mean loss curve over ``runs`` simulated runs and its standard error: (mean, se), each (T+1,).

    A direct simulation (a queue of evaluation points, the optimizer's buffers), independent of
    :func:`expected_loss`. Linear methods as there; ``sign``: x -= lr sign(m) (Signum);
    ``adamw``: Adam with bias correction and its running second moment (beta2, eps);
    ``muon``: the nodes laid out as one matrix of ``shape`` (rows x cols = number of nodes),
    x -= lr * max(1, rows/cols)^0.5 * NS5(m) (torch's Muon: its Newton-Schulz and scale), ``nesterov`` as torch's.
    Weight decay is decoupled (x -= lr wd x). Multiplicities ``w`` weight the loss."""
    lrs = np.asarray(lrs, dtype=float)
    if runs < 2:
        raise ConfigError("monte_carlo needs runs >= 2 (a standard error)")
    if method.name == "muon":
        if shape is None or shape[0] * shape[1] != spec.h.size:
            raise ConfigError(f"muon: give shape (rows, cols) with rows * cols = {spec.h.size} nodes")
    rng = np.random.default_rng(seed)
    T = lrs.size
    total = np.zeros(T + 1)
    total_sq = np.zeros(T + 1)
    done = 0
    while done < runs:
        r = min(chunk, runs - done)
        losses = _simulate(spec, method, lrs, batch, r, rng, shape, eps, beta2, nesterov)
        total += losses.sum(0)
        total_sq += (losses ** 2).sum(0)
        done += r
    mean = total / runs
    var = np.maximum(total_sq / runs - mean ** 2, 0.0) * runs / (runs - 1)
    return mean, np.sqrt(var / runs)


def _simulate(spec, method, lrs, batch, R, rng, shape, eps, beta2, nesterov):
    n = spec.h.size
    h, w = spec.h, spec.w
    x = np.sqrt(spec.x0sq) * rng.choice([-1.0, 1.0], size=(R, n))  # E[x0^2] = x0sq, mean 0
    sd = np.sqrt(spec.c / batch)
    tau_mean = method.tau_mean
    fixed = len(method.delays) == 1
    taus, probs = np.array(list(method.delays)), np.array(list(method.delays.values()))
    p = spec.p if method.name == "adam" else 1.0
    cg = method.grad_weight
    K = method.tau_max
    hist = [x.copy() for _ in range(K)]  # y_{t-1}, ..., y_{t-K}: the queue (filled with x_0)
    m = np.zeros((R, n))
    v = np.zeros((R, n))
    u_prev = np.zeros((R, n))
    out = np.empty((R, lrs.size + 1))
    out[:, 0] = 0.5 * (x * x * h * w).sum(1)
    k_upd = 0
    for t, (lr, (delayed, updating)) in enumerate(zip(lrs, method.phases(lrs.size))):
        on = delayed and tau_mean > 0
        damp = _damp(method, delayed)
        kp = tau_mean if (method.predict and on) else 0.0
        lag = method.lag if on else 0.0
        y = x - kp * u_prev  # the point this step's gradient is taken at
        queue = [y] + hist
        if not updating:  # a fill call: push only
            hist = queue[:K]
            out[:, t + 1] = out[:, t]
            continue
        if not on:
            src = y
        elif fixed:
            src = queue[K]
        else:
            pick = rng.choice(taus, size=R, p=probs)
            src = np.stack(queue, 0)[pick, np.arange(R)]
        g = h * src + sd * rng.standard_normal((R, n))
        hist = queue[:K]
        k_upd += 1
        m = method.beta * m + cg * g
        if method.name in LINEAR:
            u = lr * damp * p * m
        elif method.name == "sign":
            u = lr * damp * np.sign(m)
        elif method.name == "adamw":
            v = beta2 * v + (1 - beta2) * g * g
            mhat = m / (1 - method.beta ** k_upd)
            vhat = v / (1 - beta2 ** k_upd)
            u = lr * damp * mhat / (np.sqrt(vhat) + eps)
        else:  # muon
            d = method.beta * m + cg * g if nesterov else m
            rows, cols = shape
            u = lr * damp * max(1.0, rows / cols) ** 0.5 * _orth(d.reshape(R, rows, cols)).reshape(R, n)
        x = x * (1 - lr * method.weight_decay) - (lag + 1) * u + lag * u_prev
        u_prev = u
        out[:, t + 1] = 0.5 * (x * x * h * w).sum(1)
    return out


# ----------------------------------------------------------------------------- fitted to a run

CORRECTIONS = ("none", "ef", "predict", "ef+predict", "damp")
OPTIMIZERS = {  # optimizer -> (how the NQM models it, its default momentum)
    "adamw": ("adam", 0.9), "soap": ("adam", 0.95), "adan": ("adam", 0.98), "mars": ("adam", 0.95),
    "muon": ("muon", 0.95), "lion": ("sign", 0.9), "sgd": ("heavyball", 0.9),
}


def nodes_from_spectrum(spectrum: dict, kind: str = "hessian", checkpoint: int = -1,
                        excess0: float | None = None) -> Spectrum:
    """The NQM's nodes from one checkpoint of a spectrum file (``delaylab llm spectrum``).

    Curvatures: the SLQ nodes, negative ones set to 0 (a quadratic model has no use for them; the
    file says how much mass they carry: with few Lanczos steps the bulk near 0 can land on a
    slightly negative node); kept as flat directions, they add nothing to the loss but take
    their share of Muon's matrix. Noise: per-example c_i = kappa h_i with kappa = noise
    trace / positive trace (the NQM's assumption that the noise covariance is aligned with the
    Hessian, Zhang et al. 2019). Start: E[x_0^2] alike in every direction, scaled so that the
    starting excess loss is ``excess0`` (default: the loss at initialization minus the
    checkpoint's loss, the distance the run travelled)."""
    cks = spectrum["checkpoints"]
    try:
        ck = cks[checkpoint]
    except IndexError:
        raise ConfigError(f"the spectrum file has {len(cks)} checkpoints; no index {checkpoint}") from None
    if kind not in ck:
        raise ConfigError(f"the spectrum file has no {kind!r} density (a preconditioned one is measured for AdamW)")
    h, w = np.asarray(ck[kind]["nodes"], float).clip(0.0), np.asarray(ck[kind]["weights"], float)
    trace = float(np.sum(w * h))
    noise = ck["noise_trace_precond"] if kind == "precond" else ck["noise_trace"]
    if excess0 is None:
        excess0 = spectrum.get("init_val_loss", ck["val_loss"]) - ck["val_loss"]
    if not (trace > 0 and noise >= 0 and excess0 >= 0):
        raise ConfigError("the spectrum has no positive curvature, or a negative noise / starting loss")
    return Spectrum(h=h, w=w, c=noise / trace * h, x0sq=2 * excess0 / trace)


def _matrix_nodes(spec: Spectrum, side: int) -> tuple[Spectrum, float]:
    """side x side directions at the quantiles of the density (for Muon's matrix), and the loss
    scale (directions represented / side^2)."""
    o = np.argsort(spec.h)
    cum = np.cumsum(spec.w[o]) / spec.w.sum()
    q = (np.arange(side * side) + 0.5) / (side * side)
    idx = o[np.minimum(np.searchsorted(cum, q), o.size - 1)]
    rng = np.random.default_rng(0)
    idx = idx[rng.permutation(idx.size)]  # no curvature ordering along rows: a generic basis
    return Spectrum(h=spec.h[idx], c=spec.c[idx], x0sq=spec.x0sq[idx]), spec.w.sum() / (side * side)


def run_method(optimizer: str, delay, correction: str = "none", momentum: float | None = None,
               damping: float = 1.0) -> tuple[Method, str]:
    """The NQM method for a run's optimizer / delay / correction, and the model it uses."""
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"no NQM model of optimizer {optimizer!r}; choose from {', '.join(OPTIMIZERS)}")
    if correction not in CORRECTIONS:
        raise ConfigError(f"the NQM models corrections {', '.join(CORRECTIONS)}; got {correction!r}")
    kind, beta = OPTIMIZERS[optimizer]
    beta = beta if momentum is None else momentum
    ef = "ef" in correction.split("+")
    m = Method("ema" if kind == "adam" else kind, beta, delay, predict="predict" in correction,
               damping=damping if correction == "damp" else 0.0)
    if ef:
        m.ef = m.tau_mean
    return m, kind


def _curve(spec, method, lrs, batch, model, runs, seed, side, stages):
    """Expected loss curve (and its MC standard error, 0 for the exact recursion); per-stage
    delays average the stages' curves (each stage holds 1/P of every direction: the stages'
    Hessian blocks taken as alike and uncoupled)."""
    curves, ses = [], []
    for tau in stages:
        m = Method(method.name, method.beta, tau, ef=(tau if method.ef is not None else None),
                   predict=method.predict, damping=method.damping, sync_start=method.sync_start,
                   sync_cooldown=method.sync_cooldown) if stages != [None] else method
        if model == "exact":
            curves.append(expected_loss(spec, m, lrs, batch))
            ses.append(np.zeros(lrs.size + 1))
        elif model == "muon":
            mspec, scale = _matrix_nodes(spec, side)
            mean, se = monte_carlo(mspec, m, lrs, batch, runs=runs, seed=seed, shape=(side, side), nesterov=True)
            curves.append(mean * scale)
            ses.append(se * scale)
        else:
            mean, se = monte_carlo(spec, m, lrs, batch, runs=runs, seed=seed,
                                   beta2=0.95 if model == "adamw" else 0.999)
            curves.append(mean)
            ses.append(se)
    return np.mean(curves, 0), np.sqrt(np.sum(np.square(ses), 0)) / len(ses)


def predict_gap(spectrum: dict, optimizer: str, lr: float, steps: int, batch: int, delay=1, correction: str = "none",
                momentum: float | None = None, schedule: str = "cosine", warmup: int | None = None,
                min_lr_ratio: float = 0.1, wsd_decay: float = 0.2, model: str | None = None, runs: int = 2000,
                seed: int = 0, checkpoint: int = -1, excess0: float | None = None, damping: float = 1.0,
                eos: bool = False, sync_start: int = 0, sync_cooldown: int = 0) -> dict:
    """Sync and delayed NQM loss curves of a run and their gap, fitted to a spectrum file.

    ``delay``: an int, a list (one per pipeline stage: PipeDream) or a dict {tau: prob}.
    ``model``: ``exact`` (the recursion: AdamW & co. through the fixed diagonal preconditioner,
    on the preconditioned density), ``adamw`` / ``sign`` (Monte Carlo of the real update on the
    raw density, axis-aligned), ``muon`` (Monte Carlo on a d_model x d_model matrix); default by
    optimizer. ``eos`` (exact model only): the edge-of-stability reading of Cohen et al. 2022 --
    an adaptive method's preconditioned curvature settles below its own stability limit, so each
    curve (sync, delayed) gets its curvatures capped at 0.9 x its limit / peak lr, the noise
    with them (c = kappa h). Returns the curves, the end gap and whether either curve diverged;
    both curves share their Monte Carlo draws (common random numbers: a smaller gap error)."""
    kind_default = OPTIMIZERS.get(optimizer, (None,))[0]
    model = model or {"adam": "exact", "heavyball": "exact", "muon": "muon", "sign": "sign"}.get(kind_default)
    if model not in ("exact", "adamw", "sign", "muon"):
        raise ConfigError(f"model must be exact, adamw, sign or muon, got {model!r}")
    if not (lr > 0 and math.isfinite(lr)):
        raise ConfigError(f"lr must be > 0, got {lr}")
    stages = [None]
    if isinstance(delay, (list, tuple)):
        stages, delay = [int(t) for t in delay], max(int(t) for t in delay)
    method, kind = run_method(optimizer, delay, correction, momentum, damping)
    method.sync_start, method.sync_cooldown = int(sync_start), int(sync_cooldown)
    if model == "exact" and kind not in ("adam", "heavyball"):
        raise ConfigError(f"{optimizer} is not linear: use model {'muon' if kind == 'muon' else 'sign'} (Monte Carlo)")
    density = "precond" if (model == "exact" and kind == "adam") else "hessian"
    spec = nodes_from_spectrum(spectrum, density, checkpoint, excess0)
    if model != "exact":
        method.name = {"adamw": "adamw", "sign": "sign", "muon": "muon"}[model]
    lrs = lr * lr_factors(steps, schedule, warmup, min_lr_ratio, wsd_decay)
    side = int(spectrum.get("d_model", 64))
    sync_m = Method(method.name, method.beta, 0)

    def capped(m: Method, taus) -> Spectrum:
        if not eos:
            return spec
        if model != "exact":
            raise ConfigError("eos caps the exact model's curvatures; the Monte Carlo models adapt on their own")
        tau = max(taus) if taus != [None] else m.tau_max
        limit = max_stable(Method(m.name, m.beta, tau, ef=tau if m.ef is not None and tau else None)) / lr
        h = np.minimum(spec.h, 0.9 * limit)
        ratio = np.divide(h, spec.h, out=np.ones_like(h), where=spec.h > 0)  # flat directions stay as they are
        return Spectrum(h=h, w=spec.w, c=spec.c * ratio, x0sq=spec.x0sq / ratio)  # the same starting loss

    sync, sync_se = _curve(capped(sync_m, [None]), sync_m, lrs, batch, model, runs, seed, side, [None])
    dly, dly_se = _curve(capped(method, stages), method, lrs, batch, model, runs, seed, side, stages)
    start = float(sync[0])
    div = {"sync": diverged(sync, start), "delayed": diverged(dly, start)}
    gap = dly - sync
    return {"optimizer": optimizer, "model": model, "density": density, "lr": lr, "steps": steps, "batch": batch,
            "delay": stages if stages != [None] else method.delays if len(method.delays) > 1 else delay,
            "correction": correction, "momentum": method.beta, "schedule": schedule, "eos": eos,
            "sync": sync, "delayed": dly, "gap": gap, "se": np.sqrt(sync_se ** 2 + dly_se ** 2),
            "end_gap": None if (div["sync"] or div["delayed"]) else float(gap[-1]), "diverged": div,
            "start_loss": start}


def read_spectrum(path) -> dict:
    """A spectrum file (``delaylab llm spectrum``), checked: one reader for the CLI and the library."""
    import json
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise MissingFile(f"no spectrum file {p}")
    try:
        d = json.loads(p.read_text())
    except ValueError as err:
        raise ConfigError(f"{p}: not JSON ({err})") from None
    if not isinstance(d, dict) or d.get("format") != SPECTRUM_FORMAT or not d.get("checkpoints"):
        raise ConfigError(f"{p}: not a delaylab spectrum file (make one with `delaylab llm spectrum RUN`)")
    return d
