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
from delaylab.integrations.torchtitan.optimizer import SCHEDULE_ATTR, STAGE_ATTR

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
        schedule, parts, first, last = _async_pipeline(cls, model, parallel_dims=parallel_dims,
                                                       parallelism=parallelism, **kwargs)
        stages = [schedule._stage]
        for part in parts:  # the optimizer container and the checkpointer find the schedule here
            setattr(part, SCHEDULE_ATTR, schedule)
    for part, stage in zip(parts, stages):
        setattr(part, STAGE_ATTR, stage.stage_index)
    return schedule, parts, first, last


def _async_pipeline(cls, model, *, parallel_dims, parallelism, training, device, model_config, loss_fn, **kwargs):
    """``pipeline_llm``'s split (one stage per rank, as for GPipe) under ``cls``: torchtitan's stages
    and model parts, the stage modules left plain (see the module)."""
    from torchtitan.distributed.pipeline_parallel import (
        _build_get_mesh_callback,
        _generate_llm_fqn_per_model_part,
        _get_pipeline_metadata,
        _pipeline_module_split,
    )
    from torchtitan.tools.logging import logger

    name = parallelism.pipeline_parallel_schedule
    single = dataclasses.replace(parallelism, pipeline_parallel_schedule="GPipe")  # torchtitan's one-stage-per-rank
    stages_total, layers, input_weight, output_weight = _get_pipeline_metadata(parallel_dims, single, model_config)
    fqns = parallelism.module_fqns_per_model_part or _generate_llm_fqn_per_model_part(
        stages_total, layers, input_weight, output_weight)
    stages, parts = _pipeline_module_split(model, parallel_dims.get_mesh("pp"), "GPipe", device, fqns,
                                           get_mesh=_build_get_mesh_callback(parallel_dims))
    for i, part in enumerate(parts):
        parts[i] = stages[i].submod = _stage_parallelize(part, **kwargs)
    mbs = parallelism.pipeline_parallel_microbatch_size
    if training.local_batch_size % mbs:
        raise ConfigError(f"local batch size {training.local_batch_size} is not a multiple of the pipeline "
                          f"microbatch size {mbs}")

    def scalar_loss(*args, **kw):  # torch's schedules take the loss alone; torchtitan's returns (loss, metrics)
        return loss_fn(*args, **kw)[0]

    # zero_fill: torchtitan reduces the gradient norm over the pipeline before every optimizer step,
    # also on a call that releases no gradient, and NCCL refuses the CPU norm of an empty list.
    schedule = cls(stages[0], training.local_batch_size // mbs, loss_fn=scalar_loss, scale_grads=False,
                   zero_fill=True)
    logger.info(f"Using pipeline schedule {name} (delaylab {cls.__name__}, delay {schedule.delay} on this stage) "
                f"with {schedule._n_microbatches} microbatches and {stages[0].num_stages} stages.")
    return schedule, parts, stages[0].is_first, stages[0].is_last


def _stage_parallelize(model, *, compile_config, ac_config, dump_folder, **_):
    """What the asynchronous schedules allow on a stage module: activation checkpointing."""
    if compile_config.enable and "model" in compile_config.components:
        raise ConfigError("Schedule2BW/SchedulePipeDream call the stage through torch.func.functional_call; "
                          "torch.compile of the model is not supported with them")
    if ac_config is not None:
        ac_config.build(dump_folder=dump_folder).apply(model)
    return model
