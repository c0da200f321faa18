"""Data parallelism for the simulator, on torch's own machinery.

D replicas (``parallel.dp``) each take rows ``r*B/D:(r+1)*B/D`` of every microbatch, so batches
stay a pure function of ``(seed, index)`` and the global batch is the same whatever D. The
model is wrapped in ``DistributedDataParallel`` (or sharded with FSDP2's ``fully_shard`` when
``dp_shard``); either averages the gradients over the replicas during the backward, so the
delay wrapper sees the all-reduced gradient and the delay, EF, DC-ASGD and the sync phases are
unchanged. Equal-size slices make the average of the replicas' mean losses the mean over the
whole microbatch: the D-replica run equals the one-process run up to float reassociation.

Checkpoints are ``torch.distributed.checkpoint`` folders (:func:`save_state`, :func:`load_state`).
"""

from __future__ import annotations

import io
import os
import pickle
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten, tree_unflatten, treespec_dumps, treespec_loads

from delaylab.errors import ConfigError

# Optimizers whose update mixes the entries of a matrix (an orthogonalization, a preconditioner):
# on FSDP2's row shards they would compute something else.
NOT_SHARDABLE = ("muon", "lmo", "soap")


def world() -> tuple[int, int]:
    """``(rank, world size)`` of the running process group, or ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def under_launcher() -> bool:
    """Started by torchrun (or torch's elastic launcher): the rank comes from the environment."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def start(cfg, device: torch.device):
    """Join (or create) the process group of a D-replica run; returns the ``dp`` device mesh."""
    from torch.distributed.device_mesh import init_device_mesh

    D = cfg.parallel.dp
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size != D:
        raise ConfigError(f"{size} processes for {D} data-parallel replicas: start exactly D ranks "
                          f"(torchrun --nproc-per-node {D}, or --dp {D} without torchrun)")
    if cfg.parallel.dp_shard and cfg.optim.optimizer in NOT_SHARDABLE:
        raise ConfigError(f"--dp-shard splits matrices by rows; {cfg.optim.optimizer} needs whole matrices "
                          f"(use DDP: drop --dp-shard)")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                timeout=timedelta(seconds=cfg.parallel.timeout),
                                **({"device_id": device} if device.type == "cuda" else {}))
    return init_device_mesh(device.type, (D,), mesh_dim_names=("dp",))


def report_failure(what: str, err: BaseException) -> None:
    """A failed rank's one line on stderr (its traceback with ``DELAYLAB_DEBUG=1``); exits 1."""
    import sys
    import traceback

    rank = os.environ.get("RANK", "?")
    msg = str(err).strip().splitlines()[0] if str(err).strip() else ""
    print(f"delaylab: {what} {rank} stopped ({type(err).__name__}: {msg})", file=sys.stderr, flush=True)
    if os.environ.get("DELAYLAB_DEBUG"):
        traceback.print_exc()
    if any(s in msg for s in ("closed by peer", "reset by peer", "Broken pipe")):
        # A peer died first: leave it the moment in which the launcher sees its death, so that
        # the run's one line names that rank rather than this consequence.
        time.sleep(2.0)
    os._exit(1)  # no atexit hooks: destroying a broken process group can hang


def stop() -> None:
    """Leave the process group (the end of a replica started by :func:`train_replicas`)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, cfg, mesh) -> torch.nn.Module:
    """DDP around ``model``, or FSDP2 on each block and the whole (``dp_shard``); returns the
    module to call. Parameters keep their names, so the optimizer routes them as before."""
    if cfg.parallel.dp_shard:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    from torch.nn.parallel import DistributedDataParallel

    device = next(model.parameters()).device
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def my_rows(t: torch.Tensor, rank: int, D: int) -> torch.Tensor:
    """This replica's rows of a batch (``B`` divisible by ``D``: checked by the config)."""
    n = t.shape[0] // D
    return t[rank * n:(rank + 1) * n]


def gradient_sync(module: torch.nn.Module, on: bool):
    """A context in which the backward does (or skips, for all but a step's last microbatch) the
    gradient reduction over the replicas."""
    import contextlib

    if hasattr(module, "no_sync"):  # DDP
        return contextlib.nullcontext() if on else module.no_sync()
    if hasattr(module, "set_requires_gradient_sync"):  # FSDP2
        module.set_requires_gradient_sync(on)
    return contextlib.nullcontext()


def barrier() -> None:
    if world()[1] > 1:
        dist.barrier()


def mean_over_replicas(value: torch.Tensor) -> torch.Tensor:
    """The replicas' mean of a scalar (every rank gets the same float: one NaN check for all)."""
    if world()[1] > 1:
        value = value.detach().clone()
        dist.all_reduce(value)
        value /= world()[1]
    return value


# -- checkpoints -----------------------------------------------------------------------------------
# A state (nested dicts and lists of tensors and plain values) is flattened with torch's pytree:
# tensor leaves go to dcp under "t.<i>" (replicated ones are written once; FSDP2's DTensors by
# shard), everything else, with the tree's structure, into one pickled entry. Loading needs no
# template of the state: the structure comes from the checkpoint.
_META = "meta"


def save_state(state: dict, folder: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DTensor

    leaves, spec = tree_flatten(state)
    tensors, kinds = {}, []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            tensors[f"t.{i}"] = leaf
            kinds.append(("dtensor", tuple(leaf.shape), leaf.dtype) if isinstance(leaf, DTensor) else ("tensor",))
        else:
            kinds.append(("value", leaf))
    meta = io.BytesIO(pickle.dumps({"spec": treespec_dumps(spec), "kinds": kinds}))
    dcp.save({**tensors, _META: meta}, checkpoint_id=str(folder))


def load_state(folder: Path, mesh=None) -> dict:
    """A state saved by :func:`save_state`, with its tensors on the CPU: sharded ones as DTensors
    on ``mesh``, or whole without one (reading a sharded run in one process)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import Shard, distribute_tensor

    reader = dcp.FileSystemReader(str(folder))
    meta = {_META: io.BytesIO()}
    dcp.load(meta, storage_reader=reader)
    meta[_META].seek(0)
    info = pickle.loads(meta[_META].read())  # our own file, written by save_state
    shapes = reader.read_metadata().state_dict_metadata
    targets = {}
    for i, kind in enumerate(info["kinds"]):
        if kind[0] == "tensor":
            m = shapes[f"t.{i}"]
            targets[f"t.{i}"] = torch.empty(m.size, dtype=m.properties.dtype)
        elif kind[0] == "dtensor":  # FSDP2 shards dim 0 over the dp mesh; no mesh: the whole tensor
            full = torch.empty(kind[1], dtype=kind[2])
            targets[f"t.{i}"] = full if mesh is None else distribute_tensor(full, mesh, [Shard(0)])
    dcp.load(targets, storage_reader=dcp.FileSystemReader(str(folder)))
    leaves = [targets[f"t.{i}"] if kind[0] != "value" else kind[1] for i, kind in enumerate(info["kinds"])]
    return tree_unflatten(leaves, treespec_loads(info["spec"]))
