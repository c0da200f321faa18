"""delaylab.optim.declared: an optimizer's type for the predictions, declared or inferred."""

import pytest
import torch

from delaylab.errors import ConfigError
from delaylab.optim import LMOMomentum
from delaylab.optim.declared import Declared, infer_declared


def test_declarations():
    x = [torch.zeros(3, 2, dtype=torch.float64)]
    assert infer_declared(torch.optim.SGD(x, lr=0.1, momentum=0.9)) == Declared("heavyball", 0.9)
    assert infer_declared(torch.optim.SGD(x, lr=0.1, momentum=0.9, dampening=0.9)) == Declared("ema", 0.9)
    assert infer_declared(torch.optim.SGD(x, lr=0.1, momentum=0.9, nesterov=True)) is None
    assert infer_declared(torch.optim.AdamW(x, betas=(0.8, 0.99))) == Declared("adam", 0.8)
    assert infer_declared(LMOMomentum(x, lr=0.1, beta=0.5, norm="sign")) == Declared("lmo", 0.5, "sign")
    assert infer_declared(LMOMomentum(x, lr=0.1, nesterov=True)) is None  # not the analysed method
    assert infer_declared(torch.optim.Muon(x, lr=0.1)) is None  # Newton-Schulz, Nesterov: must be declared
    assert Declared.parse("lmo:spectral:0.95") == Declared("lmo", 0.95, "spectral")
    assert Declared.parse("heavyball:0.9") == Declared("heavyball", 0.9)
    for bad in ("lmo:0.9", "nope:0.9", "ema:1.5", "ema:x", "lmo:frob:0.9"):
        with pytest.raises(ConfigError):
            Declared.parse(bad)
