"""Messages between neighbour stages on torch.distributed, and who to blame when one fails.

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

import re
from collections import deque
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

TAGS = {"F": 0, "B": 1}  # gloo matches on tags; NCCL ignores them
_FAILED_KEY = "delaylab/pipeline/failed"


class PeerFailure(RuntimeError):
    """A message to or from ``peer`` failed (the peer died, or the process group timed out)."""

    def __init__(self, peer: int, what: str, cause: BaseException):
        super().__init__(f"{what} failed: {_short(cause)}")
        self.peer = peer


def _short(err: BaseException) -> str:
    """The first line of an error, without gloo's source location and advice."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    text = re.sub(r"^\[[^\]]*\] ", "", text)  # "[.../pair.cc:537] Read error ..."
    return text.split(". This is typically")[0]


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


def all_reduce(tensor: torch.Tensor, group, what: str) -> torch.Tensor:
    """``dist.all_reduce`` (sum) over ``group``; a failure becomes a :class:`PeerFailure`.

    Its peer is the other member of a two-rank group; in a larger group the error does not
    say which member died (``peer`` is ``None``), and :func:`blame` waits for a rank that knows.
    """
    try:
        dist.all_reduce(tensor, group=group)
    except Exception as err:
        members = dist.get_process_group_ranks(group)
        others = [r for r in members if r != dist.get_rank()]
        raise PeerFailure(others[0] if len(others) == 1 else None,
                          f"{what} over ranks {members}", err) from err
    return tensor


def blame(rank: int, err: BaseException, timeout_s: float = 5.0) -> tuple[int | None, str, bool]:
    """The first failure of the run as ``(rank, reason, ours)``, recording ours if it is the first.

    A rank that loses a neighbour blames the neighbour; a rank whose own code failed blames
    itself. The first claim in the process group's store wins, so a rank two hops away from
    a dead one (whose neighbour exited because of it) still names the rank that died. Without
    a reachable store (it lived in a dead rank) the rank blames what it saw itself. ``rank`` is
    ``None`` when only a collective of more than two ranks saw the failure and no rank named it.
    """
    vague = isinstance(err, PeerFailure) and err.peer is None
    if isinstance(err, PeerFailure):
        mine = (err.peer, f"seen by rank {rank}: {err}")
    else:
        mine = (rank, f"{type(err).__name__}: {_short(err)}")
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(timedelta(seconds=timeout_s))
        if vague:  # a collective of more than two ranks failed: a rank that saw who died will say
            try:
                store.wait([_FAILED_KEY])
            except Exception:  # nobody did within timeout_s: name the group instead
                pass
        claim = f"{'?' if mine[0] is None else mine[0]}|{mine[1]}"
        won = store.compare_set(_FAILED_KEY, "", claim).decode()
        who, _, why = won.partition("|")
        return (None if who == "?" else int(who)), why, won == claim
    except Exception:
        return (*mine, True)
