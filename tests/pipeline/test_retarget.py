"""retarget: a stage's optimizer, with all its state, moves to another weight slot."""

import pytest
import torch
from torch import nn

from delaylab.llm.pipeline.retarget import retarget
from delaylab.optim import Delayed, build_optimizer


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 8)
        self.hidden = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 11, bias=False)

    def forward(self, idx):
        return self.head(self.norm(torch.tanh(self.hidden(self.embed(idx)))))


def _loss(model):
    idx = torch.arange(6).reshape(2, 3)
    return model(idx).logsumexp(-1).mean()


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_retarget_moves_all_state_to_new_tensors(name):
    """Stepping a copy of the weights after retarget equals stepping the originals."""
    torch.manual_seed(1)
    a, b = Tiny(), Tiny()
    b.load_state_dict(a.state_dict())
    opt_a = Delayed(build_optimizer(name, a), delay=1, correction="ef")
    opt_b = Delayed(build_optimizer(name, b), delay=1, correction="ef")
    for _ in range(3):
        for m, o in ((a, opt_a), (b, opt_b)):
            _loss(m).backward()
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
            _loss(m).backward()
            o.step()
            o.zero_grad()
    for pa, pc in zip(a.parameters(), c.parameters()):
        assert torch.equal(pa, pc)
