"""The one checkpoint layout: atomic writes (a kill inside a write leaves the last good checkpoint),
exact resume after such a kill, and one-line refusals of damaged parts and of delaylab 0.1.0's layouts."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from delaylab.cli import main
from delaylab.llm import checkpoint

TINY = ["--preset", "tiny", "--batch-size", "4", "--block-size", "32", "--steps", "8", "--ckpt-every", "2",
        "--eval-every", "8", "--eval-batches", "2", "--log-every", "2", "--device", "cpu", "--threads", "1",
        "--progress", "false"]
ENGINES = {"train": ["--delay", "1", "--correction", "ef", "--optimizer", "adamw"],
           "pipeline": ["--stages", "2", "--schedule", "2bw", "--microbatches", "2", "--correction", "ef",
                        "--optimizer", "adamw", "--timeout", "60"]}


def weights(engine: str, out) -> dict:
    if engine == "train":
        return checkpoint.read(out)["model"]
    return torch.load(out / "model.pt", map_location="cpu", weights_only=True)


def lines(out) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "time"}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.dist
@pytest.mark.timeout(600)
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_kill_9_inside_a_checkpoint_write_then_resume_equals_the_uninterrupted_run(engine, tmp_path, capsys):
    flags = ["llm", engine, *TINY, *ENGINES[engine]]
    killed = tmp_path / "killed"
    # The save of step 4 stops after its data files and before its metadata: kill -9 every process there.
    env = {**os.environ, checkpoint.PAUSE_AT: "4", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "delaylab", *flags, "--out", str(killed)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    root, deadline = killed / "ckpt", time.time() + 240
    try:
        while not list(root.glob("step_0000004/stage_*.pending/*.distcp")):
            assert time.time() < deadline and proc.poll() is None, "the run never reached the save of step 4"
            time.sleep(0.2)
        time.sleep(0.5)  # every rank that gets there is inside the write
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    pending = next(root.glob("step_0000004/stage_*.pending"))
    assert not (pending / ".metadata").exists()  # killed inside the write
    stages = 2 if engine == "pipeline" else 1
    assert checkpoint.latest_complete(root, stages) == 2  # the last good checkpoint, readable
    assert checkpoint.load_part(root, 2, stages - 1)["step"] == 2

    assert main([*flags[:2], "--resume", str(killed)]) == 0
    assert main([*flags, "--out", str(tmp_path / "full")]) == 0
    capsys.readouterr()
    a, b = weights(engine, killed), weights(engine, tmp_path / "full")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit
    assert lines(killed) == lines(tmp_path / "full")
    assert not list(root.glob("*/*.pending"))  # the resume dropped the broken write
    assert checkpoint.steps_on_disk(root) == [6, 8]


def _config(quick, **kw) -> dict:
    return quick(steps=4, **kw).resolved("pipeline" if kw.get("stages") else "simulator").to_dict()


@pytest.mark.parametrize("layout", ["ckpt.pt", "dcp", "stage files"])
def test_a_folder_of_delaylab_0_1_0_is_one_line_naming_the_format(layout, quick, tmp_path, capsys):
    """The three layouts of format 1 (made by main's code at 514494e: a file, a DCP folder, one file
    per stage), refused before anything is written or any process starts."""
    folder = tmp_path / "old"
    (folder / "ckpt").mkdir(parents=True)
    engine, cfg = "train", _config(quick)
    if layout == "ckpt.pt":
        torch.save({"config": cfg, "calls": 4}, folder / "ckpt.pt")
    elif layout == "dcp":
        cfg = _config(quick, dp=2)
        (folder / "ckpt" / ".metadata").write_bytes(b"\x80")
    else:
        engine, cfg = "pipeline", _config(quick, stages=2)
        (folder / "ckpt" / "step_0000004").mkdir()
        for s in range(2):
            torch.save({"config": cfg, "step": 4}, folder / "ckpt" / "step_0000004" / f"stage_{s}.pt")
    (folder / "config.json").write_text(json.dumps(cfg))
    before = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    assert main(["llm", engine, "--resume", str(folder)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "a checkpoint in format 1 (delaylab 0.1.0" in err, err
    assert f"this delaylab reads format {checkpoint.FORMAT}" in err
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == before


def test_a_damaged_part_is_one_line_and_a_pending_part_is_never_read(quick, corpus, tmp_path):
    from delaylab.llm.run.trainer import train

    cfg = quick(steps=4, ckpt_every=2)
    train(cfg, tmp_path, dataset=corpus)
    root = tmp_path / "ckpt"
    assert checkpoint.steps_on_disk(root) == [2, 4]
    (checkpoint.part_path(root, 4, 0) / ".metadata").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"stage_0: not a delaylab checkpoint \("):
        checkpoint.read(tmp_path)
    # a write that never finished is beside its place, not in it
    os.rename(checkpoint.part_path(root, 4, 0), root / "step_0000004" / "stage_0.pending")
    assert checkpoint.latest_complete(root, 1) == 2 and checkpoint.read(tmp_path)["step"] == 2
