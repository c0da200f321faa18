"""What both engines do before their loop, in one place: the simulator's trainer and the pipeline's
rank start the same way.

:class:`Setup` is one process's start: CPU threads, the device (``LOCAL_RANK`` for a rank), and,
when the run has more than one process, the world-size check, the process group and the
``(dp, pp)`` mesh (the simulator is ``P = 1``); then the data and the model config.
:meth:`Setup.seeded_model` is the run's initial weights (every rank builds the same full model from
the seed, then keeps its part). :func:`open_run` is the run folder and the resume: this stage's part
of the newest complete checkpoint, checked against the config.

:func:`resolve` is the config as this process runs it: the world size and the GPU count read here
(the config itself reads nothing from where it runs), then the checks that belong to the engines
and the host (:func:`check_engine`), before any process starts.

One accounting, for both engines (docs/llm.md, "What a run reports"):

* ``steps``: updates made; a pipeline's update ``k`` applies batch ``k``'s gradient on every stage,
  the simulator's delayed update ``k`` does the same (its first ``tau`` calls only fill the queue);
* ``tokens`` = tokens whose gradient was applied = ``steps x batch_size x block_size x grad_accum``
  (the simulator's queue-fill calls read tokens whose gradients are applied later, or never);
* a metrics line's ``train_loss``: the mean loss of the batches whose gradients were applied since
  the previous line. Both engines write a line at the same steps (:func:`logs_at`).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from delaylab._io import write_json
from delaylab.errors import ConfigError, WriteFailed, cannot_write
from delaylab.llm import checkpoint
from delaylab.llm.config import Config
from delaylab.llm.data import load_dataset
from delaylab.llm.distributed.mesh import build_mesh
from delaylab.llm.distributed.world import barrier, check_world, launched_sizes, local_rank, start
from delaylab.llm.distributed.wrap import check_shardable, replica_rows
from delaylab.llm.pipeline.schedules import check_config
from delaylab.llm.run.folder import TrainFolder, require_folder
from delaylab.run_folder import CONFIG
from delaylab.llm.model import GPT


# Devices delaylab runs on; mps, xpu, ... are devices torch knows and delaylab does not. The tests
# add "meta" (where any host read raises) to show that a training call holds no host sync.
DEVICE_KINDS = ("cpu", "cuda")


def resolve(cfg: Config, engine: str) -> Config:
    """``cfg`` resolved for ``engine`` in this process's world (torchrun's ``WORLD_SIZE``, else 1)
    and checked against the engine and this host's GPUs: what a launcher calls before it starts
    anything. One-line :class:`ConfigError`."""
    world, local = launched_sizes()
    cfg = cfg.resolved(engine, world)
    check_engine(cfg, engine, torch.cuda.device_count(), local)
    return cfg


def check_engine(cfg: Config, engine: str, gpus: int, local_world_size: int | None = None) -> None:
    """What a resolved ``cfg`` needs from the engines and from a host with ``gpus`` CUDA devices, of
    which this node runs ``local_world_size`` ranks (torchrun's per-node count; by default every
    rank of the run, as when delaylab starts them): the schedule's rules (the simulator of a
    schedule accepts what its pipeline accepts), FSDP2 and the optimizer, one GPU per rank."""
    par, stages = cfg.parallel, cfg.parallel.stages or 1
    if par.schedule is not None:
        check_config(par.schedule.removeprefix("torch-"), stages, cfg.data.grad_accum, cfg.model_config(256).n_layer)
    check_shardable(cfg)  # FSDP2 and the optimizer: refused here, before any replica starts
    ranks = (stages if engine == "pipeline" else 1) * par.dp
    here = ranks if local_world_size is None else local_world_size
    dev = cfg.run.device
    if dev != "auto" and dev != "cpu":
        try:
            kind = torch.device(dev).type
        except RuntimeError:
            kind = None
        if kind not in DEVICE_KINDS:
            raise ConfigError(f"unknown device {dev!r} (auto, cpu, cuda, cuda:1, ...)")
        if kind == "cuda" and not gpus:
            raise ConfigError(f"device {dev!r} asked for, but this torch has no CUDA device "
                              f"(torch {torch.__version__}); use --device cpu or auto")
        need = here if ranks > 1 else (torch.device(dev).index or 0) + 1
        if kind == "cuda" and gpus < need:
            raise ConfigError(f"{need} GPUs needed on this node (one per rank), found {gpus} (or use --device cpu)")
    elif dev == "auto" and ranks > 1 and 0 < gpus < here:
        raise ConfigError(f"{here} ranks on this node need {here} GPUs, found {gpus} (or use --device cpu)")
    if cfg.model.dtype == "float64" and (dev.startswith("cuda") or dev == "auto" and gpus):
        raise ConfigError("--dtype float64 is for equivalence checks on the CPU: add --device cpu")


def load_data(cfg: Config, dataset=None):
    """The run's corpus (tokenized once and cached beside the text); bad data fails here."""
    if dataset is not None:
        return dataset
    d = cfg.data
    return load_dataset(d.data, d.tokenizer, d.vocab_size, d.val_fraction, d.text_field)


