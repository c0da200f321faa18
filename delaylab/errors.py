"""The one family of errors that delaylab raises for bad input.

``delaylab.cli.main`` alone turns a :class:`DelaylabError` into one line on stderr and its
``exit_code``: 2 for bad input, 1 for a run that failed (a diverged loss, a failed rank). Each subclass also derives from the builtin that callers would catch without us
(``ValueError``, ``FileNotFoundError``, ``ImportError``), so library users keep their
``except ValueError``. This module imports nothing, so every layer (``theory`` too) may use it.
"""


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


class Diverged(DelaylabError, RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is kept (exit code 1)."""

    exit_code = 1
    label = "diverged"
