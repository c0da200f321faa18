"""retarget: a stage's optimizer, with all its state, moves to another weight slot."""

import pytest
import torch

from delaylab.llm.pipeline.retarget import retarget
from delaylab.optim import Delayed, build_optimizer

from tiny_model import Tiny, tiny_loss


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_retarget_moves_all_state_to_new_tensors(name):
    """Stepping a copy of the weights after retarget equals stepping the originals."""
    torch.manual_seed(1)
    a, b = Tiny(), Tiny()
    b.load_state_dict(a.state_dict())
    opt_a = Delayed(build_optimizer(name, a), delay=1, corrections="ef")
    opt_b = Delayed(build_optimizer(name, b), delay=1, corrections="ef")
    for _ in range(3):
        for m, o in ((a, opt_a), (b, opt_b)):
            tiny_loss(m).backward()
            o.step()
            o.zero_grad()
    c = Tiny()
    c.load_state_dict(b.state_dict())
    params_b = [p for g in opt_b.param_groups for p in g["params"]]
    names_b = {id(p): n for n, p in b.named_parameters()}
    slot = dict(c.named_parameters())
    retarget(opt_b, [slot[names_b[id(p)]] for p in params_b])
    for _ in range(3):
        for m, o in ((a, opt_a), (c, opt_b)):
            tiny_loss(m).backward()
            o.step()
            o.zero_grad()
    for pa, pc in zip(a.parameters(), c.parameters()):
        assert torch.equal(pa, pc)
