"""The two device-tool commands of docs/gpu/README.md: under the tool's 2000 characters, valid bash,
and they run (DRY=1 on this CPU, a stand-in wheel for the carried ones)."""

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def commands() -> dict[str, str]:
    text = (ROOT / "docs" / "gpu" / "README.md").read_text()
    return dict(re.findall(r"```(device-call-\d)\n(.*?)\n```", text, flags=re.S))


def test_there_are_two_commands_each_under_2000_characters_and_valid_bash():
    cmds = commands()
    assert sorted(cmds) == ["device-call-1", "device-call-2"]
    for name, cmd in cmds.items():
        assert len(cmd) < 2000, (name, len(cmd))
        assert "--no-index --no-deps --target" in cmd and "$OUT" in cmd and "--budget" in cmd
        done = subprocess.run(["bash", "-n", "-c", cmd], capture_output=True, text=True)
        assert done.returncode == 0, (name, done.stderr)


def _stand_in(root: Path) -> None:
    """A minimal wheel (a package, METADATA, WHEEL, RECORD) for the offline install to take."""
    (root / "wheels").mkdir()
    with zipfile.ZipFile(root / "wheels" / "stand_in-0.1-py3-none-any.whl", "w") as z:
        z.writestr("stand_in/__init__.py", "")
        z.writestr("stand_in-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: stand-in\nVersion: 0.1\n")
        z.writestr("stand_in-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                    "Tag: py3-none-any\n")
        z.writestr("stand_in-0.1.dist-info/RECORD", "")


def _run(name: str, tmp_path: Path, timeout: int) -> dict:
    """The documented command as the device would run it, but DRY=1, in a folder with the repository's
    scripts and a stand-in wheel, ``python3`` this interpreter, the install target under tmp_path."""
    cwd = tmp_path / "repo"
    cwd.mkdir()
    (cwd / "scripts").symlink_to(ROOT / "scripts")
    _stand_in(cwd)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (bin_ / "python3").chmod(0o755)
    cmd = commands()[name].replace("/tmp/deps", str(tmp_path / "deps"))
    out = tmp_path / "out"
    env = {**os.environ, "DRY": "1", "OUT": str(out), "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}",
           "TMPDIR": str(tmp_path)}
    env.pop("PY", None)
    done = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert (tmp_path / "deps" / "stand_in" / "__init__.py").is_file()  # installed offline
    assert sorted(p.name for p in out.iterdir()) == ["record.json", "record.md"]
    return json.loads((out / "record.json").read_text())


@pytest.mark.dist
def test_call_2_runs_dry(tmp_path):
    record = _run("device-call-2", tmp_path, 300)
    assert {k: v["status"] for k, v in record["phases"].items()} == {"cpu16": "ok"}
    assert record["budget_s"] == 170


@pytest.mark.slow
def test_call_1_runs_dry(tmp_path):
    record = _run("device-call-1", tmp_path, 580)
    assert list(record["phases"]) == ["env", "smoke", "resume", "throughput-135m", "throughput-360m", "gap-360m"]
    assert all(v["status"] == "ok" for v in record["phases"].values()), record["phases"]
