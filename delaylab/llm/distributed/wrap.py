"""The parallelize step: how ``D`` data-parallel replicas average their gradients.

Both engines split every microbatch the same way (replica ``d`` takes rows ``d*B/D:(d+1)*B/D``,
:func:`replica_rows`), so batches stay a pure function of ``(seed, index)`` and the global batch is
the same whatever ``D``. Equal-size slices make the mean of the replicas' mean losses the mean over
the whole microbatch: a ``D``-replica run equals the one-process run up to float reassociation.

Two mechanisms, for a reason:

* The simulator (one model per replica) uses torch's: :func:`wrap` puts the model in
  ``DistributedDataParallel`` (or shards it with FSDP2's ``fully_shard`` when ``dp_shard``); either
  averages the gradients during the backward, so the delay wrapper sees the averaged gradient and
  the delay, its correctors and the sync phases are unchanged.
* The pipeline cannot use DDP: a stage keeps ``tau + 1`` weight versions (slots) and the
  microbatches of different versions interleave in its backward, each accumulating into its own
  slot; the gradient to average exists only when a slot's last microbatch is done, and it must be
  averaged then, at that slot's update, before the tied embedding's two holders add theirs. DDP
  reduces during the backward of one fixed module. :class:`GradientAverage` is that one all-reduce
  per update (of a flat buffer, sum then divide).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from delaylab.errors import ConfigError
from delaylab.llm.distributed.world import all_reduce

# Optimizers whose update mixes the entries of a matrix (an orthogonalization, a preconditioner):
# on FSDP2's row shards they would compute something else.
NOT_SHARDABLE = ("muon", "lmo", "soap")


def check_shardable(cfg) -> None:
    if cfg.parallel.dp_shard and cfg.optim.optimizer in NOT_SHARDABLE:
        raise ConfigError(f"--dp-shard splits matrices by rows; {cfg.optim.optimizer} needs whole matrices "
                          f"(use DDP: drop --dp-shard)")


def replica_rows(t: torch.Tensor, d: int, D: int) -> torch.Tensor:
    """Replica ``d``'s rows of a batch (``B`` divisible by ``D``: checked by the config)."""
    n = t.shape[0] // D
    return t[d * n:(d + 1) * n]


def wrap(model: torch.nn.Module, cfg, mesh) -> torch.nn.Module:
    """DDP around ``model`` over the mesh's ``dp`` group, or FSDP2 on each block and the whole
    (``dp_shard``); returns the module to call. Parameters keep their names, so the optimizer
    routes them as before."""
    if cfg.parallel.dp_shard:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block, mesh=mesh.dp_mesh)
        fully_shard(model, mesh=mesh.dp_mesh)
        return model
    from torch.nn.parallel import DistributedDataParallel

    device = next(model.parameters()).device
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   process_group=mesh.dp_group)


def gradient_sync(module: torch.nn.Module, on: bool):
    """A context in which the backward does (or skips, for all but a step's last microbatch) the
    gradient reduction over the replicas."""
    if hasattr(module, "no_sync"):  # DDP
        return contextlib.nullcontext() if on else module.no_sync()
    if hasattr(module, "set_requires_gradient_sync"):  # FSDP2
        module.set_requires_gradient_sync(on)
    return contextlib.nullcontext()


class GradientAverage:
    """The pipeline's data-parallel step: each gradient of a module becomes its mean over ``group``."""

    def __init__(self, group):
        self.group, self.size = group, dist.get_world_size(group)
        self.buffer: torch.Tensor | None = None  # one gradient's size, made at the first update

    def __call__(self, module: torch.nn.Module, k: int) -> None:
        grads = [p.grad for p in module.parameters() if p.grad is not None]  # the same set on every replica
        if self.buffer is None:
            self.buffer = torch.empty(sum(g.numel() for g in grads), dtype=grads[0].dtype, device=grads[0].device)
        torch.cat([g.reshape(-1) for g in grads], out=self.buffer)
        all_reduce(self.buffer, self.group, f"averaging the gradients of update {k}")
        self.buffer.div_(self.size)  # gloo has no AVG: sum, then divide
        views = self.buffer.split([g.numel() for g in grads])
        torch._foreach_copy_(grads, [v.view_as(g) for v, g in zip(views, grads)])

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes if self.buffer is not None else 0
