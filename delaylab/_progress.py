"""Progress of long commands (``demo``, ``reproduce``, ``llm sweep``): a tqdm bar on a terminal, and one
line per finished cell on stderr otherwise, so that a log (CI, ``nohup``, a pipe) sees the run move.

``progress`` None or True: the bar on a terminal, the lines elsewhere; False: silent.
"""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, desc: str, total: int = 0, progress: bool | None = None, unit: str = "run"):
        self.desc, self.total, self.done = desc, total, 0
        self._start = time.perf_counter()
        terminal = sys.stderr.isatty()
        self._bar = None
        self._lines = progress is not False and not terminal
        if progress is not False and terminal:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit)

    def set_total(self, total: int) -> None:
        self.total = total
        if self._bar is not None:
            self._bar.total = total
            self._bar.refresh()

    def update(self, name: str = "", seconds: float | None = None, note: str = "", read: bool = False) -> None:
        """One cell finished: ``seconds`` it took (None: not known), or ``read`` from an earlier run."""
        self.done += 1
        if self._bar is not None:
            self._bar.update(1)
        elif self._lines:
            took = "read" if read else "done" if seconds is None else f"{seconds:.1f} s"
            elapsed = time.perf_counter() - self._start
            print(f"{self.desc}: {self.done}/{self.total} {name} ({took}{', ' + note if note else ''}; "
                  f"{elapsed / 60:.1f} min so far)", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
