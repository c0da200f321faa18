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

from delaylab.integrations.torchtitan.checkpoint import DelayedCheckpointManager
from delaylab.integrations.torchtitan.optimizer import DelayedLRSchedulersContainer, DelayedOptimizersContainer
from delaylab.integrations.torchtitan.pipeline import pipelining_fn

__all__ = ["llama3_debugmodel_2bw", "llama3_8b_2bw", "llama3_debugmodel_pp_2bw", "llama3_tiny", "llama3_tiny_2bw",
           "llama3_tiny_pp_2bw"]


def with_delay(config: Trainer.Config, **delay) -> Trainer.Config:
    """``config`` with its optimizer, LR schedule, checkpointer and pipelining replaced by delaylab's
    (same settings)."""
    opt: OptimizersContainer.Config = config.optimizer
    config.optimizer = DelayedOptimizersContainer.Config(
        **{f.name: getattr(opt, f.name) for f in dataclasses.fields(opt)}, **delay)
    lrs = config.lr_scheduler
    config.lr_scheduler = DelayedLRSchedulersContainer.Config(
        **{f.name: getattr(lrs, f.name) for f in dataclasses.fields(lrs)})
    config.checkpoint = DelayedCheckpointManager.Config(
        **{f.name: getattr(config.checkpoint, f.name) for f in dataclasses.fields(config.checkpoint)})
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


def llama3_tiny() -> Trainer.Config:
    """The synchronous baseline at CPU size: a 4-block llama3 of width 64 (causal SDPA), a BPE
    tokenizer and data from the built-in corpus (:mod:`~delaylab.integrations.torchtitan.tiny`)."""
    from delaylab.integrations.torchtitan.tiny import assets, tiny_model

    config = llama3_debugmodel()
    folder = assets()
    config.model_spec = dataclasses.replace(config.model_spec, flavor="tiny", model=tiny_model())
    config.loss.loss_fn.global_vocab_size = config.model_spec.model.vocab_size
    config.hf_assets_path = str(folder)
    config.dataloader.dataset_path = str(folder / "data")
    config.training.seq_len = 64
    config.training.steps = 8
    config.training.mixed_precision_param = "float32"  # torchtitan's FSDP wrap casts to bf16 otherwise, even on 1 rank
    config.activation_checkpoint = None
    config.validator.enable = False  # --validator.enable: the same corpus, read from its start
    config.validator.steps = 2
    config.validator.dataloader.dataset = "c4_test"  # torchtitan's local-folder loader
    config.validator.dataloader.dataset_path = str(folder / "data")
    config.checkpoint.enable = False
    return config


def llama3_tiny_2bw() -> Trainer.Config:
    return with_delay(llama3_tiny(), delay=1, correction="ef")


def llama3_tiny_pp_2bw() -> Trainer.Config:
    config = with_delay(llama3_tiny(), delay=0, correction="ef", ef_lag=1)
    config.parallelism.pipeline_parallel_degree = 2
    config.parallelism.pipeline_parallel_schedule = "2BW"
    config.parallelism.pipeline_parallel_microbatch_size = 2
    config.training.disable_cuda_graphs = True
    return config
