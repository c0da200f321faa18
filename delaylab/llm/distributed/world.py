"""The process group: one start for every engine, one world-size check, collectives that name a peer.

A rank's device comes from ``LOCAL_RANK`` (torchrun and the launcher set it). On CUDA that device is
made current before the group starts and handed to ``init_process_group`` as ``device_id``, so NCCL
binds the group to it at once. Backend: NCCL on CUDA, gloo on the CPU. The timeout is the config's
``parallel.timeout`` (60 s by default, not torch's 30 minutes); the mesh gives its subgroups the same
(:mod:`~delaylab.llm.distributed.mesh`). The group is left by whoever started the ranks
(:func:`~delaylab.llm.distributed.launch.as_rank`), so several runs can share one start-up.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta

import torch
import torch.distributed as dist

from delaylab.errors import ConfigError


class PeerFailure(RuntimeError):
    """A message to or from ``peer`` failed (the peer died, or the group timed out); ``peer`` is
    ``None`` when the failed operation cannot say which member it lost."""

    def __init__(self, peer: int | None, what: str, cause: BaseException):
        super().__init__(f"{what} failed: {short(cause)}")
        self.peer = peer


def short(err: BaseException) -> str:
    """The first line of an error, without gloo's source location and advice."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    text = re.sub(r"^\[[^\]]*\] ", "", text)  # "[.../pair.cc:537] Read error ..."
    return text.split(". This is typically")[0]


def under_launcher() -> bool:
    """Started by torchrun (or torch's elastic launcher): the rank comes from the environment."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def launched_sizes() -> tuple[int, int | None]:
    """``(WORLD_SIZE, LOCAL_WORLD_SIZE)`` as torchrun (or the launcher) set them: ``(1, None)``
    in a plain process. The one place a run's world is read from the environment."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    return int(os.environ.get("WORLD_SIZE", "1")), None if local is None else int(local)


def world() -> tuple[int, int]:
    """``(rank, world size)`` of the running process group, or ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def check_world(stages: int, dp: int, size: int | None = None) -> None:
    """A world of exactly ``P x D`` ranks (``WORLD_SIZE`` by default); a one-line error otherwise."""
    size = int(os.environ.get("WORLD_SIZE", "1")) if size is None else size
    if size == stages * dp:
        return
    if stages == 1:
        raise ConfigError(f"{size} processes for {dp} data-parallel replicas: start exactly D ranks "
                          f"(torchrun --nproc-per-node {dp}, or --dp {dp} without torchrun)")
    raise ConfigError(f"{size} processes for {stages} stages x {dp} data-parallel replicas: start exactly "
                      f"P x D = {stages * dp} ranks" + ("" if size % stages else f" (or give --dp {size // stages})"))


def start(device: torch.device, timeout_s: float) -> None:
    """Join the process group of this run's ranks (once: a started group is kept)."""
    if dist.is_initialized():
        return
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_s),
                            **({"device_id": device} if cuda else {}))


def stop() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if world()[1] > 1:
        dist.barrier()


def all_reduce(tensor: torch.Tensor, group, what: str) -> torch.Tensor:
    """``dist.all_reduce`` (sum, in place) over ``group``; a failure becomes a :class:`PeerFailure`.

    Its peer is the other member of a two-rank group; in a larger group the error does not say
    which member died (``peer`` is ``None``) and the failure report waits for a rank that knows.
    """
    try:
        dist.all_reduce(tensor, group=group)
    except Exception as err:
        members = dist.get_process_group_ranks(group)
        others = [r for r in members if r != dist.get_rank()]
        raise PeerFailure(others[0] if len(others) == 1 else None, f"{what} over ranks {members}", err) from err
    return tensor


def mean(value: torch.Tensor, group, what: str) -> torch.Tensor:
    """The mean of ``value`` over ``group`` (gloo has no AVG: sum, then divide); every member gets the
    same float, so one NaN check decides for all of them."""
    total = all_reduce(value.detach().clone(), group, what)
    return total.div_(dist.get_world_size(group))
