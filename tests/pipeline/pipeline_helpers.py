"""Shared helpers of the pipeline tests: small configs and the single-process references."""

import torch

from delaylab.llm.pipeline.engine import PipelineConfig
from delaylab.llm.train import Trainer, lr_factor


def small(**kw) -> PipelineConfig:
    """The 4-layer preset on 2 x 16-token microbatches: seconds per run, one thread per rank."""
    base = dict(preset="small", batch_size=2, block_size=16, steps=10, eval_batches=1, log_every=5,
                ckpt_every=0, threads=1, progress=False, device="cpu")
    return PipelineConfig(**{**base, **kw})


def reference_model(cfg: PipelineConfig) -> dict:
    """Final weights of the single-process run of ``cfg`` (``delaylab.optim.Delayed`` in one process).

    The trainer's own loop (``Trainer.step``: M microbatches, ``(loss / M).backward()``, one
    ``Delayed.step()``, LR indexed by update) for one delay on every stage. With per-stage
    delays (pipedream) each param group's LR follows its own update count, as each stage's
    scheduler does in the pipeline, so the loop sets the LRs itself before every call.
    """
    tc = cfg.train_config()
    trainer = Trainer(tc)
    opt = trainer.opt
    if len(tc.delays) == 1:
        while trainer.updates < tc.steps:
            trainer.step()
        return trainer.model.state_dict()
    peak = [g["initial_lr"] for g in opt.param_groups]
    M = tc.grad_accum
    calls = 0
    while trainer.updates < tc.steps:
        for g, lr, k in zip(opt.param_groups, peak, opt.group_updates):
            g["lr"] = lr * lr_factor(k, tc)
        for j in range(M):
            x, y = trainer.data.batch(calls * M + j, tc.batch_size, trainer.block, tc.seed)
            _, loss = trainer.model(x, y)
            (loss / M).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        calls += 1
    return trainer.model.state_dict()


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def load_model(folder) -> dict:
    return torch.load(f"{folder}/model.pt", map_location="cpu", weights_only=True)
