"""Copy this file into your project's tests/ to fail CI when your optimizer becomes delay-fragile.

It needs pytest and delaylab, installed from its clone (it is not on PyPI):
``pip install -e "/path/to/delaylab[optimizers]"`` (the extra brings Lion, SOAP and the other
pytorch-optimizer methods). ``assert_delay_robust`` profiles the optimizer on small matrix
problems with a one-step gradient delay (PipeDream-2BW) and fails with a table of every check
when a delay costs more than ``max_cost`` (delayed / sync mean gradient norm, on the same
noise), or when a delayed run diverges.
"""

import torch

from delaylab.testing import assert_delay_robust


def make_optimizer(params):
    # Replace with your own: any factory params -> torch.optim.Optimizer (its lr is the centre
    # of the lr grid that is searched, x0.25 .. x4).
    return torch.optim.AdamW(params, lr=0.01)


def test_my_optimizer_is_delay_robust():
    assert_delay_robust(make_optimizer, max_cost=1.5)


def test_my_optimizer_with_error_feedback():
    # EF (delaylab.optim.Delayed(..., corrections="ef")) should close most of the gap.
    assert_delay_robust(make_optimizer, max_cost=1.1, corrections=("ef",), at=("best",), problems=("logdet",))
