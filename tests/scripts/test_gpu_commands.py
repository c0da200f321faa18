"""The one device call of docs/gpu/README.md: it is the plan's command, under the device's 2000
characters, valid bash; the docs' tables are the plan's; one source of pass marks; and the call
runs (DRY=1 on this CPU, a stand-in wheel for the carried ones): the CI's dry run of the plan."""

import json
import os
import re
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "gpu" / "README.md"


def _gpu_validate():
    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_validate

    return gpu_validate


def the_call() -> str:
    blocks = re.findall(r"```device-call\n(.*?)\n```", DOCS.read_text(), flags=re.S)
    assert len(blocks) == 1, "docs/gpu/README.md holds the call in exactly one device-call block"
    return blocks[0]


def test_the_docs_hold_the_plans_one_call_under_2000_characters_and_valid_bash():
    gv = _gpu_validate()
    cmd = the_call()
    assert cmd == gv.device_call()
    assert len(cmd) < gv.DEVICE["command_chars"] == 2000
    assert "&&" not in cmd  # independent steps are joined by ';': a failed wheel does not stop the run
    assert f"--budget {gv.CALL['budget_s']}" in cmd and "$OUT" in cmd
    assert f"--phases {','.join(gv.CALL['phases'])}" in cmd
    done = subprocess.run(["bash", "-n", "-c", cmd], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = DOCS.read_text()
    assert f"`timeout_s` {gv.CALL['timeout_s']}" in text and '`carry: ["wheels"]`' in text


def test_the_plan_prints_the_call_the_gap_first_and_a_device_time_within_840_s():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_validate.py"), "--plan"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    out = done.stdout
    gv = _gpu_validate()
    assert gv.device_call() in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("phase "))
    table = [line.split()[0] for line in lines[header + 1:header + 1 + len(gv.CALL["phases"])]]
    assert table == list(gv.CALL["phases"]) and table[:2] == ["env", "gap-360m"]
    (seconds,) = re.findall(r"^device time: (\d+) s", out, flags=re.M)
    assert int(seconds) <= 840 and int(seconds) == 240 + gv.CALL["timeout_s"] + 30
    assert gv.CALL["timeout_s"] == 570 and gv.CALL["budget_s"] == 440 and gv.CALL["carry"] == ("wheels",)


def test_the_docs_tables_are_the_plans():
    """The time budget line by line and the phase table (limits, estimates, memory) in the docs are
    what the plan computes: an estimate changed in the script fails here until the docs follow."""
    gv, docs = _gpu_validate(), DOCS.read_text()
    budget, phases = gv.plan_markdown().split("\n\n")
    assert budget in docs and phases in docs
    g = gv.settings(False)["gap-360m"]  # the gap runs' planned length and the seconds its probe sizes them to
    assert f"{g['steps']} updates by the estimates" in docs
    assert f"the {g['update_seconds']:.0f} s the plan gives the updates" in docs


def test_one_source_of_pass_marks_for_the_docs_the_plan_and_the_benchmark():
    gv = _gpu_validate()
    import trainer_throughput as tt

    docs = DOCS.read_text()
    assert tt.targets_text() in docs and tt.targets_text() in gv.plan_text(False, gv.CALL["phases"])
    found = re.findall(r"(trainer/bare|delayed/sync|ef/sync|EF/sync) >= ([0-9]+\.[0-9]+)", docs)
    assert found and all(float(v) == tt.TARGETS[k.lower()] for k, v in found), found
    # no second copy of a mark in the script or the benchmark: the numbers appear where TARGETS is written
    for path in (ROOT / "scripts" / "gpu_validate.py", ROOT / "benchmarks" / "trainer_throughput.py"):
        marks = re.findall(r">= ?0\.9\d", path.read_text())
        assert marks == [], (path.name, marks)


def test_the_gap_runs_lrs_follow_the_cpu_presets_rule():
    """AdamW: lr x d = 0.128 through the CPU optima (tiny d = 64: 2e-3; small d = 128: 1e-3); Muon 0.04."""
    gv = _gpu_validate()
    assert gv.rule_lr("adamw", 64) == pytest.approx(2e-3) and gv.rule_lr("adamw", 128) == pytest.approx(1e-3)
    assert gv.rule_lr("adamw", 960) == pytest.approx(0.128 / 960) and gv.rule_lr("muon", 960) == 0.04
    assert gv.rule_text() in DOCS.read_text()


