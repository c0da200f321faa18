"""Tokens/s of the trainer against a bare PyTorch loop on the same model and batches.

    python benchmarks/trainer_throughput.py [--preset small] [--optimizer adamw] [--steps 60]
                                            [--chunk 3] [--threads 1] [--json]

One process holds four runs of the same model, seed and batches: a bare loop (forward,
backward, ``opt.step()``, ``zero_grad``), and ``delaylab.llm.run.trainer.Trainer`` in sync, delayed
and delayed+EF mode. They take turns, ``--chunk`` steps each, until each has made ``--steps``
timed steps (after two untimed warm-up steps), so machine noise falls on all four alike.
Reported: tokens/s per variant and the ratios trainer/bare (target >= 0.95), delayed/sync
(>= 0.97), EF/sync (>= 0.95). ``Trainer.step`` is the whole per-call work of ``train()``;
what ``train()``'s loop adds around it (progress bar, logging) is measured separately, from a
run's ``loop_time_s`` against its ``train_time_s``, and folded into the trainer/bare ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from delaylab.llm.data import load_dataset
from delaylab.llm.model import GPT
from delaylab.llm.config import Config
from delaylab.llm.run.trainer import Trainer, train
from delaylab.optim import build_optimizer

TARGETS = {"trainer/bare": 0.95, "delayed/sync": 0.97, "ef/sync": 0.95}


class BareLoop:
    """The loop a user would write by hand."""

    def __init__(self, cfg: Config, data):
        torch.manual_seed(cfg.seed)
        self.model = GPT(cfg.model_config(data.vocab_size))
        self.opt = build_optimizer(cfg.optimizer, self.model, lr=cfg.resolved_lr())
        self.cfg, self.data, self.calls = cfg, data, 0

    def step(self) -> None:
        x, y = self.data.batch(self.calls, self.cfg.batch_size, self.model.config.block_size, self.cfg.seed)
        self.model(x, y)[1].backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.calls += 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--optimizer", default="adamw")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=60, help="timed steps per variant")
    p.add_argument("--chunk", type=int, default=3, help="steps per turn")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = load_dataset()
    base = Config.from_dict(preset=args.preset, optimizer=args.optimizer, batch_size=args.batch_size,
                            steps=args.steps + 10, eval_batches=1, ckpt_every=0, threads=args.threads,
                            progress=False).resolved()
    runs = {
        "bare": BareLoop(base, data),
        "sync": Trainer(base, data),
        "delayed": Trainer(base.replace(delay=1), data),
        "ef": Trainer(base.replace(delay=1, correction="ef"), data),
    }
    tokens_per_step = args.batch_size * base.model_config(data.vocab_size).block_size
    elapsed = dict.fromkeys(runs, 0.0)
    for run in runs.values():  # warm-up: first allocations, the delay queue's fill call
        run.step()
        run.step()
    done = 0
    while done < args.steps:
        n = min(args.chunk, args.steps - done)
        for name, run in runs.items():
            t0 = time.perf_counter()
            for _ in range(n):
                run.step()
            elapsed[name] += time.perf_counter() - t0
        done += n
    rate = {k: args.steps * tokens_per_step / v for k, v in elapsed.items()}
    # train()'s own loop around Trainer.step, from one short run
    s = train(base.replace(steps=max(20, args.steps // 3), eval_every=10**9), dataset=data)
    loop_overhead = s["loop_time_s"] / s["train_time_s"] - 1
    ratios = {
        "trainer/bare": rate["sync"] / rate["bare"] / (1 + loop_overhead),
        "delayed/sync": rate["delayed"] / rate["sync"],
        "ef/sync": rate["ef"] / rate["sync"],
    }
    result = {"preset": args.preset, "optimizer": args.optimizer, "threads": args.threads, "steps": args.steps,
              "tokens_per_s": rate, "train_loop_overhead": loop_overhead, "ratios": ratios, "targets": TARGETS,
              "pass": all(ratios[k] >= t for k, t in TARGETS.items())}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.preset} {args.optimizer}, {args.threads} thread(s), {args.steps} steps each, alternated:")
        for k, v in rate.items():
            print(f"  {k:<8} {v:10.0f} tokens/s")
        print(f"  train() loop around Trainer.step: {100 * loop_overhead:+.2f}%")
        for k, v in ratios.items():
            print(f"  {k:<13} {v:.3f}  (target >= {TARGETS[k]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
