"""Damaged inputs: each is one line on stderr and exit code 2 (1 where the run had started), no
traceback, and no good file overwritten. Run with ``-s`` to print the table of docs/llm.md
("Damaged inputs"): input -> exit code -> the line.

A full disk is simulated with a file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored: a write past the limit
fails with EFBIG, as a write to a full disk fails with ENOSPC) in a subprocess.
"""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from delaylab.cli import main
from delaylab.llm import checkpoint

TINY = ["--preset", "tiny", "--batch-size", "4", "--block-size", "32", "--steps", "4", "--eval-every", "4",
        "--eval-batches", "2", "--log-every", "2", "--ckpt-every", "2", "--device", "cpu", "--threads", "1",
        "--progress", "false"]
DOC = "the quick brown fox jumps over the lazy dog. " * 40


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    """A finished 4-step simulator run with checkpoints at steps 2 and 4 (and one stopped at 2)."""
    root = tmp_path_factory.mktemp("good")
    assert main(["llm", "train", *TINY, "--out", str(root / "done")]) == 0
    assert main(["llm", "train", *TINY, "--out", str(root / "half"), "--stop-at", "2"]) == 0
    return root


def _files(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _parquet(path: Path, **columns) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)


# -- inputs, each a function of a fresh folder that returns the argv (and the folder to keep intact) --
def not_parquet(d):
    (d / "bad.parquet").write_text(DOC)
    return ["train", "--data", str(d / "bad.parquet"), "--out", str(d / "out")], d


def parquet_without_the_column(d):
    _parquet(d / "docs.parquet", body=[DOC] * 4)
    return ["train", "--data", str(d / "docs.parquet"), "--out", str(d / "out")], d


def parquet_column_not_text(d):
    _parquet(d / "docs.parquet", text=[1, 2, 3, 4])
    return ["train", "--data", str(d / "docs.parquet"), "--out", str(d / "out")], d


def jsonl_binary(d):
    (d / "docs.jsonl").write_bytes(b"\xff\xfe\x00\x01" * 64)
    return ["train", "--data", str(d / "docs.jsonl"), "--out", str(d / "out")], d


def jsonl_not_json(d):
    (d / "docs.jsonl").write_text(json.dumps({"text": DOC}) + "\n" + DOC + "\n")
    return ["train", "--data", str(d / "docs.jsonl"), "--out", str(d / "out")], d


def jsonl_without_the_field(d):
    (d / "docs.jsonl").write_text(json.dumps({"body": DOC}) + "\n")
    return ["train", "--data", str(d / "docs.jsonl"), "--out", str(d / "out")], d


def txt_invalid_utf8(d):
    (d / "doc.txt").write_bytes(DOC.encode() + b"\xc3\x28" + DOC.encode())
    return ["train", "--data", str(d / "doc.txt"), "--out", str(d / "out")], d


def _copy(good_run, d, name="done"):
    shutil.copytree(good_run / name, d / "run")
    return d / "run"


def checkpoint_truncated(d, good_run):
    run = _copy(good_run, d)
    data = checkpoint.part_path(run / "ckpt", 4, 0) / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:1000])
    (run / "summary.json").unlink()
    return ["train", "--resume", str(run)], run


def checkpoint_index_garbage(d, good_run):
    run = _copy(good_run, d, "half")
    (checkpoint.part_path(run / "ckpt", 2, 0) / ".metadata").write_bytes(os.urandom(512))
    return ["train", "--resume", str(run)], run


def checkpoint_bytes_zeroed(d, good_run):
    run = _copy(good_run, d, "half")
    data = checkpoint.part_path(run / "ckpt", 2, 0) / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[:4096] = bytes(4096)
    data.write_bytes(bytes(raw))
    return ["train", "--resume", str(run)], run


def checkpoint_data_missing(d, good_run):
    run = _copy(good_run, d, "half")
    (checkpoint.part_path(run / "ckpt", 2, 0) / "__0_0.distcp").unlink()
    return ["train", "--resume", str(run)], run


def checkpoint_damaged_under_the_launcher(d, good_run):
    run = _copy(good_run, d, "half")
    data = checkpoint.part_path(run / "ckpt", 2, 0) / "__0_0.distcp"
    data.write_bytes(data.read_bytes()[:1000])
    config = json.loads((run / "config.json").read_text())
    config["parallel"]["dp"] = 2  # a --dp 2 run's folder: the launcher reads it before any rank starts
    (run / "config.json").write_text(json.dumps(config))
    return ["train", "--resume", str(run)], run


