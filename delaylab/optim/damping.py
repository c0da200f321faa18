r"""Learning-rate damping by the delay, the simplest baseline (one of the correctors of marin's
delayed-gradient study, marin-community/marin #6423):

.. math:: \eta_{delayed} = \eta / (1 + c\,\tau).

Applied to a group's lr only for an update in a delayed phase, and restored after it, so the
schedule that sets ``lr`` is untouched. Every term the inner optimizer scales by ``lr`` (AdamW's
decoupled weight decay too) is damped with it; with error feedback, EF feeds back the update the
inner made at the damped lr. It holds no memory.
"""

from __future__ import annotations

from delaylab.errors import ConfigError
from delaylab.optim.corrector import Corrector, Update


class LrDamping(Corrector):
    name = "damp"
    keywords = {"damping": "c"}

    def __init__(self, c: float = 1.0):
        if not c >= 0:
            raise ConfigError(f"damping must be >= 0, got {c}")
        self.c = float(c)

    def hyper(self) -> dict:
        return {"c": self.c}

    def scale_lr(self, lr, update: Update):
        return lr / (1 + self.c * update.tau) if update.delayed and update.tau else lr
