"""Muon against AdamW on the CPU, with Newton-Schulz in bfloat16 and in float32 (issue 38).

    python benchmarks/muon_ns_dtype.py [--rounds 12] [--chunk 3] [--threads 1] [--batch-size 16]
                                       [--block-size 64] [--json]

One process trains the ``small`` GPT (4 layers, d=128) three ways on the same batches: AdamW, Muon
with bfloat16 Newton-Schulz (torch's Muon) and Muon with float32 Newton-Schulz (``ns_dtype="float32"``).
They take turns, ``--chunk`` steps each per round, so machine noise falls on all three alike. Per round
it records the optimizer step's time and the whole step's (forward, backward, step); reported: Muon /
AdamW for each, as the mean of the per-round ratios with a 95% t interval over rounds, and the CPU
capability torch reports (a bfloat16 product is about 30x slower than a float32 one without AVX512-BF16
or AMX). Target: Muon's tokens/s within 1.3x of AdamW's, i.e. whole step Muon / AdamW <= 1.3.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from scipy import stats

from delaylab.llm.model import GPT, preset
from delaylab.optim import build_optimizer
from delaylab.optim.registry import cpu_has_native_bf16

VARIANTS = {"adamw": dict(name="adamw", lr=4e-3), "muon-bf16": dict(name="muon", lr=0.02, ns_dtype="bfloat16"),
            "muon-f32": dict(name="muon", lr=0.02, ns_dtype="float32")}


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    m, n = statistics.mean(xs), len(xs)
    h = stats.t.ppf(0.975, n - 1) * statistics.stdev(xs) / n ** 0.5
    return m, m - h, m + h


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--chunk", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = preset("small", block_size=args.block_size, vocab_size=256)
    runs = {}
    for key, v in VARIANTS.items():
        torch.manual_seed(0)
        model = GPT(cfg)
        hp = {k: x for k, x in v.items() if k != "name"}
        runs[key] = (model, build_optimizer(v["name"], model, **hp))
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 256, (args.batch_size, args.block_size + 1), generator=gen) for _ in range(8)]
    times = {k: {"opt": [], "step": []} for k in VARIANTS}
    load_before = os.getloadavg()[0]
    for r in range(args.rounds + 1):  # round 0 warms up (allocations, optimizer state)
        for key, (model, opt) in runs.items():
            t_opt = t_all = 0.0
            for i in range(args.chunk):
                b = batches[(r * args.chunk + i) % len(batches)]
                t0 = time.perf_counter()
                loss = model(b[:, :-1], b[:, 1:])[1]
                loss.backward()
                t1 = time.perf_counter()
                opt.step()
                opt.zero_grad(set_to_none=True)
                t2 = time.perf_counter()
                t_opt += t2 - t1
                t_all += t2 - t0
            if r:
                times[key]["opt"].append(t_opt)
                times[key]["step"].append(t_all)
    out = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "native_bf16": cpu_has_native_bf16(),
           "threads": args.threads, "load": [load_before, os.getloadavg()[0]],
           "tokens_per_s": {k: args.chunk * args.batch_size * args.block_size / statistics.median(t["step"])
                            for k, t in times.items()}}
    for muon in ("muon-bf16", "muon-f32"):
        for what in ("opt", "step"):
            ratios = [m / a for m, a in zip(times[muon][what], times["adamw"][what])]
            out[f"{muon}/adamw {what}"] = t_interval(ratios)
    if args.json:
        print(json.dumps(out))
        return
    print(f"CPU capability (torch): {out['cpu_capability']}; native bf16 (AVX512-BF16/AMX): {out['native_bf16']}; "
          f"{args.threads} thread(s), load {out['load'][0]:.2f} -> {out['load'][1]:.2f} on {os.cpu_count()} cores")
    print(f"small GPT, {args.batch_size} x {args.block_size} tokens, {args.rounds} rounds of {args.chunk} steps")
    for k, v in out["tokens_per_s"].items():
        print(f"  {k:<10} {v:8.0f} tokens/s")
    for muon in ("muon-bf16", "muon-f32"):
        for what, label in (("opt", "optimizer step"), ("step", "whole step (1/tokens/s)")):
            m, lo, hi = out[f"{muon}/adamw {what}"]
            print(f"  {muon}/adamw {label:<24} {m:6.2f}x  95% t [{lo:.2f}, {hi:.2f}]")
    print("target: whole step Muon / AdamW <= 1.3 (Muon's tokens/s within 1.3x of AdamW's)")


if __name__ == "__main__":
    main()
