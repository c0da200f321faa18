"""Throughput of Schedule2BW vs torch's Schedule1F1B on the same PipelineStage objects, one run.

Both schedules drive torch's ``PipelineStage`` over the same stage modules of this project's
GPT (same config, data, optimizer; ``delaylab.integrations.gpt_pipeline``) in one launch of P
gloo ranks, one thread each. Rounds alternate the two (in an order rotated by round) at each M,
so a slow phase of a shared machine hits both. Per run: the steady-state seconds per batch on the
last stage (batches ``skip`` .. end, the warm-up left out, the drain not counted); reported per
M: the ratio 1F1B / 2BW seconds per batch (= 2BW's throughput over 1F1B's) per round, its
median and its t interval over rounds, the ideal (M+P-1)/M beside it, and the CPU cores other
processes kept busy during each run. A 2-core machine shared with other work cannot resolve a
10% bubble: the ratio is a smoke number there; the claim needs a GPU (one per stage).

    python benchmarks/torch_2bw_throughput.py                # P = 2, M = 4 and 8, about 4 minutes
    python benchmarks/torch_2bw_throughput.py --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

SCHEDULES = ("1F1B", "2BW")


def t_interval(xs: list[float], level: float = 0.95) -> list[float] | None:
    from scipy import stats

    if len(xs) < 2:
        return None
    m, se = statistics.mean(xs), statistics.stdev(xs) / len(xs) ** 0.5
    h = stats.t.ppf(0.5 + level / 2, len(xs) - 1) * se
    return [m - h, m + h]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stages", type=int, default=2, help="pipeline stages = gloo ranks (default 2)")
    ap.add_argument("--microbatches", default="4,8", help="comma-separated M values (default 4,8)")
    ap.add_argument("--rounds", type=int, default=3, help="alternation rounds (default 3)")
    ap.add_argument("--steps", type=int, default=12, help="batches per run (default 12)")
    ap.add_argument("--skip", type=int, default=2, help="first batches left out of the timing (default 2)")
    ap.add_argument("--preset", default="small", help="model preset (default small: 4 layers, d=128)")
    ap.add_argument("--batch-size", type=int, default=8, help="sequences per microbatch (default 8)")
    ap.add_argument("--block-size", type=int, default=128, help="tokens per sequence (default 128)")
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    args = ap.parse_args(argv)
    Ms, P = [int(m) for m in args.microbatches.split(",")], args.stages
    if any(M < P for M in Ms) or args.steps <= args.skip + 1:
        ap.error(f"torch's Schedule1F1B needs M >= P = {P}, and steps > skip + 1")

    from delaylab.integrations.gpt_pipeline import run_torch_schedule
    from delaylab.llm.config import Config

    root = Path(tempfile.mkdtemp(prefix="torch-2bw-bench-"))
    jobs, keys = [], []
    for r in range(args.rounds):
        order = [(M, s) for M in Ms for s in SCHEDULES]
        k = r % len(order)
        for M, sched in order[k:] + order[:k]:
            cfg = Config.from_dict(
                preset=args.preset, schedule="2bw" if sched == "2BW" else "1f1b", stages=P, grad_accum=M,
                batch_size=args.batch_size, block_size=args.block_size, steps=args.steps, optimizer="adamw",
                tie_embeddings=False, eval_batches=1, log_every=args.steps, ckpt_every=0, threads=1,
                progress=False, device="cpu")
            jobs.append((cfg, sched, root / f"r{r}-M{M}-{sched}"))
            keys.append((r, M, sched))
    results = run_torch_schedule(jobs, timeout=600)

    per_batch, foreign = {}, {}
    for (r, M, sched), res in zip(keys, results):
        ends = res["batch_ends"]
        per_batch[(r, M, sched)] = (ends[-1] - ends[args.skip - 1]) / (len(ends) - args.skip)
        busy = res["machine_busy_s"]
        foreign[(r, M, sched)] = None if busy is None else max(0.0, busy - sum(res["cpu_s"])) / res["wall_s"]
    out = {"stages": P, "rounds": args.rounds, "steps": args.steps, "skip": args.skip, "preset": args.preset,
           "batch_size": args.batch_size, "block_size": args.block_size, "cpu_cores": _cores(), "by_M": {}}
    for M in Ms:
        ratios = [per_batch[(r, M, "1F1B")] / per_batch[(r, M, "2BW")] for r in range(args.rounds)]
        loads = [foreign[(r, M, s)] for r in range(args.rounds) for s in SCHEDULES]
        out["by_M"][str(M)] = {
            "seconds_per_batch": {s: statistics.median(per_batch[(r, M, s)] for r in range(args.rounds))
                                  for s in SCHEDULES},
            "throughput_ratio_2bw_over_1f1b": statistics.median(ratios),
            "ratio_per_round": ratios, "ratio_t95": (ci := t_interval(ratios)),
            "verdict": ("undetermined" if ci is None or ci[0] <= 1 <= ci[1]
                        else "2BW faster" if ci[0] > 1 else "2BW slower"),
            "ideal": (M + P - 1) / M,
            "foreign_cpu_cores_max": None if None in loads else max(loads),
        }
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"Schedule2BW vs torch's Schedule1F1B, P = {P} gloo ranks on {out['cpu_cores']} cores, "
          f"{args.rounds} rounds, batches {args.skip}..{args.steps - 1} of {args.steps}")
    print(f"{'M':>3} {'1F1B s/batch':>13} {'2BW s/batch':>12} {'2BW/1F1B':>9} {'t95':>17} {'ideal':>6} "
          f"{'foreign cores':>14}  verdict")
    for M, row in out["by_M"].items():
        ci = row["ratio_t95"]
        ci_text = "-" if ci is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]"
        load = row["foreign_cpu_cores_max"]
        print(f"{M:>3} {row['seconds_per_batch']['1F1B']:>13.3f} {row['seconds_per_batch']['2BW']:>12.3f} "
              f"{row['throughput_ratio_2bw_over_1f1b']:>9.2f} {ci_text:>17} {row['ideal']:>6.3f} "
              f"{'-' if load is None else f'{load:.2f}':>14}  {row['verdict']}")
    print("A shared 2-core machine cannot resolve a 10% bubble: read the ratio as a smoke number; "
          "the throughput claim needs one GPU per stage.")
    return 0


def _cores() -> int | None:
    import os

    return os.cpu_count()


if __name__ == "__main__":
    sys.exit(main())
