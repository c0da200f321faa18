"""Starting the ranks and ending them when one fails: one launcher, one failure type, one report.

:func:`launch` runs a function in ``P x D`` processes through torch's elastic launcher (the API
behind ``torchrun``; rank ``r`` is stage ``r % P`` of replica ``r // P``). Every rank, whether the
launcher or torchrun started it, runs its work inside :func:`as_rank`: a rank that fails prints one
line naming the rank that failed first (:func:`report_failure`) and exits with code 1 without exit
hooks (destroying a broken process group can hang); its peers see the broken connection at their
next message and do the same, so the whole run ends within seconds. The launcher then raises
:class:`RunFailed` with one line: a rank a signal killed (the cause, whatever its peers saw), else
the first failure a rank claimed, else the first rank that ended.

Blame: a rank that loses a peer blames that peer; a rank whose own code failed blames itself. The
first claim in the process group's store wins, so a rank two hops away from a dead one (whose
neighbour exited because of it) still names the rank that died. A lost connection that names no
peer (a collective of more than two ranks, DDP's all-reduce) waits a few seconds for a rank that
knows, then names none. The store must outlive the first failure: torchrun's and this launcher's
agent holds it; a plain env:// start puts it in rank 0, which then waits for the survivors' reports
before it leaves, and whose own death (the store gone) the survivors name.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import sys
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist

from delaylab.errors import DelaylabError
from delaylab.llm.distributed.mesh import place
from delaylab.llm.distributed.preempt import STOP_FILE, LauncherSignals
from delaylab.llm.distributed.world import PeerFailure, short, stop

_FAILED_KEY = "delaylab/failed"  # the first claim, in the default group's store
_REPORTED_KEY = "delaylab/reported"  # how many ranks have printed their line
_FAILURE_FILE = "DELAYLAB_FAILURE_FILE"  # where the claiming rank tells the launcher (set by launch)
_LOST = ("closed by peer", "reset by peer", "Broken pipe")  # a peer's death, seen as a socket error


class RunFailed(DelaylabError, RuntimeError):
    """A rank of a multi-process run failed; the message names it (exit code 1)."""

    exit_code = 1


def blame(rank: int, err: BaseException, timeout_s: float = 5.0) -> tuple[int | None, str, bool]:
    """The first failure of the run as ``(rank, reason, ours)``, recording ours if it is the first.

    Without a reachable store (it lived in a dead rank) the rank blames what it saw itself. ``rank``
    is ``None`` when only an operation that cannot name its peer saw the failure and no rank named it.
    """
    lost = isinstance(err, PeerFailure) or any(s in str(err) for s in _LOST)
    peer = err.peer if isinstance(err, PeerFailure) else None
    mine = (peer, f"seen by rank {rank}: {short(err)}") if lost else (rank, f"{type(err).__name__}: {short(err)}")
    if not _store_reachable():  # its host died: under torchrun and launch() the agent (which outlives the
        # ranks) holds the store, but a plain env:// start puts it in rank 0, which then is the rank that died
        # first (as the store's host, rank 0 waits for the others' reports before it leaves: report_failure)
        if lost and rank != 0 and not _agent_store():
            return 0, f"rank 0 held the store, which is gone; seen by rank {rank}: {short(err)}", True
        return (*mine, True)
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(timedelta(seconds=timeout_s))
        if lost and peer is None:  # a rank that saw who died will say
            try:
                store.wait([_FAILED_KEY])
            except Exception:  # nobody did within timeout_s: name no rank
                pass
        claim = f"{'?' if mine[0] is None else mine[0]}|{mine[1]}"
        won = store.compare_set(_FAILED_KEY, "", claim).decode()
        who, _, why = won.partition("|")
        return (None if who == "?" else int(who)), why, won == claim
    except Exception:
        return (*mine, True)


def report_failure(err: BaseException, stages: int, dp: int) -> None:
    """This rank's one line on stderr (its traceback with ``DELAYLAB_DEBUG=1``); exits 1."""
    rank = int(os.environ.get("RANK", "0"))
    who, why, ours = blame(rank, err)
    culprit = "it failed" if who == rank else ("a rank failed" if who is None else f"rank {who} failed")
    print(f"delaylab: rank {rank} ({place(rank, stages, dp)}) stopped: {culprit} ({why})", file=sys.stderr, flush=True)
    if ours and os.environ.get(_FAILURE_FILE):  # the launcher repeats the first failure in its own line
        try:
            Path(os.environ[_FAILURE_FILE]).write_text(json.dumps({"rank": who, "reason": why}))
        except OSError:
            pass
    if os.environ.get("DELAYLAB_DEBUG"):
        import traceback

        traceback.print_exc()
    _reported(rank)
    os._exit(1)  # no atexit hooks: destroying a broken process group can hang


