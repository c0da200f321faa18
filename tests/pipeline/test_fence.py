"""The pipeline's timing fences (issue 39, item 5): on CUDA one device sync per update, not three per
action; torch.cuda.synchronize is replaced by a counter, the executor runs one stage in this process."""

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