def _stand_in(root: Path) -> None:
    """A minimal wheel (a package, METADATA, WHEEL, RECORD) for the offline install to take."""
    (root / "wheels").mkdir()
    with zipfile.ZipFile(root / "wheels" / "stand_in-0.1-py3-none-any.whl", "w") as z:
        z.writestr("stand_in/__init__.py", "")
        z.writestr("stand_in-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: stand-in\nVersion: 0.1\n")
        z.writestr("stand_in-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                    "Tag: py3-none-any\n")
        z.writestr("stand_in-0.1.dist-info/RECORD", "")
    (root / "wheels" / "broken-0.1-py3-none-any.whl").write_bytes(b"not a zip")  # fails to install: the run goes on


@pytest.mark.dist
@pytest.mark.timeout(600)
def test_the_call_runs_dry_every_phase_ok_and_only_the_records_come_back(tmp_path):
    """The documented call as the device would run it, but DRY=1, in a folder with the repository's
    scripts and benchmarks and two wheels (one broken), ``python3`` this interpreter, the install
    target under tmp_path. This is the CI's dry run of the whole plan."""
    cwd = tmp_path / "repo"
    cwd.mkdir()
    for d in ("scripts", "benchmarks"):
        (cwd / d).symlink_to(ROOT / d)
    _stand_in(cwd)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (bin_ / "python3").chmod(0o755)
    cmd = the_call().replace("/tmp/deps", str(tmp_path / "deps"))
    out = tmp_path / "out"
    env = {**os.environ, "DRY": "1", "OUT": str(out), "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}",
           "TMPDIR": str(tmp_path)}
    env.pop("PY", None)
    t0 = time.perf_counter()
    done = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=580)
    print(f"the call, dry: {time.perf_counter() - t0:.0f} s at load {os.getloadavg()[0]:.1f}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (tmp_path / "deps" / "stand_in" / "__init__.py").is_file()  # installed offline, past the broken one
    assert sorted(p.name for p in out.iterdir()) == ["record.json", "record.md"]
    assert all((out / f).stat().st_size < 300_000 for f in ("record.json", "record.md"))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("delaylab-gpu-")]  # its temporary folder removed
    record = json.loads((out / "record.json").read_text())
    gv = _gpu_validate()
    assert list(record["phases"]) == list(gv.CALL["phases"]) and record["budget_s"] == gv.CALL["budget_s"]
    assert {p: r["status"] for p, r in record["phases"].items()} == dict.fromkeys(gv.CALL["phases"], "ok")
    data = {p: r["data"] for p, r in record["phases"].items()}
    assert data["env"]["info"]["packages"]["matplotlib"] and not data["env"]["missing"]

    gap = data["gap-360m"]
    runs = {(i["optimizer"], i["arm"], i["seed"]) for i in gap["items"]}
    assert runs == {(o, a, s) for o in ("adamw", "muon") for a in ("sync", "delay 1", "delay 1 + EF") for s in (0, 1)}
    assert gap["lrs"] == {"adamw": pytest.approx(2e-3), "muon": 0.04}  # tiny's d = 64 under the rule
    assert 4 <= gap["steps"] <= 8 and set(gap["probe"]["seconds_per_update"]) == {"adamw", "muon"}
    an = gap["analysis"]
    assert set(an["optimizers"]) == {"adamw", "muon"} and an["adamw_minus_muon"]["n"] == 2
    assert all(row["gap"]["ci"] is not None for row in an["optimizers"].values())

    smoke = data["smoke"]["items"]
    gv_cases = cases = _gpu_validate()._smoke_cases()  # every optimizer sync / delayed / EF, every corrector
    assert len(smoke) == len(gv_cases) and all(i["status"] == "ok" for i in smoke)
    assert {c["optimizer"] for c in cases} >= {"adamw", "muon", "rotated-adam"}
    assert {c["correction"].split(":")[0] for c in cases} == {"none", *__import__("delaylab.optim.corrections",
                                                                                   fromlist=["x"]).CORRECTORS}
    same, nan = data["resume"]["items"]
    assert same["bit_for_bit"] and same["metrics_equal"] and same["torch_deterministic"]
    assert nan["status"] == "diverged" and nan["loss_at_kept_weights_finite"] and nan["pending_left"] == 0
    for p in ("throughput-135m", "throughput-360m"):
        items = data[p]["items"]
        assert [i["compile"] for i in items] == [False, True]
        assert all(set(i["tokens_per_s"]) == {"bare", "sync", "delayed", "ef", "ef-bf16"} for i in items)
        assert all(0 < i["mfu_causal"]["sync"] < i["mfu"]["sync"] for i in items)  # this CPU's measured peak
        assert items[1]["compiled_graphs"] >= 1 and items[1]["build_s"] == items[0]["build_s"]  # one build for both

    nccl1 = data["nccl1"]
    assert nccl1["backend"] == "gloo" and nccl1["world_size"] == 1  # the CPU's backend in a dry run
    assert [i["ok"] for i in nccl1["items"]] == [True, True, True], nccl1["items"]
    pipe, ddp, _ = nccl1["items"]
    assert pipe["bit_for_bit"] and ddp["bit_for_bit"] and ddp["ddp"] == "DistributedDataParallel"  # float32, CPU

    cpu16 = data["cpu16"]["items"]
    assert [i["round"] for i in cpu16 if "round" in i] == [0, 1]
    (final,) = [i for i in cpu16 if "round" not in i]
    assert final["M"] == 2 and final["ideal"] == 1.5 and final["rounds"] == 2
    for s in ("1f1b/2bw", "gpipe/2bw"):
        lo, hi = final[s]["interval95"]
        assert len(final[s]["per_round"]) == 2 and lo < final[s]["mean"] < hi
        assert final[s]["advise"] > 1  # the cost model's flush: a synchronous schedule is slower than 2BW
    text = (out / "record.md").read_text()
    assert f"{len(gv_cases)} of {len(gv_cases)} runs ok" in text and "AdamW - Muon" in text and "gpipe/2bw [95% t]" in text
