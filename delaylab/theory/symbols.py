"""Every sympy symbol of the theory, in one place.

Names match the constants vocabulary of :mod:`delaylab.theory` (``L``, ``sigma``, ``rho``,
``Delta``, ``T``, ``eta``, ``beta``, ``tau``, ``G0``, ``delta_bar``, ``E_bar``), so a symbol's
``name`` is also the keyword that :func:`delaylab.theory.evaluate` takes for it.
"""

from __future__ import annotations

import sympy as sp

L = sp.Symbol("L", positive=True)            # smoothness in the method's norm
sigma = sp.Symbol("sigma", nonnegative=True)  # Euclidean noise std
rho = sp.Symbol("rho", positive=True)         # ||v||_* <= rho ||v||_2
Delta = sp.Symbol("Delta", positive=True)     # f(x0) - inf f
T = sp.Symbol("T", positive=True)             # number of updates
eta = sp.Symbol("eta", positive=True)         # step size (the step norm for LMO methods)
beta = sp.Symbol("beta", nonnegative=True)    # momentum, 0 <= beta < 1
tau = sp.Symbol("tau", nonnegative=True)      # gradient delay in steps
G0 = sp.Symbol("G0", nonnegative=True)        # ||grad f(x0)||_*
delta_bar = sp.Symbol("delta_bar", nonnegative=True)  # EF's mean direction drift
E_bar = sp.Symbol("E_bar", nonnegative=True)  # mean gradient perturbation (virtual sequence)

#: The noise constant the LMO bounds use: sigma_* = rho * sigma.
sigma_star = rho * sigma

ALL = (L, sigma, rho, Delta, T, eta, beta, tau, G0, delta_bar, E_bar)
BY_NAME = {s.name: s for s in ALL}
