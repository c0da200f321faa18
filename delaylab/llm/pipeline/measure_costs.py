"""Measuring per-stage action costs on one device, for the cost model (:mod:`.cost_model`).

For a machine with one GPU (or none): build every stage of the model on that device and time one
microbatch's forward, backward and an optimizer update per stage; the cost model then replays the
schedules with those costs (``delaylab llm advise`` does both). Messages cost ``activation bytes /
link bandwidth`` (``link_gbps``, an assumption: nothing is sent on one device).
"""

from __future__ import annotations

import statistics
import time

import torch

from delaylab.llm.model import GPT, autocast, lm_loss
from delaylab.llm.pipeline.cost_model import Costs
from delaylab.llm.pipeline.stages import Stage, optimizer_factory


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_costs(cfg, device: torch.device, repeats: int = 5, link_gbps: float = 100.0) -> Costs:
    """Median seconds of F, B and U per stage of ``cfg`` (a :class:`Config`) for one microbatch."""
    cfg = cfg.resolved("pipeline")
    P = cfg.parallel.stages
    model_cfg = cfg.model_config(256 if cfg.data.tokenizer == "byte" else cfg.data.vocab_size)
    torch.manual_seed(cfg.run.seed)
    model = GPT(model_cfg, cfg.data.grad_accum)
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
