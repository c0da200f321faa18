"""The one family of errors that delaylab raises for bad input.

``delaylab.cli.main`` alone turns a :class:`DelaylabError` into one line on stderr and its
``exit_code``: 2 for bad input, 1 for a run that failed (a diverged loss, a failed rank, a write that
failed mid-run), 75 for a run that a signal stopped with a checkpoint (:class:`Preempted`). Each
subclass also derives from the builtin that callers would catch without us (``ValueError``,
``FileNotFoundError``, ``ImportError``, ``OSError``), so library users keep their ``except ValueError``.
This module imports nothing of ours (nor torch), so every layer (``theory`` too) may use it.
"""

import contextlib


class DelaylabError(Exception):
    """Bad input or a run that cannot go on: a message for the user, not a bug."""

    exit_code = 2
    label = "error"  # the word after "delaylab:" on the one line


class ConfigError(DelaylabError, ValueError):
    """A value out of range, an unknown name, settings that do not fit together."""


class MissingFile(DelaylabError, FileNotFoundError):
    """A data file, run folder or checkpoint that is not there."""


class MissingExtra(DelaylabError, ImportError):
    """An optional dependency is not installed; the message says which extra brings it."""


def install_hint(extra: str) -> str:
    """How to install an extra: delaylab is installed from its checkout (it is not on PyPI)."""
    return f"pip install -e '.[{extra}]' in the delaylab checkout"


@contextlib.contextmanager
def overflow_is_divergence(what: str):
    """Inside the block, torch's refusal of a scalar beyond the tensors' dtype (an lr of 1e38 in a
    float32 run: "value cannot be converted ... without overflow") is a :class:`Diverged` run: its
    numbers left the dtype's range, as a NaN loss says."""
    try:
        yield
    except RuntimeError as err:
        if "without overflow" not in str(err):
            raise
        raise Diverged(f"{what}: a value overflowed the parameters' dtype ({str(err).splitlines()[0]})") from None


class WriteFailed(DelaylabError, OSError):
    """A file delaylab must write cannot be written: no permission, a full disk, a file-size limit.

    Exit code 2 before a run has started (nothing was written); 1 once it has (``started``): the run
    failed, and the message names the last good checkpoint, which is never overwritten.
    """

    def __init__(self, message: str, *, started: bool = False):
        super().__init__(message)
        self.exit_code = 1 if started else 2


def cannot_write(path, err: OSError) -> str:
    """``cannot write PATH: No space left on device`` (the errno's words, not Python's repr)."""
    return f"cannot write {getattr(err, 'filename', None) or path}: {err.strerror or err}"


class Diverged(DelaylabError, RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept (exit code 1)."""

    exit_code = 1
    label = "diverged"


class Preempted(DelaylabError, RuntimeError):
    """SIGTERM, SIGUSR1 or SIGINT stopped the run at an update boundary, after every rank wrote its part
    of a checkpoint: ``--resume`` continues it exactly. Exit code 75 (``EX_TEMPFAIL`` of sysexits.h,
    a temporary failure: run it again), distinct from a finished run (0), a failed one (1) and bad
    input (2); see :mod:`delaylab.llm.distributed.preempt`."""

    exit_code = 75
    label = "preempted"
