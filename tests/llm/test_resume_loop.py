"""Resume as a preemption loop uses it (`until delaylab llm ... --resume DIR; do sleep 1; done`), for both
engines: the run's config.json is written before any process starts, so a run killed in its start-up
leaves a folder that --resume takes, from update 0; a folder holding only that config is still new to
the command that made it; --resume of a finished run says so in one line before starting anything
(exit 0; --json prints its summary)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from delaylab.cli import main
from delaylab.llm.run import rank as R
from delaylab.llm.run import trainer as T

SMALL = ["--preset", "tiny", "--batch-size", "2", "--block-size", "16", "--eval-batches", "1", "--log-every", "2",
         "--eval-every", "4", "--device", "cpu"]
ENGINES = {"simulator": ["llm", "train"], "pipeline": ["llm", "pipeline", "--stages", "2"]}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DELAYLAB_CACHE", str(tmp_path / "cache"))


class Killed(Exception):
    """Stands for the SIGKILL of a preemption: nothing after it runs."""


def _config(out: Path) -> dict:
    return json.loads((out / "config.json").read_text())


@pytest.mark.parametrize("engine,dp", [("simulator", 1), ("simulator", 2), ("pipeline", 1), ("pipeline", 2)])
def test_the_config_is_written_before_any_process_starts(engine, dp, tmp_path, monkeypatch, capsys):
    """Killed as the ranks (or the one process's trainer) start: config.json is there, nothing else."""
    out = tmp_path / "run"
    seen = {}

    def killed(*args, **kwargs):
        seen["files"] = sorted(p.name for p in out.iterdir())
        raise Killed

    if engine == "pipeline":
        monkeypatch.setattr(R, "launch", killed)
    elif dp > 1:
        monkeypatch.setattr(T, "launch", killed)
    else:
        monkeypatch.setattr(T, "Trainer", killed)
    with pytest.raises(Killed):
        main([*ENGINES[engine], *SMALL, "--dp", str(dp), "--steps", "4", "--out", str(out)])
    assert seen["files"] == ["config.json"]
    assert _config(out)["parallel"]["dp"] == dp and _config(out)["run"]["steps"] == 4


@pytest.mark.parametrize("engine", ["simulator", pytest.param("pipeline", marks=pytest.mark.dist)])
def test_a_config_alone_is_resumed_from_update_0_and_rerun_by_its_command(engine, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    argv = [*ENGINES[engine], *SMALL, "--steps", "4", "--out", str(out)]
    launch_or_train = (R, "launch") if engine == "pipeline" else (T, "Trainer")
    with monkeypatch.context() as m:
        m.setattr(*launch_or_train, lambda *a, **k: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            main(argv)
    assert [p.name for p in out.iterdir()] == ["config.json"]
    # the preemption loop's next try: --resume, with no checkpoint yet, starts at update 0
    assert main([*ENGINES[engine][:2], "--resume", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == "finished" and summary["steps"] == 4 and not summary.get("resumed_from")
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 4]
    if engine == "pipeline":  # the folder guard below is the engines' one TrainFolder
        return
    # the command that made it runs on a folder holding only its config (and refuses one of another config)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text((out / "config.json").read_text())
    assert main([*argv[:-1], str(other), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["val_loss"] == summary["val_loss"]
    third = tmp_path / "third"
    third.mkdir()
    (third / "config.json").write_text((out / "config.json").read_text())
    assert main([*argv[:-4], "--steps", "6", "--out", str(third)]) == 2
    assert "already holds a run" in capsys.readouterr().err


@pytest.mark.parametrize("engine", ["simulator", "pipeline"])
def test_resume_of_a_finished_run_says_so_and_starts_nothing(engine, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    if engine == "simulator":
        assert main([*ENGINES[engine], *SMALL, "--steps", "4", "--out", str(out)]) == 0
    else:  # a finished pipeline folder: its config and summary (the run itself is test_pipeline_*'s)
        monkeypatch.setattr(R, "launch", lambda *a, **k: {1: [{"status": "finished", "steps": 4}]})
        assert main([*ENGINES[engine], *SMALL, "--steps", "4", "--out", str(out), "--json"]) == 0
        (out / "summary.json").write_text(json.dumps({"status": "finished", "steps": 4, "val_loss": 3.5}))
    done = json.loads((out / "summary.json").read_text())
    capsys.readouterr()

    def started(*a, **k):
        raise AssertionError("a process was started")

    for module, name in ((R, "launch"), (T, "launch"), (T, "Trainer")):
        monkeypatch.setattr(module, name, started)
    assert main([*ENGINES[engine][:2], "--resume", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == done
    assert captured.err == f"delaylab: {out} holds a finished run (4 of 4 updates): nothing to resume\n"
    if engine == "simulator":  # the text form: the line, then the summary's
        assert main([*ENGINES[engine][:2], "--resume", str(out)]) == 0
        captured = capsys.readouterr()
        assert captured.err.count("\n") == 1 and captured.out.startswith("adamw delay 0 (correction none): val_loss")


def _kill_when(out: Path, proc: subprocess.Popen, ready, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ready() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


@pytest.mark.parametrize("engine", [
    "simulator",
    pytest.param("pipeline", marks=[pytest.mark.slow, pytest.mark.dist]),  # about 2 minutes on 2 cores
])
def test_a_preemption_loop_survives_a_kill_in_the_start_up(engine, tmp_path):
    """The command killed (SIGKILL, its whole process group) once config.json exists, before any
    checkpoint: the loop's --resume finishes the run from update 0, and a further --resume of the
    finished run is one line and exit 0."""
    out = tmp_path / "run"
    flags = ["--dp", "2"] if engine == "pipeline" else []
    argv = [sys.executable, "-m", "delaylab", *ENGINES[engine], *flags, *SMALL, "--steps", "4",
            "--ckpt-every", "2", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    _kill_when(out, proc, lambda: (out / "config.json").is_file())
    assert not (out / "ckpt").exists() and not (out / "summary.json").exists()
    resume = [sys.executable, "-m", "delaylab", *ENGINES[engine][:2], "--resume", str(out), "--json"]
    run = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(run.stdout)
    assert summary["status"] == "finished" and summary["steps"] == 4
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [2, 4]
    again = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and json.loads(again.stdout) == summary
    assert again.stderr.strip().splitlines() == [f"delaylab: {out} holds a finished run (4 of 4 updates): "
                                                  "nothing to resume"]
