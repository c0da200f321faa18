"""The closure convention of ``torch.optim`` shared by our optimizers."""

from __future__ import annotations

import torch


def closure_loss(closure):
    """Evaluate ``closure`` with autograd enabled (``step`` itself runs under ``no_grad``)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()
