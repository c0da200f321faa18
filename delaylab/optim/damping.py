r"""Learning-rate damping by the delay, the simplest baseline (one of the correctors of marin's
delayed-gradient study, marin-community/marin #6423):

.. math:: \eta_{delayed} = \eta / (1 + c\,\tau).

Applied to a group's lr only for an update in a delayed phase, and restored after it, so the
schedule that sets ``lr`` is untouched. Every term the inner optimizer scales by ``lr`` (AdamW's
decoupled weight decay too) is damped with it. It holds no memory.
"""

from __future__ import annotations

from contextlib import contextmanager

from delaylab.errors import ConfigError


class LrDamping:
    keys = ()

    def __init__(self, c: float = 1.0):
        if not c >= 0:
            raise ConfigError(f"damping must be >= 0, got {c}")
        self.c = float(c)

    @contextmanager
    def damped(self, groups: list[tuple[dict, int]]):
        """Inside, each ``(group, tau)`` has ``lr / (1 + c tau)``; the old lr object comes back."""
        saved = [(g, g["lr"]) for g, _ in groups]
        try:
            for g, tau in groups:
                g["lr"] = g["lr"] / (1 + self.c * tau)
            yield
        finally:
            for g, lr in saved:
                g["lr"] = lr
