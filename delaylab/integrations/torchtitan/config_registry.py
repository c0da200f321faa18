"""torchtitan configs with the gradient delay: ``--module delaylab.integrations.torchtitan --config NAME``.

Each is torchtitan's own llama3 config with delaylab's optimizer container, LR schedule and
``pipelining_fn``; every field stays a torchtitan flag (``--optimizer.delay``,
``--optimizer.correction``, ``--parallelism.pipeline_parallel_schedule``, ...).

- ``llama3_debugmodel_2bw``: the debug-size llama3 simulating PipeDream-2BW on any parallelism
  (the delay queue in the optimizer: ``delay=1``, ``correction="ef"``).
- ``llama3_8b_2bw``: the same at the 8B shape.
- ``llama3_debugmodel_pp_2bw``: the real schedule, ``Schedule2BW`` over 2 pipeline stages
  (``delay=0``: the schedule delays; EF at lag 1), cuda graphs off as torchtitan needs with PP.
"""

from __future__ import annotations

import dataclasses

from torchtitan.components.optimizer import OptimizersContainer
from torchtitan.models.llama3.config_registry import llama3_8b, llama3_debugmodel
from torchtitan.trainer import Trainer

from delaylab.integrations.torchtitan.optimizer import DelayedLRSchedulersContainer, DelayedOptimizersContainer
from delaylab.integrations.torchtitan.pipeline import pipelining_fn

__all__ = ["llama3_debugmodel_2bw", "llama3_8b_2bw", "llama3_debugmodel_pp_2bw"]


def with_delay(config: Trainer.Config, **delay) -> Trainer.Config:
    """``config`` with its optimizer, LR schedule and pipelining replaced by delaylab's (same settings)."""
    opt: OptimizersContainer.Config = config.optimizer
    config.optimizer = DelayedOptimizersContainer.Config(
        **{f.name: getattr(opt, f.name) for f in dataclasses.fields(opt)}, **delay)
    lrs = config.lr_scheduler
    config.lr_scheduler = DelayedLRSchedulersContainer.Config(
        **{f.name: getattr(lrs, f.name) for f in dataclasses.fields(lrs)})
    config.model_spec = dataclasses.replace(config.model_spec, pipelining_fn=pipelining_fn)
    return config


def llama3_debugmodel_2bw() -> Trainer.Config:
    return with_delay(llama3_debugmodel(), delay=1, correction="ef")


def llama3_8b_2bw() -> Trainer.Config:
    return with_delay(llama3_8b(), delay=1, correction="ef")


def llama3_debugmodel_pp_2bw() -> Trainer.Config:
    config = with_delay(llama3_debugmodel(), delay=0, correction="ef", ef_lag=1)
    config.parallelism.pipeline_parallel_degree = 2
    config.parallelism.pipeline_parallel_schedule = "2BW"
    config.parallelism.pipeline_parallel_microbatch_size = 2  # local batch 8: M = 4 microbatches
    config.training.disable_cuda_graphs = True
    return config
