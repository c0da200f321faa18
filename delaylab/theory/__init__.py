"""Convergence bounds for training under a gradient delay, in sympy; their tuning and checks.

Every bound is a :class:`Bound` (sympy terms with names, assumptions, validity conditions,
the docs/theory.md section that proves it, references). Build one with

* :func:`lmo_bound` ``(delay=0, ef=False, nesterov=False, init="zero", point="virtual")``:
  momentum-LMO (Muon / normalized SGD / sign descent) on mean E||grad f||_*;
  ``delay=None`` keeps tau symbolic;
* :func:`virtual_lmo_bound`: the virtual-sequence form with a measured ``E_bar``;
* :func:`sgdm_bound` ``(delay=0)``: delayed EMA-SGDM, Euclidean, on mean E||grad f||_2^2;
* :func:`get_bound` ``(method="lmo"|"sgdm", ...)``: one entry point for both.

How tight they are: :func:`pep_worst_case` and :func:`pep_compare` (:mod:`delaylab.theory.pep`)
compute the exact worst case of deterministic SGD with momentum (delayed, with or without EF) over
all L-smooth functions by performance estimation (PEPit, the optional extra ``delaylab[pep]``)
and set Theorem 4 against it. LMO methods cannot be expressed there (their step is not linear in
the gradients).

Predicting the gap rather than bounding it: :mod:`delaylab.theory.nqm` (the noisy quadratic
model under delay: exact expected loss curves, Lyapunov stationary loss, Monte Carlo of the
nonlinear optimizers; docs/nqm.md) with :mod:`delaylab.theory.slq` (stochastic Lanczos
quadrature).

Operations: :func:`evaluate` (vectorised over numpy arrays), :func:`tune` (closed form from
sympy + scipy check), :func:`closed_form`, :func:`delay_penalty`, the linear stability helpers
in :mod:`delaylab.theory.stability`, and the estimators of the constants in
:mod:`delaylab.theory.assumptions`.

Constants vocabulary (keyword names everywhere; other modules pass these):

========== ==============================================================================
``L``      smoothness in the method's norm: ||grad f(x) - grad f(y)||_* <= L ||x - y||
           (Euclidean for ``sgdm_bound``)
``sigma``  Euclidean noise std: E||g - grad f||_2^2 <= sigma^2
``rho``    norm equivalence ||v||_* <= rho ||v||_2 (1 for l2, sqrt(d) for sign/l_inf,
           sqrt(min(m, n)) for spectral); the bounds' noise constant is sigma_* = rho sigma
``Delta``  f(x0) - inf f
``T``      number of updates (>= 1)
``eta``    step size; for LMO methods the norm of every step
``beta``   momentum in [0, 1)
``tau``    gradient delay in updates (>= 0)
``G0``     ||grad f(x0)||_*, for the zero-initialised momentum's start-up term
``delta_bar`` EF's mean direction drift (1/T) sum_t E||d_{t-1} - d_{t-2}|| in [0, 2]
``E_bar``  mean gradient perturbation of the virtual sequence (Theorem 2)
``norm``   optional: the norm L, G0 and rho are in ("euclidean", "l2", "sign", "spectral");
           evaluate/tune refuse it when it is not ``bound.norm`` (euclidean for ``sgdm_bound``)
========== ==============================================================================

This package imports no other delaylab package.
"""

from delaylab.theory.bound import ASSUMPTIONS, Assumption, Bound, Evaluation, evaluate
from delaylab.theory.bounds import (
    METHODS,
    get_bound,
    lmo_bound,
    sgdm_bound,
    staleness,
    virtual_lmo_bound,
)
from delaylab.theory.pep import Comparison as PEPComparison
from delaylab.theory.pep import WorstCase
from delaylab.theory.pep import compare as pep_compare
from delaylab.theory.pep import worst_case as pep_worst_case
from delaylab.theory.tuning import (
    ClosedForm,
    Penalty,
    Tuned,
    closed_form,
    delay_penalty,
    leading_order,
    penalty_limit,
    tune,
)

__all__ = [
    "ASSUMPTIONS", "Assumption", "Bound", "Evaluation", "evaluate",
    "METHODS", "get_bound", "lmo_bound", "sgdm_bound", "staleness", "virtual_lmo_bound",
    "ClosedForm", "Penalty", "Tuned", "closed_form", "delay_penalty", "leading_order",
    "penalty_limit", "tune",
    "PEPComparison", "WorstCase", "pep_compare", "pep_worst_case",
]
