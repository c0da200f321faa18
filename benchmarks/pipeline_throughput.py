"""Per-batch time of 2bw vs our 1f1b/gpipe vs torch's Schedule1F1B, next to the simulator's prediction.

P = 2 ranks, one thread each, M in {4, 8} microbatches. All runs share one launch of the two
ranks and alternate: each round runs every (M, schedule) once, in an order rotated by
round, so slow phases of a noisy machine hit every schedule alike. Reported per (M,
schedule): the median over rounds of the steady-state seconds per batch (engine timeline,
one update at either end left out), its ratio to 2bw (paired by round), the ratio the
event-driven simulator predicts from the per-action costs measured in the same runs, the
ideal (M+P-1)/M, each stage's idle fraction, and each stage's memory (weight slots, grads,
optimizer state, peak stashed activations). Every run also records the CPU share that other
processes took; a run with more than --noisy cores of it is flagged and not to be trusted.

    python benchmarks/pipeline_throughput.py              # about 3 minutes on 2 cores
    python benchmarks/pipeline_throughput.py --json --out runs/bench
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

SCHEDULES = ("2bw", "1f1b", "gpipe", "torch-1f1b")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--microbatches", default="4,8", help="comma-separated M values (default 4,8)")
    ap.add_argument("--rounds", type=int, default=3, help="alternation rounds (default 3)")
    ap.add_argument("--steps", type=int, default=12, help="updates per run (default 12)")
    ap.add_argument("--preset", default="small", help="model preset (default small: 4 layers, d=128)")
    ap.add_argument("--batch-size", type=int, default=8, help="sequences per microbatch (default 8)")
    ap.add_argument("--block-size", type=int, default=128, help="tokens per sequence (default 128)")
    ap.add_argument("--noisy", type=float, default=0.25, help="foreign CPU cores above which a run is flagged")
    ap.add_argument("--out", help="folder for results.json and the runs (default: a temporary one)")
    ap.add_argument("--figures", metavar="DIR", help="also write pipeline_schedules.png and pipeline_timeline.png here")
    ap.add_argument("--json", action="store_true", help="print exactly one JSON object")
    args = ap.parse_args(argv)
    Ms = [int(m) for m in args.microbatches.split(",")]

    from delaylab.llm.config import Config
    from delaylab.llm.run.rank import run_jobs
    from delaylab.llm.pipeline.cost_model import Costs, simulate
    from delaylab.llm.pipeline.schedules import Schedule
    from delaylab.llm.pipeline.timeline import Timeline

    P = 2
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="pipeline-bench-"))
    jobs, keys = [], []
    for r in range(args.rounds):
        order = [(M, s) for M in Ms for s in SCHEDULES]
        k = r % len(order)
        for M, sched in order[k:] + order[:k]:  # rotate: every config leads a round once
            cfg = Config.from_dict(
                preset=args.preset, schedule=sched, stages=P, grad_accum=M, batch_size=args.batch_size,
                block_size=args.block_size, steps=args.steps, optimizer="adamw", eval_batches=1,
                log_every=args.steps, ckpt_every=0, threads=1, progress=False, device="cpu",
            )
            jobs.append((cfg, root / f"r{r}-M{M}-{sched}"))
            keys.append((r, M, sched))
    summaries = run_jobs(jobs)

    def timeline(folder: Path) -> Timeline:
        data = json.loads((folder / "timeline.json").read_text())
        return Timeline.from_list(data["events"], data["stages"])

    runs = {key: (s, out) for key, s, (_, out) in zip(keys, summaries, jobs)}
    tl = {key: timeline(out) for key, (_, out) in runs.items()}

    def predicted(r: int, M: int, sched: str) -> dict:
        """The simulator on the per-action costs measured in that run (torch's: in our 1f1b's)."""
        own = (r, M, "1f1b") if sched.startswith("torch") else (r, M, sched)
        costs = Costs.measured(tl[own])
        return simulate(Schedule(sched.removeprefix("torch-"), P, M, args.steps), costs).steady_state(skip=1)

    rows = []
    for M in Ms:
        pred = {(r, s): predicted(r, M, s) for r in range(args.rounds) for s in SCHEDULES}
        for sched in SCHEDULES:
            R = range(args.rounds)
            mine = [runs[(r, M, sched)][0] for r in R]
            spb = [x["seconds_per_batch"] for x in mine]
            spb_2bw = [runs[(r, M, "2bw")][0]["seconds_per_batch"] for r in R]
            p_spb = [pred[(r, sched)]["seconds_per_batch"] for r in R]
            p_2bw = [pred[(r, "2bw")]["seconds_per_batch"] for r in R]
            med = statistics.median
            idle = [med(x["idle_fraction"][i] for x in mine) for i in range(P)] \
                if mine[0]["idle_fraction"] is not None else None
            foreign = [x["foreign_cpu_cores"] for x in mine if x["foreign_cpu_cores"] is not None]
            mem = mine[0]["memory_bytes"]
            rows.append({
                "M": M, "schedule": sched, "seconds_per_batch": med(spb),
                "predicted_seconds_per_batch": med(p_spb),
                "measured_over_predicted": med(a / b for a, b in zip(spb, p_spb)),
                "ratio_to_2bw": med(a / b for a, b in zip(spb, spb_2bw)),
                "predicted_ratio_to_2bw": med(a / b for a, b in zip(p_spb, p_2bw)),
                "ideal_ratio_to_2bw": 1.0 if sched == "2bw" else (M + P - 1) / M,
                "idle_fraction": idle,
                "predicted_idle_fraction": [med(pred[(r, sched)]["idle_fraction"][i] for r in R) for i in range(P)],
                "memory_mb": [m["total"] / 2**20 for m in mem],
                "activation_mb": [None if m["activations"] is None else m["activations"] / 2**20 for m in mem],
                "foreign_cpu_cores": max(foreign) if foreign else None,
                "noisy": any(f > args.noisy for f in foreign),
                "costs_round0": vars(Costs.measured(tl[(0, M, "1f1b" if sched.startswith("torch") else sched)])),
            })
    if args.figures:
        _figures(Path(args.figures), tl, Ms[0], args, P)
    result = {
        "stages": P, "threads_per_rank": 1, "preset": args.preset, "batch_size": args.batch_size,
        "block_size": args.block_size, "steps": args.steps, "rounds": args.rounds,
        "noisy_threshold_cores": args.noisy, "cpu_cores": summaries[0]["cpu_cores"], "rows": rows,
        "noisy": any(r["noisy"] for r in rows), "runs": str(root),
    }
    (root / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"P={P}, one thread per rank, {args.preset} preset, microbatch {args.batch_size}x{args.block_size} "
          f"tokens, {args.steps} updates per run, {args.rounds} rounds alternated")
    print(f"{'M':>2} {'schedule':<11} {'s/batch':>8} {'pred':>8} {'meas/pred':>9} {'vs 2bw':>7} "
          f"{'pred':>6} {'ideal':>6}  {'idle/stage':<12} {'MB/stage':<12} {'foreign':>7}")
    for r in rows:
        idle = "-" if r["idle_fraction"] is None else ",".join(f"{x:.0%}" for x in r["idle_fraction"])
        mem = ",".join(f"{x:.1f}" for x in r["memory_mb"]) + ("*" if r["activation_mb"][0] is None else "")
        foreign = "n/a" if r["foreign_cpu_cores"] is None else f"{r['foreign_cpu_cores']:.2f}"
        print(f"{r['M']:>2} {r['schedule']:<11} {r['seconds_per_batch']:>8.4f} {r['predicted_seconds_per_batch']:>8.4f} "
              f"{r['measured_over_predicted']:>9.2f} {r['ratio_to_2bw']:>7.3f} {r['predicted_ratio_to_2bw']:>6.3f} "
              f"{r['ideal_ratio_to_2bw']:>6.3f}  {idle:<12} {mem:<12} {foreign:>7}{'  NOISY' if r['noisy'] else ''}")
    verdict = ("NOISY: other processes took more than "
               f"{args.noisy} cores during some runs; do not trust these ratios") if result["noisy"] else "quiet run"
    print("MB/stage: weight slots + grads + optimizer state + peak stashed activations "
          "(* torch's runtime: activations not counted)")
    print(f"{verdict}. Results: {root / 'results.json'}")
    return 0


def _figures(folder: Path, tl: dict, M: int, args, P: int) -> None:
    """The four schedules simulated with equal unit costs, and measured vs simulated runs."""
    from matplotlib.figure import Figure

    from delaylab.llm.pipeline.schedules import Schedule
    from delaylab.llm.pipeline.cost_model import Costs, simulate
    from delaylab.llm.pipeline.timeline import Event, Timeline, plot_timeline

    folder.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplots(4, 1)
    Pd, Md, steps = 4, 4, 3
    from delaylab.llm.pipeline.cost_model import predict

    unit = Costs.make(Pd, 1.0, 2.0)
    for ax, (name, m) in zip(axes, [("gpipe", Md), ("1f1b", Md), ("2bw", Md), ("pipedream", 1)]):
        sched = Schedule(name, Pd, m, steps * Md // m)
        steady = predict(name, Pd, m, unit)
        plot_timeline(simulate(sched, unit), ax=ax, microbatches=m, title=(
            f"{name}: P={Pd}, M={m}, forward 1, backward 2 per microbatch, delays {sched.delays()}; steady "
            f"state {steady['seconds_per_batch']:g} per update, bubble {steady['bubble']:.0%}"))
        ax.set_xlim(0, 66)
    fig.savefig(folder / "pipeline_schedules.png", dpi=110)

    fig = Figure(figsize=(11, 6.5), layout="constrained")
    axes = fig.subplots(4, 1, sharex=True)
    for ax, sched, kind in zip(axes, ["2bw", "2bw", "1f1b", "1f1b"], ["measured", "simulated"] * 2):
        real = tl[(0, M, sched)]
        head = Timeline([[e for e in evs if (e.n if e.op == "U" else e.n // M) < 4] for evs in real.events])
        if kind == "simulated":
            head = simulate(Schedule(sched, P, M, 4), Costs.measured(real))
        else:  # start the clock at 0 like the simulation
            t0 = min(e.ready for evs in head.events for e in evs)
            head = Timeline([[Event(e.stage, e.op, e.n, e.ready - t0, e.start - t0, e.end - t0) for e in evs]
                             for evs in head.events])
        plot_timeline(head, ax=ax, microbatches=M,
                      title=f"{sched}, P={P}, M={M}, {args.preset} preset: {kind}"
                      + (" from the costs measured in the run above" if kind == "simulated" else " (engine clock)"))
        ax.set_xlabel("seconds" if ax is axes[-1] else "")
    fig.savefig(folder / "pipeline_timeline.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
