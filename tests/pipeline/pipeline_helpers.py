"""Shared helpers of the pipeline tests: small configs, the single-process references, ranks by hand."""

import os
import signal
import subprocess
import sys
import time

import torch

from delaylab.llm.config import Config
from delaylab.llm.run.trainer import Trainer


def small(**kw) -> Config:
    """The 4-layer preset on 2 x 16-token microbatches: seconds per run, one thread per rank."""
    base = dict(preset="small", batch_size=2, block_size=16, steps=10, eval_batches=1, log_every=5,
                ckpt_every=0, threads=1, progress=False, device="cpu")
    return Config.from_dict({**base, **kw}).resolved("pipeline")


def reference_model(cfg: Config) -> dict:
    """Final weights of the single-process run of ``cfg`` (``delaylab.optim.Delayed`` in one process):
    the trainer's own loop (``Trainer.step``: M microbatches, ``(loss / M).backward()``, one
    ``Delayed.step()``, each param group's LR indexed by its own update count)."""
    trainer = Trainer(cfg)  # the same config, run by the simulator
    while trainer.updates < trainer.cfg.run.steps:
        trainer.step()
    return trainer.model.state_dict()


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def load_model(folder) -> dict:
    return torch.load(f"{folder}/model.pt", map_location="cpu", weights_only=True)


def start_ranks(tmp_path, P: int, D: int, store_port: int, agent_store: bool = True) -> list:
    """Start P x D ranks of a long 2bw run by hand, as torchrun would (environment variables and a
    store that outlives the ranks; ``agent_store=False``: as a plain env:// start, rank 0 holding the
    store at ``store_port``); returns ``[(process, stderr file)]``, stderr in rank<r>.err."""
    cmd = [sys.executable, "-m", "delaylab", "llm", "pipeline", "--stages", str(P), "--dp", str(D),
           "--schedule", "2bw", "--preset", "small", "--microbatches", str(max(2, P - 1)), "--batch-size", "2",
           "--block-size", "16", "--steps", "5000", "--log-every", "1", "--ckpt-every", "0", "--timeout", "60",
           "--device", "cpu", "--out", str(tmp_path / "run")]
    procs = []
    for r in range(P * D):
        env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(P * D),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store_port), "OMP_NUM_THREADS": "1"}
        if agent_store:
            env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
        else:
            env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        err = open(tmp_path / f"rank{r}.err", "w")
        procs.append((subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err), err))
    return procs


def kill_when_running(tmp_path, procs: list, victim: int) -> dict[int, tuple[int, str, float]]:
    """Once the run has logged 3 updates, SIGKILL rank ``victim``; ``{rank: (exit code, stderr,
    seconds after the kill)}`` of every other rank (each waited for up to 60 s)."""
    deadline, metrics = time.time() + 120, tmp_path / "run" / "metrics.jsonl"
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
        assert time.time() < deadline, "the pipeline never got going"
        assert all(p.poll() is None for p, _ in procs), "a rank exited before the kill"
        time.sleep(0.2)
    os.kill(procs[victim][0].pid, signal.SIGKILL)
    killed, out = time.time(), {}
    for r, (p, _) in enumerate(procs):
        if r != victim:
            rc = p.wait(timeout=60)
            out[r] = (rc, (tmp_path / f"rank{r}.err").read_text(), time.time() - killed)
            print(f"rank {r} exited {out[r][2]:.2f} s after rank {victim} was killed: {out[r][1].strip()}")
    return out
