"""Preemption: SIGTERM, SIGUSR1 and SIGINT stop every engine at an update boundary with a checkpoint
(exit code 75), and the resumed run ends bit for bit on the uninterrupted run's weights and metrics;
a second signal exits at once (128 + signal) with the last good checkpoint intact.

Counts: in CI the simulator is stopped in-process by each of the three signals at a random update,
``--dp 2`` in-process by a SIGTERM to its launcher that rank 0 sends during its third update, a
2-stage pipeline (a signal to one of its ranks) and a 2-stage x 2-replica run (a signal to the
launcher) once each in a subprocess at a random moment within the first 10 updates (a run that ends
before the signal lands fails), and the simulator's second signal; ``-m slow`` adds six
random moments per engine (the simulator, ``--dp 2``, the pipeline, DP x PP: five SIGTERMs and one
SIGUSR1 or SIGINT; the moment and the receiver drawn: the launcher, its whole process group, or one rank) and the pipeline's second
signal. The agreement protocol itself is checked with four rank threads on one store over 40 random
interleavings.
"""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

from delaylab.cli import main
from delaylab.llm import checkpoint
from delaylab.llm.distributed.preempt import PREEMPTED, StopGate

TINY = ["--preset", "tiny", "--batch-size", "4", "--block-size", "32", "--steps", "30", "--eval-every", "30",
        "--eval-batches", "2", "--log-every", "1", "--ckpt-every", "7", "--device", "cpu", "--threads", "1",
        "--progress", "false", "--optimizer", "adamw"]
ENGINES = {"simulator": ["train", "--delay", "1", "--correction", "ef"],
           "dp": ["train", "--dp", "2", "--delay", "1", "--correction", "ef"],
           "pipeline": ["pipeline", "--stages", "2", "--microbatches", "2", "--correction", "ef"],
           "dp-x-pp": ["pipeline", "--stages", "2", "--dp", "2", "--microbatches", "2"]}
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def test_ranks_agree_on_the_stop_and_none_begins_an_update_past_it(tmp_path):
    """Four ranks (threads) at staggered speeds on one TCPStore; one of them is asked to stop at a
    random moment. Every rank must get the same K, run every update below K and none from K on."""
    R, H, stopped = 4, 40, 0
    server = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    clients = [dist.TCPStore("127.0.0.1", server.port, 1, False) for _ in range(R)]  # one per rank, as processes have
    for trial in range(40):
        rng = random.Random(trial)
        request = tmp_path / f"stop{trial}"
        gates = [StopGate(0, store=clients[r], rank=r, world=R, run=f"t{trial}") for r in range(R)]
        asker = rng.randrange(R)
        gates[asker].stop_file = str(request)
        ran = [[] for _ in range(R)]
        delays = [rng.uniform(0, 0.002) for _ in range(R)]
        ask_at = rng.randrange(1, H // 2)

        def rank(r):
            for h in range(H):
                if r == asker and h == ask_at:
                    request.touch()
                if gates[r](h):
                    ran[r].append(h)
                time.sleep(delays[r] * rng.random())

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(R)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        K = gates[asker].stop
        # a rank that finished before the decision never hears of it: then K is past the end
        assert K is not None and all(g.stop in (K, None) for g in gates), [g.stop for g in gates]
        assert all(g.stop == K for g in gates) or K >= H
        assert all(r == list(range(min(K, H))) for r in ran), (K, ran)
        stopped += K < H
    # Half the trials at least must stop mid-run, or the test checks nothing (the others: K past the
    # end, nothing to stop). A quiet machine stops 35-40 of 40; one at load 12 on 2 cores stopped 28.
    assert stopped >= 20


def _weights(engine: str, out) -> dict:
    if ENGINES[engine][0] == "train":
        return checkpoint.read(out)["model"]
    return torch.load(out / "model.pt", map_location="cpu", weights_only=True)


def _lines(out) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "time"}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def _same_run(engine: str, a, b) -> None:
    x, y = _weights(engine, a), _weights(engine, b)
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)  # bit for bit
    assert _lines(a) == _lines(b)


