"""Tokens/s and MFU of the trainer against a bare PyTorch loop on the same model, device and batches.

    python benchmarks/trainer_throughput.py [--preset small] [--optimizer adamw] [--steps 60]
                                            [--chunk 3] [--threads 1] [--device auto]
                                            [--compile | --also-compiled] [--batch-size 32]
                                            [--block-size N] [--data PATH] [--ef-bf16] [--json]

One process holds four runs of the same model, seed and batches, on one device: a bare loop
(forward, backward, ``opt.step()``, ``zero_grad``; bf16 autocast on CUDA as the trainer),
and ``delaylab.llm.run.trainer.Trainer`` in sync, delayed and delayed+EF mode (``--ef-bf16``: a
fifth, EF with a bfloat16 buffer), each stepped as
``train()`` steps it (``step(wait=False)``: the loss checked one call late, no host sync in the
call). They take turns, ``--chunk`` steps each, until each has made ``--steps`` timed steps
after two untimed warm-up steps, so machine noise falls on all four alike; every turn is fenced
(the trainer's losses settled, the device synchronized) at its start and end. Reported: tokens/s
per variant, the ratios trainer/bare, delayed/sync and EF/sync against :data:`TARGETS`, FLOPs per
token and MFU both ways (``delaylab.llm.mfu``: the convention 6 N + 12 L d T and the causal
6 N + 6 L d T) against a peak: on CUDA the device's bf16 dense figure (``--peak-tflops``
overrides), on the CPU this CPU's fp32 matrix-product rate measured here (a 1024 x 1024 product at
``--threads`` threads, best of 20). ``Trainer.step`` is the whole per-call work of ``train()``; what
``train()``'s loop adds around it (progress bar, logging) is measured separately, from a run's
``loop_time_s`` against its ``train_time_s``, and folded into the trainer/bare ratio.

The variants' models are one initialization (:func:`reused_models`: the seeded model is built once
and copied, on the device, for the others; at 360m a build is seconds of CPU work, a copy is
milliseconds). ``--also-compiled`` measures the same runs twice: as built, then with every block
compiled in place (``compile_blocks``) and warmed up again: one build and, the blocks being alike,
one compilation per preset for both measurements.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import sys
import time

import torch

from delaylab.llm import mfu
from delaylab.llm.mfu import matmul_tflops  # scripts/gpu_validate.py imports it from here too
from delaylab.llm.config import Config
from delaylab.llm.data import load_dataset
from delaylab.llm.model import autocast, compile_blocks
from delaylab.llm.run.setup import Setup
from delaylab.llm.run.trainer import Trainer, train
from delaylab.optim import build_optimizer

# The pass marks, the one place they are written: this benchmark, scripts/gpu_validate.py (its plan
# and record) and docs/gpu/README.md read them (tests/scripts/test_gpu_commands.py checks the docs).
TARGETS = {"trainer/bare": 0.97, "delayed/sync": 0.97, "ef/sync": 0.95}
# On a GPU, beside the ratios: the sync trainer's MFU under the convention (6 N + 12 L d T, the
# count torchtitan and nanoGPT report) at 360m, bf16, with --compile.
MFU_TARGET = {"preset": "360m", "mfu": 0.40}


def targets_text() -> str:
    """The pass marks in one line, as the plan, the record and docs/gpu/README.md print them."""
    ratios = ", ".join(f"{k} >= {v:.2f}" for k, v in TARGETS.items())
    return (f"pass marks: {ratios}; on a GPU the sync trainer's MFU (convention) >= "
            f"{MFU_TARGET['mfu']:.0%} at {MFU_TARGET['preset']} with --compile")


@contextlib.contextmanager
def reused_models():
    """Within, every run's seeded model (``Setup.seeded_model``) is built once per (seed, shape,
    device) and copied for each later run: the same weights a fresh build gives (the build is a
    pure function of the seed), made on the device by a copy instead of an initialization on the
    CPU. The first build is moved to the run's device and kept there as the original."""
    built, original = {}, Setup.seeded_model

    def seeded_model(setup: Setup):
        key = (setup.cfg.run.seed, repr(setup.model_cfg), setup.cfg.data.grad_accum, str(setup.device))
        if key not in built:
            built[key] = original(setup).to(setup.device)
        return copy.deepcopy(built[key])

    Setup.seeded_model = seeded_model
    try:
        yield
    finally:
        Setup.seeded_model = original


