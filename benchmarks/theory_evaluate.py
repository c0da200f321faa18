"""How fast `delaylab.theory.evaluate` is on a grid, against point-by-point evaluation.

    python benchmarks/theory_evaluate.py [--points 1000000] [--repeats 5]

Prints the time of one vectorised call on N points (the issue's target: 10^6 points well
under a second) and the per-point cost ratio against calling the same compiled bound once
per point, the two measured alternately in one run (shared machines are noisy).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from delaylab.theory import evaluate, lmo_bound


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=10**6)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    bound = lmo_bound(1, ef=True)
    consts = dict(L=2.0, sigma=1.0, rho=3.0, Delta=5.0, G0=2.0, T=1e4, delta_bar=0.5)
    rng = np.random.default_rng(0)
    eta = rng.uniform(1e-5, 1e-1, args.points)
    beta = rng.uniform(0.0, 0.999, args.points)
    few = 2000
    evaluate(bound, **consts, eta=eta[:10], beta=beta[:10])  # compile once (cached)
    grid, loop = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        evaluate(bound, **consts, eta=eta, beta=beta)
        grid.append(time.perf_counter() - t)
        t = time.perf_counter()
        for i in range(few):
            evaluate(bound, **consts, eta=float(eta[i]), beta=float(beta[i]))
        loop.append((time.perf_counter() - t) / few)
    g, p = statistics.median(grid), statistics.median(loop)
    print(f"vectorised: {args.points} points in {g:.3f} s ({g / args.points * 1e9:.0f} ns/point)")
    print(f"one call per point: {p * 1e6:.1f} us/point")
    print(f"speed-up per point: {p / (g / args.points):.0f}x")


if __name__ == "__main__":
    main()
