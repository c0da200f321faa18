"""Hand-written numpy recursions the theory tests check the bounds against.

Written from the method's definition, independently of delaylab.optim and delaylab.toy:
update t uses the stochastic gradient of batch t at x_{max(t-tau, 0)} (the Delayed
wrapper's semantics); EF applies x_{t+1} = x_t + (tau+1) u_t - tau u_{t-1}.
"""

from __future__ import annotations

import numpy as np


# --- test problems with known constants --------------------------------------------------

def cauchy_f(x):
    return np.log1p(x**2).sum(axis=tuple(range(1, x.ndim)))


def cauchy_grad(x):
    """f(x) = sum_i log(1 + x_i^2): L_2 = 2, L in l_inf (dual l1) = 2 d."""
    return 2 * x / (1 + x**2)


def logdet_f(w):
    m = np.swapaxes(w, -1, -2) @ w
    return np.linalg.slogdet(np.eye(w.shape[-1]) + m)[1]


def logdet_grad(w):
    """F(W) = log det(I + W^T W): gradient 2 W (I + W^T W)^{-1}; L_op (nuclear dual) = 2 min(m, n)."""
    n = w.shape[-1]
    return 2 * w @ np.linalg.inv(np.eye(n) + np.swapaxes(w, -1, -2) @ w)


# --- norms: primal and dual, batched over a leading seed axis ----------------------------

def dual_norm(g, norm):
    axes = tuple(range(1, g.ndim))
    if norm == "l2":
        return np.sqrt((g**2).sum(axis=axes))
    if norm == "sign":
        return np.abs(g).sum(axis=axes)
    if norm == "spectral":
        return np.linalg.svd(g, compute_uv=False).sum(axis=-1)
    raise ValueError(norm)


def primal_norm(x, norm):
    axes = tuple(range(1, x.ndim))
    if norm == "l2":
        return np.sqrt((x**2).sum(axis=axes))
    if norm == "sign":
        return np.abs(x).max(axis=axes)
    if norm == "spectral":
        return np.linalg.svd(x, compute_uv=False).max(axis=-1)
    raise ValueError(norm)


def lmo(m, norm):
    """argmin_{||d|| <= 1} <m, d> (0 maps to 0)."""
    axes = tuple(range(1, m.ndim))
    if norm == "l2":
        n = np.sqrt((m**2).sum(axis=axes, keepdims=True))
        return -np.divide(m, n, out=np.zeros_like(m), where=n > 0)
    if norm == "sign":
        return -np.sign(m)
    if norm == "spectral":
        u, _, vt = np.linalg.svd(m, full_matrices=False)
        return -(u @ vt)
    raise ValueError(norm)


# --- the delayed momentum-LMO recursion --------------------------------------------------

def run_lmo(grad, x0, eta, beta, T, tau=0, norm="l2", sigma=0.0, seeds=8, seed=0,
            ef=False, nesterov=False, lion_beta1=None, etas=None):
    """Run S seeds of delayed momentum-LMO (m_{-1} = 0); returns a dict of recorded arrays.

    ``lion_beta1``: Lion's direction c_t = beta1 m_{t-1} + (1-beta1) g_t (then m_t = EMA_beta);
    ``etas``: a step size per update (a schedule) in place of ``eta``.

    ``x``: real iterates x_0..x_{T-1}; ``y``: the points the applied gradients were taken at;
    ``w``: the virtual sequence w_t = x_t - tau eta d_{t-1} (EF; w = x without EF);
    ``delta``: ||d_{t-1} - d_{t-2}|| (d_{<0} = 0); ``m``, ``c`` the momentum and direction input.
    """
    rng = np.random.default_rng(seed)
    x = np.broadcast_to(x0, (seeds,) + np.shape(x0)).astype(float).copy()
    dim = x[0].size
    m = np.zeros_like(x)
    hist = [x.copy()]           # x_0 .. x_t
    d_prev = np.zeros_like(x)   # d_{t-1}
    d_prev2 = np.zeros_like(x)  # d_{t-2}
    rec = {k: [] for k in ("x", "y", "w", "delta", "m", "c")}
    for t in range(T):
        y = hist[max(t - tau, 0)]
        g = grad(y) + rng.normal(0.0, sigma / np.sqrt(dim), size=x.shape)
        if lion_beta1 is not None:
            c = lion_beta1 * m + (1 - lion_beta1) * g
            m = beta * m + (1 - beta) * g
        else:
            m = beta * m + (1 - beta) * g
            c = beta * m + (1 - beta) * g if nesterov else m
        d = lmo(c, norm)
        eta = eta if etas is None else etas[t]
        rec["x"].append(x.copy())
        rec["y"].append(y)
        rec["w"].append(x - tau * eta * d_prev if ef else x.copy())
        rec["delta"].append(primal_norm(d_prev - d_prev2, norm))
        rec["m"].append(m.copy())
        rec["c"].append(c.copy())
        if ef:
            x = x + eta * ((tau + 1) * d - tau * d_prev)
        else:
            x = x + eta * d
        hist.append(x.copy())
        d_prev2, d_prev = d_prev, d
    return {k: np.array(v) for k, v in rec.items()}


def run_sgdm(grad, x0, eta, beta, T, tau=0, sigma=0.0, seeds=8, seed=0):
    """Delayed EMA-SGDM: m_t = beta m_{t-1} + (1-beta) g_t, x_{t+1} = x_t - eta m_t; records y."""
    rng = np.random.default_rng(seed)
    x = np.broadcast_to(x0, (seeds,) + np.shape(x0)).astype(float).copy()
    dim = x[0].size
    m = np.zeros_like(x)
    hist = [x.copy()]
    ys = []
    for t in range(T):
        y = hist[max(t - tau, 0)]
        g = grad(y) + rng.normal(0.0, sigma / np.sqrt(dim), size=x.shape)
        m = beta * m + (1 - beta) * g
        x = x - eta * m
        hist.append(x.copy())
        ys.append(y)
    return np.array(ys)


def mean_and_se(per_seed):
    per_seed = np.asarray(per_seed, dtype=float)
    return float(per_seed.mean()), float(per_seed.std(ddof=1) / np.sqrt(per_seed.size))