class BareLoop:
    """The loop a user would write by hand."""

    def __init__(self, cfg: Config, data, device: torch.device):
        self.model = Setup(cfg, "simulator", data).seeded_model().to(device)  # the trainer's initial weights
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
        self.model = self.trainer.model

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
    """Run the benchmark; the result dict with ``--json`` (or ``quiet``), else print it and return
    None. With ``--also-compiled`` the dict is ``{"eager": result, "compiled": result}``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--optimizer", default="adamw")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--block-size", type=int, default=None, help="context length (default: the preset's)")
    p.add_argument("--steps", type=int, default=60, help="timed steps per variant")
    p.add_argument("--chunk", type=int, default=3, help="steps per turn")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="auto")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--compile", action="store_true", help="torch.compile each block, in every variant")
    mode.add_argument("--also-compiled", action="store_true",
                      help="measure as built, then with the same models' blocks compiled in place")
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
    t0 = time.perf_counter()
    with reused_models():
        runs = {
            "bare": BareLoop(base, data, device),
            "sync": TrainerLoop(base, data),
            "delayed": TrainerLoop(base.replace(delay=1).resolved(), data),
            "ef": TrainerLoop(base.replace(delay=1, correction="ef").resolved(), data),
        }
        if args.ef_bf16:
            runs["ef-bf16"] = TrainerLoop(base.replace(delay=1, correction="ef", ef_dtype="bfloat16").resolved(),
                                          data)
        build_s = time.perf_counter() - t0
        # train()'s own loop around Trainer.step, from one short run (uncompiled: its final validation
        # would cost a compilation of the eval graph); the same for both measurements
        steps = args.overhead_steps or max(20, args.steps // 3)
        s = train(base.replace(steps=steps, eval_every=10**9, compile=False).resolved(), dataset=data)
    loop_overhead = s["loop_time_s"] / s["train_time_s"] - 1
    model_cfg = base.model_config(data.vocab_size)
    if device.type == "cuda":
        peak, peak_what = mfu.peak_tflops(device, args.peak_tflops), "bf16 dense peak (table or --peak-tflops)"
    elif args.peak_tflops is not None:
        peak, peak_what = args.peak_tflops, "--peak-tflops"
    else:
        peak, peak_what = matmul_tflops(device), f"this CPU's measured fp32 1024^3 matmul rate, {args.threads} thread(s)"
    common = {"preset": args.preset, "optimizer": args.optimizer, "threads": args.threads, "steps": args.steps,
              "device": str(device), "block_size": model_cfg.block_size, "batch_size": args.batch_size,
              "train_loop_overhead": loop_overhead, "targets": TARGETS, "build_s": build_s,
              "flops_per_token": mfu.flops_per_token(model_cfg),
              "flops_per_token_causal": mfu.flops_per_token(model_cfg, causal=True),
              "peak_tflops": peak, "peak": peak_what, "load_before": load_before}
    results = {}
    for compiled in ([False, True] if args.also_compiled else [args.compile]):
        if compiled and args.also_compiled:
            for run in runs.values():
                compile_blocks(run.model)
        graphs = _compiled_graphs()
        rate, warmup = _alternate(runs, args.steps, args.chunk)
        tokens_per_step = args.batch_size * model_cfg.block_size
        rate = {k: args.steps * tokens_per_step / v for k, v in rate.items()}
        ratios = {
            "trainer/bare": rate["sync"] / rate["bare"] / (1 + loop_overhead),
            "delayed/sync": rate["delayed"] / rate["sync"],
            "ef/sync": rate["ef"] / rate["sync"],
            **({"ef-bf16/sync": rate["ef-bf16"] / rate["sync"]} if "ef-bf16" in rate else {}),
        }
        both = {k: mfu.mfu_both(v, model_cfg, 1, peak) for k, v in rate.items()}
        results["compiled" if compiled else "eager"] = {
            **common, "compile": compiled, "tokens_per_s": rate, "ratios": ratios,
            "pass": all(ratios[k] >= t for k, t in TARGETS.items()), "warmup_s": warmup,
            "mfu": {k: b["mfu"] for k, b in both.items()}, "mfu_causal": {k: b["mfu_causal"] for k, b in both.items()},
            "compiled_graphs": _compiled_graphs() - graphs if compiled else 0, "load_after": _load()}
    result = results if args.also_compiled else next(iter(results.values()))
    if args.json or quiet:
        return result
    for r in results.values():
        _print(r)
    return None


def _alternate(runs: dict, steps: int, chunk: int) -> tuple[dict, dict]:
    """Two untimed warm-up steps of each run (allocations, compilation, the delay queue's fill
    call), then turns of ``chunk`` fenced steps until each has made ``steps``: ``(seconds, warm-up
    seconds)`` per run."""
    elapsed, warmup = dict.fromkeys(runs, 0.0), {}
    for name, run in runs.items():
        t0 = time.perf_counter()
        run.step()
        run.step()
        run.fence()
        warmup[name] = time.perf_counter() - t0
    done = 0
    while done < steps:
        n = min(chunk, steps - done)
        for name, run in runs.items():
            run.fence()
            t0 = time.perf_counter()
            for _ in range(n):
                run.step()
            run.fence()
            elapsed[name] += time.perf_counter() - t0
        done += n
    return elapsed, warmup


def _compiled_graphs() -> int:
    """Graphs torch.compile has made in this process so far (Dynamo's count of unique graphs)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def _print(result: dict) -> None:
    r, load_before = result, result["load_before"]
    print(f"{r['preset']} {r['optimizer']} on {r['device']}{', compiled' if r['compile'] else ''}, "
          f"{r['threads']} thread(s), {r['steps']} steps each, alternated "
          f"(load {load_before.get('loadavg_1m', float('nan')):.2f} before, "
          f"{r['load_after'].get('loadavg_1m', float('nan')):.2f} after, {os.cpu_count()} cores):")
    for k, v in r["tokens_per_s"].items():
        m, c = r["mfu"][k], r["mfu_causal"][k]
        print(f"  {k:<8} {v:10.0f} tokens/s"
              + (f"   MFU {100 * m:5.1f}% (convention)  {100 * c:5.1f}% (causal)" if m is not None else ""))
    print(f"  FLOPs per token {r['flops_per_token']:.4g} ({mfu.MFU_NAMES['mfu']}), "
          f"{r['flops_per_token_causal']:.4g} ({mfu.MFU_NAMES['mfu_causal']})")
    print(f"  peak {r['peak_tflops']:.4g} TFLOPS: {r['peak']}" if r["peak_tflops"] is not None else "  no peak known")
    print(f"  train() loop around Trainer.step: {100 * r['train_loop_overhead']:+.2f}%")
    for k, v in r["ratios"].items():
        print(f"  {k:<13} {v:.3f}" + (f"  (target >= {TARGETS[k]})" if k in TARGETS else ""))


if __name__ == "__main__":
    sys.exit(main())
