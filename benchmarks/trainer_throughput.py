"""Tokens/s and MFU of the trainer against a bare PyTorch loop on the same model, device and batches.

    python benchmarks/trainer_throughput.py [--preset small] [--optimizer adamw] [--steps 60]
                                            [--chunk 3] [--threads 1] [--device auto] [--compile]
                                            [--batch-size 32] [--block-size N] [--data PATH]
                                            [--ef-bf16] [--json]

One process holds four runs of the same model, seed and batches, on one device: a bare loop
(forward, backward, ``opt.step()``, ``zero_grad``; bf16 autocast on CUDA as the trainer),
and ``delaylab.llm.run.trainer.Trainer`` in sync, delayed and delayed+EF mode (``--ef-bf16``: a
fifth, EF with a bfloat16 buffer), each stepped as
``train()`` steps it (``step(wait=False)``: the loss checked one call late, no host sync in the
call). They take turns, ``--chunk`` steps each, until each has made ``--steps`` timed steps
after two untimed warm-up steps, so machine noise falls on all four alike; every turn is fenced
(the trainer's losses settled, the device synchronized) at its start and end. Reported: tokens/s
per variant, the ratios trainer/bare (target >= 0.97), delayed/sync (>= 0.97), EF/sync (>= 0.95),
FLOPs per token (``delaylab.llm.mfu``) and MFU against a peak: on CUDA the device's bf16 dense
figure (``--peak-tflops`` overrides), on the CPU this CPU's fp32 matrix-product rate measured here
(a 1024 x 1024 product at ``--threads`` threads, best of 20). ``Trainer.step`` is the whole
per-call work of ``train()``; what ``train()``'s loop adds around it (progress bar, logging) is
measured separately, from a run's ``loop_time_s`` against its ``train_time_s``, and folded into the
trainer/bare ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from delaylab.llm import mfu
from delaylab.llm.mfu import matmul_tflops  # scripts/gpu_validate.py imports it from here too
from delaylab.llm.config import Config
from delaylab.llm.data import load_dataset
from delaylab.llm.model import GPT, autocast, compile_blocks
from delaylab.llm.run.trainer import Trainer, train
from delaylab.optim import build_optimizer

TARGETS = {"trainer/bare": 0.97, "delayed/sync": 0.97, "ef/sync": 0.95}


class BareLoop:
    """The loop a user would write by hand."""

    def __init__(self, cfg: Config, data, device: torch.device):
        torch.manual_seed(cfg.seed)
        self.model = GPT(cfg.model_config(data.vocab_size), cfg.data.grad_accum).to(device)
        if cfg.run.compile:
            compile_blocks(self.model)
        self.opt = build_optimizer(cfg.optimizer, self.model, lr=cfg.resolved_lr())
        self.cfg, self.data, self.calls, self.device = cfg, data, 0, device

    def step(self) -> None:
        x, y = self.data.batch(self.calls, self.cfg.batch_size, self.model.config.block_size, self.cfg.seed)
        with autocast(self.device):
            if self.device.type == "cuda":
                x, y = x.pin_memory(), y.pin_memory()
            loss = self.model(x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True))[1]
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.calls += 1

    def fence(self) -> None:
        _synchronize(self.device)


class TrainerLoop:
    """``Trainer`` stepped as ``train()`` steps it."""

    def __init__(self, cfg: Config, data):
        self.trainer = Trainer(cfg, data)

    def step(self) -> None:
        self.trainer.step(wait=False)

    def fence(self) -> None:
        self.trainer.settle()
        self.trainer.synchronize()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _load() -> dict:
    """The machine's load average and cores (the benchmark shares the machine: say so)."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return {}
    return {"loadavg_1m": one, "loadavg_5m": five, "cpu_cores": os.cpu_count()}


def main(argv=None) -> int:
    result = measure(argv)
    if result is not None:
        print(json.dumps(result))
    return 0


