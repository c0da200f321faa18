"""docs/torchtitan.md's commands against torchtitan itself: its --help lists every flag, and its
own config parser turns them into delaylab's components with the values the docs claim."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

DOC = Path(__file__).resolve().parents[2] / "docs" / "torchtitan.md"


def commands() -> list[list[str]]:
    """The arguments after ``-m torchtitan.train`` (or the CPU entry point, tests/integrations/titan_cpu.py,
    which runs it) of every such command in the doc's bash blocks."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            tokens = shlex.split(line) if ("torchtitan.train" in line or "titan_cpu.py" in line) else []
            entry = [i for i, t in enumerate(tokens) if t == "torchtitan.train" or t.endswith("titan_cpu.py")]
            if entry:
                out.append(tokens[entry[0] + 1:])
    return out


def flags(args: list[str]) -> list[str]:
    return [a.split("=")[0].replace("_", "-") for a in args if a.startswith("--")]


def value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_the_doc_has_the_commands_it_describes():
    found = commands()
    assert len(found) == 3
    assert {value(a, "--config") for a in found} == {"llama3_8b_2bw", "llama3_debugmodel_pp_2bw", "llama3_tiny_pp_2bw"}


@pytest.mark.timeout(300)
def test_every_flag_is_in_torchtitans_help():
    """One ``--help`` (the configs share torchtitan's Trainer.Config and delaylab's components)."""
    found = commands()
    module = {value(a, "--module") for a in found}
    assert module == {"delaylab.integrations.torchtitan"}
    run = subprocess.run([sys.executable, "-m", "torchtitan.train", "--module", module.pop(), "--config",
                          value(found[-1], "--config"), "--help"], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    listed = set(re.findall(r"--[a-z0-9][a-z0-9._-]*", run.stdout))
    assert "--optimizer.ef-lag" in listed  # delaylab's container is what the help describes
    for args in found:
        missing = [f for f in flags(args) if f not in listed and f not in ("--module", "--config")]
        assert not missing, f"{value(args, '--config')}: not in torchtitan's --help: {missing}"


def test_torchtitans_parser_builds_delaylabs_components_from_them():
    from torchtitan.config import ConfigManager

    from delaylab.integrations.torchtitan import DelayedLRSchedulersContainer, DelayedOptimizersContainer, pipelining_fn
    from delaylab.integrations.torchtitan.checkpoint import DelayedCheckpointManager

    by_config = {value(a, "--config"): a for a in commands()}
    simulated, real = by_config["llama3_8b_2bw"], by_config["llama3_debugmodel_pp_2bw"]
    cfg = ConfigManager().parse_args(simulated)
    assert isinstance(cfg.optimizer, DelayedOptimizersContainer.Config)
    assert isinstance(cfg.lr_scheduler, DelayedLRSchedulersContainer.Config)
    assert (cfg.optimizer.delay, cfg.optimizer.correction) == (1, "ef")
    assert cfg.model_spec.flavor == "8B" and cfg.model_spec.pipelining_fn is pipelining_fn
    cfg = ConfigManager().parse_args(real)
    assert (cfg.optimizer.delay, cfg.optimizer.correction, cfg.optimizer.ef_lag) == (0, "ef", 1)
    assert cfg.parallelism.pipeline_parallel_schedule == "2BW" and cfg.parallelism.pipeline_parallel_degree == 2
    assert cfg.training.disable_cuda_graphs
    assert isinstance(cfg.checkpoint, DelayedCheckpointManager.Config)  # it drains the pipe, no user code
    cfg = ConfigManager().parse_args([*simulated, "--optimizer.stage_delays", "3", "2", "1", "0"])
    assert cfg.optimizer.stage_delays == [3, 2, 1, 0]
    cfg = ConfigManager().parse_args(by_config["llama3_tiny_pp_2bw"])
    assert cfg.parallelism.pipeline_parallel_schedule == "2BW" and cfg.training.mixed_precision_param == "float32"
