"""A torchtitan ``ModelSpec.pipelining_fn`` that adds ``Schedule2BW`` and ``SchedulePipeDream``.

torchtitan 0.3.0 picks its schedule from torch's fixed map (``get_schedule_class``), which has no
asynchronous schedule. :func:`pipelining_fn` hands every other name to torchtitan's own
``pipeline_llm``; for ``--parallelism.pipeline_parallel_schedule 2BW`` (or ``PipeDream``) it lets
``pipeline_llm`` split the model and build the stages (as for ``GPipe``: one stage per rank) and
wraps those very stages in this package's schedule. Either way each model part carries its stage
index (:data:`~delaylab.integrations.torchtitan.optimizer.STAGE_ATTR`), which the optimizer
container's ``stage_delays`` read.

The asynchronous schedules keep copies of plain stage modules: with them the parts get
activation checkpointing only (no FSDP2, TP, CP or torch.compile: torchtitan's llama3
``parallelize_fn`` always wraps in FSDP2, whose hooks would run the live weights instead of the
batch's copy), i.e. pipeline parallelism alone, ``pp`` = world size. torchtitan requires
``--training.disable_cuda_graphs`` with PP.
"""

from __future__ import annotations

import dataclasses

from delaylab.errors import ConfigError
from delaylab.integrations.pipelining import SCHEDULES
from delaylab.integrations.torchtitan.optimizer import STAGE_ATTR

__all__ = ["pipelining_fn"]


def _ours(name: str):
    return {k.lower(): cls for k, cls in SCHEDULES.items()}.get(name.lower())


def pipelining_fn(model, *, parallel_dims, parallelism, parallelize_fn, **kwargs):
    """torchtitan's ``pipeline_llm`` signature; returns ``(schedule, model_parts, has_first, has_last)``."""
    from torchtitan.distributed.pipeline_parallel import pipeline_llm

    cls = _ours(parallelism.pipeline_parallel_schedule)
    if cls is None:
        schedule, parts, first, last = pipeline_llm(model, parallel_dims=parallel_dims, parallelism=parallelism,
                                                    parallelize_fn=parallelize_fn, **kwargs)
        stages = getattr(schedule, "_stages", None) or [schedule._stage]
    else:
        for dim in ("dp_replicate", "dp_shard", "cp", "tp", "ep"):
            if getattr(parallel_dims, dim) > 1:
                raise ConfigError(f"{cls.__name__} runs pipeline parallelism alone (plain stage modules); "
                                  f"{dim} = {getattr(parallel_dims, dim)}: set pipeline_parallel_degree to the world size")
        carrier = dataclasses.replace(parallelism, pipeline_parallel_schedule="GPipe")  # one stage per rank
        base, parts, first, last = pipeline_llm(model, parallel_dims=parallel_dims, parallelism=carrier,
                                                parallelize_fn=_stage_parallelize, **kwargs)
        stages = [base._stage]
        schedule = cls(base._stage, base._n_microbatches, loss_fn=base._loss_fn, scale_grads=False)
    for part, stage in zip(parts, stages):
        setattr(part, STAGE_ATTR, stage.stage_index)
    return schedule, parts, first, last


def _stage_parallelize(model, *, compile_config, ac_config, dump_folder, **_):
    """What the asynchronous schedules allow on a stage module: activation checkpointing."""
    if compile_config.enable and "model" in compile_config.components:
        raise ConfigError("Schedule2BW/SchedulePipeDream call the stage through torch.func.functional_call; "
                          "torch.compile of the model is not supported with them")
    if ac_config is not None:
        ac_config.build(dump_folder=dump_folder).apply(model)
    return model
