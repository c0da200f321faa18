"""The one fit every fitted predictor uses: ridge regression on standardized features, its penalty
chosen by leave-one-group-out on the cells it is given (the held-in cells of a fold: nothing else).

The target of a gap predictor is ``log(max(gap, FLOOR))``: a gap is a ratio-scale quantity (the
metrics are within x2 and ranks), and below ``FLOOR`` a measured gap is mostly seed noise (the
median cell's 95% half-width is 0.07), so a cell measured at 0.001 or -0.01 is fitted as 0.01.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FLOOR = 0.01
PENALTIES = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)


def log_gap(gap: float) -> float:
    return math.log(max(gap, FLOOR))


@dataclass
class Ridge:
    """``y ~ w . (x - mu) / sd`` (the first feature, the constant, left unscaled); ``penalty`` the
    chosen one, ``sigma`` the SD of its leave-one-group-out residuals (the spread of a held-out
    prediction's error, in the target's units), ``dof`` their number minus one."""

    names: list[str]
    w: np.ndarray
    mu: np.ndarray
    sd: np.ndarray
    penalty: float
    sigma: float
    dof: int

    def predict(self, x: dict) -> float:
        v = np.array([float(x[k]) for k in self.names])
        return float(((v - self.mu) / self.sd) @ self.w)

    def to_dict(self) -> dict:
        return {"names": self.names, "w": self.w.tolist(), "mu": self.mu.tolist(), "sd": self.sd.tolist(),
                "penalty": self.penalty, "sigma": self.sigma, "dof": self.dof}

    @classmethod
    def from_dict(cls, d: dict) -> "Ridge":
        return cls(d["names"], np.array(d["w"]), np.array(d["mu"]), np.array(d["sd"]), d["penalty"], d["sigma"],
                   d["dof"])


def _solve(X: np.ndarray, y: np.ndarray, penalty: float):
    mu, sd = X.mean(0), X.std(0)
    mu[0], sd[0] = 0.0, 1.0  # the constant column
    sd[sd == 0] = 1.0  # a feature constant on these cells: weight 0 after the penalty
    Z = (X - mu) / sd
    pen = penalty * np.eye(Z.shape[1])
    pen[0, 0] = 0.0  # the intercept is not shrunk
    return np.linalg.solve(Z.T @ Z + pen, Z.T @ y), mu, sd


def fit(rows: list[dict], names: list[str], target: list[float], groups: list, penalties=PENALTIES) -> Ridge:
    """Ridge of ``target`` on ``rows[i][name]`` (``names[0]`` must be the constant ``"1"``); the penalty
    minimising the squared error of leave-one-group-out predictions over ``groups`` (one group:
    the middle penalty, and sigma from the in-sample residuals)."""
    if names[0] != "1":
        raise ValueError("the first feature must be the constant '1'")
    X = np.array([[float(r[k]) for k in names] for r in rows])
    y = np.asarray(target, float)
    g = np.asarray(groups, dtype=object)
    best = None
    kinds = list(dict.fromkeys(g.tolist()))
    for lam in penalties if len(kinds) > 1 else (penalties[len(penalties) // 2],):
        resid = np.empty_like(y)
        if len(kinds) > 1:
            for k in kinds:
                held = g == k
                w, mu, sd = _solve(X[~held], y[~held], lam)
                resid[held] = y[held] - ((X[held] - mu) / sd) @ w
        else:
            w, mu, sd = _solve(X, y, lam)
            resid = y - ((X - mu) / sd) @ w
        err = float(np.mean(resid ** 2))
        if best is None or err < best[0]:
            best = (err, lam, resid)
    _, lam, resid = best
    w, mu, sd = _solve(X, y, lam)
    return Ridge(list(names), w, mu, sd, lam, float(np.std(resid, ddof=1)) if len(resid) > 1 else math.inf,
                 len(resid) - 1)