class Setup:
    """One process of ``cfg`` on ``engine`` (``"simulator"`` or ``"pipeline"``)."""

    def __init__(self, cfg: Config, engine: str, dataset=None):
        self.cfg = cfg = resolve(cfg, engine)
        self.stages = cfg.parallel.stages if engine == "pipeline" else 1
        D = cfg.parallel.dp
        distributed = engine == "pipeline" or D > 1
        threads = cfg.run.threads or (1 if distributed else None)  # one thread per rank by default
        if threads:
            torch.set_num_threads(threads)
        self.device = cfg.torch_device(local_rank() if distributed else None)
        if cfg.run.deterministic:
            use_deterministic_algorithms()
        self.mesh = None
        if distributed:
            check_world(self.stages, D)
            start(self.device, cfg.parallel.timeout)
            self.mesh = build_mesh(self.device.type, D, self.stages, cfg.parallel.timeout,
                                   tied=cfg.model_config(256).tie_embeddings)
        self.data = load_data(cfg, dataset)
        self.model_cfg = cfg.model_config(self.data.vocab_size)

    @property
    def stage(self) -> int:
        return self.mesh.s if self.mesh is not None else 0

    @property
    def replica(self) -> int:
        return self.mesh.d if self.mesh is not None else 0

    def seeded_model(self) -> GPT:
        """The run's initial weights, on the CPU in float32: the same on every rank."""
        torch.manual_seed(self.cfg.run.seed)
        return GPT(self.model_cfg, self.cfg.data.grad_accum)

    def rows(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This replica's rows of a batch, on the device."""
        D = self.cfg.parallel.dp
        if D > 1:
            x, y = replica_rows(x, self.replica, D), replica_rows(y, self.replica, D)
        if self.device.type == "cuda":  # from pinned memory the copy is asynchronous (pageable memory may wait)
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def tokens(self, steps: int) -> int:
        """Tokens whose gradient ``steps`` updates applied (the accounting above)."""
        d = self.cfg.data
        return steps * d.batch_size * d.grad_accum * self.model_cfg.block_size


def use_deterministic_algorithms() -> None:
    """``--deterministic``, for this process (before its first CUDA matrix product): torch's
    deterministic algorithms (an error where an operation has none), cuBLAS's fixed workspace
    (``CUBLAS_WORKSPACE_CONFIG=:4096:8``, which torch requires for deterministic cuBLAS on CUDA >=
    10.2), and an attention backward that is deterministic: flash attention's, which torch runs
    deterministically under this flag, or the math one; the cuDNN and memory-efficient kernels
    are switched off. Slower (the deterministic flash backward, the smaller cuBLAS workspace), and
    what makes a CUDA resume exact as a CPU one is."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.enable_cudnn_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)


def logs_at(step: int, cfg: Config) -> bool:
    """Whether update ``step`` gets a metrics line (with the simulator's validation when it has one)."""
    r = cfg.run
    return step % r.log_every == 0 or step % r.eval_every == 0 or step == r.steps


def checkpoint_at(step: int, end: int, cfg: Config) -> bool:
    """Whether update ``step`` of a session that ends at update ``end`` writes a checkpoint: every
    ``ckpt_every`` updates; at a stop before the last update (the run continues from there); and at
    the last update with ``ckpt_final`` (by default when ``ckpt_every > 0``)."""
    r = cfg.run
    if r.ckpt_every and step % r.ckpt_every == 0:
        return True
    if step != end:
        return False
    if end < r.steps:
        return True
    return r.ckpt_final if r.ckpt_final is not None else r.ckpt_every > 0


def check_folder(cfg: Config, out: str | os.PathLike, resume: bool, stages: int) -> None:
    """Raise (one line) unless ``out`` can take a new run, or holds a resumable run of ``cfg``: what a
    launcher checks before any process starts. A run to resume needs its config.json; without a
    complete checkpoint it starts again from update 0 (it stopped before its first one)."""
    out = Path(out)
    run = TrainFolder(cfg, out, marks=checkpoint.MARKS)
    run.check_writable()
    if not resume:
        run.check_new()
        return
    if (out / CONFIG).is_file():
        run.check_same_run(require_folder(out))
    root = out / checkpoint.ROOT
    step = resume_step(root, stages, out)
    if step is not None:
        checkpoint.verify(root, step, stages)


def claim_folder(cfg: Config, out: str | os.PathLike, resume: bool, stages: int) -> None:
    """Check ``out`` (:func:`check_folder`) and, for a new run, write its config.json, before any
    process starts: a run killed in its start-up, before its first checkpoint, leaves a folder that
    ``--resume`` takes (from update 0) and that the command which made it still accepts
    (:meth:`TrainFolder.check_new`). The caller has checked the config and the data."""
    check_folder(cfg, out, resume, stages)
    if not resume:
        try:
            Path(out).mkdir(parents=True, exist_ok=True)
            write_json(Path(out) / CONFIG, cfg.to_dict())
        except OSError as err:
            raise WriteFailed(cannot_write(out, err)) from None


def resume_step(root: Path, stages: int, out: Path | None = None) -> int | None:
    """The newest complete checkpoint under ``root`` to continue from; None where there is none in a
    folder ``out`` that holds the run's config.json (the run starts again from update 0), else a
    one-line error."""
    step = checkpoint.latest_complete(root, stages)
    if step is None and (out is None or not (Path(out) / CONFIG).is_file()):
        checkpoint.require_latest(root, stages)  # raises: no run to resume
    return step


def open_run(setup: Setup, out, *, writer: bool, resume: bool):
    """The run folder, this stage's checkpoints and (``resume``) its part of the newest complete step:
    ``(TrainFolder, Checkpoints, part or None)``; None also for a resume of a run that stopped before
    its first checkpoint (it starts again). The writer checks a new folder; the others wait."""
    cfg, mesh = setup.cfg, setup.mesh
    run = TrainFolder(cfg, out, writer=writer, marks=checkpoint.MARKS)
    ckpts = checkpoint.Checkpoints(run.out, setup.stages, setup.stage, mesh.dp_group if mesh is not None else None)
    part = None
    if resume:
        if ckpts.root is None:
            raise ConfigError("resume needs the run's folder")
        step = resume_step(ckpts.root, setup.stages, run.out)
        if step is None:
            run.check_same_run(require_folder(run.out))
            ckpts.drop_after(0)  # parts of a first checkpoint that was never completed
        else:
            checkpoint.verify(ckpts.root, step, setup.stages)  # a damaged part: one line naming what is wrong
            part = ckpts.load(step, mesh.dp_mesh if mesh is not None and cfg.parallel.dp_shard else None)
            run.check_same_run(part["config"], ckpts.root)
            ckpts.drop_after(step)
    elif run.writer:
        run.check_new()
    barrier()
    return run, ckpts, part


# -- optimizers ---------------------------------------------------------------------------------------
def build_delayed_optimizer(model: GPT, cfg: Config):
    """``Delayed(build_optimizer(...))`` for the config's delay; one inner optimizer per stage
    (with that stage's tau on each of its param groups) when ``delay`` is a list."""
    from delaylab.llm.pipeline.stages import Stage
    from delaylab.optim import CombinedOptimizer, Delayed, build_optimizer

    hp, name, delays = cfg.optimizer_kwargs(), cfg.optim.optimizer, cfg.delays
    if len(delays) == 1:
        inner, per_group = build_optimizer(name, model, **hp), delays[0]
    else:
        parts, per_group = [], []
        for s, tau in enumerate(delays):  # the pipeline's stages: same names, same routing
            opt = build_optimizer(name, Stage(model, s, len(delays)), **hp)
            parts.append(opt)
            per_group += [tau] * len(opt.param_groups)
        inner = CombinedOptimizer(parts)
    d = cfg.delay
    return Delayed(inner, delay=cfg.delay_distribution() or per_group, corrections=cfg.correctors(),
                   sync_start=d.sync_start, sync_cooldown=d.sync_cooldown, total_steps=cfg.run.steps)
