"""The grids of ``delaylab reproduce``: what each preset runs, as plain data.

A preset has up to four parts: the GPT grid of findings 1-4 and the protocol's ablations
(:class:`LLMGrid`), the schedule comparison of finding 5 (:class:`ScheduleGrid`, per-stage
delays in the single-process simulator), the toy checks of finding 6 (:class:`ToyGrid`) and the
scale axis (:class:`ScaleGrid`, optional). Every field ends up in ``DIR/reproduce.json``, so a
folder is only ever resumed with the grid that started it.

``cpu-small`` (the full protocol) took 67 min on a 2-core CPU with two runs at a time, one
thread each; ``cpu-quick`` (AdamW vs Muon on the small GPT) 12 min; ``ci`` runs every part of
the pipeline on a few seconds of training.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from delaylab.errors import ConfigError

MITIGATIONS = ("ef", "dc-asgd", "sync-start", "sync-cooldown")


@dataclass(frozen=True)
class LLMGrid:
    """Findings 1-4 on one model.

    ``base``: TrainConfig fields of every run. ``lrs``: the peak-lr grid per optimizer; finding 1
    compares sync and delayed at each optimizer's best sync lr of it (the paper tunes lr per
    optimizer), finding 4 reads the whole grid of the ``lr_sweep`` optimizers. ``momentum``: the
    momentum of findings 1, 2 and 4 (absent: the optimizer's default), given explicitly where
    ``momenta`` (finding 3's grid, at the best lr) contains it so the two share runs.
    ``sync_steps``: K of the sync-start and sync-cooldown mitigations.
    """

    base: dict
    optimizers: tuple[str, ...]
    lrs: dict[str, tuple[float, ...]]
    momentum: dict[str, float]
    momenta: dict[str, tuple[float, ...]]
    lr_sweep: tuple[str, ...]
    seeds: int
    sync_steps: int
    mitigations: tuple[str, ...] = MITIGATIONS
    # Protocol v2 (each empty = not run). ``ef_lrs``: optimizers whose EF runs also cover the two
    # lrs next to the best sync lr. The ablations run ``ablation_modes`` of
    # ``ablation_optimizers`` at the best sync lr: warmup as a fraction of the updates, the run
    # length as a multiple of ``base["steps"]``, DC-ASGD's lambda, and DC-ASGD-a.
    ef_lrs: tuple[str, ...] = ()
    ablation_optimizers: tuple[str, ...] = ()
    ablation_modes: tuple[str, ...] = ("sync", "delayed", "ef")
    warmup_fractions: tuple[float, ...] = ()
    length_factors: tuple[int, ...] = ()
    dc_lambdas: tuple[float, ...] = ()
    dc_adaptive: bool = False


@dataclass(frozen=True)
class ScaleGrid:
    """The scale axis: ``modes`` of ``optimizers`` at every model size, one tokens-per-parameter ratio.

    ``steps[size]`` = tokens_per_param * params / (batch_size * block_size), rounded (a test
    checks it against the model). The peak lr is the best of a one-seed sync scan over
    ``lrs[opt]`` at each size in ``scan_sizes``; a size without a scan takes the lr of the
    largest scanned size below it (transferred, not tuned: said in the report).
    """

    sizes: tuple[str, ...]
    steps: dict[str, int]
    tokens_per_param: float | None  # None: steps chosen for speed, no ratio (ci)
    batch_size: int
    block_size: int
    optimizers: tuple[str, ...]
    lrs: dict[str, tuple[float, ...]]
    scan_sizes: tuple[str, ...]
    seeds: int
    modes: tuple[str, ...] = ("sync", "delayed", "ef")
    evals: int = 12  # validations per run


@dataclass(frozen=True)
class ScheduleGrid:
    """Finding 5: sync, PipeDream-2BW (tau = 1 everywhere) and PipeDream's per-stage delays.

    ``overrides`` change the LLM grid's base (the model must have at least ``max(depths)``
    layers: one per stage). Every schedule updates once per batch of the same size, so only
    the delay pattern differs between them.
    """

    overrides: dict
    optimizers: tuple[str, ...]
    lrs: dict[str, float]
    depths: tuple[int, ...]
    seeds: int


@dataclass(frozen=True)
class ToyGrid:
    """Finding 6: ``delaylab toy rates`` (every problem x LMO method x {sync, tau=1, EF}),
    the delay's cost at fixed (eta, beta) and the sync/delayed/EF comparison with EF's drift."""

    problems: tuple[str, ...]
    methods: tuple[str, ...]
    T: tuple[int, ...]
    seeds: int
    cost_problem: str = "logdet"
    cost_method: str = "lmo-spectral"
    cost_T: int = 1000
    cost_betas: tuple[float, ...] = (0.0, 0.5, 0.8, 0.9, 0.95, 0.99)
    compare_problem: str = "logdet"
    compare_T: int = 1000
    compare_seeds: int = 8


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    llm: LLMGrid
    schedules: ScheduleGrid
    toy: ToyGrid
    scale: ScaleGrid | None = None
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return asdict(self)


_RUN = dict(data="shakespeare", tokenizer="byte", threads=1, progress=False, device="cpu")

# The lrs of the paper's two headline optimizers, factor-2 steps around their best sync lr.
_MAIN_LRS = {"adamw": (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2), "muon": (0.01, 0.02, 0.04, 0.08, 0.16)}

PRESETS: dict[str, Preset] = {
    "cpu-small": Preset(
        name="cpu-small",
        summary="tiny GPT (2 layers, d=64, context 64), 300 updates of 16 sequences, 3 seeds, with the lr, "
                "momentum, warmup, length and DC-ASGD ablations; schedules on the 4-layer small GPT (d=128, "
                "context 64), 200 updates, 3 seeds; a scale axis tiny / small / medium (0.14M / 0.86M / 2.3M "
                "parameters) at 0.5 tokens per parameter, 2 seeds; toy rates at T = 100..1600, 8 seeds",
        llm=LLMGrid(
            base=dict(preset="tiny", batch_size=16, steps=300, eval_every=25, eval_batches=8,
                      log_every=10, ckpt_every=100, **_RUN),
            optimizers=("adamw", "muon", "lion", "soap", "adan", "mars"),
            # Centred on each optimizer's best sync lr of a one-seed scan of this config (2026-12-02).
            lrs={**_MAIN_LRS, "lion": (3e-4, 1e-3, 3e-3), "soap": (3e-3, 1e-2, 3e-2),
                 "adan": (3e-3, 1e-2, 3e-2), "mars": (3e-3, 1e-2, 3e-2)},
            momentum={"adamw": 0.9, "muon": 0.95},
            # Stops at 0.95: beta1 = 0.98 would need beta2 > 0.9604 (AdamW's is 0.95) and
            # 10 / (1 - 0.98) = 500 updates after warmup (these runs have 285); check_protocol.
            momenta={"adamw": (0.8, 0.9, 0.95), "muon": (0.8, 0.9, 0.95)},
            lr_sweep=("adamw", "muon"),
            seeds=3,
            sync_steps=30,
            ef_lrs=("adamw", "muon"),
            ablation_optimizers=("adamw", "muon"),
            warmup_fractions=(0.25,),
            length_factors=(4,),
            dc_lambdas=(0.04, 0.4, 4.0, 40.0, 400.0, 4000.0),
            dc_adaptive=True,
        ),
        schedules=ScheduleGrid(
            overrides=dict(preset="small", block_size=64, steps=200, eval_every=20, ckpt_every=100),
            optimizers=("adamw", "muon"), lrs={"adamw": 2e-3, "muon": 0.02}, depths=(2, 4), seeds=3,
        ),
        toy=ToyGrid(problems=("logdet", "matrix-sensing"), methods=("lmo-spectral", "lmo-sign", "lmo-l2"),
                    T=(100, 400, 1600), seeds=8),
        scale=ScaleGrid(
            sizes=("tiny", "small", "medium"), steps={"tiny": 132, "small": 841, "medium": 2270},
            tokens_per_param=0.5, batch_size=8, block_size=64, optimizers=("adamw", "muon"),
            lrs={"adamw": (1e-3, 2e-3, 4e-3), "muon": (0.01, 0.02, 0.04)}, scan_sizes=("tiny", "small"),
            seeds=2,
        ),
        notes=("depth 8 not in this preset (time): run it with n_layer=8 in the schedule overrides",
               "the medium model's lr is the small model's best (no scan at medium: time)"),
    ),
    "cpu-quick": Preset(
        name="cpu-quick",
        summary="the small GPT (4 layers, d=128, context 64), 200 updates of 16 sequences, AdamW and Muon over "
                "3 lrs, 4 seeds: the paper's ordering, EF and sync start, 2BW vs PipeDream at depth 2; toy rates",
        llm=LLMGrid(
            base=dict(preset="small", block_size=64, batch_size=16, steps=200, eval_every=20, eval_batches=8,
                      log_every=10, ckpt_every=100, **_RUN),
            optimizers=("adamw", "muon"),
            lrs={"adamw": (2e-3, 4e-3, 8e-3), "muon": (0.01, 0.02, 0.04)},
            momentum={"adamw": 0.9, "muon": 0.95},
            momenta={},
            lr_sweep=("adamw", "muon"),
            seeds=4,
            sync_steps=20,
            mitigations=("ef", "sync-start"),
        ),
        schedules=ScheduleGrid(overrides={}, optimizers=("adamw", "muon"), lrs={"adamw": 4e-3, "muon": 0.02},
                               depths=(2,), seeds=4),
        toy=ToyGrid(problems=("logdet",), methods=("lmo-spectral", "lmo-sign"), T=(100, 400, 1600), seeds=4,
                    compare_seeds=4),
    ),
    "ci": Preset(
        name="ci",
        summary="every part of the report on a few seconds of training (checks the pipeline, not the science)",
        llm=LLMGrid(
            base=dict(preset="tiny", batch_size=4, block_size=32, steps=24, eval_every=4, eval_batches=2,
                      log_every=4, ckpt_every=12, **_RUN),
            optimizers=("adamw", "muon"),
            lrs={"adamw": (1e-3, 3e-3), "muon": (0.01, 0.02)},
            momentum={"adamw": 0.9, "muon": 0.95},
            momenta={"adamw": (0.8, 0.9), "muon": (0.9, 0.95)},
            lr_sweep=("adamw", "muon"),
            seeds=2,
            sync_steps=4,
            ef_lrs=("adamw",),
            ablation_optimizers=("adamw",),
            warmup_fractions=(0.25,),
            length_factors=(2,),
            dc_lambdas=(0.04, 40.0),
            dc_adaptive=True,
        ),
        schedules=ScheduleGrid(overrides={}, optimizers=("adamw",), lrs={"adamw": 3e-3}, depths=(2,), seeds=2),
        toy=ToyGrid(problems=("logdet",), methods=("lmo-spectral",), T=(50, 100), seeds=2,
                    cost_T=100, cost_betas=(0.5, 0.9), compare_T=100,
                    compare_seeds=2),
        scale=ScaleGrid(sizes=("tiny", "small"), steps={"tiny": 12, "small": 16}, tokens_per_param=None,
                        batch_size=2, block_size=32, optimizers=("adamw", "muon"),
                        lrs={"adamw": (1e-3, 3e-3), "muon": (0.01, 0.02)}, scan_sizes=("tiny",), seeds=2,
                        evals=4),
    ),
}


def check_protocol(p: Preset) -> None:
    """The momentum grid's rules: AdamW's beta1^2 < beta2 (else its second moment lags the first),
    and at least 10 / (1 - beta) updates after warmup (the momentum's memory, ten times over)."""
    from delaylab.optim.registry import DEFAULTS

    g = p.llm
    steps = g.base["steps"]
    after_warmup = steps - g.base.get("warmup", steps // 20)
    beta2 = DEFAULTS["adamw"]["betas"][1]
    for opt, grid in g.momenta.items():
        for m in grid:
            if opt == "adamw" and not m * m < beta2:
                raise ConfigError(f"preset {p.name}: AdamW beta1 {m} needs beta2 > {m * m:.4f}, has {beta2}")
            if steps >= 100 and 10 / (1 - m) > after_warmup:  # ci's runs are too short to mean anything
                raise ConfigError(f"preset {p.name}: momentum {m} needs {10 / (1 - m):.0f} updates after warmup, "
                                  f"the runs have {after_warmup}")


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    check_protocol(PRESETS[name])
    return PRESETS[name]
