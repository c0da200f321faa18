"""How long a full default `delaylab toy profile` of one optimizer takes (target: <= 60 s on 2 cores).

    python benchmarks/toy_profile_speed.py [--optimizer adamw|muon|lion|sgd|lmo] [--threads 1]

Runs ``delaylab.toy.profile.profile`` with every default (the five problems of the suite,
delays 0, 1, 2 with and without EF, 5 lrs, T up to 200, 8 seeds, the stability bisection, and
the bound check for a declared LMO method) and prints the wall time per part, next to the
machine's load average (shared machines are noisy: read the time with the load).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

FACTORIES = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01),
    "muon": lambda params: torch.optim.Muon(params, lr=0.02),
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "lmo": lambda params: __import__("delaylab.optim", fromlist=["LMOMomentum"]).LMOMomentum(
        params, lr=0.02, beta=0.9, norm="spectral"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optimizer", default="adamw", choices=[*FACTORIES, "lion"])
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: the CI setting)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from delaylab.toy.profile import profile

    if args.optimizer == "lion":
        from pytorch_optimizer import Lion

        factory = lambda params: Lion(params, lr=3e-3)  # noqa: E731
    else:
        factory = FACTORIES[args.optimizer]
    parts: dict[str, float] = {}
    last = [time.perf_counter()]

    def progress(item: dict) -> None:
        key = "stability" if "stability" in item else "bound check" if "bound_check" in item else "sweep"
        now = time.perf_counter()
        parts[key] = parts.get(key, 0.0) + now - last[0]
        last[0] = now

    load0 = os.getloadavg()
    start = time.perf_counter()
    r = profile(factory, name=args.optimizer, progress=progress)
    total = time.perf_counter() - start
    load1 = os.getloadavg()
    ran = [p["problem"] for p in r["problems"]]
    print(f"toy profile of {args.optimizer}: {total:.1f} s wall ({', '.join(f'{k} {v:.1f} s' for k, v in parts.items())}); "
          f"problems {', '.join(ran)}" + (f"; skipped {', '.join(s['problem'] for s in r['skipped'])}" if r["skipped"] else ""))
    print(f"torch threads {torch.get_num_threads()}, cpus {os.cpu_count()}, load average before "
          f"{load0[0]:.2f} / after {load1[0]:.2f} (1 min)")
    print(f"target <= 60 s: {'met' if total <= 60 else 'NOT met'}")


if __name__ == "__main__":
    main()
