"""Seconds per batch of one pipeline run under two source trees, side by side (a code change's cost).

Each round runs ``delaylab llm pipeline`` once with ``--before`` and once with ``--after`` first
on ``PYTHONPATH`` (in an order that alternates by round, so a slow spell of the shared machine hits
both alike); the ratio after/before is paired by round and gets a 95% t interval over the rounds.

    git archive HEAD~1 delaylab | tar -x -C /tmp/before
    python benchmarks/pipeline_ab.py --before /tmp/before --after . --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(tree: str, args, folder: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "delaylab", "llm", "pipeline", "--stages", str(args.stages), "--schedule",
           args.schedule, "--grad-accum", str(args.microbatches), "--preset", args.preset, "--batch-size",
           str(args.batch_size), "--block-size", str(args.block_size), "--steps", str(args.steps),
           "--eval-batches", "1", "--ckpt-every", "0", "--threads", "1", "--out", str(folder), "--json"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["seconds_per_batch"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True, help="folder holding the old delaylab/ package")
    ap.add_argument("--after", required=True, help="folder holding the new delaylab/ package")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--schedule", default="2bw")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from delaylab.stats import t_interval

    root = Path(tempfile.mkdtemp(prefix="pipeline-ab-"))
    spb = {"before": [], "after": []}
    for r in range(args.rounds):
        order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
        for which in order:
            spb[which].append(run(getattr(args, which), args, root / f"r{r}-{which}"))
    ratios = [a / b for a, b in zip(spb["after"], spb["before"])]
    result = {"setup": {k: v for k, v in vars(args).items() if k not in ("before", "after")},
              "seconds_per_batch": spb, "after_over_before": statistics.fmean(ratios),
              "interval95": t_interval(ratios, 0.95), "per_round": ratios}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