def measure(argv=None, quiet: bool = False) -> dict | None:
    """Run the benchmark; the result dict with ``--json`` (or ``quiet``), else print it and return None."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--optimizer", default="adamw")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--block-size", type=int, default=None, help="context length (default: the preset's)")
    p.add_argument("--steps", type=int, default=60, help="timed steps per variant")
    p.add_argument("--chunk", type=int, default=3, help="steps per turn")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="auto")
    p.add_argument("--compile", action="store_true", help="torch.compile each block, in every variant")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's peak (default: see above)")
    p.add_argument("--data", default="shakespeare", help="the corpus (default: the built-in one)")
    p.add_argument("--ef-bf16", action="store_true", help="also EF with a bfloat16 buffer")
    p.add_argument("--overhead-steps", type=int, default=None,
                   help="steps of the train() run that measures its loop (default max(20, steps / 3))")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = load_dataset(args.data)
    base = Config.from_dict(preset=args.preset, optimizer=args.optimizer, batch_size=args.batch_size,
                            block_size=args.block_size, steps=args.steps + 10, eval_batches=1, ckpt_every=0,
                            threads=args.threads, progress=False, device=args.device, compile=args.compile,
                            peak_tflops=args.peak_tflops, data=args.data).resolved()
    device = base.torch_device()
    load_before = _load()
    runs = {
        "bare": BareLoop(base, data, device),
        "sync": TrainerLoop(base, data),
        "delayed": TrainerLoop(base.replace(delay=1).resolved(), data),
        "ef": TrainerLoop(base.replace(delay=1, correction="ef").resolved(), data),
    }
    if args.ef_bf16:
        runs["ef-bf16"] = TrainerLoop(base.replace(delay=1, correction="ef", ef_dtype="bfloat16").resolved(), data)
    model_cfg = base.model_config(data.vocab_size)
    tokens_per_step = args.batch_size * model_cfg.block_size
    elapsed, warmup = dict.fromkeys(runs, 0.0), {}
    for name, run in runs.items():  # warm-up: first allocations, compilation, the delay queue's fill call
        t0 = time.perf_counter()
        run.step()
        run.step()
        run.fence()
        warmup[name] = time.perf_counter() - t0
    done = 0
    while done < args.steps:
        n = min(args.chunk, args.steps - done)
        for name, run in runs.items():
            run.fence()
            t0 = time.perf_counter()
            for _ in range(n):
                run.step()
            run.fence()
            elapsed[name] += time.perf_counter() - t0
        done += n
    rate = {k: args.steps * tokens_per_step / v for k, v in elapsed.items()}
    # train()'s own loop around Trainer.step, from one short run
    # (uncompiled: its final validation would cost a compilation of the eval graph)
    steps = args.overhead_steps or max(20, args.steps // 3)
    s = train(base.replace(steps=steps, eval_every=10**9, compile=False).resolved(), dataset=data)
    loop_overhead = s["loop_time_s"] / s["train_time_s"] - 1
    ratios = {
        "trainer/bare": rate["sync"] / rate["bare"] / (1 + loop_overhead),
        "delayed/sync": rate["delayed"] / rate["sync"],
        "ef/sync": rate["ef"] / rate["sync"],
        **({"ef-bf16/sync": rate["ef-bf16"] / rate["sync"]} if "ef-bf16" in rate else {}),
    }
    flops = mfu.flops_per_token(model_cfg)
    if device.type == "cuda":
        peak, peak_what = mfu.peak_tflops(device, args.peak_tflops), "bf16 dense peak (table or --peak-tflops)"
    elif args.peak_tflops is not None:
        peak, peak_what = args.peak_tflops, "--peak-tflops"
    else:
        peak, peak_what = matmul_tflops(device), f"this CPU's measured fp32 1024^3 matmul rate, {args.threads} thread(s)"
    result = {"preset": args.preset, "optimizer": args.optimizer, "threads": args.threads, "steps": args.steps,
              "device": str(device), "compile": args.compile, "block_size": model_cfg.block_size,
              "batch_size": args.batch_size, "tokens_per_s": rate, "train_loop_overhead": loop_overhead,
              "ratios": ratios, "targets": TARGETS, "pass": all(ratios[k] >= t for k, t in TARGETS.items()),
              "warmup_s": warmup,
              "flops_per_token": flops, "peak_tflops": peak, "peak": peak_what,
              "mfu": {k: mfu.mfu(v, flops, 1, peak) for k, v in rate.items()},
              "load_before": load_before, "load_after": _load()}
    if args.json or quiet:
        return result
    else:
        print(f"{args.preset} {args.optimizer} on {device}, {args.threads} thread(s), {args.steps} steps each, "
              f"alternated (load {load_before.get('loadavg_1m', float('nan')):.2f} before, "
              f"{result['load_after'].get('loadavg_1m', float('nan')):.2f} after, {os.cpu_count()} cores):")
        for k, v in rate.items():
            m = result["mfu"][k]
            print(f"  {k:<8} {v:10.0f} tokens/s" + (f"   MFU {100 * m:5.1f}%" if m is not None else ""))
        print(f"  FLOPs per token {flops:.4g} (6 N + 12 L d T); peak {peak:.4g} TFLOPS: {peak_what}"
              if peak is not None else f"  FLOPs per token {flops:.4g} (6 N + 12 L d T); no peak known")
        print(f"  train() loop around Trainer.step: {100 * loop_overhead:+.2f}%")
        for k, v in ratios.items():
            print(f"  {k:<13} {v:.3f}" + (f"  (target >= {TARGETS[k]})" if k in TARGETS else ""))
    return None


if __name__ == "__main__":
    sys.exit(main())
