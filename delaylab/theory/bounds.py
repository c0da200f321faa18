"""The convergence bounds (docs/theory.md proves each one; section anchors in ``proof``).

* :func:`lmo_bound` -- momentum-LMO (Muon, normalized SGD, sign descent) with gradient
  delay ``tau``, optionally with Error Feedback, optionally Nesterov: Theorems 1-3.
* :func:`virtual_lmo_bound` -- the virtual-sequence form with a measured gradient-space
  perturbation ``E_bar`` (Theorem 2), of which the delayed and EF bounds are instances.
* :func:`sgdm_bound` -- delayed SGD with EMA momentum in the Euclidean norm (Theorem 4),
  for contrast.

Every bound is on an average over the run, (1/T) sum_{t<T} E||grad f(.)||^power.
"""

from __future__ import annotations

import sympy as sp

from delaylab.errors import ConfigError
from delaylab.theory import symbols as S
from delaylab.theory.bound import DOCS, Bound

L, sigma, rho, Delta, T, eta, beta, tau, G0 = S.L, S.sigma, S.rho, S.Delta, S.T, S.eta, S.beta, S.tau, S.G0
delta_bar, E_bar = S.delta_bar, S.E_bar

REF_CM = "Cutkosky & Mehta 2020, Momentum Improves Normalized SGD, ICML, arXiv:2002.03305"
REF_KOV = ("Kovalev 2025, Understanding Gradient Orthogonalization for Deep Learning via "
           "Non-Euclidean Trust-Region Optimization, arXiv:2503.12645")
REF_PET = ("Pethick et al. 2025, Training Deep Learning Models with Norm-Constrained LMOs, "
           "ICML, arXiv:2502.07529")
REF_SK = ("Stich & Karimireddy 2020, The Error-Feedback Framework: Better Rates for SGD with "
          "Delayed Gradients and Compressed Communication, JMLR, arXiv:1909.05350")
REF_ARJ = ("Arjevani, Shamir & Srebro 2020, A Tight Convergence Analysis for SGD with Delayed "
           "Updates, ALT, arXiv:1806.10188")
REF_GL = ("Ghadimi & Lan 2013, Stochastic First- and Zeroth-Order Methods for Nonconvex Stochastic "
          "Programming, SIAM J. Optim.")
REF_2BW = ("Narayanan et al. 2021, Memory-Efficient Pipeline-Parallel DNN Training (PipeDream-2BW), ICML, "
           "arXiv:2006.09503")

INITS = ("zero", "first")
POINTS = ("virtual", "real")


def _delay_value(delay):
    """``None`` keeps tau symbolic; otherwise a non-negative integer delay."""
    if delay is None:
        return tau
    if isinstance(delay, bool) or int(delay) != delay or delay < 0:
        raise ConfigError(f"delay must be a non-negative integer, got {delay!r}")
    return sp.Integer(int(delay))


def momentum_weights(nesterov: bool):
    """(lag, noise, p) of the momentum average: see docs/theory.md#lemma-3-momentum-error.

    lag   -- mean age (in steps) of the gradients the direction uses, beyond the delay:
             beta/(1-beta), or beta^2/(1-beta) for Nesterov;
    noise -- sum of squared weights of the noise, the factor under sigma_*^2;
    p     -- the weight missing at step t of a zero-initialised average is beta^(t+p).
    """
    if nesterov:
        return (beta**2 / (1 - beta),
                (1 - beta) * (1 + 2 * beta - 2 * beta**3) / (1 + beta), 2)
    return beta / (1 - beta), (1 - beta) / (1 + beta), 1


def lion_weights(beta1):
    """(lag, noise, start) of Lion's direction c_t = beta1 m_{t-1} + (1-beta1) g_t, m_t = EMA_beta(g).

    ``beta`` is Lion's buffer decay (its beta2, the momentum knob); the weight of the gradient j
    updates old is 1-beta1 (j = 0) and beta1 (1-beta) beta^(j-1) (j >= 1): lag beta1/(1-beta),
    noise (1-beta1)^2 + beta1^2 (1-beta)/(1+beta), and the weight missing at step t of the
    zero-initialised buffer is beta1 beta^t. Nesterov is beta1 = beta^2 (docs/theory.md#lion).
    """
    b1 = sp.nsimplify(beta1)
    if not 0 <= b1 < 1:
        raise ConfigError(f"Lion's beta1 must be in [0, 1), got {beta1!r}")
    return b1 / (1 - beta), (1 - b1) ** 2 + b1**2 * (1 - beta) / (1 + beta), b1


