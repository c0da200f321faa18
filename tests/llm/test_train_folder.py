"""The llm run folder both engines share: guard, resume check, metrics and their mirrors, divergence."""

import json
import re
import sys
import types

import pytest

from delaylab.errors import ConfigError, MissingExtra
from delaylab.llm.run.folder import TrainFolder
from delaylab.llm.run.trainer import train


def metrics(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_a_folder_with_a_run_is_never_overwritten(quick, corpus, tmp_path):
    cfg = quick(steps=2).resolved()
    train(cfg, tmp_path / "run", dataset=corpus)
    with pytest.raises(ConfigError, match="already holds a run"):
        train(cfg, tmp_path / "run", dataset=corpus)


def test_resume_refuses_a_checkpoint_of_another_config(quick, corpus, tmp_path):
    train(quick(steps=4).resolved(), tmp_path / "run", stop_at=2, dataset=corpus)
    with pytest.raises(ConfigError, match="from another config: lr=0.002 vs None"):
        train(quick(steps=4, lr=2e-3), tmp_path / "run", resume=True, dataset=corpus)
    # fields that do not change the trajectory may differ
    summary = train(quick(steps=4, threads=2, log="none"), tmp_path / "run", resume=True, dataset=corpus)
    assert summary["status"] == "finished"


def test_tensorboard_holds_the_same_scalars_as_metrics_jsonl(quick, corpus, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    train(quick(steps=6, log_every=2, eval_every=3, log="tensorboard"), out, dataset=corpus)
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    lines = metrics(out)
    for key in ("train_loss", "val_loss", "lr", "tokens"):
        want = [(r["step"], r[key]) for r in lines if key in r]
        got = [(e.step, e.value) for e in events.Scalars(key)]
        assert [s for s, _ in got] == [s for s, _ in want], key
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), key  # stored as float32


def test_wandb_gets_every_metrics_line_offline(quick, corpus, tmp_path, monkeypatch):
    """Our side of the W&B contract, with a stand-in module: offline by default, one log call per
    metrics.jsonl line at its step, the config attached, finish() at the end."""
    calls = {"log": [], "finish": 0}

    def init(**kw):
        calls["init"] = kw
        calls["mode"] = __import__("os").environ.get("WANDB_MODE")
        return types.SimpleNamespace(log=lambda rec, step: calls["log"].append((step, rec)),
                                     finish=lambda: calls.__setitem__("finish", calls["finish"] + 1))

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    out = tmp_path / "run"
    train(quick(steps=4, log_every=2, log="wandb"), out, dataset=corpus)
    assert calls["mode"] == "offline" and calls["finish"] == 1
    assert calls["init"]["config"]["optim"]["optimizer"] == "adamw"
    assert [(s, {"step": s, **rec}) for s, rec in calls["log"]] == [(r["step"], r) for r in metrics(out)]


def test_a_missing_logger_is_a_one_line_hint(quick, corpus, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails
    with pytest.raises(MissingExtra, match=re.escape("pip install -e '.[wandb]'")):
        train(quick(steps=2, log="wandb"), tmp_path / "run", dataset=corpus)


def test_only_the_writer_writes(quick, tmp_path):
    run = TrainFolder(quick().resolved(), tmp_path / "run", writer=False)
    run.open()
    run.record(1, tokens=10, time=1.0)
    run.close()
    assert not (tmp_path / "run").exists()


def test_the_summary_carries_the_regime_diagnostics_of_its_metrics(quick, corpus, tmp_path):
    from delaylab.llm import metrics as M

    # 20 updates, warmup 1 (5%), lines every 2: the lr peaks at the first line, step 2
    summary = train(quick(steps=20, log_every=2, eval_every=4), tmp_path / "run", dataset=corpus)
    recs = metrics(tmp_path / "run")
    d = summary["diagnostics"]
    assert d["spike"]["warmup"] == 2 and d["plateau"]["level"] == recs[0]["train_loss"]
    losses = [r["train_loss"] for r in recs]
    rises = [losses[i] - min(losses[:i]) for i in range(1, len(losses))]  # lines after step 2
    assert d["spike"]["spike"] == pytest.approx(max(0.0, *rises))
    assert d == M.diagnostics(recs)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["diagnostics"] == d
