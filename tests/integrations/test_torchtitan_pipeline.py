"""delaylab's pipelining_fn inside torchtitan: the schedule it returns and its stages (CPU, gloo).

torchtitan's llama3 cannot train on a CPU (FlexAttention has no CPU backward), so this checks
what the trainer gets from ``ModelSpec.pipelining_fn`` on the debug model: the schedule class,
its stage and microbatches, the model parts and their stage tags; Schedule2BW's training
itself is tested on this project's GPT (test_pipelining.py).
"""

import uuid

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")


def _rank(schedules: list[str], dump: str) -> dict:
    import torch
    import torch.distributed as dist
    import torchtitan.distributed.parallel_dims as parallel_dims_module

    parallel_dims_module.device_type = "cpu"  # torchtitan assumes CUDA; the meshes work on gloo too
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    out = {name: _build(name, dump) for name in schedules}
    dist.destroy_process_group()
    return out


def _build(schedule: str, dump: str) -> dict:
    import torch
    import torch.distributed as dist
    from torchtitan.distributed import ParallelDims

    from delaylab.integrations.torchtitan.config_registry import llama3_debugmodel_pp_2bw

    cfg = llama3_debugmodel_pp_2bw()
    cfg.parallelism.pipeline_parallel_schedule = schedule
    cfg.activation_checkpoint = None
    dims = ParallelDims.from_config(cfg.parallelism, dist.get_world_size())
    spec = cfg.model_spec
    spec.model.update_from_config(config=cfg)
    with torch.device("meta"):
        model = spec.model.build()
    sched, parts, first, last = spec.pipelining_fn(
        model, parallel_dims=dims, training=cfg.training, parallelism=cfg.parallelism, compile_config=cfg.compile,
        ac_config=cfg.activation_checkpoint, dump_folder=dump, device=torch.device("cpu"), model_config=spec.model,
        parallelize_fn=spec.parallelize_fn, loss_fn=cfg.loss.build(compile_config=cfg.compile))
    stage = sched._stage
    return {"norm_devices": _norm_devices_on_a_filling_call(sched, parts, dims), "schedule": type(sched).__name__, "stage": stage.stage_index, "stages": stage.num_stages,
            "microbatches": sched._n_microbatches, "first": first, "last": last, "parts": len(parts),
            "tag": getattr(parts[0], "_delaylab_stage", None), "same_module": stage.submod is parts[0],
            "fsdp": any("FSDP" in c.__name__ for c in type(parts[0]).__mro__),
            "layers": sorted(parts[0].layers.keys()), "delay": getattr(sched, "delay", None)}


def _norm_devices_on_a_filling_call(sched, parts, dims) -> list[str]:
    """The device of what torchtitan's gradient clip all-reduces over the pipeline after a call that
    releases no gradient. The model is on ``meta`` here, as a GPU would be: a norm made on the CPU
    (``get_total_norm([])`` of no gradients) shows as ``cpu``, which NCCL refuses. The collective
    itself is recorded, not run (gloo has no meta tensors)."""
    import torch.distributed as dist
    from torchtitan.distributed import utils as dist_utils

    if not hasattr(sched, "flush"):
        return []
    seen, all_reduce = [], dist.all_reduce
    dist.all_reduce = lambda tensor, *a, **k: seen.append(tensor.device.type)
    try:
        sched.flush()  # nothing in flight: releases nothing, as the first call of a run
        dist_utils.clip_grad_norm_([p for m in parts for p in m.parameters()], 1.0, foreach=None,  # none on meta
                                   pp_mesh=dims.get_optional_mesh("pp"))
    finally:
        dist.all_reduce = all_reduce
    return seen


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    """``{rank: {schedule: what the trainer got}}``: one launch of 2 gloo ranks for both schedules."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=uuid.uuid4().hex[:12],
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.2,
                          start_method="spawn")
    return elastic_launch(config, _rank)(["2BW", "1F1B"], str(tmp_path_factory.mktemp("dump")))


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_pipelining_fn_builds_schedule2bw_on_torchtitans_own_stages(ranks):
    for r, by_name in ranks.items():
        got = by_name["2BW"]
        assert got["schedule"] == "Schedule2BW" and got["delay"] == 1
        assert got["stage"] == got["tag"] == r and got["stages"] == 2 and got["parts"] == 1
        assert got["microbatches"] == 4  # local batch 8 / microbatch 2
        assert (got["first"], got["last"]) == (r == 0, r == 1)
        assert got["same_module"] and not got["fsdp"]  # the plain stage module the schedule copies
        assert got["norm_devices"] == ["meta"]  # the parameters' device, not the CPU
    # torchtitan's own split of the 6-layer debug model over 2 stages
    assert ranks[0]["2BW"]["layers"] + ranks[1]["2BW"]["layers"] == [str(i) for i in range(6)]


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_other_schedules_go_to_torchtitan_with_their_parts_tagged(ranks):
    for r, by_name in ranks.items():
        got = by_name["1F1B"]
        assert got["schedule"] == "Schedule1F1B" and got["tag"] == r
        assert got["fsdp"]  # torchtitan's parallelize_fn, untouched


def test_schedule2bw_refuses_data_parallel_dimensions_before_building_anything():
    from types import SimpleNamespace

    from delaylab.errors import ConfigError
    from delaylab.integrations.torchtitan import pipelining_fn

    dims = SimpleNamespace(dp_replicate=1, dp_shard=2, cp=1, tp=1, ep=1)
    with pytest.raises(ConfigError, match="dp_shard = 2"):
        pipelining_fn(None, parallel_dims=dims, parallelism=SimpleNamespace(pipeline_parallel_schedule="2bw"),
                      parallelize_fn=None)
