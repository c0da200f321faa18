"""The NQM's numerical checks at full size, for docs/nqm.md.

``python -m delaylab.predict.nqm_checks --out docs/nqm`` writes checks.json and checks.md:

* the exact recursion against a Monte Carlo of the same dynamics (10^5 runs), optimizer x tau x
  correction, on a 4-direction quadratic with a cosine schedule: relative error of the final
  mean loss and its size in standard errors (and the largest |z| along the 60-step curve);
* the Lyapunov stationary loss against the recursion run 4000 steps at a constant lr;
* the stability limit (spectral radius of the state matrix) against delaylab.theory.stability;
* SLQ on a quadratic with 2000 planted eigenvalues in a random basis: top eigenvalue, trace,
  density quantiles (decades) and the NQM loss computed from its nodes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from delaylab._io import write_json


def recursion_vs_mc(runs: int = 100_000) -> list[dict]:
    from delaylab.theory import nqm

    spec = nqm.Spectrum(h=[2.0, 0.5, 0.1, 0.02], c=[1.0, 0.5, 0.2, 0.1], x0sq=[1, 1, 1, 1], p=[0.5, 1, 2, 3])
    lrs = 0.1 * nqm.lr_factors(60, "cosine", warmup=5)
    rows = []
    for name, beta in (("sgd", 0.0), ("heavyball", 0.5), ("adam", 0.9)):
        for tau in (0, 1, 2, 4):
            for corr in ("none", "ef", "predict"):
                if tau == 0 and corr != "none":
                    continue
                m = nqm.Method(name, beta, tau, ef=tau if corr == "ef" else None, predict=corr == "predict")
                rec = nqm.expected_loss(spec, m, lrs, batch=4)
                mc, se = nqm.monte_carlo(spec, m, lrs, batch=4, runs=runs, seed=1)
                ok = se > 0
                z = (mc[ok] - rec[ok]) / se[ok]
                rows.append({"method": name, "beta": beta, "tau": tau, "correction": corr, "exact": rec[-1],
                             "mc": mc[-1], "se": se[-1], "rel_err": (mc[-1] - rec[-1]) / rec[-1],
                             "rel_se": se[-1] / rec[-1], "z_end": z[-1], "max_abs_z_curve": float(np.abs(z).max())})
    for delay, corr in (({0: 0.5, 2: 0.5}, "none"), ({1: 0.3, 3: 0.7}, "ef")):  # random delays
        m = nqm.Method("ema", 0.9, delay, ef=2.4 if corr == "ef" else None)
        rec = nqm.expected_loss(spec, m, lrs, batch=4)
        mc, se = nqm.monte_carlo(spec, m, lrs, batch=4, runs=runs, seed=2)
        ok = se > 0
        z = (mc[ok] - rec[ok]) / se[ok]
        rows.append({"method": "ema", "beta": 0.9, "tau": str(delay), "correction": corr, "exact": rec[-1],
                     "mc": mc[-1], "se": se[-1], "rel_err": (mc[-1] - rec[-1]) / rec[-1], "rel_se": se[-1] / rec[-1],
                     "z_end": z[-1], "max_abs_z_curve": float(np.abs(z).max())})
    return rows


def lyapunov() -> list[dict]:
    from delaylab.theory import nqm

    spec = nqm.Spectrum(h=[2.0, 0.5, 0.1], c=[1.0, 0.5, 0.2], x0sq=[1, 1, 1])
    out = []
    for m in (nqm.Method("heavyball", 0.5, 1), nqm.Method("ema", 0.9, 2, ef=2), nqm.Method("ema", 0.9, {0: 0.5, 2: 0.5}),
              nqm.Method("sgd", 0.0, 1, predict=True, damping=1.0), nqm.Method("ema", 0.9, 8)):
        s = nqm.stationary_loss(spec, m, 0.05, batch=2)
        r = nqm.expected_loss(spec, m, np.full(4000, 0.05), batch=2)[-1]
        out.append({"method": repr(m), "lyapunov": s, "recursion_4000": r, "rel_diff": abs(s - r) / s})
    return out


def stability() -> list[dict]:
    from delaylab.theory import nqm
    from delaylab.theory import stability as st

    out = []
    for meth, beta in (("gd", 0.0), ("heavyball", 0.5), ("heavyball", 0.9), ("ema", 0.9), ("ema", 0.99)):
        for tau, ef in ((0, False), (1, False), (1, True), (2, False), (2, True), (4, False), (8, False)):
            a = st.max_stable(meth, beta, tau, ef)
            b = nqm.max_stable(nqm.Method("sgd" if meth == "gd" else meth, beta, tau, ef=tau if ef else None))
            out.append({"method": meth, "beta": beta, "tau": tau, "ef": ef, "stability": a, "nqm": b,
                        "rel_diff": abs(a - b) / a})
    return out


def slq_planted(n: int = 2000) -> dict:
    from delaylab.theory import nqm
    from delaylab.theory.slq import slq

    rng = np.random.default_rng(0)
    eig = np.concatenate([np.geomspace(1e-4, 1, n - 10), np.geomspace(2, 50, 10)])
    Q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    A = (Q * eig) @ Q.T
    nodes, w = slq(lambda v: A @ v, n, probes=4, steps=40)

    def quantile(vals, wts, p):
        o = np.argsort(vals)
        c = np.cumsum(wts[o]) / wts.sum()
        return vals[o][min(np.searchsorted(c, p), vals.size - 1)]

    lrs = 0.02 * nqm.lr_factors(300, "cosine")

    def loss(h, wt, tau):
        return nqm.expected_loss(nqm.Spectrum(h=h.clip(0), w=wt, c=0.05 * h.clip(0), x0sq=1.0),
                                 nqm.Method("ema", 0.9, tau), lrs, batch=16)[-1]

    return {"n": n, "probes": 4, "steps": 40, "top_rel_err": abs(nodes.max() - eig.max()) / eig.max(),
            "trace_rel_err": float((w * nodes).sum() / eig.sum() - 1),
            "quantile_decades": {str(p): float(np.log10(max(quantile(nodes, w, p), 1e-12)) - np.log10(
                quantile(eig, np.ones(n), p))) for p in (0.1, 0.5, 0.9)},
            "nqm_loss_rel_err": {str(t): float(loss(nodes, w, t) / loss(eig, np.ones(n), t) - 1) for t in (0, 1)}}


def markdown(d: dict) -> str:
    lines = ["| method | tau | correction | exact E[L_T] | MC mean | rel. error | rel. SE | z (end) | max abs z (curve) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in d["recursion_vs_mc"]:
        lines.append(f"| {r['method']} (beta {r['beta']}) | {r['tau']} | {r['correction']} | {r['exact']:.6g} | "
                     f"{r['mc']:.6g} | {100 * r['rel_err']:+.3f}% | {100 * r['rel_se']:.3f}% | {r['z_end']:+.2f} | "
                     f"{r['max_abs_z_curve']:.2f} |")
    rv = d["recursion_vs_mc"]
    lines += ["", f"{len(rv)} settings at {d['runs']} runs: largest |rel. error| "
              f"{100 * max(abs(r['rel_err']) for r in rv):.3f}%, largest |z| at the end "
              f"{max(abs(r['z_end']) for r in rv):.2f}, largest |z| anywhere on the 60-step curves "
              f"{max(r['max_abs_z_curve'] for r in rv):.2f}.", "",
              f"Lyapunov vs the recursion at 4000 steps: largest relative difference "
              f"{max(r['rel_diff'] for r in d['lyapunov']):.1e} over {len(d['lyapunov'])} methods.",
              f"Stability limit vs delaylab.theory.stability: largest relative difference "
              f"{max(r['rel_diff'] for r in d['stability']):.1e} over {len(d['stability'])} settings.", ""]
    s = d["slq"]
    lines.append(f"SLQ on {s['n']} planted eigenvalues ({s['probes']} probes x {s['steps']} Lanczos steps): top "
                 f"eigenvalue relative error {s['top_rel_err']:.1e}, trace {100 * s['trace_rel_err']:+.1f}%, density "
                 "quantiles off by " + ", ".join(f"{v:+.2f} decades at {k}" for k, v in s["quantile_decades"].items())
                 + ", NQM end loss from its nodes " + ", ".join(f"{100 * v:+.1f}% (tau {k})"
                                                                for k, v in s["nqm_loss_rel_err"].items()) + ".")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/nqm")
    ap.add_argument("--runs", type=int, default=100_000)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    d = {"runs": args.runs, "recursion_vs_mc": recursion_vs_mc(args.runs), "lyapunov": lyapunov(),
         "stability": stability(), "slq": slq_planted()}
    d["seconds"] = time.perf_counter() - t0
    out = Path(args.out)
    write_json(out / "checks.json", d)
    (out / "checks.md").write_text(markdown(d))
    print(markdown(d))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
