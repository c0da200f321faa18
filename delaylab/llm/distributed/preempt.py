"""Preemption: SIGTERM, SIGUSR1 and SIGINT end a run at an update boundary, with a checkpoint.

Clusters send SIGTERM before they kill a job (SLURM: SIGUSR1 too, ``--signal=USR1@60``), a user
Ctrl-C. Every engine treats the three alike: the updates in flight finish, every rank writes its part
of one checkpoint, and the process exits with :data:`PREEMPTED` (75, ``EX_TEMPFAIL`` of sysexits.h:
a temporary failure, to be retried); ``--resume DIR`` then continues exactly. A second signal, at
least :data:`GRACE_S` after the first, exits at once with code ``128 + signal`` (the shells'
convention): the checkpoint being written is left beside its place and the last good one is kept.
The same signal twice within :data:`GRACE_S` counts once: torchrun forwards what it receives to ranks
that, under SLURM or a terminal, received it already.

Three pieces:

* :func:`signals` (every process that runs work): the handlers, which only note the request;
* :class:`StopGate` (every engine's loop): where the ranks agree on the update to stop after, ``K``.
  A rank calls it before its first action of each update ``h`` (a pipeline stage's first forward
  of group ``h``; the simulator's first call of update ``h``); it answers whether to go on, and a
  stage skips every action of the groups ``>= K``. With one process ``K`` is the next update.
  With several, the ranks reach update ``h`` at different times (a pipeline's stages are
  staggered by design), so no collective at an update boundary can agree without stalling the
  pipeline. Instead, ranks use the process group's store (host-side, no device sync): entering ``h``,
  a rank writes ``h`` under its own key, then reads the decision key; a rank with a request claims
  the decision, reads every rank's key and publishes ``K`` = their maximum + 1. The store is
  linearizable, so either a rank's write came before the decider's read (``K`` covers its update) or
  its read comes after the claim (it obeys ``K``): no rank has begun an update ``>= K``, every rank
  finishes every update ``< K``. Cost: two store round trips per update and rank. Every dependency
  of an action is an action of the same or an earlier update, so dropping the updates ``>= K`` from
  every stage's list leaves the lists of a run that ends at ``K`` (``tests/pipeline/test_schedules.py``).
* :func:`raising` (a process that drives a pool of such processes, ``reproduce``): the first signal
  raises :class:`~delaylab.errors.Preempted` where the driver waits, so it forwards the stop and
  records its session before it exits 75.
* :class:`LauncherSignals` (the process that started the ranks with torch's elastic agent): the
  first signal creates :data:`STOP_FILE`'s file, which every rank's gate reads as a request (a rank
  need not receive the signal itself); a second kills the ranks and exits at once.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import signal
import sys
import threading
import time
from pathlib import Path

import torch.distributed as dist

from delaylab.errors import Preempted

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
PREEMPTED = Preempted.exit_code  # 75
GRACE_S = 1.0  # a repeat of a signal within this many seconds is the same stop
STOP_FILE = "DELAYLAB_STOP_FILE"  # set by the launcher for the ranks it starts
_KEY = "delaylab/stop"
_jobs = itertools.count()  # one key space per run of a process group (run_jobs runs several)


class _Request:
    signum: int | None = None  # the first signal received
    at = 0.0
    depth = 0  # signals() blocks open (the outermost installs the handlers)


_request = _Request()


def requested() -> str | None:
    """The name of the signal that asked this process to stop, or None."""
    return None if _request.signum is None else signal.Signals(_request.signum).name


def _second(signum: int) -> bool:
    """Note a signal; True when it is a second one (the first came at least GRACE_S before)."""
    now = time.monotonic()
    if _request.signum is None:
        _request.signum, _request.at = signum, now
        return False
    return now - _request.at >= GRACE_S


def _exit_at_once(signum: int, what: str) -> None:
    """A second signal: say so in one line and exit now, ``128 + signal`` (the shells' convention)."""
    print(f"delaylab: {signal.Signals(signum).name} again: {what}", file=sys.stderr, flush=True)
    os._exit(128 + signum)


@contextlib.contextmanager
def signals():
    """This process notes SIGTERM, SIGUSR1 and SIGINT as a stop request while the block runs (and
    exits at once, ``128 + signal``, on a second one); outside the main thread, or inside such a
    block already, it changes nothing."""
    if threading.current_thread() is not threading.main_thread() or _request.depth:
        yield
        return

    def handler(signum, _frame):
        if _second(signum):
            _exit_at_once(signum, "stopped at once; the last good checkpoint is kept")

    old = {s: signal.signal(s, handler) for s in SIGNALS}
    _request.depth += 1
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _request.signum, _request.depth = None, 0


@contextlib.contextmanager
def raising():
    """The handlers of a process that drives workers instead of stepping (``reproduce``'s pool): while
    the block runs, a first signal raises :class:`Preempted` here, in the main thread, so the driver
    can stop its workers and record what finished; a second, :data:`GRACE_S` later, exits at once.
    SIGINT is left alone where it is ignored (a job started in the background keeps it so)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        first = _request.signum is None
        if _second(signum):
            _exit_at_once(signum, "stopped at once; finished runs and checkpoints are kept")
        if first:
            raise Preempted(f"{signal.Signals(signum).name}: stopped; the runs in progress keep their last "
                            "checkpoint (run the same command again to resume)")

    handled = [s for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
    old = {s: signal.signal(s, handler) for s in handled}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _request.signum = None


def preemptible(fn):
    """``fn`` run inside :func:`signals` (an engine's entry: ``train``, ``run_rank``)."""
    @functools.wraps(fn)
    def run(*args, **kw):
        with signals():
            return fn(*args, **kw)
    return run


class StopGate:
    """The stop agreement of one run: ``gate(h)`` before a rank's first action of update ``h``.

    ``start``: the first update this session runs (every rank has entered it). ``stop`` is ``K``
    once known: the run ends after update ``K - 1``, a checkpoint at step ``K``.
    """

    def __init__(self, start: int, *, store=None, rank: int = 0, world: int = 1, run: str | None = None):
        self.entered, self.stop = start, None
        self.stop_file = os.environ.get(STOP_FILE)
        if store is None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            store, rank, world = dist.distributed_c10d._get_default_store(), dist.get_rank(), dist.get_world_size()
        self.store, self.rank, self.world = store, rank, world  # a store of world ranks, or one process
        if store is not None:
            self.prefix = f"{_KEY}/{next(_jobs) if run is None else run}"
            store.set(self._front(rank), str(start))

    def _front(self, rank: int) -> str:
        return f"{self.prefix}/front/{rank}"

    def cause(self) -> str:
        """What asked for the stop, in words."""
        return requested() or ("the launcher's stop request" if self._file_request() else "another rank's stop request")

    def _file_request(self) -> bool:
        return bool(self.stop_file) and os.path.exists(self.stop_file)

    def __call__(self, h: int) -> bool:
        """Whether this rank may run (the actions of) update ``h``."""
        if self.stop is None and (requested() or self._file_request()):
            self._decide()
        if self.stop is None and h > self.entered and self.store is not None:
            self.store.set(self._front(self.rank), str(h))  # first the write, then the read (see above)
            if self.store.check([f"{self.prefix}/claim"]):
                self.stop = int(self.store.get(f"{self.prefix}/at"))  # waits while the decider reads
        if self.stop is not None:
            return h < self.stop
        self.entered = max(self.entered, h)
        return True

    def _decide(self) -> None:
        if self.store is None:
            self.stop = self.entered + 1
            return
        claim = f"{self.prefix}/claim"
        if self.store.compare_set(claim, "", str(self.rank)).decode() == str(self.rank):
            fronts = self.store.multi_get([self._front(r) for r in range(self.world)])
            self.store.set(f"{self.prefix}/at", str(max(int(f) for f in fronts) + 1))
        self.stop = int(self.store.get(f"{self.prefix}/at"))


class LauncherSignals:
    """The launcher's handlers while its ranks run: a first signal asks them to stop (the file at
    ``stop_file``), a second kills them and exits at once. ``ranks()``: their process ids."""

    def __init__(self, stop_file: Path, ranks):
        self.stop_file, self.ranks = Path(stop_file), ranks

    def __enter__(self):
        self._old = {}
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def _handle(self, signum, _frame):
        if not _second(signum):
            self.stop_file.touch()
            return
        for pid in self.ranks():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        _exit_at_once(signum, "stopped the ranks at once; the last good checkpoint is kept")

    def __exit__(self, *exc):
        for s, h in self._old.items():
            signal.signal(s, h)
        _request.signum = None
        return False
