"""README.md is a front door: short, with three quick starts that run as written.

Quick start 1's Python block runs on the worked example's model (docs/examples/check_assumptions.py
supplies the model, loss, batches and trajectory the snippet names); quick start 2 runs the CI
example with pytest; quick start 3's command is the one the GPU plan prints. The notebook's run is
tests/theory/test_check_assumptions_notebook.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_short_and_cites_the_paper():
    assert len(README.splitlines()) <= 130
    assert "arXiv:2606.30634" in README and "Zmushko" in README
    assert not re.search(r"\bissue \d+|helper|farm-", README, re.I)


def test_quick_start_1_runs_as_written(monkeypatch):
    import torch

    monkeypatch.syspath_prepend(str(ROOT / "docs" / "examples"))
    import check_assumptions as ex
    from delaylab.theory import assumptions as A

    model, loss_fn, batches = ex.make_model(), ex.loss_fn, ex.make_batches(8, seed=2)
    trace = A.TorchObjective(model, loss_fn, batches)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.5)
    points, losses = [], []
    for b in ex.make_batches(20, seed=1):
        points.append(trace.point())
        losses.append(trace.loss(points[-1]))
        opt.zero_grad()
        loss_fn(model, b).backward()
        opt.step()
    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    scope = {"model": model, "loss_fn": loss_fn, "batches": batches, "points": points, "losses": losses}
    printed = []
    scope["print"] = printed.append
    exec(compile(code, "README quick start 1", "exec"), scope)
    tuned = printed[0]
    assert tuned.value > 0 and tuned.eta > 0
    assert scope["est"]["constants"]["norm"] == "euclidean"


def test_quick_start_2_runs_as_written(tmp_path):
    block = re.search(r"\*\*2\. .*?```bash\n(.*?)```", README, re.S).group(1)
    assert "cp docs/examples/test_my_optimizer.py tests/" in block
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_my_optimizer.py").write_text((ROOT / "docs/examples/test_my_optimizer.py").read_text())
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_my_optimizer.py"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-2000:]
    assert "2 passed" in out.stdout
    assert time.perf_counter() - start < 120  # the README says about 10 s on 2 quiet cores


@pytest.mark.parametrize("line", ["python3 scripts/gpu_validate.py --plan", "bash scripts/gpu_validate.sh"])
def test_quick_start_3_is_the_plans_call(line):
    block = re.search(r"\*\*3\. .*?```bash\n(.*?)```", README, re.S).group(1)
    assert line in block
    plan = subprocess.run([sys.executable, "scripts/gpu_validate.py", "--plan"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    run = next(x for x in block.splitlines() if x.startswith("bash scripts/gpu_validate.sh"))
    assert run.removesuffix(" OUT") in plan  # the phases and budget the plan prints
    assert re.search(r"device time: (\d+) s", plan) and int(re.search(r"device time: (\d+) s", plan).group(1)) <= 840


def test_the_demos_time_is_quoted_once_and_the_cli_agrees():
    """One measured figure for the demo, in the README and in `delaylab --help`."""
    minutes = re.findall(r"`make demo` then took about (\d+) minutes", README)
    assert len(minutes) == 1
    out = subprocess.run([sys.executable, "-m", "delaylab", "--help"], capture_output=True, text=True, check=True)
    assert f"about {minutes[0]} minutes on 2 CPU cores" in " ".join(out.stdout.split())
