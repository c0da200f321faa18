"""delaylab.run_folder: the guard, nothing written before open, lines flushed as they come,
resume truncation, the summary. (The llm folder on top of it: tests/llm/test_train_folder.py.)"""

import json
import subprocess
import sys

import pytest

from delaylab.errors import ConfigError
from delaylab.run_folder import RunFolder


def lines(folder) -> list[dict]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


def test_nothing_is_written_before_open_and_each_line_is_on_disk_at_once(tmp_path):
    out = tmp_path / "run"
    run = RunFolder(out, {"lr": 0.5})
    run.check_new()
    assert not out.exists()
    run.open(total=3, progress=False)
    assert json.loads((out / "config.json").read_text()) == {"lr": 0.5}
    run.log({"step": 1, "loss": float("nan")})  # JSON has no NaN: null
    assert lines(out) == [{"step": 1, "loss": None}]  # before any close
    assert run.finish({"status": "finished", "x": 1}) == {"status": "finished", "x": 1}
    assert json.loads((out / "summary.json").read_text()) == {"status": "finished", "x": 1}
    assert run.finished_summary() == {"status": "finished", "x": 1}
    run.close()  # again: nothing happens


@pytest.mark.parametrize("mark", ["config.json", "metrics.jsonl", "summary.json", "ckpt"])
def test_a_folder_with_any_mark_of_a_run_is_refused(tmp_path, mark):
    (tmp_path / mark).write_text("{}")
    with pytest.raises(ConfigError, match="already holds a run"):
        RunFolder(tmp_path, {}, marks=("ckpt",)).check_new()
    RunFolder(tmp_path / "empty", {}).check_new()  # no folder, or an empty one: a new run
    (tmp_path / "empty").mkdir()
    RunFolder(tmp_path / "empty", {}).check_new()


def test_resume_truncates_metrics_to_the_checkpoint(tmp_path):
    run = RunFolder(tmp_path, {})
    run.open(progress=False)
    run.log({"step": 1})
    saved = run.loop_state()  # what a checkpoint after step 1 holds
    run.log({"step": 2})  # logged after the checkpoint, then the process dies
    run.close()
    again = RunFolder(tmp_path, {})
    again.open(saved, progress=False)
    again.log({"step": 2, "again": True})
    again.close()
    assert lines(tmp_path) == [{"step": 1}, {"step": 2, "again": True}]


def test_only_the_writer_writes_and_no_folder_writes_nothing(tmp_path):
    for run in (RunFolder(tmp_path / "run", {}, writer=False), RunFolder(None, {})):
        run.open(total=1, progress=False)
        run.log({"step": 1})
        run.advance()
        run.finish({"status": "finished"})
        assert run.finished_summary() is None
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_logger_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match="unknown logger 'tb'"):
        RunFolder(tmp_path / "run", {}).open(log="tb")
    assert not (tmp_path / "run").exists()


def test_importing_it_loads_no_torch():
    code = "import sys, delaylab.run_folder; assert 'torch' not in sys.modules, 'torch loaded'"
    subprocess.run([sys.executable, "-c", code], check=True)