class _References:
    """The uninterrupted run of each engine, made when first asked for (or by a test, beside a resume)."""

    def __init__(self, root):
        self.root = root

    def folder(self, engine: str):
        return self.root / engine

    def made(self, engine: str) -> bool:
        return (self.folder(engine) / "summary.json").is_file()

    def __call__(self, engine: str):
        if not self.made(engine):
            assert main(["llm", *ENGINES[engine], *TINY, "--out", str(self.folder(engine))]) == 0
        return self.folder(engine)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _References(tmp_path_factory.mktemp("ref"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_stops_the_simulator_after_the_update_in_flight_and_the_resume_is_exact(
        sig, reference, tmp_path, monkeypatch, capsys):
    from delaylab.llm.run.trainer import Trainer

    call = random.Random(sig).randrange(1, 25)  # the call during which the signal arrives
    step = Trainer.step

    def step_with_signal(self, *args, **kw):
        if self.calls == call:
            os.kill(os.getpid(), sig)  # the handler notes it; the update in flight goes on
        return step(self, *args, **kw)

    monkeypatch.setattr(Trainer, "step", step_with_signal)
    out = tmp_path / "run"
    assert main(["llm", *ENGINES["simulator"], *TINY, "--out", str(out)]) == PREEMPTED
    err = capsys.readouterr().err.strip().splitlines()
    K = call  # delay 1: call c makes update c (call 0 fills the queue)
    assert err == [f"delaylab: preempted: {sig.name}: stopped after update {K} (a checkpoint in "
                   f"{checkpoint.step_dir(out / 'ckpt', K)}; --resume {out} continues)"]
    assert checkpoint.latest_complete(out / "ckpt", 1) == K and checkpoint.read(out)["step"] == K
    monkeypatch.undo()
    assert main(["llm", "train", "--resume", str(out)]) == 0
    _same_run("simulator", out, reference("simulator"))


def _descendants(pid: int) -> list[int]:
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if ppid == pid:
                kids += [int(entry), *_descendants(int(entry))]
    return kids


def _ranks(pid: int) -> list[int]:
    def cmdline(p):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    return [p for p in _descendants(pid) if "spawn_main" in cmdline(p)]


def _interrupt(engine: str, out, rng: random.Random, who: str | None = None,
               sig: signal.Signals | None = None, latest: int = 25) -> tuple[int, str, str]:
    """Start the engine's run, send ``sig`` (default: a random one of the three signals) at a random
    moment (after a random number of logged updates, below ``latest`` of the 30) to ``who`` (the
    launcher, its process group, one rank), and return (exit code, what got the signal, stderr's last line)."""
    sig = sig or rng.choice(SIGNALS)
    who = who or rng.choice(["launcher"] if engine == "simulator" else ["launcher", "group", "rank"])
    lines = rng.randrange(0, latest)
    proc = subprocess.Popen([sys.executable, "-m", "delaylab", "llm", *ENGINES[engine], *TINY, "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        metrics, deadline = out / "metrics.jsonl", time.time() + 240
        while proc.poll() is None and time.time() < deadline:
            logged = len(metrics.read_text().splitlines()) if metrics.is_file() else 0
            # a moment of the run: once config.json is written, every engine's handlers are in place
            # (before it, during start-up, a signal has its default action: nothing has run)
            started = (out / "config.json").is_file()
            ranks_up = who != "rank" or len(_ranks(proc.pid)) == 2 * (engine == "dp-x-pp") + 2
            if started and logged >= lines and ranks_up:
                break
            time.sleep(0.05)
        if who == "launcher":
            os.kill(proc.pid, sig)
        elif who == "group":
            os.killpg(proc.pid, sig)
        else:
            os.kill(rng.choice(_ranks(proc.pid)), sig)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    last = err.strip().splitlines()[-1] if err.strip() else ""
    return proc.returncode, f"{sig.name} to the {who} after {lines} logged updates", last


def _resume_beside_the_reference(engine: str, out, reference) -> None:
    """Resume ``out``; the engine's reference run, when not made yet, runs in the same start-up of
    the ranks (one launch fewer: start-ups are most of a tiny run's time)."""
    from delaylab.llm.config import Config

    if reference.made(engine) or ENGINES[engine][0] == "train" and "--dp" not in ENGINES[engine]:
        assert main(["llm", ENGINES[engine][0], "--resume", str(out)]) == 0
        return
    cfg = Config.from_dict(json.loads((out / "config.json").read_text()))
    ref = reference.folder(engine)
    if ENGINES[engine][0] == "train":
        from delaylab.llm.distributed.launch import launch
        from delaylab.llm.run.trainer import _replicas

        specs = [(cfg.to_dict(), str(ref), False, None), (cfg.to_dict(), str(out), True, None)]
        summaries = launch(_replicas, (specs,), dp=2, what="data-parallel run")[0]
    else:
        from delaylab.llm.run.rank import _launch

        summaries = _launch([(cfg.resolved("pipeline"), ref, False, None), (cfg.resolved("pipeline"), out, True, None)])
    assert [s["status"] for s in summaries] == ["finished", "finished"]


def _check_interrupted(engine: str, out, reference, rng: random.Random, who: str | None = None,
                       sig: signal.Signals | None = None, latest: int = 25, must_stop: bool = True) -> bool:
    """Interrupt the engine's run (:func:`_interrupt`), resume it and compare it with the reference;
    True when the signal stopped it. A run that ended before the signal landed fails ``must_stop``
    (it checked nothing); otherwise it must be the reference's run."""
    code, what, last = _interrupt(engine, out, rng, who, sig, latest)
    print(f"{engine}: {what}: exit {code}: {last}", file=sys.__stderr__, flush=True)  # the table, uncaptured
    if code == 0:
        assert not must_stop, f"{engine}: the run ended before the signal landed ({what}): nothing was tested"
        _same_run(engine, out, reference(engine))
        return False
    assert code == PREEMPTED and last.startswith("delaylab: preempted: ") and "Traceback" not in last, last
    stages = 2 if ENGINES[engine][0] == "pipeline" else 1
    K = checkpoint.latest_complete(out / "ckpt", stages)
    assert f"stopped after update {K} " in last and not list((out / "ckpt").glob("*/*.pending"))
    _resume_beside_the_reference(engine, out, reference)
    _same_run(engine, out, reference(engine))
    return True


@pytest.mark.dist
@pytest.mark.timeout(600)
@pytest.mark.parametrize("engine,who", [("pipeline", "rank"), ("dp-x-pp", "launcher")])
def test_a_signal_at_a_random_moment_stops_every_rank_at_one_update_and_the_resume_is_exact(
        engine, who, reference, tmp_path, capsys):
    # the moment within the first 10 of 30 updates: the run cannot end before the signal lands
    _check_interrupted(engine, tmp_path / "run", reference, random.Random(engine), who, latest=10)
    capsys.readouterr()


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_a_sigterm_to_the_dp_launcher_stops_both_replicas_at_one_update_and_the_resume_is_exact(
        tmp_path, monkeypatch, capsys):
    """``llm train --dp 2`` (gloo, 2 ranks): rank 0 sends SIGTERM to the launcher during its update
    ``preempt_ranks.CALL`` (tests/llm/preempt_ranks.py, run in the spawned ranks), so the signal lands
    mid-run, every time. Both replicas stop at one update K with a checkpoint (exit 75), and the run
    resumed from it ends bit for bit on the uninterrupted run."""
    import preempt_ranks

    from delaylab.llm.run import trainer

    monkeypatch.setattr(trainer, "_replicas", preempt_ranks.replicas_signalling)
    out, short = tmp_path / "run", ["--steps", "12", "--ckpt-every", "4", "--eval-every", "12"]  # two launches
    assert main(["llm", *ENGINES["dp"], *TINY, *short, "--out", str(out)]) == PREEMPTED
    last = capsys.readouterr().err.strip().splitlines()[-1]
    K = checkpoint.latest_complete(out / "ckpt", 1)
    assert last.startswith("delaylab: preempted: ") and f"stopped after update {K} " in last, last
    assert preempt_ranks.CALL <= K < 12 and checkpoint.read(out)["step"] == K
    assert not list((out / "ckpt").glob("*/*.pending"))
    monkeypatch.undo()
    reference = _References(tmp_path / "ref")  # the reference of this config, made beside the resume
    _resume_beside_the_reference("dp", out, reference)
    _same_run("dp", out, reference.folder("dp"))


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_five_sigterms_per_engine_at_random_moments(engine, reference, tmp_path, capsys):
    """Five SIGTERMs (what a scheduler sends) and one SIGUSR1 or SIGINT, each at a random moment."""
    rng = random.Random(f"{engine}-slow")
    stopped = sum(_check_interrupted(engine, tmp_path / f"run{i}", reference, rng, sig=sig, must_stop=False)
                  for i, sig in enumerate([signal.SIGTERM] * 5 + [rng.choice(SIGNALS[1:])]))
    assert stopped >= 3, f"{engine}: {stopped} of 6 signals landed before the run ended"  # else little is tested
    capsys.readouterr()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("engine", ["simulator", pytest.param("pipeline", marks=[pytest.mark.slow, pytest.mark.dist])])
def test_a_second_signal_exits_at_once_and_keeps_the_last_good_checkpoint(engine, reference, tmp_path, capsys):
    """The save of step 14 hangs (between its data files and its metadata); the first signal cannot
    reach an update boundary, the second ends every process at once."""
    out = tmp_path / "run"
    env = {**os.environ, checkpoint.PAUSE_AT: "14", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "delaylab", "llm", *ENGINES[engine], *TINY, "--out", str(out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    root, stages = out / "ckpt", 2 if engine == "pipeline" else 1
    try:
        deadline = time.time() + 240
        while len(list(root.glob("step_0000014/stage_*.pending/*.distcp"))) < stages:
            assert time.time() < deadline and proc.poll() is None, "the run never reached the save of step 14"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(1.5)  # later than GRACE_S: a second signal, not the first one delivered twice
        os.kill(proc.pid, signal.SIGTERM)
        sent = time.time()
        _, err = proc.communicate(timeout=60)
        assert time.time() - sent < 10
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.strip().splitlines()[-1].startswith("delaylab: SIGTERM again: stopped"), err
    time.sleep(1)  # the killed ranks are gone
    assert checkpoint.latest_complete(root, stages) == 7  # the last good checkpoint, readable
    assert checkpoint.load_part(root, 7, stages - 1)["step"] == 7
    assert main(["llm", ENGINES[engine][0], "--resume", str(out)]) == 0
    capsys.readouterr()
    _same_run(engine, out, reference(engine))
