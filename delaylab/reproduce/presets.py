"""The grids of ``delaylab reproduce``: what each preset runs, as plain data.

A preset has three parts: the GPT grid of findings 1-4 (:class:`LLMGrid`), the schedule
comparison of finding 5 (:class:`ScheduleGrid`, per-stage delays in the single-process
simulator) and the toy checks of finding 6 (:class:`ToyGrid`). Every field ends up in
``DIR/reproduce.json``, so a folder is only ever resumed with the grid that started it.

``cpu-small`` is sized for a 2-core CPU in under an hour with two runs at a time, one thread
each; ``ci`` runs every part of the pipeline on a few seconds of training.
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
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return asdict(self)


_RUN = dict(data="shakespeare", tokenizer="byte", threads=1, progress=False, device="cpu")

PRESETS: dict[str, Preset] = {
    "cpu-small": Preset(
        name="cpu-small",
        summary="tiny GPT (2 layers, d=64, context 64), 300 updates of 16 sequences, 3 seeds; schedules on "
                "the 4-layer small GPT (d=128, context 64), 200 updates, 3 seeds; toy rates at T = 100..1600, 8 seeds",
        llm=LLMGrid(
            base=dict(preset="tiny", batch_size=16, steps=300, eval_every=100, eval_batches=16,
                      log_every=10, ckpt_every=100, **_RUN),
            optimizers=("adamw", "muon", "lion", "soap", "adan", "mars"),
            # Centred on each optimizer's best sync lr of a one-seed scan of this config (2026-12-02).
            lrs={"adamw": (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2), "muon": (0.01, 0.02, 0.04, 0.08, 0.16),
                 "lion": (3e-4, 1e-3, 3e-3), "soap": (3e-3, 1e-2, 3e-2), "adan": (3e-3, 1e-2, 3e-2),
                 "mars": (3e-3, 1e-2, 3e-2)},
            momentum={"adamw": 0.9, "muon": 0.95},
            momenta={"adamw": (0.8, 0.9, 0.95, 0.98), "muon": (0.8, 0.9, 0.95, 0.98)},
            lr_sweep=("adamw", "muon"),
            seeds=3,
            sync_steps=30,
        ),
        schedules=ScheduleGrid(
            overrides=dict(preset="small", block_size=64, steps=200, eval_every=100, ckpt_every=100),
            optimizers=("adamw", "muon"), lrs={"adamw": 2e-3, "muon": 0.02}, depths=(2, 4), seeds=3,
        ),
        toy=ToyGrid(problems=("logdet", "matrix-sensing"), methods=("lmo-spectral", "lmo-sign", "lmo-l2"),
                    T=(100, 400, 1600), seeds=8),
        notes=("depth 8 not in this preset (time): run it with n_layer=8 in the schedule overrides",),
    ),
    "ci": Preset(
        name="ci",
        summary="every part of the report on a few seconds of training (checks the pipeline, not the science)",
        llm=LLMGrid(
            base=dict(preset="tiny", batch_size=4, block_size=32, steps=24, eval_every=12, eval_batches=2,
                      log_every=4, ckpt_every=12, **_RUN),
            optimizers=("adamw", "muon"),
            lrs={"adamw": (1e-3, 3e-3), "muon": (0.01, 0.02)},
            momentum={"adamw": 0.9, "muon": 0.95},
            momenta={"adamw": (0.8, 0.9), "muon": (0.9, 0.95)},
            lr_sweep=("adamw", "muon"),
            seeds=2,
            sync_steps=4,
        ),
        schedules=ScheduleGrid(overrides={}, optimizers=("adamw",), lrs={"adamw": 3e-3}, depths=(2,), seeds=2),
        toy=ToyGrid(problems=("logdet",), methods=("lmo-spectral",), T=(50, 100), seeds=2,
                    cost_T=100, cost_betas=(0.5, 0.9), compare_T=100,
                    compare_seeds=2),
    ),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    return PRESETS[name]
