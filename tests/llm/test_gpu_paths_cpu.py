"""CUDA-only branches reached on the CPU (issue 39, item 7): bf16 autocast under every corrector (the
CPU's bf16 autocast stands in for CUDA's), torch's fused AdamW/SGD through Delayed and EF (the
registry chooses them for CUDA parameters; torch has them on the CPU too), the loss's
event-timed copy to the host and the pinned copy of a batch (torch.cuda's pieces replaced by stubs)."""

import math
import types

import pytest
import torch

from delaylab.llm.model import Block
from delaylab.llm.run import trainer as trainer_module
from delaylab.llm.run.setup import Setup
from delaylab.llm.run.trainer import Trainer, _Call, _to_host, _value
from delaylab.optim import registry
from delaylab.optim.corrections import NAMES


# every corrector alone (and none), two combinations, EF's buffer in bf16, Muon
CASES = [dict(correction=c) for c in NAMES if c != "drop"] + [dict(correction="drop:2", delay=0, delay_dist="uniform:0-3"),
                                                             dict(correction="ef,damp", optimizer="muon"),
                                               dict(correction="ef,dc-asgd"),
                                               dict(correction="ef", ef_dtype="bfloat16")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c.values())))
def test_bf16_autocast_trains_under_every_corrector(quick, corpus, monkeypatch, case):
    seen = []
    monkeypatch.setattr(trainer_module, "autocast", lambda device: torch.autocast("cpu", dtype=torch.bfloat16))
    t = Trainer(quick(**{"optimizer": "adamw", "delay": 1, "steps": 6, **case}), corpus)
    block = next(m for m in t.model.modules() if isinstance(m, Block))
    block.attn.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    before = [p.detach().clone() for p in t.model.parameters()]
    losses = [t.step() for _ in range(6)]
    t.settle()
    assert seen and set(seen) == {torch.bfloat16}  # the products ran in bf16: the stand-in took effect
    assert all(p.dtype == torch.float32 for p in t.model.parameters())  # the weights stay float32
    assert all(math.isfinite(v) for v in [c for c in losses if c is not None]) and math.isfinite(t.evaluate())
    assert any(not torch.equal(a, p) for a, p in zip(before, t.model.parameters()))  # updates were applied


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_fused_kernels_through_delayed_and_ef_on_the_cpu(quick, corpus, monkeypatch, optimizer):
    """The registry's CUDA choice (fused=True) taken on CPU parameters: Delayed + EF drive torch's fused
    step like the single-tensor one (same trajectory to float rounding)."""
    def run(fused: bool):
        if fused:
            monkeypatch.setattr(registry, "_on_cuda", lambda params: True)
        t = Trainer(quick(optimizer=optimizer, delay=1, correction="ef", steps=6, lr=1e-2), corpus)
        for _ in range(6):
            t.step()
        t.settle()
        monkeypatch.undo()
        return t

    plain, fused = run(False), run(True)
    assert plain.opt.inner.defaults.get("fused") is None and fused.opt.inner.defaults["fused"] is True
    diffs = [(a - b).abs().max().item() for a, b in zip(plain.model.parameters(), fused.model.parameters())]
    assert max(diffs) < 1e-5
    moved = [(a - b).abs().max().item() for a, b in zip(fused.model.parameters(), Trainer(plain.cfg, corpus).model.parameters())]
    assert max(moved) > 1e-3  # 5 updates moved the weights: equal trajectories, not two idle ones


def test_a_cuda_loss_is_copied_without_blocking_and_read_after_its_event(monkeypatch):
    log = []

    class Event:
        def record(self):
            log.append("record")

        def synchronize(self):
            log.append("synchronize")

    class CudaLoss:  # what the trainer's loss is on a GPU: a device tensor
        device = torch.device("cuda")

        def to(self, where, non_blocking=False):
            log.append(("to", where, non_blocking))
            return torch.tensor(2.5)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    host, event = _to_host(CudaLoss())
    assert log == [("to", "cpu", True), "record"] and isinstance(event, Event)
    assert _value(_Call(0, 0, host, event)) == 2.5 and log[-1] == "synchronize"  # waited before the read
    cpu = torch.tensor(1.5)
    assert _to_host(cpu) == (cpu, None) and _value(_Call(0, 0, cpu, None)) == 1.5  # the CPU: no event


def test_a_batch_for_the_gpu_is_pinned_before_its_asynchronous_copy():
    log = []

    class Rows:
        def __init__(self, name, pinned=False):
            self.name, self.pinned = name, pinned

        def pin_memory(self):
            log.append(("pin", self.name))
            return Rows(self.name, True)

        def to(self, device, non_blocking=False):
            log.append(("to", self.name, self.pinned, non_blocking))
            return self

    for kind, expected in (("cuda", [("pin", "x"), ("pin", "y"), ("to", "x", True, True), ("to", "y", True, True)]),
                           ("cpu", [("to", "x", False, True), ("to", "y", False, True)])):
        log.clear()
        setup = types.SimpleNamespace(cfg=types.SimpleNamespace(parallel=types.SimpleNamespace(dp=1)),
                                      device=types.SimpleNamespace(type=kind))
        Setup.rows(setup, Rows("x"), Rows("y"))
        assert log == expected, kind
