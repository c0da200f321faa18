"""Runs per hour of `delaylab llm sweep` with --jobs 1 and --jobs 2, side by side.

The same grid (AdamW and Muon, sync and delayed, 4 seeds: 16 runs of the tiny GPT) runs with one
job and with two, alternating over rounds so that a noisy machine hurts both alike; prints the
wall time of each, runs per hour, and the ratio (target: --jobs 2 >= 1.8x --jobs 1 on 2 cores).
The load average is recorded before and after.

    python benchmarks/sweep_jobs.py [--rounds 2] [--steps 150] [--seeds 4] [--json]

With few runs per sweep the last run leaves a core idle and the pool's start-up (torch imported
in each worker) weighs more: 8 runs gave 1.77 (rounds 1.86, 1.68) on this machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from delaylab.llm.config import Config
from delaylab.llm.sweep import sweep

TARGET = 1.8


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--seeds", type=int, default=4, help="seeds per cell (default 4: 16 runs per sweep)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    base = Config.from_dict(preset="tiny", batch_size=16, steps=args.steps, eval_every=args.steps // 10,
                            eval_batches=8, ckpt_every=0, progress=False, device="cpu")
    grid = dict(optimizers=["adamw", "muon"], modes=["sync", "delayed"], seeds=args.seeds)
    runs = len(grid["optimizers"]) * len(grid["modes"]) * grid["seeds"]
    load_before = os.getloadavg()
    seconds: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory(prefix="sweep-jobs-") as root:
        for r in range(args.rounds):
            for jobs in ((1, 2) if r % 2 == 0 else (2, 1)):
                t0 = time.perf_counter()
                sweep(base.replace(threads=1), Path(root) / f"r{r}-j{jobs}", jobs=jobs, **grid)
                seconds[jobs].append(time.perf_counter() - t0)
    load_after = os.getloadavg()
    per_hour = {j: [runs * 3600 / s for s in v] for j, v in seconds.items()}
    ratios = [a / b for a, b in zip(per_hour[2], per_hour[1])]
    result = {"runs_per_sweep": runs, "steps": args.steps, "seconds": seconds,
              "runs_per_hour": {j: statistics.median(v) for j, v in per_hour.items()},
              "ratio_per_round": ratios, "ratio": statistics.median(ratios), "target": TARGET,
              "cores": os.cpu_count(), "load_before": load_before, "load_after": load_after}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{runs} tiny-GPT runs of {args.steps} updates per sweep, {os.cpu_count()} cores, "
          f"load {load_before[0]:.1f} -> {load_after[0]:.1f}")
    for j in (1, 2):
        print(f"  --jobs {j}: {statistics.median(seconds[j]):6.1f} s per sweep, "
              f"{result['runs_per_hour'][j]:6.0f} runs per hour")
    print(f"  --jobs 2 / --jobs 1 = {result['ratio']:.2f} (rounds: {' '.join(f'{x:.2f}' for x in ratios)}; "
          f"target >= {TARGET})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
