"""GPU paths of the pipeline and the evaluation, on the CPU (issue 39, items 5 and 6): one device sync
per update, not three per action (torch.cuda.synchronize replaced by a counter; the executor runs
its stage in this process); bf16 messages between stages under autocast; no second compilation
for the evaluation under --compile."""

import pytest
import torch

from delaylab.errors import ConfigError
from delaylab.llm.config import Config
from delaylab.llm.model import GPT
from delaylab.llm.pipeline.executor import StageExecutor
from delaylab.llm.pipeline.p2p import P2P
from delaylab.llm.pipeline.schedules import Schedule
from delaylab.llm.pipeline.stages import Stage
from delaylab.llm.pipeline.timeline import Timeline


def _executor(sync_timing, schedule="2bw", M=2, steps=4) -> StageExecutor:
    torch.manual_seed(0)
    model = GPT(Config.from_dict(preset="tiny", block_size=16).model_config(256))
    gen = torch.Generator().manual_seed(0)
    return StageExecutor(
        Stage(model, 0, 1), Schedule(schedule, 1, M, steps),
        P2P((2, 16, model.config.d_model), torch.float32, torch.device("cpu")),
        make_optimizer=lambda module, tau: torch.optim.SGD(module.parameters(), lr=0.1), lr_lambda=lambda k: 1.0,
        batch=lambda n: (torch.randint(0, 256, (2, 16), generator=gen), torch.randint(0, 256, (2, 16), generator=gen)),
        sync_timing=sync_timing)


@pytest.mark.parametrize("schedule", ["2bw", "1f1b"])
def test_step_timing_fences_once_per_update_at_its_end(monkeypatch, schedule):
    fences = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: fences.append(len(ex.events)))
    ex = _executor("step", schedule)
    ex.run()
    updates = [i for i, e in enumerate(ex.events) if e.op == "U"]
    assert len(fences) == len(updates) == 4  # was 3 per action: 3 x 20 = 60
    assert fences == updates  # each one taken for the update's end, before its event is stored
    assert Timeline([ex.events]).steady_state(skip=1)["seconds_per_batch"] > 0


def test_action_timing_keeps_the_three_fences_per_action_and_none_off_cuda(monkeypatch):
    fences = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: fences.append(1))
    ex = _executor("action")
    ex.run()
    assert len(fences) == 3 * len(ex.events) == 3 * 4 * (2 * 2 + 1)
    fences.clear()
    _executor(False).run()
    assert fences == []


def test_an_unknown_timing_mode_is_refused():
    with pytest.raises(ConfigError, match="sync_timing"):
        _executor(True)


def test_messages_travel_in_bf16_under_autocast_and_the_stage_computes_in_float32():
    """A middle stage of three with a bf16 wire (what the rank chooses under CUDA's autocast; here the
    CPU's bf16 autocast stands in): what it sends forward and backward is bf16, what it stashes and
    computes on is float32 (the residual stream as in one process)."""
    torch.manual_seed(0)
    model = GPT(Config.from_dict(preset="tiny", block_size=16, tie_embeddings=False).model_config(256))
    d = model.config.d_model
    ex = StageExecutor(
        Stage(model, 1, 3), Schedule("2bw", 3, 2, 2), P2P((2, 16, d), torch.bfloat16, torch.device("cpu")),
        make_optimizer=lambda module, tau: torch.optim.SGD(module.parameters(), lr=0.1), lr_lambda=lambda k: 1.0,
        batch=lambda n: None, amp=lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    f, b = (next(a for a in ex.schedule.iter_actions(1) if a.op == op) for op in "FB")
    sent = ex._forward(f, torch.randn(2, 16, d).to(torch.bfloat16))
    x, _ = ex._stash[f.n]
    assert sent.dtype == torch.bfloat16 and x.dtype == torch.float32
    grad = ex._backward(b, torch.randn(2, 16, d).to(torch.bfloat16))
    assert grad.dtype == torch.bfloat16 and grad.shape == (2, 16, d) and bool(grad.abs().sum() > 0)


def test_the_rank_chooses_bf16_messages_only_under_cuda_autocast_of_a_float32_model():
    from delaylab.llm.run.rank import wire_dtype

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert wire_dtype(Config.from_dict(preset="tiny"), cuda) == torch.bfloat16
    assert wire_dtype(Config.from_dict(preset="tiny"), cpu) == torch.float32
    assert wire_dtype(Config.from_dict(preset="tiny", dtype="float64"), cuda) == torch.float64


def test_evaluation_under_compile_compiles_nothing_more(monkeypatch):
    """Eval mode and no autograd fail the training graph's guards: the evaluation once compiled every
    block again (a second graph). The blocks now run eagerly there."""
    from torch._dynamo.utils import counters

    from delaylab.llm.run.trainer import Trainer

    monkeypatch.setenv("DELAYLAB_COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    counters.clear()
    t = Trainer(Config.from_dict(preset="tiny", batch_size=2, block_size=16, steps=6, compile=True, threads=1,
                                 progress=False, eval_batches=2, dropout=0.1))
    t.step()
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1  # the training graph was compiled: the count can move
    assert t.evaluate() > 0
    t.step()
    assert counters["stats"]["unique_graphs"] == graphs
    assert all(b._compiled_call_impl is not None for b in t.model.modules() if hasattr(b, "_compiled_call_impl")
               and type(b).__name__ == "Block")  # compiled again after the evaluation
