"""The one configuration of a GPT run, for every way to run it, and the one home of its defaults.

A :class:`Config` is nested dataclasses (model, data, optim, lr_schedule, delay, parallel,
run). Every leaf name is unique across sections, so a flat dict (``{"lr": 3e-3, "delay": 1}``)
names a field as well as the nested one does, and the command-line flags are the leaf names
(``--lr``, ``--delay``), generated from the fields and their ``help`` metadata
(:mod:`delaylab.commands._config_flags`).

The simulator (``delaylab llm train``) and the pipeline engine (``delaylab llm pipeline``) run
the same config; :meth:`Config.resolved` fills what one of them leaves open (the delay from the
pipeline schedule or the schedule from the delay, the stage count, the microbatch count) and
validates everything, once. The same flags then give the same run. Resolving reads nothing from
where it runs: the launcher passes the world size in, and what depends on the host or on an engine
(GPU counts, a schedule's microbatch rule, FSDP2 and the optimizer) is checked by
:func:`delaylab.llm.run.setup.resolve`, beside the engines.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from delaylab.errors import ConfigError
from delaylab.llm.model_config import PRESETS, preset
from delaylab.optim import corrections

ENGINES = ("simulator", "pipeline")
LR_SCHEDULES = ("cosine", "wsd", "constant")
DTYPES = ("float32", "float64")
LOGGERS = ("none", "tensorboard", "wandb")
# Pipeline schedules and the delay each one produces on stage s of P (schedule_delays): config-level
# data, so resolving a config needs no engine code.
PIPELINE_SCHEDULES = ("2bw", "pipedream", "1f1b", "gpipe", "torch-1f1b", "torch-gpipe")
DEFAULT_STAGES = 2  # a pipeline run's stage count when none is given
# The single corrector names each engine runs, from the registry (which imports no torch): a
# pipeline stage runs the correctors that take their gradients' staleness as a lag.
CORRECTIONS_BY_ENGINE = {"simulator": corrections.NAMES, "pipeline": corrections.PIPELINE}


def schedule_delays(name: str, stages: int) -> list[int]:
    """Each stage's delay under schedule ``name`` (torch's runtimes: as their own names): 2BW one
    update everywhere, PipeDream ``P - 1 - s`` on stage s, the flushing schedules none."""
    name = name.removeprefix("torch-")
    if name == "2bw":
        return [1] * stages
    if name == "pipedream":
        return [stages - 1 - s for s in range(stages)]
    return [0] * stages


def _f(default: Any, help: str, **kw):
    """A field with its help text (the flag's ``--help`` line)."""
    if callable(default) and not isinstance(default, type):
        return field(default_factory=default, metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ModelConfig:
    preset: str = _f("tiny", f"model size: {', '.join(PRESETS)}", choices=tuple(PRESETS))
    n_layer: int | None = _f(None, "transformer blocks (default: the preset's)", range="[1, inf)")
    mlp: str | None = _f(None, "gelu or swiglu (default: the preset's)", choices=("gelu", "swiglu"))
    tie_embeddings: bool | None = _f(None, "share the embedding and lm_head matrix (default: the preset's)")
    dropout: float = _f(0.0, "dropout probability", range="[0, 1)")
    block_size: int | None = _f(None, "context length (default: the preset's)", range="[1, inf)")
    dtype: str = _f("float32", "parameter dtype: float32, or float64 on the CPU for equivalence checks "
                    "(every optimizer then computes in float64)", choices=DTYPES)
    mlp_hidden: int | None = _f(None, "MLP hidden width; with --moe-experts each expert's (default: the "
                                "preset's)", range="[1, inf)")
    moe_experts: int = _f(0, "mixture of experts: E experts in every block's MLP (0: the dense MLP)", range="[0, inf)")
    moe_top_k: int = _f(2, "MoE: experts per token, k, in [1, E]", range="[1, inf)")
    moe_capacity_factor: float = _f(1.25, "MoE: each expert takes at most min(T, ceil(factor T k / E)) of a "
                                    "sequence's T tokens; the rest of its assignments are dropped", range="(0, inf)")
    moe_aux_loss_coef: float = _f(0.01, "MoE: load-balancing loss coefficient (Switch Transformer's alpha)", range="[0, inf)")


@dataclass
class DataConfig:
    data: str | list[str] = _f("shakespeare", "shakespeare (built in) or .txt/.md/.jsonl/.parquet files or "
                               "folders", nargs="+")
    tokenizer: str = _f("byte", "byte, bpe (trained locally on the training documents) or a tokenizer.json "
                        "file (HF tokenizers format; its vocabulary sets the model's)")
    vocab_size: int = _f(4096, "BPE vocabulary size (the byte tokenizer has 256; a tokenizer file has its own)", range="[1, inf)")
    text_field: str = _f("text", "JSONL field / parquet column holding the text")
    val_fraction: float = _f(0.1, "share of the documents held out for validation", range="(0, 1)")
    batch_size: int = _f(32, "sequences per microbatch", range="[1, inf)")
    grad_accum: int | None = _f(None, "microbatches per update, M (default 1; with a pipeline schedule "
                                "max(4, P-1), pipedream 1)", aliases=("--microbatches",), range="[1, inf)")


@dataclass
class OptimConfig:
    optimizer: str = _f("adamw", "adamw, muon, lion, soap, adan, mars, rotated-adam, sgd or lmo")
    lr: float | None = _f(None, "peak learning rate (default: the optimizer's)", range="(0, inf)")
    momentum: float | None = _f(None, "the optimizer's momentum knob (AdamW beta1, Muon momentum, ...)", range="[0, 1)")
    weight_decay: float | None = _f(None, "weight decay (default: the optimizer's)", range="[0, inf)")
    muon_ns_dtype: str = _f("auto", "Muon/LMO Newton-Schulz dtype: auto (bfloat16 on a GPU or a CPU with native "
                            "bf16, else float32), bfloat16 (torch's Muon bit for bit) or float32",
                            choices=("auto", "bfloat16", "float32"))


@dataclass
class LRScheduleConfig:
    lr_schedule: str = _f("cosine", "LR schedule after a linear warmup: cosine, wsd or constant",
                          choices=LR_SCHEDULES)
    warmup: int | None = _f(None, "warmup updates (default 5%% of steps)", range="[0, inf)")
    min_lr_ratio: float = _f(0.1, "final lr / peak lr (cosine, wsd)", range="[0, 1]")
    wsd_decay: float = _f(0.2, "WSD: fraction of steps in the final linear decay", range="(0, 1]")


@dataclass
class DelayConfig:
    delay: int | list[int] | None = _f(None, "gradient delay tau, 0 = synchronous; a list gives one tau per "
                                       "stage, e.g. 3,2,1,0 (default: the schedule's, else 0)", range="[0, inf)")
    delay_dist: str | None = _f(None, "variable delay, simulator only, in place of --delay: cycle:A,B,... (update "
                                "k's delay is the list's entry k mod n) or uniform:K / uniform:LO-HI (i.i.d. per "
                                "update, drawn from --seed); see docs/correctors.md")
    correction: str = _f("none", corrections.help_text())
    dc_lambda: float = _f(0.04, "DC-ASGD's lambda", range="[0, inf)")
    dc_lambda0: float = _f(2.0, "DC-ASGD-a's lambda0: lambda = lambda0 / sqrt(mean square of g + 1e-7)", range="[0, inf)")
    dc_ms_decay: float = _f(0.95, "DC-ASGD-a: EMA factor m of the gradient's mean square, in [0, 1)", range="[0, 1)")
    lookahead_momentum: float = _f(0.99, "lookahead: gamma of the look-ahead point x - gamma u_last, in [0, 1)", range="[0, 1)")
    damping: float = _f(1.0, "damp: c in lr / (1 + c tau)", range="[0, inf)")
    ef_dtype: str = _f("float32", "EF buffer dtype: float32 (the parameters' own; float64 in a float64 run) "
                       "or bfloat16 (half the bytes; simulator only)", choices=("float32", "bfloat16"))
    sync_start: int = _f(0, "first K updates undelayed (simulator only)", range="[0, inf)")
    sync_cooldown: int = _f(0, "last K updates undelayed (simulator only)", range="[0, inf)")


@dataclass
class ParallelConfig:
    schedule: str | None = _f(None, "pipeline schedule: 2bw (one-step delay), pipedream (delay P-1-s on stage "
                              "s), 1f1b or gpipe (flush every batch), torch-1f1b or torch-gpipe (torch's "
                              "runtime); default: from --delay (the pipeline: 2bw)", choices=PIPELINE_SCHEDULES)
    stages: int | None = _f(None, "pipeline stages P (default: the delay list's length, else 2 on a pipeline)", range="[1, inf)")
    dp: int | None = _f(None, "data-parallel replicas D: each takes 1/D of every microbatch (default: the "
                        "torchrun world size / P, else 1)", range="[1, inf)")
    dp_shard: bool = _f(False, "shard weights and optimizer state over the D replicas with FSDP2 "
                        "(fully_shard) instead of replicating them with DDP")
    timeout: float = _f(60.0, "pipeline: seconds a message may take before the run fails", range="(0, inf)")


@dataclass
class RunConfig:
    steps: int = _f(200, "optimizer updates", range="[1, inf)")
    seed: int = _f(0, "init and batch order", range="[0, 4294967296)")
    eval_every: int = _f(50, "updates between validations (simulator)", range="[1, inf)")
    eval_batches: int = _f(16, "fixed validation batches", range="[1, inf)")
    log_every: int = _f(10, "updates between metrics.jsonl lines", range="[1, inf)")
    ckpt_every: int = _f(100, "updates between checkpoints (0: none, unless --ckpt-final true)", range="[0, inf)")
    ckpt_final: bool | None = _f(None, "also a checkpoint at the last update (default: yes unless --ckpt-every 0); "
                                 "a stop (stop_at) always writes one")
    device: str = _f("auto", "auto (CUDA when present), cpu, cuda, cuda:1, ...")
    threads: int | None = _f(None, "torch CPU threads (per rank on a pipeline; default 1 there)", range="[1, inf)")
    progress: bool | None = _f(None, "progress: a bar on a terminal, else a line every DELAYLAB_PROGRESS_INTERVAL s "
                                     "(20); false: none")
    log: str = _f("none", "also log metrics to tensorboard or wandb (offline unless WANDB_MODE says otherwise)",
                  choices=LOGGERS)
    compile: bool = _f(False, "torch.compile each transformer block (one compiled graph, reused by every block: "
                       "a short compile; the first steps are slower)")
    deterministic: bool = _f(False, "deterministic kernels (torch.use_deterministic_algorithms, cuBLAS workspace "
                             ":4096:8, flash or math attention): exact resume on CUDA too, and slower")
    peak_tflops: float | None = _f(None, "the device's peak TFLOPS for MFU (default: the bf16 dense figure of a "
                                   "known GPU, none on the CPU)", range="(0, inf)")


SECTIONS = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig, "lr_schedule": LRScheduleConfig,
            "delay": DelayConfig, "parallel": ParallelConfig, "run": RunConfig}
# Fields that may differ between a checkpoint and the run that resumes it: none of them
# changes the trajectory of the weights.
RESUMABLE_CHANGES = ("threads", "ckpt_every", "ckpt_final", "progress", "timeout", "log", "peak_tflops")
# Names of earlier versions' flat configs (run folders made before the nested config).
_LEGACY = {"schedule": "lr_schedule", "pipeline": "schedule", "microbatches": "grad_accum"}


@functools.cache
def leaf_fields() -> dict[str, tuple[str, Any]]:
    """``{leaf name: (section name, dataclasses.Field)}`` for every field of every section."""
    return {f.name: (sec, f) for sec, cls in SECTIONS.items() for f in fields(cls)}


_SECTION_OF = {name: sec for name, (sec, _) in leaf_fields().items()}


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    lr_schedule: LRScheduleConfig = field(default_factory=LRScheduleConfig)
    delay: DelayConfig = field(default_factory=DelayConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __getattr__(self, name: str):
        """Read a leaf by its flat name (``cfg.lr`` is ``cfg.optim.lr``): leaf names are unique."""
        section = _SECTION_OF.get(name)
        if section is None:
            raise AttributeError(f"Config has no field {name!r}")
        return getattr(getattr(self, section), name)

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict | None = None, **overrides) -> "Config":
        """From a nested dict (``config.json``), a flat one (``{"lr": 1e-3}``), or both mixed,
        then ``overrides`` (flat). Unknown names raise :class:`ConfigError`."""
        flat = _flatten(d or {})
        flat.update(overrides)
        leaves = leaf_fields()
        unknown = sorted(set(flat) - set(leaves))
        if unknown:
            raise ConfigError(f"unknown config fields: {', '.join(unknown)}")
        parts = {sec: {} for sec in SECTIONS}
        for name, value in flat.items():
            parts[leaves[name][0]][name] = value
        cfg = cls(**{sec: SECTIONS[sec](**kw) for sec, kw in parts.items()})
        _check_types(cfg)
        return cfg

    def flat(self) -> dict:
        """``{leaf: value}`` for every field."""
        return {k: v for sec in SECTIONS for k, v in asdict(getattr(self, sec)).items()}

    def to_dict(self) -> dict:
        """Nested plain dict (what ``config.json`` holds)."""
        return {sec: asdict(getattr(self, sec)) for sec in SECTIONS}

    def replace(self, **flat) -> "Config":
        """A copy with some leaf fields changed (unresolved: resolve it again)."""
        return Config.from_dict(self.flat(), **flat)

    def differences(self, other: dict) -> list[str]:
        """Fields of ``other`` (a saved config, nested or flat) that would change this run."""
        theirs = Config.from_dict(other)
        if self.is_resolved:  # compare like with like: both with every open choice filled
            theirs = theirs.resolved(self._resolved_for, self._world_size)
        mine, theirs = self.flat(), theirs.flat()
        return [f"{k}={mine[k]!r} vs {theirs[k]!r}" for k in mine
                if k not in RESUMABLE_CHANGES and mine[k] != theirs[k]]

    # -- resolution and validation ------------------------------------------------------------
    @property
    def is_resolved(self) -> bool:
        return getattr(self, "_resolved_for", None) is not None

    def resolved(self, engine: str = "simulator", world_size: int = 1) -> "Config":
        """A checked copy with every open choice filled for ``engine`` in a world of ``world_size``
        processes (the default ``dp`` is ``world_size / P``); a resolved config returns itself
        (validation runs once). Raises :class:`ConfigError` (one line). A pure function of the
        config: the launcher gives the world size, and :func:`delaylab.llm.run.setup.resolve` adds
        the checks of the host and the engines."""
        if engine not in ENGINES:
            raise ConfigError(f"unknown engine {engine!r}")
        if getattr(self, "_resolved_for", None) == engine:
            return self
        cfg = Config.from_dict(self.flat())
        _check_ranges(cfg)
        _resolve_parallel(cfg, engine, world_size)
        _check_combinations(cfg, engine)
        cfg._resolved_for, cfg._world_size = engine, world_size
        return cfg

    # -- derived values (of a resolved config) -------------------------------------------------
    @property
    def delays(self) -> list[int]:
        d = self.delay.delay
        return [d] if isinstance(d, int) else list(d)

    @property
    def delayed(self) -> bool:
        return any(self.delays) or self.delay_distribution() is not None and self.delay_distribution().max > 0

    def delay_distribution(self):
        """The ``DelayDistribution`` of ``--delay-dist`` (seeded by the run's seed), or None."""
        from delaylab.optim.queue import DelayDistribution

        spec = self.delay.delay_dist
        return None if spec is None else DelayDistribution.parse(spec, seed=self.run.seed)

    @property
    def mode(self) -> str:
        """``sync`` or ``delayed``: a label for tables and summaries, not a setting."""
        return "delayed" if self.delayed else "sync"

    def model_config(self, vocab_size: int):
        m = self.model
        moe = ("moe_experts", "moe_top_k", "moe_capacity_factor", "moe_aux_loss_coef")
        over = {"vocab_size": vocab_size, "dropout": m.dropout, **{name: getattr(m, name) for name in moe}}
        for name in ("n_layer", "mlp", "tie_embeddings", "block_size", "mlp_hidden"):
            if getattr(m, name) is not None:
                over[name] = getattr(m, name)
        return preset(m.preset, **over)

    def resolved_lr(self) -> float:
        from delaylab.optim import DEFAULTS

        return self.optim.lr if self.optim.lr is not None else DEFAULTS[self.optim.optimizer]["lr"]

    def optimizer_kwargs(self) -> dict:
        """What ``delaylab.optim.build_optimizer`` takes besides the name and the parameters."""
        o = self.optim
        ns = {"ns_dtype": o.muon_ns_dtype} if o.optimizer in ("muon", "lmo") else {}
        return dict(lr=self.resolved_lr(), momentum=o.momentum, weight_decay=o.weight_decay, **ns)

    def correctors(self) -> list:
        """The run's delay correctors as objects (``--correction`` in the registry's order), each
        configured from the delay section's fields its class declares (``Corrector.keywords``):
        made here, once, and handed to ``Delayed``."""
        names, d = corrections.parse(self.delay.correction), self.delay
        known = {f.name for f in fields(DelayConfig)}
        return corrections.build(self.delay.correction, **{kw: getattr(d, kw) for n in names
                                           for kw in corrections.CORRECTORS[n].factory.keywords if kw in known})

    def ns_dtype(self) -> str | None:
        """The Newton-Schulz dtype this run computes in (``auto`` resolved on its device); None
        without Newton-Schulz."""
        if self.optim.optimizer not in ("muon", "lmo"):
            return None
        if self.model.dtype == "float64":
            return "float64"
        from delaylab.optim.registry import resolve_ns_dtype

        return str(resolve_ns_dtype(self.optim.muon_ns_dtype, self.torch_device())).removeprefix("torch.")

    def torch_device(self, local_rank: int | None = None):
        """``auto``: CUDA when present (``cuda:local_rank`` for a rank), else the CPU."""
        import torch

        dev = self.run.device
        if dev == "auto":
            dev = "cuda" if torch.cuda.is_available() else "cpu"
        if dev == "cuda" and local_rank is not None:
            return torch.device("cuda", local_rank)
        return torch.device(dev)

    def torch_dtype(self):
        import torch

        return {"float32": torch.float32, "float64": torch.float64}[self.model.dtype]


def _flatten(d: dict) -> dict:
    flat = {}
    for k, v in d.items():
        if k in SECTIONS and isinstance(v, dict):
            flat.update(v)
        else:
            flat[k] = v
    # Earlier versions' flat configs (they all have ``mode``): renamed fields, and the ``mode``
    # switch (the delay counted only in mode "delayed", where its default was 1).
    if "mode" in flat:
        for old, new in _LEGACY.items():
            if old in flat:
                flat[new] = flat.pop(old)
        mode = flat.pop("mode")
        if mode == "sync":
            flat["delay"] = 0
        elif flat.get("delay") is None:
            flat["delay"] = 1
    return flat


_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


def _check_types(cfg: Config) -> None:
    """Each value of the type its field declares (a malformed config file fails here, in one line)."""
    leaves = leaf_fields()
    for name, value in cfg.flat().items():
        kinds = leaves[name][1].type.replace(" ", "").split("|")
        ok = value is None and "None" in kinds
        for kind in kinds:
            if kind in _TYPES:
                ok |= isinstance(value, _TYPES[kind]) and not (kind != "bool" and isinstance(value, bool))
            elif kind.startswith("list["):
                inner = _TYPES[kind[5:-1]]
                ok |= isinstance(value, (list, tuple)) and all(isinstance(v, inner) for v in value)
        if not ok:
            raise ConfigError(f"{name} must be {' or '.join(kinds)}, got {value!r}")


def parse_range(text: str) -> tuple[float, bool, float, bool]:
    """``"[0, 1)"`` -> ``(0.0, True, 1.0, False)``: the bounds and whether each is included."""
    lo, hi = (float(t) for t in text[1:-1].split(","))
    return lo, text[0] == "[", hi, text[-1] == "]"


def range_error(name: str, text: str, value) -> str | None:
    """The one-line complaint about ``value`` for a field whose metadata ``range`` is ``text``, or
    None when it is inside (NaN never is; an open infinite bound keeps infinities out)."""
    lo, lo_in, hi, hi_in = parse_range(text)
    if (lo < value or lo_in and value == lo) and (value < hi or hi_in and value == hi):
        return None
    if math.isinf(hi):
        want = f"{'>=' if lo_in else '>'} {lo:g}"
    else:
        want = f"in {text}"
    return f"{name} must be {want}, got {value}"


def _check_ranges(cfg: Config) -> None:
    from delaylab.optim import OPTIMIZERS

    d = cfg.delay.delay
    if d is not None:
        taus = [d] if isinstance(d, int) else list(d)
        if not taus or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in taus):
            raise ConfigError(f"delay must be an integer >= 0 or a list of them, got {d}")
        if isinstance(d, (list, tuple)):
            cfg.delay.delay = taus[0] if len(taus) == 1 else taus
    if cfg.delay.delay_dist is not None:
        cfg.delay.delay_dist = cfg.delay_distribution().spec  # checks it (one line); the canonical form
        if d not in (None, 0):
            raise ConfigError(f"give --delay or --delay-dist, not both (got delay {d} and {cfg.delay.delay_dist})")
    leaves = leaf_fields()
    flat = cfg.flat()
    for name, (_, f) in leaves.items():
        options = f.metadata.get("choices")
        if options and flat[name] is not None and flat[name] not in options:
            raise ConfigError(f"unknown {name} {flat[name]!r} (choose from {', '.join(options)})")
        # Every numeric field declares its range (a test walks them): one loop checks them all.
        bounds, value = f.metadata.get("range"), flat[name]
        for v in (value if isinstance(value, (list, tuple)) else [value]):
            problem = None if v is None or bounds is None else range_error(name, bounds, v)
            if problem:
                raise ConfigError(problem)
    from delaylab.llm.data import tokenizer_file

    tokenizer_file(cfg.data.tokenizer)  # byte, bpe or a file that exists (its content: when loaded)
    if cfg.optim.optimizer not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer {cfg.optim.optimizer!r} (choose from {', '.join(OPTIMIZERS)})")
    if cfg.data.tokenizer == "bpe" and cfg.data.vocab_size <= 256:
        raise ConfigError(f"a BPE vocab_size must be > 256 (the byte alphabet), got {cfg.data.vocab_size}")
    if cfg.delay.sync_start + cfg.delay.sync_cooldown > cfg.run.steps:
        raise ConfigError("sync_start + sync_cooldown exceed steps")
    w = cfg.lr_schedule.warmup
    if w is not None and not 0 <= w <= cfg.run.steps:
        raise ConfigError(f"warmup must be in [0, steps], got {w}")
    try:
        cfg.model_config(256)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _resolve_parallel(cfg: Config, engine: str, world_size: int) -> None:
    """Fill schedule, delay, stages and grad_accum: one place for how they determine each other."""

    par, dl = cfg.parallel, cfg.delay
    given = dl.delay
    if isinstance(given, list) and par.stages is not None and par.stages != len(given):
        raise ConfigError(f"{len(given)} stage delays but stages={par.stages}")
    stages = par.stages or (len(given) if isinstance(given, list) else DEFAULT_STAGES)
    schedule = par.schedule
    if schedule is None and engine == "pipeline":
        taus = [given] * stages if isinstance(given, int) else given
        if given is None or taus == schedule_delays("2bw", stages):
            schedule = "2bw"
        elif taus == schedule_delays("1f1b", stages):
            schedule = "1f1b"
        elif taus == schedule_delays("pipedream", stages):
            schedule = "pipedream"
        else:
            raise ConfigError(f"no pipeline schedule gives delay {given} on {stages} stages: 2bw gives 1, "
                              f"pipedream {schedule_delays('pipedream', stages)}, 1f1b/gpipe 0")
    if schedule is not None:
        implied = schedule_delays(schedule, stages)
        implied_value = implied[0] if len(set(implied)) == 1 else implied
        if given is not None and given != implied_value and [given] * stages != implied:
            raise ConfigError(f"delay {given} contradicts schedule {schedule} on {stages} stages "
                              f"(which gives {implied_value}); give one of them")
        dl.delay = implied_value
        par.stages = stages
    else:  # the simulator with a delay and no schedule
        dl.delay = 0 if given is None else given
        par.stages = len(given) if isinstance(given, list) else par.stages
    par.schedule = schedule
    if par.dp is None:  # under torchrun the world is P x D (P = 1 for the simulator)
        par.dp = max(1, world_size // (par.stages if engine == "pipeline" else 1))
    if cfg.data.batch_size % par.dp:
        raise ConfigError(f"batch_size {cfg.data.batch_size} does not split over {par.dp} data-parallel "
                          f"replicas: give a multiple of {par.dp}")
    if cfg.data.grad_accum is None:
        cfg.data.grad_accum = 1 if schedule in (None, "pipedream") else max(4, stages - 1)


def _check_combinations(cfg: Config, engine: str) -> None:
    dl, par = cfg.delay, cfg.parallel
    dl.correction = corrections.canonical(dl.correction)  # checks the names and the combination
    if not set(corrections.parse(dl.correction)) <= set(CORRECTIONS_BY_ENGINE[engine]):
        raise ConfigError(f"the {engine} supports correction {' or '.join(CORRECTIONS_BY_ENGINE[engine])}, "
                          f"got {dl.correction!r}")
    if dl.delay_dist is not None:
        if engine == "pipeline" or par.schedule is not None:
            raise ConfigError("--delay-dist is for the simulator (`delaylab llm train`): a pipeline schedule sets its "
                              "own delays")
        queued = [n for n in corrections.parse(dl.correction) if n.startswith("dc-asgd") or n == "predict-momentum"]
        if queued:
            raise ConfigError(f"correction {queued[0]} is not defined for a delay distribution (ef, predict, "
                              f"lookahead, damp and drop are)")
    elif "drop" in corrections.parse(dl.correction):
        raise ConfigError("correction drop:K discards gradients by their delay: it needs --delay-dist (under a "
                          "constant delay every gradient has the same age)")
    if dl.correction != "none" and not cfg.delayed:
        raise ConfigError(f"correction {dl.correction!r} needs a delay (--delay 1, or a delayed schedule)")
    model = cfg.model_config(256)
    stages = par.stages or 1
    if stages > model.n_layer:
        raise ConfigError(f"{stages} stages but the model has only {model.n_layer} layers (use --n-layer)")
    if len(cfg.delays) > 1 and model.tie_embeddings:
        raise ConfigError("per-stage delays need untied embeddings (--tie-embeddings false): "
                          "the tied matrix would have two delays")
    if engine == "pipeline":
        if dl.ef_dtype != "float32":
            raise ConfigError("ef_dtype bfloat16 is supported by the simulator only")
        if dl.sync_start or dl.sync_cooldown:
            raise ConfigError("sync_start / sync_cooldown are not supported by the pipeline engine")
        if par.schedule.startswith("torch-") and stages < 2:
            raise ConfigError(f"{par.schedule} needs at least 2 stages")
        if par.schedule == "torch-1f1b" and cfg.data.grad_accum < stages:
            raise ConfigError(f"torch's Schedule1F1B needs microbatches >= stages = {stages}")
        if cfg.run.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"the pipeline places rank r on cuda:r; use device auto, cuda or cpu, "
                              f"not {cfg.run.device!r}")
        if par.dp_shard:
            raise ConfigError("--dp-shard (FSDP2) is for `delaylab llm train`: the pipeline replicates each stage "
                              "(FSDP2 is not wired into its weight versions)")


def warmup_updates(steps: int, warmup: int | None) -> int:
    """The linear warmup's length: ``warmup``, or by default 5% of the run's updates."""
    return steps // 20 if warmup is None else warmup


def lr_factor(k: int, cfg: Config) -> float:
    """Multiplier of the peak lr at update ``k`` (0-based): linear warmup, then the schedule."""
    s, steps = cfg.lr_schedule, cfg.run.steps
    warmup = warmup_updates(steps, s.warmup)
    if k < warmup:
        return (k + 1) / warmup
    lo = s.min_lr_ratio
    if s.lr_schedule == "constant":
        return 1.0
    if s.lr_schedule == "cosine":
        progress = (k - warmup) / max(1, steps - 1 - warmup)
        return lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    decay = max(1, round(s.wsd_decay * steps))  # WSD: warmup, stable, linear decay
    start = steps - decay
    return 1.0 if k < start else 1.0 - (1 - lo) * (k - start + 1) / decay


