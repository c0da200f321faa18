"""Data-parallel scaling of the simulator: tokens/s at D = 1, 2, ... replicas on one global batch.

Every D runs the same config (same global batch, one thread per replica) in alternating rounds,
so a noisy machine hurts every D alike; the ratio to D = 1 is printed per round and as the
median. Tokens/s come from each run's ``train_time_s`` (the training loop, without start-up).
With ``--pp`` it also runs the pipeline at P = 2 with ``--dp 2``, 2bw vs 1f1b, when the engine
supports data parallelism. The load average is recorded before and after.

    python benchmarks/dp_scaling.py                    # D = 1, 2 (and 4, 8, ... where cores allow)
    python benchmarks/dp_scaling.py --dp 1,2,4,8 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from delaylab.llm.config import Config
from delaylab.llm.run.trainer import train, train_replicas

TARGET = 1.6  # D = 2 over D = 1 on 2 cores, `small` preset, one thread per replica


def main(argv=None) -> int:
    cores = os.cpu_count() or 1
    default_dp = ",".join(str(d) for d in (1, 2, 4, 8, 16) if d <= cores)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dp", default=default_dp, help=f"replica counts (default {default_dp}: up to the cores)")
    p.add_argument("--preset", default="small")
    p.add_argument("--batch-size", type=int, default=32, help="global sequences per microbatch (default 32)")
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pp", action="store_true", help="also the pipeline at P=2, D=2: 2bw vs 1f1b")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    sizes = [int(d) for d in args.dp.split(",")]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    base = Config.from_dict(preset=args.preset, batch_size=args.batch_size, block_size=args.block_size,
                            steps=args.steps, eval_every=10**6, eval_batches=1, ckpt_every=0, threads=1,
                            progress=False, device="cpu", delay=1)
    load_before = os.getloadavg()
    rates: dict[int, list[float]] = {d: [] for d in sizes}
    with tempfile.TemporaryDirectory(prefix="dp-scaling-") as root:
        for r in range(args.rounds):
            order = sizes[r % len(sizes):] + sizes[:r % len(sizes)]  # every D leads a round once
            for d in order:
                cfg = base.replace(dp=d)
                s = train(cfg) if d == 1 else train_replicas(cfg, Path(root) / f"r{r}-dp{d}")
                rates[d].append(s["tokens"] / s["train_time_s"])
        pipe = _pipeline(base, Path(root), args.rounds) if args.pp else None
    load_after = os.getloadavg()
    ratios = {d: [a / b for a, b in zip(rates[d], rates[sizes[0]])] for d in sizes}
    result = {
        "preset": args.preset, "global_batch": args.batch_size, "block_size": args.block_size, "steps": args.steps,
        "cores": cores, "load_before": load_before, "load_after": load_after,
        "tokens_per_s": {d: statistics.median(v) for d, v in rates.items()},
        "ratio_to_first": {d: statistics.median(v) for d, v in ratios.items()},
        "ratio_per_round": ratios, "target_dp2": TARGET, "pipeline": pipe,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{args.preset}, global batch {args.batch_size} x {args.block_size}, {args.steps} updates, "
          f"{cores} cores, load {load_before[0]:.1f} -> {load_after[0]:.1f}")
    for d in sizes:
        rounds = " ".join(f"{x:.2f}" for x in ratios[d])
        print(f"  D={d:<3} {result['tokens_per_s'][d]:10.0f} tokens/s   x{result['ratio_to_first'][d]:.2f} "
              f"(rounds: {rounds})")
    if 2 in sizes:
        print(f"  D=2 / D=1 = {result['ratio_to_first'][2]:.2f} (target >= {TARGET} on 2 cores)")
    if pipe:
        print(f"  pipeline P=2 D=2: 2bw {pipe['2bw']:.0f} tokens/s, 1f1b {pipe['1f1b']:.0f} tokens/s, "
              f"ratio {pipe['2bw'] / pipe['1f1b']:.3f}")
    return 0


def _pipeline(base: Config, root: Path, rounds: int) -> dict | None:
    """Pipeline P=2 x D=2 tokens/s, 2bw vs 1f1b (None where the engine has no --dp yet)."""
    from delaylab.errors import DelaylabError
    from delaylab.llm.run.rank import run_jobs

    jobs = []
    for r in range(rounds):
        for sched in ("2bw", "1f1b") if r % 2 == 0 else ("1f1b", "2bw"):
            cfg = base.replace(schedule=sched, stages=2, dp=2, delay=None, grad_accum=4)
            jobs.append((sched, (cfg, root / f"pp-r{r}-{sched}")))
    try:
        summaries = run_jobs([job for _, job in jobs])
    except DelaylabError as err:
        print(f"  pipeline with --dp: not run ({err})")
        return None
    out: dict[str, list[float]] = {}
    for (sched, _), s in zip(jobs, summaries):
        out.setdefault(sched, []).append(s["tokens_per_s"])
    return {k: statistics.median(v) for k, v in out.items()}


if __name__ == "__main__":
    raise SystemExit(main())
