"""Messages between neighbour stages on torch.distributed.

Activations flow from stage ``s`` to ``s+1`` and input gradients back, so each directed
channel carries one kind of message, in the order the schedule issues them. Gloo matches a
receive to a send by (peer, tag) in FIFO order and NCCL by issue order, so both see the same
pairing. Two rules from torch's own ``Schedule1F1B`` keep NCCL from deadlocking:

* the sends of an action and the receive of the next action go out together in one
  ``batch_isend_irecv`` (when stage ``s`` sends an activation to ``s+1`` while ``s+1``
  sends a gradient back, both pairs are in flight at once);
* sends are waited on lazily (at most ``max_outstanding`` at a time), never before the
  next receive is posted: a gloo send may not finish until its peer has posted the receive.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist

from delaylab.llm.distributed.world import PeerFailure

TAGS = {"F": 0, "B": 1}  # gloo matches on tags; NCCL ignores them


@dataclass
class Pending:
    """A posted receive: ``buffer`` is valid after :meth:`P2P.wait`."""

    buffer: torch.Tensor
    work: object
    peer: int
    what: str


def _name(kind: str, n: int) -> str:
    return f"{'activation' if kind == 'F' else 'gradient'} of microbatch {n}"


class P2P:
    """Sends and receives of fixed-shape tensors between neighbour stages of one pipeline.

    Callers name stages; ``ranks[s]`` is stage ``s``'s global rank and ``group`` the pipeline's
    process group (a data-parallel run has one pipeline per replica: its row of the mesh).
    By default the stages are the ranks of the default group.
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, max_outstanding: int = 8,
                 *, group=None, ranks: list[int] | None = None):
        self.shape, self.dtype, self.device = tuple(shape), dtype, device
        self.max_outstanding = max_outstanding
        self.group, self.ranks = group, ranks
        self._sends: deque = deque()  # (work, tensor kept alive, peer, what)

    def rank_of(self, stage: int) -> int:
        return stage if self.ranks is None else self.ranks[stage]

    def post(self, send: tuple[torch.Tensor, int, str, int] | None, recv: tuple[int, str, int] | None) -> Pending | None:
        """Issue ``send = (tensor, dst stage, kind, n)`` and ``recv = (src stage, kind, n)`` as one batch."""
        ops, buf = [], None
        if send is not None:
            tensor, dst, kind, n = send
            dst = self.rank_of(dst)
            ops.append(dist.P2POp(dist.isend, tensor, dst, group=self.group, tag=TAGS[kind]))
        if recv is not None:
            src, rkind, rn = recv
            src = self.rank_of(src)
            buf = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            ops.append(dist.P2POp(dist.irecv, buf, src, group=self.group, tag=TAGS[rkind]))
        if not ops:
            return None
        works = dist.batch_isend_irecv(ops)
        coalesced = len(works) != len(ops)  # NCCL: one work for the whole group
        pending = None
        if send is not None:
            work = works[-1] if coalesced else works[0]
            self._sends.append((work, tensor, dst, f"sending the {_name(kind, n)} to rank {dst}"))
        if recv is not None:
            pending = Pending(buf, works[-1], src, f"receiving the {_name(rkind, rn)} from rank {src}")
        while len(self._sends) > self.max_outstanding:
            self._finish(self._sends.popleft())
        return pending

    def wait(self, pending: Pending) -> torch.Tensor:
        _wait(pending.work, pending.peer, pending.what)
        return pending.buffer

    def flush(self) -> None:
        """Wait for every outstanding send."""
        while self._sends:
            self._finish(self._sends.popleft())

    @staticmethod
    def _finish(item) -> None:
        work, _tensor, peer, what = item
        _wait(work, peer, what)


def _wait(work, peer: int, what: str) -> None:
    try:
        work.wait()
    except Exception as err:  # gloo: "Connection closed by peer"; any backend: timeout
        raise PeerFailure(peer, what, err) from err