def _lmo_terms(perturbation, nesterov: bool, init: str, lion_beta1=None):
    if init not in INITS:
        raise ConfigError(f"init must be one of {INITS}, got {init!r}")
    if lion_beta1 is None:
        lag, noise_w, p = momentum_weights(nesterov)
        start = beta**p
    elif nesterov:
        raise ConfigError("Lion's direction is its own interpolation: no Nesterov variant on top")
    else:
        lag, noise_w, start = lion_weights(lion_beta1)
    sig_star = S.sigma_star
    if init == "zero":
        init_term = 2 * start / ((1 - beta) * T) * (G0 + L * eta * beta / (1 - beta))
    else:
        init_term = 2 * start * sig_star / ((1 - beta) * T)
    return (
        ("opt", Delta / (eta * T)),
        ("step", L * eta / 2),
        ("momentum", 2 * L * eta * lag),
        ("delay", perturbation),
        ("noise", 2 * sig_star * sp.sqrt(noise_w)),
        ("init", init_term),
    )


def _bound_norm(norm):
    if norm is not None:
        from delaylab.theory.assumptions import check_norm

        check_norm(norm)
    return norm


def lmo_bound(delay=0, ef: bool = False, nesterov: bool = False, init: str = "zero",
              point: str = "virtual", norm: str | None = None, lion_beta1=None) -> Bound:
    """Bound on (1/T) sum_t E||grad f||_* for momentum-LMO with gradient delay ``delay``.

    Method: m_t = beta m_{t-1} + (1-beta) g_t with g_t a stochastic gradient at
    x_{max(t-tau, 0)}, x_{t+1} = x_t + eta LMO(m_t) (Nesterov: LMO(beta m_t + (1-beta) g_t)).
    This is ``Delayed(LMOMomentum(...), delay=tau)``: update t uses batch t at x_{t-tau}.

    ``delay=None`` keeps tau as a symbol. ``init``: "zero" (m_{-1} = 0, torch's Muon; needs
    ``G0``) or "first" (m_0 = g_0). With ``ef=True`` (x_{t+1} = x_t + (tau+1) u_t - tau u_{t-1})
    the delay term is data-dependent, in the measured mean direction drift ``delta_bar``;
    ``point`` says where the gradient norm is measured: "virtual" (w_t = x_t - tau eta d_{t-1},
    the undelayed sequence of the proof) or "real" (the weights the gradients were taken at).
    Without EF both are the same point and ``point`` is ignored.

    ``norm``: the LMO's norm, which L, G0 and rho must be in ("spectral" for Muon, "sign" for
    sign descent and Lion, "l2" per tensor, "euclidean" for normalized SGD on the whole
    vector); None leaves it to the caller. ``lion_beta1``: Lion's direction
    c_t = beta1 m_{t-1} + (1-beta1) g_t in place of the plain or Nesterov one, with ``beta``
    its buffer decay (:func:`lion_weights`).
    """
    d = _delay_value(delay)
    if point not in POINTS:
        raise ConfigError(f"point must be one of {POINTS}, got {point!r}")
    if ef:
        # ||e_t|| <= eta sum_{i=1}^{tau} i ||d_{t-i} - d_{t-i-1}||  ->  eta tau(tau+1)/2 delta_bar
        e_mean = eta * d * (d + 1) / 2 * delta_bar
        pert = L * e_mean * (2 if point == "virtual" else 3)
        section, theorem = "#theorem-3-delay-with-error-feedback", "Theorem 3"
        metric = ("(1/T) sum_{t<T} E||grad f(w_t)||_*, w_t = x_t - tau eta d_{t-1}" if point == "virtual"
                  else "(1/T) sum_{t<T} E||grad f(x_{max(t-tau,0)})||_*")
        assumptions = ("A1", "A2", "A3", "A4", "A5")
    else:
        pert = 2 * L * eta * d
        section, theorem = "#theorem-1-delayed-momentum-lmo", "Theorem 1"
        metric = "(1/T) sum_{t<T} E||grad f(x_t)||_*"
        assumptions = ("A1", "A2", "A3", "A4")
    name = ("lmo" + ("-nesterov" if nesterov else "") + ("-lion" if lion_beta1 is not None else "")
            + ("" if d == 0 and not ef else "-delayed") + ("-ef" if ef else "")
            + ("" if init == "zero" else "-first"))
    return Bound(
        name=name,
        metric=metric,
        terms=_lmo_terms(pert, nesterov, init, lion_beta1),
        assumptions=assumptions,
        proof=DOCS + ("#nesterov-momentum" if nesterov else "#lion" if lion_beta1 is not None else section),
        references=(REF_CM, REF_KOV, REF_PET, REF_2BW),
        options=(("method", "lmo"), ("delay", None if delay is None else int(delay)), ("ef", bool(ef)),
                 ("nesterov", bool(nesterov)), ("init", init), ("point", point if ef else "real"))
        + ((("lion_beta1", float(lion_beta1)),) if lion_beta1 is not None else ()),
        notes=f"{theorem}; no step-size restriction; the delay costs the additive 'delay' term only.",
        norm=_bound_norm(norm),
    )


