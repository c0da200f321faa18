"""Progress of long commands: a tqdm bar on a terminal, and lines on stderr otherwise, so that a log
(CI, ``nohup``, a pipe, a batch job) sees the run move.

Every long command reports through :class:`Progress`: ``llm train`` and ``llm pipeline`` (through
:class:`delaylab.run_folder.RunFolder`: one unit per update, the loss and tokens/s as its status),
``toy`` checks (one unit per run), ``llm sweep`` and ``reproduce`` (one unit per finished cell,
each with a line of its own). Off a terminal a line comes at least every ``interval`` seconds, from
a timer thread when no unit finishes in that time (a cell of minutes, a slow first step): done /
total, the status, the time so far and the ETA. ``interval``: the ``DELAYLAB_PROGRESS_INTERVAL``
environment variable (seconds), default 20.

``progress`` None or True: the bar on a terminal, the lines elsewhere; False: silent.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref

INTERVAL_ENV = "DELAYLAB_PROGRESS_INTERVAL"
DEFAULT_INTERVAL = 20.0


def interval_from_env() -> float:
    """Seconds between lines off a terminal (``DELAYLAB_PROGRESS_INTERVAL``; a bad value: the default)."""
    try:
        value = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL))
    except ValueError:
        return DEFAULT_INTERVAL
    return value if value >= 0 else DEFAULT_INTERVAL


def duration(seconds: float) -> str:
    """``45 s``, ``3.2 min`` or ``2.1 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """``total`` units of ``unit`` (``"update"``/``"step"``: a training loop), ``initial`` of them done
    before (a resume: they do not count towards the ETA's rate)."""

    def __init__(self, desc: str, total: int = 0, progress: bool | None = None, unit: str = "run", *,
                 initial: int = 0, leave: bool = True, interval: float | None = None):
        self.desc, self.total, self.done, self.unit = desc, total, initial, unit
        self.status: dict[str, str] = {}
        self.interval = interval_from_env() if interval is None else interval
        self._start = self._last = time.perf_counter()
        self._counted = initial  # units that do not measure this session's speed (done before, read back)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._bar = None
        self._lines = progress is not False and not sys.stderr.isatty()
        if progress is not False and not self._lines:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, leave=leave)
        self._timer = None
        if self._lines:
            self._timer = threading.Thread(target=_beat, args=(weakref.ref(self), self._stop),
                                           name="delaylab-progress", daemon=True)
            self._timer.start()

    # -- what the command reports -----------------------------------------------------------------
    def set_total(self, total: int) -> None:
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def set_status(self, **fields) -> None:
        """What the next line (or the bar's postfix) shows after done / total: ``loss="3.41"``, ..."""
        self.status = {k: str(v) for k, v in fields.items()}
        if self._bar is not None:
            self._bar.set_postfix(**self.status)

    def advance(self, n: int = 1) -> None:
        """``n`` more units done; off a terminal a line once ``interval`` has passed since the last."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._lines and time.perf_counter() - self._last >= self.interval:
            self._print(self.line())

    def update(self, name: str = "", seconds: float | None = None, note: str = "", read: bool = False) -> None:
        """One cell finished (a line of its own off a terminal): ``seconds`` it took (None: not
        known), or ``read`` from an earlier run."""
        self.done += 1
        self._counted += read
        if self._bar is not None:
            self._bar.update(1)
        elif self._lines:
            took = "read" if read else "done" if seconds is None else f"{seconds:.1f} s"
            self._print(f"{self.desc}: {self.done}/{self.total} {name} ({took}{', ' + note if note else ''}; "
                        f"{self._times()})")

    def close(self) -> None:
        self._stop.set()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # -- the lines ----------------------------------------------------------------------------------
    def eta(self) -> float | None:
        """Seconds left at this session's rate; None before the first unit (or without a total)."""
        fresh = self.done - self._counted
        if fresh <= 0 or not self.total:
            return None
        return (time.perf_counter() - self._start) / fresh * max(self.total - self.done, 0)

    def _times(self) -> str:
        eta = self.eta()
        return f"{duration(time.perf_counter() - self._start)} so far" + ("" if eta is None else f", ETA {duration(eta)}")

    def line(self) -> str:
        """``DESC: update 120/600, loss 3.41, tokens/s 9000, 45 s so far, ETA 3.0 min`` (or ``DESC: 3/40 runs``)."""
        if self.unit in ("update", "step"):
            count = f"update {self.done}/{self.total or '?'}"
        else:
            count = f"{self.done}/{self.total or '?'} {self.unit}s"
        status = "".join(f", {k} {v}" for k, v in self.status.items())
        return f"{self.desc}: {count}{status}, {self._times()}"

    def _print(self, text: str) -> None:
        with self._lock:
            self._last = time.perf_counter()
            print(text, file=sys.stderr, flush=True)

    def _beat_once(self) -> float:
        """A line if ``interval`` passed without one; the seconds until the next may be due."""
        if time.perf_counter() - self._last >= self.interval:
            self._print(self.line())
        return max(self._last + self.interval - time.perf_counter(), 0.05)


def _beat(ref: weakref.ref, stop: threading.Event) -> None:
    """The timer thread: a line whenever ``interval`` passes without one, until ``close`` (or until
    the Progress is gone: the thread holds no reference that would keep it)."""
    wait = 0.05
    while not stop.wait(wait):
        progress = ref()
        if progress is None:
            return
        wait = progress._beat_once()
        del progress