def _agent_store() -> bool:
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _store_reachable(timeout_s: float = 2.0) -> bool:
    """Whether the default group's store (at MASTER_ADDR:MASTER_PORT) still accepts a connection; asked
    with a plain socket, because torch's client logs a stack trace when its server is gone."""
    import socket

    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return True  # not known here: the store call will tell
    try:
        socket.create_connection((addr, int(port)), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def _reported(rank: int, wait_s: float = 15.0) -> None:
    """Count this rank's report in the store; rank 0, when it holds the store itself (a plain env://
    start), waits for the others' reports (up to ``wait_s``) so that its exit does not take the first
    failure's record with it."""
    import time

    try:
        if not _store_reachable():
            return
        store = dist.distributed_c10d._get_default_store()
        done = store.add(_REPORTED_KEY, 1)
        if rank != 0 or _agent_store():
            return
        world, deadline = int(os.environ.get("WORLD_SIZE", "1")), time.monotonic() + wait_s
        while done < world - 1 and time.monotonic() < deadline:  # every survivor, if one rank died
            time.sleep(0.1)
            done = store.add(_REPORTED_KEY, 0)
    except Exception:  # noqa: BLE001 - best effort: the line is printed already
        pass


def as_rank(work: Callable[[], Any], *, stages: int, dp: int, passes: tuple[type, ...] = ()):
    """Run this rank's ``work``, then leave the process group. A failure once the group exists is
    reported (:func:`report_failure`); ``passes``: errors every rank raises alike, left to the caller."""
    try:
        result = work()
    except (KeyboardInterrupt, *passes):
        raise
    except BaseException as err:  # noqa: BLE001 - every failure ends the rank the same way
        if not dist.is_initialized():
            raise
        report_failure(err, stages, dp)
    stop()
    return result


def _entry(fn, args, stages, dp):
    return as_rank(functools.partial(fn, *args), stages=stages, dp=dp)


def launch(fn: Callable, args: tuple, *, stages: int = 1, dp: int, what: str) -> dict[int, Any]:
    """Run ``fn(*args)`` in ``stages x dp`` ranks through torch's elastic launcher; ``{rank: result}``.
    A rank that fails raises :class:`RunFailed` ("``what`` stopped: rank r ...")."""
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # The ranks report failures themselves (one line each); the agent's tracebacks add nothing.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)  # "Terminating process ... via SIGTERM"
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the ranks inherit it; one thread each
    # A rank that fails leaves with os._exit; multiprocessing's tracker then warns about a
    # semaphore it cleans up anyway.
    os.environ.setdefault("PYTHONWARNINGS", "ignore::UserWarning:multiprocessing.resource_tracker")
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=stages * dp, run_id=uuid.uuid4().hex[:12],
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.2,
        start_method="spawn",
        # SIGTERM, SIGINT and SIGUSR1 are ours (preempt.LauncherSignals): the ranks stop at an update
        # boundary with a checkpoint; the agent would forward them and kill the ranks after 30 s.
        signals_to_handle="SIGHUP,SIGQUIT",
    )
    _tracker_ignores_sigusr1()
    with tempfile.TemporaryDirectory() as tmp:
        claim = Path(tmp) / "failure.json"
        os.environ[_FAILURE_FILE] = str(claim)  # the spawned ranks inherit it
        os.environ[STOP_FILE] = str(Path(tmp) / "stop")
        try:
            with LauncherSignals(Path(tmp) / "stop", lambda: [p.pid for p in multiprocessing.active_children()]):
                return elastic_launch(config, _entry)(fn, args, stages, dp)
        except ChildFailedError as err:
            first = json.loads(claim.read_text()) if claim.is_file() else None
            raise RunFailed(f"{what} stopped: {_first_failure(err, first)}") from None
        finally:
            os.environ.pop(_FAILURE_FILE, None)
            os.environ.pop(STOP_FILE, None)


def _tracker_ignores_sigusr1() -> None:
    """Start multiprocessing's resource tracker (the spawned ranks share it) with SIGUSR1 blocked: it
    ignores SIGINT and SIGTERM itself, but SLURM's SIGUSR1 to every process of a job would kill it,
    and its successor prints a traceback for each semaphore it never knew."""
    import signal
    from multiprocessing import resource_tracker

    if not hasattr(signal, "pthread_sigmask"):
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        resource_tracker.ensure_running()  # inherits the mask, and never unblocks SIGUSR1
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _first_failure(err, claim: dict | None) -> str:
    # A rank killed by a signal is the cause; the ranks that then lost their peer exit 1 and can be
    # seen first (the agent's SIGTERM to the rest, -15, is a consequence too).
    killed = sorted((r, f.exitcode) for r, f in err.failures.items() if f.exitcode < 0 and f.exitcode != -15)
    if killed:
        return f"rank {killed[0][0]} ended first (killed by signal {-killed[0][1]})"
    if claim is not None:
        return f"{'a rank' if claim['rank'] is None else 'rank ' + str(claim['rank'])} failed ({claim['reason']})"
    rank, failure = err.get_first_failure()
    code = failure.exitcode
    return f"rank {rank} ended first ({f'killed by signal {-code}' if code < 0 else f'exit code {code}'})"