def virtual_lmo_bound(nesterov: bool = False, init: str = "zero", point: str = "virtual",
                      norm: str | None = None) -> Bound:
    """Theorem 2: momentum-LMO whose gradients are taken at perturbed points w_t + e_t.

    ``E_bar`` = (1/T) sum_t E||grad f(w_t + e_t) - grad f(w_t)||_*, measured in gradient space
    (the sharp check for sign descent, where one flipped sign makes ||d_t - d_{t-1}||_inf = 2).
    ``point``: "virtual" bounds the mean of E||grad f(w_t)||_*, "real" that of
    E||grad f(w_t + e_t)||_*.
    """
    if point not in POINTS:
        raise ConfigError(f"point must be one of {POINTS}, got {point!r}")
    return Bound(
        name="lmo-virtual" + ("-nesterov" if nesterov else "") + ("" if init == "zero" else "-first"),
        metric=("(1/T) sum_{t<T} E||grad f(w_t)||_*" if point == "virtual"
                else "(1/T) sum_{t<T} E||grad f(w_t + e_t)||_*"),
        terms=_lmo_terms((2 if point == "virtual" else 3) * E_bar, nesterov, init),
        assumptions=("A1", "A2", "A3", "A4"),
        proof=DOCS + "#theorem-2-virtual-sequence",
        references=(REF_SK, REF_KOV),
        options=(("method", "lmo"), ("nesterov", bool(nesterov)), ("init", init), ("point", point)),
        notes="Theorem 2; E_bar is measured on the run (data-dependent).",
        norm=_bound_norm(norm),
    )


def staleness(delay=0):
    """kappa = tau + beta/(1-beta): the mean age of the gradients in an EMA-SGDM step."""
    return _delay_value(delay) + beta / (1 - beta)


def sgdm_bound(delay=0) -> Bound:
    """Theorem 4: delayed SGD with EMA momentum, Euclidean norm, on (1/T) sum E||grad f||_2^2.

    Method: m_t = beta m_{t-1} + (1-beta) g_t, x_{t+1} = x_t - eta m_t, g_t at
    x_{max(t-tau,0)}. torch.optim.SGD(lr, momentum=beta) is this method with eta = lr/(1-beta).
    Valid while c = 1 - L eta - 2 (L eta kappa)^2 > 0 with kappa = tau + beta/(1-beta): unlike
    the LMO bounds, the delay caps the step size (at about 1/(sqrt(2) L kappa)).
    """
    kappa = staleness(delay)
    c = 1 - L * eta - 2 * L**2 * eta**2 * kappa**2
    return Bound(
        name="sgdm" + ("" if delay == 0 else "-delayed"),
        metric="(1/T) sum_{t<T} E||grad f(x_{max(t-tau,0)})||_2^2",
        terms=(
            ("opt", 2 * Delta / (c * eta * T)),
            ("noise", L * eta * sigma**2 / c),
            ("staleness", 2 * L**2 * eta**2 * kappa * sigma**2 / c),
        ),
        assumptions=("A1", "A2e", "A3", "A4e"),
        proof=DOCS + "#theorem-4-delayed-sgd-with-momentum",
        references=(REF_SK, REF_ARJ, REF_GL),
        conditions=(sp.StrictGreaterThan(c, 0),),
        eta_max=2 / (L * (1 + sp.sqrt(1 + 8 * kappa**2))),  # the positive root of c = 0
        power=2,
        options=(("method", "sgdm"), ("delay", None if delay is None else int(delay))),
        notes="Theorem 4; L and sigma are Euclidean here; compare with LMO via sqrt (Jensen).",
        norm="euclidean",
    )


METHODS = ("lmo", "sgdm")


def get_bound(method: str = "lmo", delay=0, ef: bool = False, nesterov: bool = False,
              init: str = "zero", point: str = "virtual", norm: str | None = None) -> Bound:
    """One entry point for the CLI and other tools: ``method`` in {"lmo", "sgdm"}.

    ``norm`` (lmo only): the LMO's norm, checked against the constants' (sgdm is euclidean).
    """
    if method == "lmo":
        return lmo_bound(delay=delay, ef=ef, nesterov=nesterov, init=init, point=point, norm=norm)
    if method == "sgdm":
        if ef or nesterov:
            raise ConfigError("the sgdm bound has no EF or Nesterov variant")
        if norm not in (None, "euclidean"):
            raise ConfigError(f"the sgdm bound (Theorem 4) is in the euclidean norm, not {norm!r}")
        return sgdm_bound(delay=delay)
    raise ConfigError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
