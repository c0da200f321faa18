"""Progress off a terminal: every long command prints a line at least every interval on a piped
stderr (DELAYLAB_PROGRESS_INTERVAL, here ~0 s), with update, loss, tokens/s and ETA for training and
done / total and ETA otherwise; the Progress helper itself on a fake clock."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

import delaylab._progress as P

TIMES = r"(\d+ s|\d+\.\d (min|h)) so far, ETA (\d+ s|\d+\.\d (min|h))"


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def perf_counter(self):
        return self.now


class _Err:
    def __init__(self, capsys):
        self.capsys, self.text = capsys, ""

    def getvalue(self) -> str:
        self.text += self.capsys.readouterr().err
        return self.text


@pytest.fixture
def piped(monkeypatch, capsys):
    """stderr is pytest's capture (not a terminal), the clock is ours and the timer thread idle (the
    lines come from advance/update alone)."""
    clock = _Clock()
    monkeypatch.setattr(P, "time", clock)
    monkeypatch.setattr(P, "_beat", lambda ref, stop: None)
    assert not sys.stderr.isatty()
    return _Err(capsys), clock


def test_a_training_line_has_update_loss_tokens_per_second_and_eta(piped):
    err, clock = piped
    bar = P.Progress("muon delay 1", 600, unit="update", initial=100, interval=30)
    try:
        clock.now += 10
        bar.advance(20)  # 10 s < 30 s: no line yet
        assert err.getvalue() == ""
        bar.set_status(loss="3.412", **{"tokens/s": "9000"})
        clock.now += 20
        bar.advance(20)  # 30 s since the start: a line
        # 40 updates in 30 s (the 100 done before the resume do not count): 460 left take 345 s
        assert err.getvalue().splitlines() == [
            "muon delay 1: update 140/600, loss 3.412, tokens/s 9000, 30 s so far, ETA 5.8 min"]
        assert bar.eta() == pytest.approx(345.0)
    finally:
        bar.close()


def test_cells_get_a_line_each_and_read_cells_do_not_speed_up_the_eta(piped):
    err, clock = piped
    bar = P.Progress("reproduce", 4, interval=1e9)
    try:
        bar.update("a", read=True)  # an earlier run's: no time spent
        clock.now += 60
        bar.update("b", 60.0, "val loss 3.000")
        lines = err.getvalue().splitlines()
        assert lines[0] == "reproduce: 1/4 a (read; 0 s so far)"
        assert lines[1] == "reproduce: 2/4 b (60.0 s, val loss 3.000; 60 s so far, ETA 2.0 min)"
    finally:
        bar.close()


def test_the_timer_prints_while_nothing_finishes_and_stops_at_close(capsys):
    err = _Err(capsys)
    bar = P.Progress("sweep", 3, interval=0.05)
    deadline = time.monotonic() + 10
    while err.getvalue().count("\n") < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    bar.close()
    lines = err.getvalue().splitlines()
    assert len(lines) >= 3 and all(line.startswith("sweep: 0/3 runs, ") for line in lines)
    time.sleep(0.3)
    assert err.getvalue().splitlines() == lines  # closed: no more lines


def test_interval_from_the_environment(monkeypatch):
    monkeypatch.setenv(P.INTERVAL_ENV, "0.5")
    assert P.interval_from_env() == 0.5
    for bad in ("x", "-1"):
        monkeypatch.setenv(P.INTERVAL_ENV, bad)
        assert P.interval_from_env() == P.DEFAULT_INTERVAL
    monkeypatch.delenv(P.INTERVAL_ENV)
    assert P.interval_from_env() == P.DEFAULT_INTERVAL <= 30
    assert [P.duration(s) for s in (45, 192, 9000)] == ["45 s", "3.2 min", "2.5 h"]


def test_silent_when_asked(piped):
    err, clock = piped
    bar = P.Progress("x", 2, progress=False, interval=0)
    bar.advance()
    bar.update("y")
    bar.close()
    assert err.getvalue() == ""


# -- the commands, with stderr a pipe ------------------------------------------------------------------

def _env(tmp_path) -> dict:
    return {**os.environ, P.INTERVAL_ENV: "0", "OMP_NUM_THREADS": "1", "DELAYLAB_CACHE": str(tmp_path / "cache")}


def _run(tmp_path, *argv, timeout=300) -> list[str]:
    run = subprocess.run([sys.executable, "-m", "delaylab", *argv], env=_env(tmp_path), cwd=tmp_path,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stderr.splitlines()


TRAIN = ["--preset", "tiny", "--batch-size", "2", "--block-size", "16", "--steps", "12", "--log-every", "3",
         "--eval-every", "6", "--eval-batches", "1", "--device", "cpu"]


def _training_lines(lines: list[str], desc: str, steps: int) -> list[re.Match]:
    pat = re.compile(rf"^{re.escape(desc)}: update (\d+)/{steps}, loss \d+\.\d{{3}}, tokens/s \d+, {TIMES}$")
    found = [m for m in map(pat.match, lines) if m]
    assert found, lines[:10]
    return found


def test_llm_train_prints_update_loss_tokens_per_second_and_eta(tmp_path):
    lines = _run(tmp_path, "llm", "train", *TRAIN, "--out", str(tmp_path / "run"))
    found = _training_lines(lines, "adamw delay 0", 12)
    assert int(found[-1].group(1)) >= 9  # lines up to the end, with the loss of the last metrics line


@pytest.mark.slow  # 37 s here: two ranks; the train test above is the same TrainFolder progress
@pytest.mark.dist
def test_llm_pipeline_prints_update_loss_tokens_per_second_and_eta(tmp_path):
    lines = _run(tmp_path, "llm", "pipeline", "--stages", "2", "--schedule", "2bw", "--microbatches", "2", *TRAIN,
                 "--out", str(tmp_path / "run"))
    found = _training_lines(lines, "2bw P=2 adamw", 12)
    assert int(found[-1].group(1)) >= 9


def test_toy_profile_prints_done_total_and_eta(tmp_path):
    lines = _run(tmp_path, "toy", "profile", "--optimizer", "torch.optim:SGD", "--kwargs", '{"lr": 0.05}',
                 "--problems", "logdet", "--delays", "1", "--no-ef", "--lr-scales", "0.5,1", "--T", "20",
                 "--seeds", "2", "--no-stability")
    pat = re.compile(rf"^.+: (\d+)/4 runs, {TIMES}$")
    done = [int(m.group(1)) for m in map(pat.match, lines) if m]
    assert done and max(done) >= 1, lines[:10]


@pytest.mark.slow  # 22 s here; tests/llm/test_sweep.py checks the cells' lines in process
def test_llm_sweep_prints_each_cell_and_lines_between(tmp_path):
    lines = _run(tmp_path, "llm", "sweep", "--optimizers", "adamw", "--modes", "sync,delayed", *TRAIN,
                 "--out", str(tmp_path / "sw"))
    cells = [x for x in lines if re.match(rf"^sweep: \d/2 adamw_\S+ \(\d+\.\d s, val loss \d\.\d{{3}}; {TIMES}\)$", x)]
    between = [x for x in lines if re.match(r"^sweep: \d/2 runs, \d+ s so far", x)]
    assert len(cells) == 2 and between, lines[:10]


def test_reproduce_prints_done_total_and_eta(tmp_path):
    """The first lines of `reproduce --preset ci-tokens` (its 32 runs take minutes: stopped once seen)."""
    proc = subprocess.Popen([sys.executable, "-m", "delaylab", "reproduce", "--preset", "ci-tokens", "--jobs", "1",
                             "--out", str(tmp_path / "rep")], env=_env(tmp_path), cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line.rstrip("\n"))
            if re.match(rf"^reproduce: [1-9]\d*/\d+ runs, {TIMES}$", seen[-1]):
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert re.match(r"^reproduce: 0/(\d+|\?) runs, \d+ s so far$", seen[0]), seen[:3]  # before the first run: no ETA
    assert re.match(rf"^reproduce: [1-9]\d*/\d+ runs, {TIMES}$", seen[-1]), seen[-3:]
