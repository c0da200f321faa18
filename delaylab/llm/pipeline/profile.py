"""Per-stage action costs measured on one device, and what the simulator predicts from them.

For a machine with one GPU (or none): build every stage of the model on that device, time
one microbatch's forward, backward and an optimizer update per stage, and replay the
schedules with those costs. Messages cost ``activation bytes / link bandwidth``
(``--link-gbps``, an assumption: nothing is sent on one device).

    python -m delaylab.llm.pipeline.profile --preset 135m --stages 4 --microbatches 8 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from delaylab.llm.model import GPT, autocast, lm_loss
from delaylab.llm.pipeline.simulator import Costs, predict
from delaylab.llm.pipeline.stages import Stage


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_costs(cfg, device: torch.device, repeats: int = 5, link_gbps: float = 100.0) -> Costs:
    """Median seconds of F, B and U per stage of ``cfg`` (a :class:`Config`) for one microbatch."""
    from delaylab.llm.pipeline.engine import optimizer_factory

    cfg = cfg.resolved("pipeline")
    P = cfg.parallel.stages
    model_cfg = cfg.model_config(256 if cfg.data.tokenizer == "byte" else cfg.data.vocab_size)
    torch.manual_seed(cfg.run.seed)
    model = GPT(model_cfg)
    B, T, d = cfg.data.batch_size, model_cfg.block_size, model_cfg.d_model
    make = optimizer_factory(cfg)
    f, b, u = [], [], []
    for s in range(P):
        stage = Stage(model, s, P).to(device)
        opt = make(stage, 0)
        idx = torch.randint(0, model_cfg.vocab_size, (B, T), device=device)
        times = {"F": [], "B": [], "U": []}
        for rep in range(repeats + 1):  # the first round warms up kernels and allocator
            x = idx if stage.first else torch.randn(B, T, d, device=device, requires_grad=True)
            _sync(device)
            t0 = time.perf_counter()
            with autocast(device):
                out = stage(x)
                loss = lm_loss(out, idx) if stage.last else None
            _sync(device)
            t1 = time.perf_counter()
            (loss if stage.last else out).backward(None if stage.last else torch.ones_like(out))
            _sync(device)
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            _sync(device)
            t3 = time.perf_counter()
            if rep:
                times["F"].append(t1 - t0)
                times["B"].append(t2 - t1)
                times["U"].append(t3 - t2)
        f.append(statistics.median(times["F"]))
        b.append(statistics.median(times["B"]))
        u.append(statistics.median(times["U"]))
        stage.to("cpu")
        del opt
    send = B * T * d * 4 / (link_gbps * 1e9)  # float32 activations on the wire
    return Costs.make(P, f, b, u, send=send)


def main(argv=None) -> int:
    from delaylab.llm.config import Config

    ap = argparse.ArgumentParser(description="Predict 2bw vs 1f1b/gpipe from per-stage costs measured on one device.")
    ap.add_argument("--preset", default="135m")
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=1024)
    ap.add_argument("--optimizer", default="adamw")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--link-gbps", type=float, default=100.0, help="assumed link bandwidth, GB/s (default 100)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    cfg = Config.from_dict(preset=args.preset, stages=args.stages, grad_accum=args.microbatches, device="cpu",
                           batch_size=args.batch_size, block_size=args.block_size, optimizer=args.optimizer)
    costs = measure_costs(cfg, torch.device(args.device), link_gbps=args.link_gbps)
    tokens = args.microbatches * args.batch_size * args.block_size
    result = {"preset": args.preset, "stages": args.stages, "microbatches": args.microbatches,
              "tokens_per_batch": tokens, "device": args.device,
              "costs": {"forward": costs.forward, "backward": costs.backward, "update": costs.update,
                        "send": costs.send}, "predicted": {}}
    for name in ("2bw", "1f1b", "gpipe"):
        p = predict(name, args.stages, args.microbatches, costs)
        result["predicted"][name] = {"seconds_per_batch": p["seconds_per_batch"], "bubble": p["bubble"],
                                     "tokens_per_s_per_gpu": tokens / p["seconds_per_batch"] / args.stages}
    pr = result["predicted"]
    result["speedup_2bw_over_1f1b"] = pr["1f1b"]["seconds_per_batch"] / pr["2bw"]["seconds_per_batch"]
    result["ideal"] = (args.microbatches + args.stages - 1) / args.microbatches
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.preset}, P={args.stages}, M={args.microbatches}, {tokens} tokens per batch, costs on {args.device}")
        for name, p in pr.items():
            print(f"  {name:<5} {p['seconds_per_batch'] * 1e3:8.1f} ms/batch  bubble {p['bubble']:5.1%}  "
                  f"{p['tokens_per_s_per_gpu']:10.0f} tokens/s per GPU (predicted)")
        print(f"  2bw over 1f1b: {result['speedup_2bw_over_1f1b']:.3f} (ideal (M+P-1)/M = {result['ideal']:.3f})")
    return 0


if __name__ == "__main__":
    from delaylab.cli import exit_code_of

    sys.exit(exit_code_of(main))
