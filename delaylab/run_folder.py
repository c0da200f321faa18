"""The run folder: what every command that writes ``--out DIR`` shares (torch-free).

One :class:`RunFolder` per run owns the files around the work itself:

* the guard: :meth:`~RunFolder.check_new` refuses a folder that already holds a run, so a new
  run never overwrites another;
* nothing is written before :meth:`~RunFolder.open`: a caller checks every input first, so bad
  input leaves no folder behind;
* ``config.json`` (written at ``open``), ``metrics.jsonl`` (one JSON object per line, flushed as
  it arrives, so an interrupted run keeps what it measured; on resume truncated to the bytes the
  checkpoint had logged, so a resumed run's file equals an uninterrupted one's) and
  ``summary.json`` (:meth:`~RunFolder.finish`);
* the optional TensorBoard / W&B mirror of the metrics lines and the progress
  (:class:`delaylab._progress.Progress`: a bar on a terminal, lines every few seconds elsewhere).

What a run is (an llm config, the arguments of a toy check) is the caller's: the folder takes
the config as a JSON-ready dict. :class:`delaylab.llm.run.folder.TrainFolder` adds what only an
llm training run has.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from delaylab._io import dumps, write_json
from delaylab.errors import ConfigError, MissingExtra, WriteFailed, cannot_write, install_hint

CONFIG, METRICS, SUMMARY = "config.json", "metrics.jsonl", "summary.json"
LOGGERS = ("none", "tensorboard", "wandb")


class RunFolder:
    """``out`` (None: nothing is written) for a run described by ``config`` (a JSON-ready dict).

    ``writer``: this process writes the files (rank 0 / the last stage); the others only read.
    ``marks``: further names whose presence means the folder holds a run (checkpoints).
    """

    def __init__(self, out: str | os.PathLike | None, config: dict | None = None, *, writer: bool = True,
                 marks: tuple[str, ...] = ()):
        self.out = Path(out) if out is not None else None
        self.writer = writer and out is not None
        self.config = config
        self.marks = (CONFIG, METRICS, SUMMARY, *marks)
        # What a resume needs back (saved inside the checkpoint): where metrics.jsonl ended.
        self.state: dict = {"metrics_bytes": 0}
        self._metrics = None
        self._sinks: list = []
        self._bar = None

    # -- before anything is written ---------------------------------------------------------
    def check_new(self) -> None:
        """Refuse a folder that already holds a run (read-only)."""
        if self.out is not None and any((self.out / n).exists() for n in self.marks):
            raise ConfigError(f"{self.out} already holds a run: resume it or choose another output folder")

    def check_writable(self) -> None:
        """Refuse a folder that cannot take files (no permission, a read-only disk, a file in the
        way), without creating anything: a temporary file in its nearest existing ancestor."""
        import tempfile

        if self.out is None:
            return
        place = self.out
        while not place.exists() and place != place.parent:
            place = place.parent
        try:
            if not place.is_dir():
                raise NotADirectoryError(20, "Not a directory", str(place))
            with tempfile.TemporaryFile(dir=place):
                pass
        except OSError as err:
            raise WriteFailed(f"cannot write {self.out}: {err.strerror or err}") from None

    def finished_summary(self) -> dict | None:
        """The summary of a run that already finished, if this folder holds one."""
        path = self.out / SUMMARY if self.out is not None else None
        if path is not None and path.is_file():
            summary = json.loads(path.read_text())
            if summary.get("status") == "finished":
                return summary
        return None

    # -- opening ------------------------------------------------------------------------------
    def open(self, loop_state: dict | None = None, *, total: int | None = None, initial: int = 0, desc: str = "",
             unit: str = "step", progress: bool | None = None, leave: bool = True, log: str = "none") -> None:
        """Write config.json, start (or, with a checkpoint's ``loop_state``, continue) metrics.jsonl,
        open the ``log`` mirror and the progress (``total`` units; ``progress`` None: a bar on a
        terminal, lines elsewhere; False: none)."""
        from delaylab._progress import Progress

        if log not in LOGGERS:
            raise ConfigError(f"unknown logger {log!r}; expected one of {', '.join(LOGGERS)}")
        if loop_state is not None:
            self.state.update(loop_state)
        if self.writer:
            try:  # nothing has run yet: an output folder that takes no files is bad input (exit 2)
                self.out.mkdir(parents=True, exist_ok=True)
                write_json(self.out / CONFIG, self.config)
                path = self.out / METRICS
                self._metrics = open(path, "r+b" if loop_state is not None and path.is_file() else "wb")
                self._metrics.truncate(self.state["metrics_bytes"])  # lines logged after the checkpoint
                self._metrics.seek(self.state["metrics_bytes"])
            except OSError as err:
                raise WriteFailed(cannot_write(self.out, err)) from None
            self._sinks = _open_sinks(log, self.out, self.config)
        self._bar = Progress(desc, total or 0, progress, unit, initial=initial, leave=leave)

    def close(self) -> None:
        """Close the progress, metrics.jsonl and the mirrors (again: nothing happens)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        for sink in self._sinks:
            sink.close()
        self._sinks = []

    # -- during the run -----------------------------------------------------------------------
    def log(self, rec: dict) -> None:
        """One metrics.jsonl line (flushed), mirrored to the logger; the progress shows :meth:`postfix`."""
        if self._metrics is not None:
            self._metrics.write((dumps(rec) + "\n").encode())
            self._metrics.flush()
            self.state["metrics_bytes"] = self._metrics.tell()
            for sink in self._sinks:
                sink.log(rec)
        if self._bar is not None:
            postfix = self.postfix(rec)
            if postfix:
                self._bar.set_status(**postfix)

    def postfix(self, rec: dict) -> dict:
        """What the progress shows of a metrics line (nothing here; subclasses choose)."""
        return {}

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.advance(n)

    def loop_state(self) -> dict:
        """A copy of :attr:`state`, for a checkpoint."""
        return json.loads(json.dumps(self.state))

    # -- the end --------------------------------------------------------------------------------
    def finish(self, summary: dict) -> dict:
        """Close, write summary.json (the writer), return ``summary``."""
        self.close()
        if self.writer:
            write_json(self.out / SUMMARY, summary)
        return summary


# -- metric mirrors ---------------------------------------------------------------------------------
class _TensorBoard:
    def __init__(self, out: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise MissingExtra(f"--log tensorboard needs the tensorboard package: {install_hint('log')}") from None
        self.writer = SummaryWriter(log_dir=str(out / "tensorboard"))

    def log(self, rec: dict) -> None:
        for key, value in rec.items():
            if key != "step" and isinstance(value, (int, float)) and value is not None:
                self.writer.add_scalar(key, value, rec["step"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, out: Path, config: dict | None):
        try:
            import wandb
        except ImportError:
            raise MissingExtra(f"--log wandb needs the wandb package: {install_hint('wandb')}") from None
        os.environ.setdefault("WANDB_MODE", "offline")  # no network unless the user says so
        self.run = wandb.init(project="delaylab", dir=str(out), config=config, reinit=True)

    def log(self, rec: dict) -> None:
        self.run.log({k: v for k, v in rec.items() if k != "step"}, step=rec["step"])

    def close(self) -> None:
        self.run.finish()


def _open_sinks(log: str, out: Path, config: dict | None) -> list:
    if log == "tensorboard":
        return [_TensorBoard(out)]
    if log == "wandb":
        return [_WandB(out, config)]
    return []
