"""The delay queue owns its gradients (issue 35, point 4).

Before, the queue held ``p.grad`` by reference, so anything that writes the next gradient into
the same storage changed a gradient after it was queued: a CUDA graph's replay (static gradient
buffers), DDP with ``gradient_as_bucket_view=True``, ``zero_grad(set_to_none=False)``. Each test
here failed on the reference-holding queue (measured: the probe applied -5 instead of -1, DDP ended
0.038 away from the hand-written delay in float32).
"""

import torch
import torch.distributed as dist
from torch import nn

from delaylab.optim import Delayed


def test_a_gradient_overwritten_in_place_after_it_was_queued_is_applied_as_queued():
    """A CUDA graph's replay writes each new gradient into the same static buffer, which stays
    ``p.grad``: update k must still apply gradient k-1."""
    x = torch.zeros(3, requires_grad=True)
    static = torch.zeros(3)
    opt = Delayed(torch.optim.SGD([x], lr=1.0), delay=1)
    applied = []
    for g in (1.0, 5.0, 7.0):
        static.fill_(g)  # the replay
        x.grad = static  # the buffer the graph writes is the one p.grad names
        before = x.detach().clone()
        opt.step()
        applied.append((before - x.detach()).tolist())
        assert x.grad is static  # never replaced: the next replay's gradient is the one read
    assert applied == [[0.0] * 3, [1.0] * 3, [5.0] * 3]


def test_zero_grad_without_set_to_none_does_not_zero_a_queued_gradient():
    x = torch.zeros(2, requires_grad=True)
    opt = Delayed(torch.optim.SGD([x], lr=1.0), delay=2)
    for c in range(4):
        opt.zero_grad(set_to_none=False)
        if x.grad is None:
            x.grad = torch.zeros(2)
        x.grad.add_(float(c + 1))  # backward accumulates into the zeroed buffer
        opt.step()
    # updates 0 and 1 applied the gradients of calls 0 and 1: 1 + 2
    assert x.tolist() == [-3.0, -3.0] and opt.num_updates == 2


def _hand_written_delay_1(model: nn.Module, batches, lr: float) -> None:
    """SGD applying the previous call's gradient (none on the first call)."""
    prev = None
    for x, y in batches:
        model.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        grads = [p.grad.clone() for p in model.parameters()]
        if prev is not None:
            with torch.no_grad():
                for p, g in zip(model.parameters(), prev):
                    p.sub_(g, alpha=lr)
        prev = grads


def test_ddp_with_gradient_as_bucket_view_equals_the_hand_written_delay(tmp_path):
    """DDP's bucket view is the gradient storage of every backward: the queue must copy it."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        make = lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).double()  # noqa: E731
        ref, net = make(), make()
        net.load_state_dict(ref.state_dict())
        g = torch.Generator().manual_seed(1)
        batches = [(torch.randn(5, 4, generator=g, dtype=torch.float64),
                    torch.randn(5, 2, generator=g, dtype=torch.float64)) for _ in range(6)]
        _hand_written_delay_1(ref, batches, lr=0.5)
        ddp = nn.parallel.DistributedDataParallel(net, gradient_as_bucket_view=True)
        opt = Delayed(torch.optim.SGD(ddp.parameters(), lr=0.5), delay=1)
        for x, y in batches:
            opt.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        diff = max((p - q).abs().max().item() for p, q in zip(net.parameters(), ref.parameters()))
        assert diff < 1e-12, diff
    finally:
        dist.destroy_process_group()


def test_flush_applies_what_is_queued_oldest_first():
    """``Delayed.flush()``: the end of training applies the queued gradients, as a pipeline drains."""
    x = torch.zeros(1, requires_grad=True)
    opt = Delayed(torch.optim.SGD([x], lr=1.0), delay=2)
    for g in (1.0, 2.0, 4.0):
        x.grad = torch.full((1,), g)
        opt.step()
    assert x.item() == -1.0 and opt.num_updates == 1
    assert opt.flush() and x.item() == -3.0
    assert opt.flush() and x.item() == -7.0 and opt.num_updates == 3
    assert not opt.flush() and x.item() == -7.0