def config_of_another_version(d, good_run):
    run = _copy(good_run, d, "half")
    config = json.loads((run / "config.json").read_text())
    config["optim"]["nesterov_warmup"] = 5  # a field this version does not know
    (run / "config.json").write_text(json.dumps(config))
    return ["train", "--resume", str(run)], run


def config_not_json(d, good_run):
    run = _copy(good_run, d, "half")
    (run / "config.json").write_bytes(b"\x00\x01 not json")
    return ["train", "--resume", str(run)], run


def output_under_a_file(d):
    (d / "a_file").write_text("mine")
    return ["train", "--out", str(d / "a_file" / "run")], d


def output_unwritable(d):
    return ["train", "--out", "/proc/delaylab-run"], None  # procfs takes no folders, whoever asks


def pipeline_output_unwritable(d):
    return ["pipeline", "--stages", "2", "--out", "/proc/delaylab-run"], None


CASES = {  # name: (make, exit code, the start of the line after "delaylab: ")
    "a .parquet that is text": (not_parquet, 2, "error: {d}/bad.parquet: not a parquet file ("),
    "a parquet without the text column": (parquet_without_the_column, 2,
                                          "error: {d}/docs.parquet: no column 'text' (columns: body)"),
    "a parquet whose text column holds numbers": (parquet_column_not_text, 2,
                                                  "error: {d}/docs.parquet: column 'text' holds int64, not text"),
    "a .jsonl of binary bytes": (jsonl_binary, 2, "error: {d}/docs.jsonl:1: not UTF-8 text (byte 0xff at offset 0 of "
                                 "the line)"),
    "a .jsonl line that is not JSON": (jsonl_not_json, 2,
                                       "error: {d}/docs.jsonl:2: not a JSON object with a 'text' field"),
    "a .jsonl without the text field": (jsonl_without_the_field, 2,
                                        "error: {d}/docs.jsonl:1: not a JSON object with a 'text' field"),
    "a .txt with invalid UTF-8": (txt_invalid_utf8, 2, "error: {d}/doc.txt: not UTF-8 text (byte 0xc3 at offset "
                                  f"{len(DOC)})"),
    "a checkpoint's data file truncated": (checkpoint_truncated, 2,
                                           "error: {d}/run/ckpt/step_0000004/stage_0: damaged checkpoint "
                                           "(__0_0.distcp is 1000 bytes, its index needs"),
    "a checkpoint's index overwritten with random bytes": (checkpoint_index_garbage, 2,
                                                          "error: {d}/run/ckpt/step_0000002/stage_0: damaged "
                                                          "checkpoint ("),
    "a checkpoint's first 4 KiB zeroed": (checkpoint_bytes_zeroed, 2,
                                          "error: {d}/run/ckpt/step_0000002/stage_0: damaged checkpoint ("),
    "a checkpoint's data file missing": (checkpoint_data_missing, 2,
                                         "error: {d}/run/ckpt/step_0000002/stage_0: damaged checkpoint ("),
    "a --dp 2 run's truncated checkpoint (checked by the launcher)": (
        checkpoint_damaged_under_the_launcher, 2,
        "error: {d}/run/ckpt/step_0000002/stage_0: damaged checkpoint (__0_0.distcp is 1000 bytes"),
    "a config.json with a field of another version": (config_of_another_version, 2,
                                                      "error: {d}/run/config.json: not a config of this delaylab "
                                                      "version (unknown config fields: nesterov_warmup)"),
    "a config.json that is not JSON": (config_not_json, 2, "error: {d}/run/config.json: not a JSON config ("),
    "--out below a regular file": (output_under_a_file, 2, "error: cannot write {d}/a_file/run: Not a directory"),
    "--out where no folder can be made (/proc)": (output_unwritable, 2, "error: cannot write /proc/delaylab-run: "),
    "the same for a pipeline (before any rank starts)": (pipeline_output_unwritable, 2,
                                                         "error: cannot write /proc/delaylab-run: "),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_damaged_input_is_one_line_exit_2_and_overwrites_nothing(name, good_run, tmp_path, capsys, monkeypatch):
    make, code, want = CASES[name]
    takes_run = "good_run" in make.__code__.co_varnames[:make.__code__.co_argcount]
    argv, keep = make(tmp_path, good_run) if takes_run else make(tmp_path)
    before = _files(keep) if keep is not None else None
    import torch.distributed.launcher.api as launcher

    def no_launch(*a, **k):
        raise AssertionError("a process was started")

    monkeypatch.setattr(launcher, "elastic_launch", no_launch)  # bad input starts no process
    got = main(["llm", *argv, *([] if "--resume" in argv else TINY)])
    err = capsys.readouterr().err
    print(f"| {name} | {got} | `{err.strip().replace(str(tmp_path), 'D')}` |")
    assert got == code and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("delaylab: " + want.format(d=tmp_path)), err
    if keep is not None:
        assert _files(keep) == before  # nothing overwritten, nothing added


def _limited(limit: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


def _run_limited(argv: list[str], limit: int) -> tuple[int, str]:
    done = subprocess.run([sys.executable, "-m", "delaylab", "llm", *argv], capture_output=True, text=True,
                          timeout=240, preexec_fn=_limited(limit), env={**os.environ, "OMP_NUM_THREADS": "1"})
    return done.returncode, done.stderr


@pytest.mark.timeout(300)
def test_a_full_disk_stops_the_run_in_one_line_and_keeps_the_last_good_checkpoint(good_run, tmp_path):
    # before the run: config.json does not fit -> bad input, exit 2, no half file left
    code, err = _run_limited(["train", *TINY, "--out", str(tmp_path / "tiny_limit")], 1000)
    print(f"| an output folder that takes no more than 1000 bytes per file (a new run) | {code} | "
          f"`{err.strip().replace(str(tmp_path), 'D')}` |")
    assert code == 2 and err.strip() == f"delaylab: error: cannot write {tmp_path}/tiny_limit/config.json: " \
                                        f"File too large", err
    assert not list((tmp_path / "tiny_limit").iterdir())
    # during the run: the first checkpoint (1.8 MB) does not fit -> the run failed, exit 1
    out = tmp_path / "new"
    code, err = _run_limited(["train", *TINY, "--out", str(out)], 64 << 10)
    print(f"| the same at 64 KiB per file (a new run: config.json fits, the checkpoint does not) | {code} | "
          f"`{err.strip().replace(str(tmp_path), 'D')}` |")
    assert code == 1 and err.strip() == f"delaylab: error: cannot write {out}/ckpt/step_0000002/stage_0.pending: " \
                                        f"File too large; no checkpoint was written", err
    assert not list((out / "ckpt").rglob("*.distcp"))  # the failed write took no room
    # resumed: the checkpoint of step 2 is kept as it was, and a later resume with room finishes the run
    run = tmp_path / "half"
    shutil.copytree(good_run / "half", run)
    before = _files(run / "ckpt")
    code, err = _run_limited(["train", "--resume", str(run)], 64 << 10)
    print(f"| the same, resuming a run that has a checkpoint | {code} | `{err.strip().replace(str(tmp_path), 'D')}` |")
    assert code == 1 and err.strip().endswith(f"File too large; the last good checkpoint {run}/ckpt/step_0000002 "
                                              "is kept"), err
    assert {k: v for k, v in _files(run / "ckpt").items() if ".pending" not in str(k)} == before
    assert main(["llm", "train", "--resume", str(run)]) == 0
    assert checkpoint.latest_complete(run / "ckpt", 1) == 4


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_a_full_disk_under_the_launcher_is_one_line_naming_the_failed_write(tmp_path):
    out = tmp_path / "pipe"
    code, err = _run_limited(["pipeline", "--stages", "2", *TINY, "--out", str(out)], 64 << 10)
    lines = err.strip().replace(str(tmp_path), "D").splitlines()
    print(f"| a pipeline at 64 KiB per file | {code} | `{lines[-1]}` (and one line per rank) |")
    assert code == 1 and "Traceback" not in err and len(lines) <= 3, err  # one line per rank, then the launcher's
    assert lines[-1].startswith("delaylab: error: pipeline stopped: rank ") and "cannot write D/pipe/ckpt/" in lines[-1]
    assert "File too large" in lines[-1] or "file-size limit of 65536 bytes" in lines[-1], err
