"""The grids of ``delaylab reproduce``: what each preset runs, as plain data.

A preset has up to five parts: the GPT grid of findings 1-4 and the protocol's ablations
(:class:`LLMGrid`), the schedule comparison of finding 5 (:class:`ScheduleGrid`, per-stage
delays in the single-process simulator), the toy checks of finding 6 (:class:`ToyGrid`), the
tokens-per-parameter and model-size axes (:class:`ScaleGrid`) and the delay axis
(:class:`DelayGrid`); a part that is None is not run. Every field ends up in ``DIR/reproduce.json``, so a
folder is only ever resumed with the grid that started it.

Each CPU preset is sized to finish within 90 minutes on a 2-core CPU with two runs at a time,
one thread each (docs/reproduction.md has the measured times); ``ci`` runs every part of the
pipeline on a few seconds of training.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from delaylab.errors import ConfigError

MITIGATIONS = ("ef", "dc-asgd", "sync-start", "sync-cooldown")


@dataclass(frozen=True)
class LLMGrid:
    """Findings 1-4 on one model.

    ``base``: TrainConfig fields of every run. ``lrs``: the starting peak-lr grid per optimizer,
    extended by the plan's rule (``lr_extend``); finding 1 compares sync and delayed at each
    optimizer's best sync lr of it (the paper tunes lr per optimizer), finding 4 reads the whole
    grid of the ``lr_sweep`` optimizers. ``momentum``: the momentum of findings 1, 2 and 4
    (absent: the optimizer's default), given explicitly where ``momenta`` (finding 3's grid, at
    the best lr) contains it so the two share runs. ``sync_steps``: K of the sync-start and
    sync-cooldown mitigations. ``seeds``: every cell's base seeds (``optimizer_seeds`` may set an
    optimizer's own); which lr is best is decided on them.
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
    ablation_seeds: int | None = None  # None: ``seeds``
    # Protocol v3 (issue 24). ``lr_extend``: an lr grid grows by x2 / /2 while its best point is at
    # an edge, at most this many steps per side (then the optimum is reported censored).
    # ``headline``: optimizers whose best-sync-lr cell (sync, delayed, EF) adds seeds two at a time,
    # up to ``max_seeds``, until its gap's 95% t interval is narrower than half the gap.
    # ``overhead``: optimizers whose delayed (and EF) runs that miss sync's final loss are rerun
    # ``overhead_lengths`` times as long (schedule stretched) until they reach it.
    lr_extend: int = 2
    optimizer_seeds: dict[str, int] = field(default_factory=dict)  # an optimizer's own base seeds
    headline: tuple[str, ...] = ()
    max_seeds: int = 10
    overhead: tuple[str, ...] = ()
    overhead_lengths: tuple[float, ...] = (1.5, 2, 4)
    # Issue 36: the tolerance of a point claim, stated before any run (absent: a bare point, which the
    # one rule can only find undetermined or disagreeing). ``adamw_muon_gap_ratio``: around the paper's 23.
    tolerances: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ScaleGrid:
    """The tokens-per-parameter axis (and beside it the model-size axis, where several sizes share
    a ratio): ``modes`` of ``optimizers`` at each (size, ratio) point, ratios up to ``max_ratio``.

    A point's updates are ``ratio * params / (batch_size[size] * block_size)``, rounded, with the
    model's parameters counted for the run's vocabulary. Its peak lr is the best of a
    ``scan_seeds``-seed sync scan over ``lrs[opt]``, extended at an edge by ``lr_extend`` steps per
    side like every lr grid: the lr is tuned at every ratio (the optimum moves with the length).
    ``seeds``: the runs at that lr; ``max_seeds``: the power rule's cap (see :class:`LLMGrid`).
    """

    base: dict
    sizes: tuple[str, ...]
    ratios: tuple[float, ...]
    batch_size: dict[str, int]
    block_size: int
    optimizers: tuple[str, ...]
    lrs: dict[str, tuple[float, ...]]
    seeds: int
    max_ratio: dict[str, float] = field(default_factory=dict)
    modes: tuple[str, ...] = ("sync", "delayed", "ef")
    momentum: dict[str, float] = field(default_factory=dict)
    scan_seeds: int = 1
    lr_extend: int = 2
    max_seeds: int | None = None  # None: no seeds beyond ``seeds``
    evals: int = 12  # validations per run

    def points(self) -> list[tuple[str, float]]:
        return [(size, r) for size in self.sizes for r in self.ratios if r <= self.max_ratio.get(size, r)]


@dataclass(frozen=True)
class TokensGrid:
    """The tokens-per-parameter axis with its confounds pulled apart (issue 36): ``optimizer``'s sync
    and delayed runs at three kinds of point, each ``(size, ratio, schedule, batch)``:

    - ``cosine`` at every size and ratio, ``batch_size`` sequences per update (more tokens = more updates);
    - ``wide``: the largest ratio with ``wide_batch`` sequences, as many updates as the smallest ratio
      (more tokens, same updates; against ``cosine`` at the largest ratio: same tokens, more updates);
    - ``constant``: the largest ratio with the lr held after warmup (no decay: the gap read along
      it against cosine's says how much of its closing is the decay).

    At every point both modes' lrs are tuned over the same ``seeds`` seeds on ``lrs`` (grown at an edge
    by ``lr_extend`` steps per side), each mode its own best by the mean; the gap is the paired
    (same seed: same init and batches) delayed - sync difference at the two best lrs, read at every
    validation (``evals`` per run) as well as at the end.
    """

    base: dict
    sizes: tuple[str, ...]
    ratios: tuple[float, ...]
    batch_size: int
    wide_batch: int
    block_size: int
    optimizer: str
    lrs: tuple[float, ...]
    momentum: float | None
    seeds: int
    modes: tuple[str, ...] = ("sync", "delayed")
    lr_extend: int = 2
    evals: int = 12
    val_windows: int = 40  # every point validates on the same windows: a multiple of both batches

    def points(self) -> list[tuple[str, float, str]]:
        """``(size, ratio, kind)``: kind ``cosine``, ``wide`` or ``constant``."""
        top = max(self.ratios)
        return ([(size, r, "cosine") for size in self.sizes for r in self.ratios]
                + [(size, top, kind) for kind in ("wide", "constant") for size in self.sizes])


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
class DelaySetting:
    """One delay of the delay axis: a constant ``delay`` (an int, or one tau per pipeline stage as
    a tuple: the simulator's per-stage split, :func:`delaylab.llm.model.stage_ranges`, needs
    ``len(delay) <= n_layer`` and gives stage 0 the embedding, the last stage the head) or a
    ``delay_dist`` (``uniform:LO-HI``, ``cycle:A,B,...``). ``model``: TrainConfig fields the
    setting changes besides the delay (``{"n_layer": 8}`` for eight stages); its sync runs are
    then its own. ``modes``: the grid's modes where None; ``seeds``: its cells' seeds where not the
    grid's (a setting that is not a headline may have fewer, for time)."""

    name: str
    delay: int | tuple[int, ...] | None = None
    delay_dist: str | None = None
    model: dict = field(default_factory=dict)
    modes: tuple[str, ...] | None = None
    seeds: int | None = None

    @property
    def mean_delay(self) -> float:
        if self.delay_dist is not None:
            from delaylab.optim.queue import DelayDistribution

            return DelayDistribution.parse(self.delay_dist).mean
        d = self.delay if isinstance(self.delay, tuple) else (self.delay,)
        return sum(d) / len(d)


@dataclass(frozen=True)
class DelayGrid:
    """The delay axis (issue 28): sync and each delayed ``mode`` (a corrector list, e.g. ``ef+predict``)
    of every optimizer at every :class:`DelaySetting`.

    lr: sync's over ``lrs[opt]``; every mode's over its own grid at the ``tuned`` settings, in
    their order, each grid starting at the three lrs around the same mode's best at the previous
    tuned setting (the first around sync's best). Every grid is decided on ``scan_seeds`` seeds and
    grows at an edge by ``lr_extend`` steps per side (the plan's rule). At a setting that is not
    tuned, a mode's lr is interpolated between the tuned settings' optima, linear in log lr against
    log mean delay, and rounded to the nearest lr of the factor-2 lattice of ``lrs``; a setting with
    ``model`` overrides takes the lrs of the base model. Every reported cell has ``seeds`` seeds.
    ``overhead``: settings whose ``overhead_modes`` runs of seeds ``0..overhead_seeds-1`` that miss
    their seed's sync final loss are rerun ``overhead_lengths`` times as long (iso-loss overhead).
    """

    base: dict
    optimizers: tuple[str, ...]
    lrs: dict[str, tuple[float, ...]]
    momentum: dict[str, float]
    settings: tuple[DelaySetting, ...]
    tuned: tuple[str, ...]
    modes: tuple[str, ...] = ("delayed", "ef", "predict", "ef+predict")
    seeds: int = 4
    scan_seeds: int = 3
    lr_extend: int = 2
    overhead: tuple[str, ...] = ()
    overhead_modes: tuple[str, ...] = ("delayed",)
    overhead_seeds: int = 2
    overhead_lengths: tuple[float, ...] = (2, 4)

    def __post_init__(self):
        names = [s.name for s in self.settings]
        if len(set(names)) != len(names) or not self.tuned or not set(self.tuned) <= set(names):
            raise ConfigError(f"delay grid: setting names must be unique and the tuned ones among them, got {names} "
                              f"and tuned {list(self.tuned)}")
        tuned_modes = {m for n in self.tuned for m in self.modes_of(self.setting(n))}
        for s in self.settings:
            if (s.delay is None) == (s.delay_dist is None):
                raise ConfigError(f"delay setting {s.name}: give a delay or a delay_dist, not both or neither")
            untuned = set(self.modes_of(s)) - tuned_modes
            if untuned:
                raise ConfigError(f"delay setting {s.name}: mode {sorted(untuned)[0]} is tuned at no setting")
        if any(self.seeds_of(s) < max(2, self.overhead_seeds if s.name in self.overhead else 0) for s in self.settings):
            raise ConfigError("delay grid: every cell needs 2 seeds or more, and the overhead's seeds")
        if "delayed" not in self.modes:
            raise ConfigError("delay grid: the modes need 'delayed' (every recovery is a share of its gap)")

    def setting(self, name: str) -> DelaySetting:
        return next(s for s in self.settings if s.name == name)

    def modes_of(self, s: DelaySetting) -> tuple[str, ...]:
        return self.modes if s.modes is None else s.modes

    def seeds_of(self, s: DelaySetting) -> int:
        return self.seeds if s.seeds is None else s.seeds


@dataclass(frozen=True)
class FieldGrid:
    """The field's claims beside the delay axis (docs/field.md): what the :class:`DelayGrid` of the
    same preset does not run, on ``optimizer`` (Muon: marin's and Ringmaster's optimizer).

    - ``held``: its delayed runs at these settings with the lr held at tau-1's best delayed lr (marin
      kept one lr across tau); ``retuned``: settings whose delayed lr is tuned here as well (a grid
      around the delay axis's interpolated lr), so that with the delay axis's tuned settings the tau
      curve is tuned at every tau;
    - ``raw_momentum``: settings where weight prediction along the raw momentum runs
      (``predict-momentum``, at the lr of ``predict`` there);
    - ``random`` with ``drop``: the delay distribution and the staleness threshold K of the Ringmaster
      comparison, delayed against ``drop-K``, each mode's lr tuned on a grid around the delayed lr the
      delay axis interpolates at the distribution's mean delay;
    - ``budgets``: run lengths (multiples of the base's updates) at ``budget_setting``, where sync and
      delayed runs of seeds ``0..overhead_seeds-1`` measure the iso-loss token overhead (delayed reruns
      ``overhead_lengths`` times as long until they reach their seed's sync loss); every budget at the
      base budget's lrs.

    Each claim's region is :data:`FIELD_REGIONS`, stated before any run. ``scan_seeds``: seeds of every lr grid here; ``seeds``: of every reported cell.
    """

    optimizer: str
    held: tuple[str, ...]
    retuned: tuple[str, ...]
    raw_momentum: tuple[str, ...]
    random: str
    drop: int
    budget_setting: str
    budgets: tuple[float, ...]
    seeds: int
    scan_seeds: int
    overhead_seeds: int = 3
    overhead_lengths: tuple[float, ...] = (1.5, 2, 3)
    lr_extend: int = 2


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
    """A report's grids; a part that is None is not run (the tokens-per-parameter preset has only ``scale``)."""

    name: str
    summary: str
    llm: LLMGrid | None
    schedules: ScheduleGrid | None
    toy: ToyGrid | None
    scale: ScaleGrid | None = None
    notes: tuple[str, ...] = field(default=())
    delays: DelayGrid | None = None
    tokens: TokensGrid | None = None
    field: FieldGrid | None = None  # needs ``delays`` (its lrs and settings)
    estimate: str = ""  # its run count and wall time, stated before it starts (printed by ``reproduce``)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def base(self) -> dict:
        """The TrainConfig fields every GPT run of the preset starts from."""
        return next(g.base for g in (self.llm, self.scale, self.delays, self.tokens) if g is not None)


_RUN = dict(data="shakespeare", tokenizer="byte", threads=1, progress=False, device="cpu")

# The lrs of the paper's two headline optimizers, factor-2 steps around their best sync lr.
_MAIN_LRS = {"adamw": (1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2), "muon": (0.01, 0.02, 0.04, 0.08, 0.16)}

_TOY_FULL = ToyGrid(problems=("logdet", "matrix-sensing"), methods=("lmo-spectral", "lmo-sign", "lmo-l2"),
                    T=(100, 400, 1600), seeds=8)

# The delay axis (issue 28): uniform tau, PipeDream's per-stage delays (stage s of P waits P-1-s
# updates: delaylab.llm.pipeline.schedules; one block per stage, so P = 8 takes an 8-layer model, with
# the 2BW delay on it as its comparison) and a random delay of mean 2, the mean of tau = 2.
# The tuned settings (tau = 1 and 8) are the headline cells, 4 seeds; the others 3, and P = 8 (twice the
# layers, twice the time) without the single correctors (time: the preset was sized on a shared machine,
# docs/beyond.md "Delay axis").
_DELAY_SETTINGS = (
    DelaySetting("tau-1", 1), DelaySetting("tau-2", 2), DelaySetting("tau-4", 4), DelaySetting("tau-8", 8),
    DelaySetting("pipedream-4", (3, 2, 1, 0)),
    DelaySetting("pipedream-8", (7, 6, 5, 4, 3, 2, 1, 0), model={"n_layer": 8}, modes=("delayed", "ef+predict")),
    DelaySetting("2bw-8", 1, model={"n_layer": 8}, modes=("delayed",)),
    DelaySetting("uniform-0-4", delay_dist="uniform:0-4"),
)

# The field's claims (docs/field.md), each claim's region stated before any run. Shares in %, ratios as
# ratios; a direction is (0, None) or (None, 0). Tolerances: a point claim gets its own value +- a
# stated margin (marin's 53% / 45% closed by prediction: 30-70%; its 3.3x per-stage ratio: 2-5x; its
# near-linear tau curve: gap(8) / gap(2) between 3 and 8, where linear is 4 and marin measured 6.1).
FIELD_REGIONS = {
    "rotation_gap_smaller": (0, None),  # AdamW gap - rotated-Adam gap at the largest uniform tau
    "rotation_grows_with_depth": (0, None),  # that difference at the largest tau minus at tau 1
    "rotation_grows_with_pipeline": (0, None),  # AdamW - rotated-Adam gap, PipeDream P=8 minus P=4
    "muon_linear": (3.0, 8.0),  # gap(tau 8) / gap(tau 2), delayed Muon
    "predict_closes": (30.0, 70.0),  # % of Muon's gap closed by prediction along the update, tau 2 and 8
    "raw_momentum_worse": (None, 0.0),  # % recovered by prediction along the raw momentum, Muon: below none
    "dc_asgd_small": (None, 3.0),  # % recovered by DC-ASGD(-a), Muon
    "per_stage_milder": (2.0, 5.0),  # gap(uniform tau = P - 1) / gap(PipeDream P), Muon
    "overhead_falls": (0, None),  # overhead at the short budget - at the long one
    "drop_faster": (0, None),  # delayed - drop:K val loss under the random delay, equal updates
    "lookahead_beats_sync": (None, 0),  # lookahead's gap to sync
    "ef_recovers": (50.0, 90.0),  # % of the gap EF recovers at tau 1
    "two_bw_beats_pipedream": (0, None),  # PipeDream - 2BW val loss (the delay part scores it)
}

_FIELD_RUN = dict(preset="tiny", block_size=64, batch_size=8, steps=220, eval_every=22, eval_batches=8, log_every=10,
                  ckpt_every=110, **_RUN)

PRESETS: dict[str, Preset] = {
    "cpu-small": Preset(
        name="cpu-small",
        summary="tiny GPT (2 layers, d=64, context 64), 300 updates of 16 sequences, 5 seeds for AdamW and Muon "
                "(their best-sync-lr cells up to 10 by the power rule), 3 for Lion, SOAP, Adan and MARS, lr grids "
                "extended at an edge, with the lr, "
                "momentum, warmup, length and DC-ASGD ablations (3 seeds) and iso-loss overheads measured with "
                "runs up to 4x as long; schedules on the 4-layer small GPT (d=128, context 64), 220 updates, "
                "5 seeds; toy rates at T = 100..1600, 8 seeds",
        llm=LLMGrid(
            base=dict(preset="tiny", batch_size=16, steps=300, eval_every=25, eval_batches=8,
                      log_every=10, ckpt_every=100, **_RUN),
            optimizers=("adamw", "muon", "lion", "soap", "adan", "mars"),
            # Centred on each optimizer's best sync lr of a one-seed scan of this config (2026-12-02).
            lrs={**_MAIN_LRS, "lion": (3e-4, 1e-3, 3e-3), "soap": (3e-3, 1e-2, 3e-2),
                 "adan": (3e-3, 1e-2, 3e-2), "mars": (3e-3, 1e-2, 3e-2)},
            momentum={"adamw": 0.9, "muon": 0.95},
            # Stops at 0.95: beta1 = 0.98 would need beta2 > 0.9604 (AdamW's is 0.95) and
            # 10 / (1 - 0.98) = 500 updates after warmup (these runs have 285); plan.check_protocol.
            momenta={"adamw": (0.8, 0.9, 0.95), "muon": (0.8, 0.9, 0.95)},
            lr_sweep=("adamw", "muon"),
            seeds=5,
            sync_steps=30,
            ef_lrs=("adamw", "muon"),
            ablation_optimizers=("adamw", "muon"),
            warmup_fractions=(0.25,),
            length_factors=(4,),
            dc_lambdas=(0.04, 0.4, 4.0, 40.0, 400.0, 4000.0),
            dc_adaptive=True,
            ablation_seeds=3,
            optimizer_seeds={"lion": 3, "soap": 3, "adan": 3, "mars": 3},  # not headline cells: time
            headline=("adamw", "muon"),
            max_seeds=10,
            overhead=("adamw", "muon"),
        ),
        schedules=ScheduleGrid(
            overrides=dict(preset="small", block_size=64, steps=220, eval_every=22, ckpt_every=110),
            optimizers=("adamw", "muon"), lrs={"adamw": 2e-3, "muon": 0.02}, depths=(2, 4), seeds=5,
        ),
        toy=_TOY_FULL,
        notes=("depth 8 not in this preset (time): run it with n_layer=8 in the schedule overrides",
               "Lion (momentum beta2 0.99: 1000 updates after warmup) and Adan (beta1 0.98: 500) break the "
               "updates-after-warmup rule at 300 updates: their verdicts are undetermined",
               "the model-size and tokens-per-parameter axes are the cpu-tokens preset"),
    ),
    "cpu-quick": Preset(
        name="cpu-quick",
        summary="the small GPT (4 layers, d=128, context 64), 220 updates of 16 sequences, AdamW and Muon over "
                "3 lrs (extended at an edge), 5 seeds (best-sync-lr cells up to 10 by the power rule): the "
                "paper's ordering, EF and sync start, delayed runs up to 4x as long for the iso-loss overhead, "
                "2BW vs PipeDream at depth 2; toy rates",
        llm=LLMGrid(
            # 220 updates: 209 after the 5% warmup, the 200 Muon's momentum 0.95 needs (plan.check_protocol)
            base=dict(preset="small", block_size=64, batch_size=16, steps=220, eval_every=22, eval_batches=8,
                      log_every=10, ckpt_every=110, **_RUN),
            optimizers=("adamw", "muon"),
            lrs={"adamw": (2e-3, 4e-3, 8e-3), "muon": (0.01, 0.02, 0.04)},
            momentum={"adamw": 0.9, "muon": 0.95},
            momenta={},
            lr_sweep=("adamw", "muon"),
            seeds=5,
            sync_steps=22,
            mitigations=("ef", "sync-start"),
            headline=("adamw", "muon"),
            max_seeds=10,
            overhead=("adamw", "muon"),
        ),
        schedules=ScheduleGrid(overrides={}, optimizers=("adamw", "muon"), lrs={"adamw": 4e-3, "muon": 0.02},
                               depths=(2,), seeds=5),
        toy=ToyGrid(problems=("logdet",), methods=("lmo-spectral", "lmo-sign"), T=(100, 400, 1600), seeds=4,
                    compare_seeds=4),
    ),
    "cpu-tokens": Preset(
        name="cpu-tokens",
        summary="the tokens-per-parameter axis: AdamW and Muon, sync / delayed / EF, on the tiny GPT (0.14M "
                "parameters, batch 4 x 64) at 0.5, 2, 5 and 20 tokens per parameter and on the small GPT (0.86M, "
                "batch 8 x 64) at 0.5 (the model-size comparison), the lr tuned at every point by a one-seed sync scan (extended at an "
                "edge), 5 seeds",
        llm=None, schedules=None, toy=None,
        scale=ScaleGrid(
            base=dict(preset="tiny", eval_batches=8, log_every=10, **_RUN),
            sizes=("tiny", "small"), ratios=(0.5, 2.0, 5.0, 20.0), max_ratio={"small": 0.5},
            # tiny at 0.5 tokens/param with 8 sequences would be 132 updates, under the 200 after warmup
            # Muon's momentum 0.95 needs: 4 sequences give 264
            batch_size={"tiny": 4, "small": 8}, block_size=64, optimizers=("adamw", "muon"),
            lrs={"adamw": (1e-3, 2e-3, 4e-3), "muon": (0.01, 0.02, 0.04)},
            momentum={"adamw": 0.9, "muon": 0.95}, seeds=5,  # no seeds beyond 5 (time): an unresolved gap says so
        ),
        notes=("the small GPT stops at 0.5 tokens per parameter and the medium one is not run: time (small at 2 "
               "tokens per parameter alone would take about 45 min of the 90 on 2 cores)",),
    ),
    "cpu-tokens-2": Preset(
        name="cpu-tokens-2",
        summary="the tokens-per-parameter axis unconfounded: AdamW sync and delayed (2BW) on three GPT sizes "
                "(2 layers, d = 32 / 48 / 64: 0.04M, 0.08M, 0.14M parameters) at 2 and 20 tokens per "
                "parameter, 4 x 64-token batches and a cosine schedule; at 20 tokens per parameter also 40 x 64 "
                "(the updates of 2:1 with the tokens of 20:1) and a constant lr (no decay); both modes' lrs "
                "tuned at every point over 3 seeds; the gap read at every validation",
        llm=None, schedules=None, toy=None,
        tokens=TokensGrid(
            base=dict(_RUN),
            sizes=("nano", "micro", "tiny"), ratios=(2.0, 20.0), batch_size=4, wide_batch=40, block_size=64,
            optimizer="adamw", lrs=(2e-3, 4e-3, 8e-3), momentum=0.9, seeds=3,
        ),
        notes=("AdamW only and 3 seeds per lr (time: the preset was sized for about an hour of 2 cores); Muon's "
               "gap at these sizes is a few hundredths (cpu-tokens), under what 3 seeds resolve",),
    ),
    "cpu-delays": Preset(
        name="cpu-delays",
        summary="the delay axis: the small GPT (4 layers, d=128, context 64), 220 updates of 8 sequences, AdamW and "
                "Muon x none / EF / weight prediction / EF + prediction at tau = 1, 2, 4, 8, PipeDream's per-stage "
                "delays at P = 4 and 8 (P = 8 and its 2BW comparison on an 8-layer small GPT) and a random delay "
                "uniform on {0..4} (mean 2); sync's lr and every mode's tuned at tau = 1 and 8 (2-seed grids "
                "grown at an edge), interpolated in log tau elsewhere; 4 seeds per cell; iso-loss overhead "
                "of the delayed runs at tau = 1 and 8 (2 seeds, runs up to 4x as long)",
        llm=None, schedules=None, toy=None,
        delays=DelayGrid(
            # 220 updates: 209 after the 5% warmup, the 200 Muon's momentum 0.95 needs (plan.check_protocol);
            # 8 sequences (not cpu-quick's 16) to fit 90 min on 2 cores (docs/beyond.md, "Delay axis")
            base=dict(preset="small", block_size=64, batch_size=8, steps=220, eval_every=22, eval_batches=8,
                      log_every=10, ckpt_every=110, **_RUN),
            optimizers=("adamw", "muon"),
            lrs={"adamw": (5e-4, 1e-3, 2e-3), "muon": (0.01, 0.02, 0.04)},
            momentum={"adamw": 0.9, "muon": 0.95},
            settings=_DELAY_SETTINGS, tuned=("tau-1", "tau-8"),
            seeds=4, scan_seeds=2, lr_extend=2,
            overhead=("tau-1", "tau-8"), overhead_seeds=2, overhead_lengths=(2, 4),
        ),
        notes=("sized for 90 min on 2 cores: lr grids decided on 2 seeds, P = 8 without the single correctors, "
               "and the iso-loss "
               "overhead of the delayed runs (no corrector) of seeds 0 and 1 at tau = 1 and 8 only",),
    ),
    "cpu-field": Preset(
        name="cpu-field",
        summary="the field's claims side by side: the tiny GPT (2 layers, d=64, context 64), 220 updates of 8 "
                "sequences, AdamW, rotated Adam (basis rotation) and Muon x none / EF / weight prediction / "
                "look-ahead / DC-ASGD-a at tau = 1, 2, 4, 8, PipeDream's per-stage delays (the last stage fresh) "
                "at P = 4 and 8 beside 2BW and a uniform tau = P - 1 on 4- and 8-layer models; Muon's tau curve with "
                "the lr held at tau 1's and tuned at every tau, prediction along the raw momentum, Ringmaster's "
                "threshold drop:4 under a delay uniform on {0..8}, and the iso-loss token overhead at 220 and 550 "
                "updates; lrs tuned on 1-seed grids grown at an edge up to four steps per side (sync; each mode at tau 1 "
                "and 8), 5 seeds per cell (3 on the 8-layer model)",
        llm=None, schedules=None, toy=None,
        delays=DelayGrid(
            base=_FIELD_RUN,
            optimizers=("adamw", "rotated-adam", "muon"),
            # centred on cpu-small's best sync lrs on the same model (16 x 300: adamw 0.002, muon 0.04,
            # and SOAP's 0.01 for rotated Adam); grown at an edge, so only the start is reused
            lrs={"adamw": (1e-3, 2e-3, 4e-3), "rotated-adam": (2.5e-3, 5e-3, 1e-2), "muon": (0.02, 0.04, 0.08)},
            momentum={"adamw": 0.9, "rotated-adam": 0.9, "muon": 0.95},
            settings=(
                DelaySetting("tau-1", 1, modes=("delayed", "ef", "lookahead")),
                DelaySetting("tau-2", 2, modes=("delayed", "predict")),
                DelaySetting("tau-4", 4, modes=("delayed", "predict")),
                DelaySetting("tau-8", 8, modes=("delayed", "ef", "predict", "lookahead", "dc-asgd-a")),
                DelaySetting("pipedream-4", (3, 2, 1, 0), model={"n_layer": 4}, modes=("delayed", "lookahead")),
                DelaySetting("tau-3-l4", 3, model={"n_layer": 4}, modes=("delayed",)),
                DelaySetting("2bw-4", 1, model={"n_layer": 4}, modes=("delayed",)),
                DelaySetting("pipedream-8", (7, 6, 5, 4, 3, 2, 1, 0), model={"n_layer": 8}, modes=("delayed",),
                             seeds=3),
                DelaySetting("2bw-8", 1, model={"n_layer": 8}, modes=("delayed",), seeds=3),
            ),
            tuned=("tau-1", "tau-8"), modes=("delayed", "ef", "predict", "lookahead", "dc-asgd-a"),
            # four steps per side: with two, Muon's tau-8 optimum (and every lr interpolated from it) stayed
            # at its grid's low edge
            seeds=5, scan_seeds=1, lr_extend=4,
        ),
        field=FieldGrid(optimizer="muon", held=("tau-2", "tau-4", "tau-8"), retuned=("tau-2", "tau-4"),
                        raw_momentum=("tau-2", "tau-8"), random="uniform:0-8", drop=4, budget_setting="tau-4",
                        budgets=(1.0, 2.5), seeds=5, scan_seeds=1, overhead_seeds=5, lr_extend=4),
        estimate="at least 389 runs (where no lr grid grows; 473 in the committed report, where grids grew at their "
                 "edges); 22.2 min on 2 cores, 2 runs at a time, at a load average of 0.5 (measured, the committed "
                 "report); about 45 min at a load of 3.7 (the plan replayed on the 3-seed report's runs and per-run "
                 "times: 474-484 runs); at a load of 8 to 10 single runs take 2-4x longer (220 updates of the 2-layer "
                 "model: 20 s AdamW, 34 s Muon, 44 s rotated Adam; 4 layers 3.8x AdamW's)",
        notes=("sized for about 75 min of 2 cores (the estimate above): lr grids decided on one seed, 5 seeds per "
               "cell, 3 on the 8-layer model, the 4- and 8-layer settings at the lrs of the 2-layer one; momentum's "
               "effect is the cpu-small report's finding 3, not rerun here",),
    ),
    "ci-field": Preset(
        name="ci-field",
        summary="the field's claims on a few seconds of training, Muon only (checks the pipeline, not the science: "
                "its runs are too short for the protocol, so every verdict on them is undetermined)",
        llm=None, schedules=None, toy=None,
        delays=DelayGrid(
            base=dict(preset="nano", batch_size=2, block_size=16, steps=4, eval_every=2, eval_batches=1,
                      log_every=2, ckpt_every=4, **_RUN),
            optimizers=("muon",), lrs={"muon": (0.02,)}, momentum={"muon": 0.95},
            settings=(DelaySetting("tau-1", 1, modes=("delayed", "predict")),
                      DelaySetting("tau-2", 2, modes=("delayed", "predict")),
                      DelaySetting("pipedream-2", (1, 0), modes=("delayed",))),
            tuned=("tau-1",), modes=("delayed", "predict"), seeds=2, scan_seeds=1, lr_extend=0,
        ),
        field=FieldGrid(optimizer="muon", held=("tau-2",), retuned=("tau-2",), raw_momentum=("tau-2",),
                        random="uniform:0-2", drop=1, budget_setting="tau-2", budgets=(1.0, 2.0), seeds=2,
                        scan_seeds=1, overhead_seeds=2, overhead_lengths=(2,), lr_extend=0),
    ),
    "ci-delays": Preset(
        name="ci-delays",
        summary="the delay axis on a few seconds of training (checks the pipeline, not the science: its runs are too "
                "short for the protocol, so every verdict on them is undetermined)",
        llm=None, schedules=None, toy=None,
        delays=DelayGrid(
            base=dict(preset="tiny", batch_size=2, block_size=32, steps=16, eval_every=4, eval_batches=2,
                      log_every=4, ckpt_every=8, **_RUN),
            optimizers=("adamw", "muon"), lrs={"adamw": (1e-3, 2e-3), "muon": (0.01, 0.02)},
            momentum={"adamw": 0.9, "muon": 0.95},
            # every kind of setting: uniform (tuned, in order), per-stage on the base model and on a
            # 3-layer one with its own sync and 2BW rows, random
            settings=(DelaySetting("tau-1", 1), DelaySetting("tau-2", 2), DelaySetting("pipedream-2", (1, 0)),
                      DelaySetting("pipedream-3", (2, 1, 0), model={"n_layer": 3}, modes=("delayed",)),
                      DelaySetting("2bw-3", 1, model={"n_layer": 3}, modes=("delayed",)),
                      DelaySetting("uniform-0-2", delay_dist="uniform:0-2")),
            tuned=("tau-1", "tau-2"), modes=("delayed", "ef+predict"), seeds=2, scan_seeds=2, lr_extend=1,
            overhead=("tau-2",), overhead_seeds=1, overhead_lengths=(2,),
        ),
    ),
    "ci-tokens": Preset(
        name="ci-tokens",
        summary="the unconfounded tokens axis on a few seconds of training (checks the pipeline, not the science)",
        llm=None, schedules=None, toy=None,
        tokens=TokensGrid(base=dict(_RUN), sizes=("nano",), ratios=(0.1, 0.4), batch_size=2, wide_batch=8,
                          block_size=32, optimizer="adamw", lrs=(2e-3, 4e-3), momentum=0.9, seeds=2, lr_extend=0,
                          evals=4, val_windows=8),
    ),
    "ci": Preset(
        name="ci",
        summary="every part of the report on a few seconds of training (checks the pipeline, not the science: its "
                "GPT runs are too short for the protocol, so every verdict on them is undetermined)",
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
            lr_extend=1,
            headline=("adamw", "muon"),
            max_seeds=4,
            overhead=("adamw",),
            overhead_lengths=(1.5, 2),
        ),
        schedules=ScheduleGrid(overrides={}, optimizers=("adamw",), lrs={"adamw": 3e-3}, depths=(2,), seeds=2),
        toy=ToyGrid(problems=("logdet",), methods=("lmo-spectral",), T=(50, 100), seeds=2,
                    cost_T=100, cost_betas=(0.5, 0.9), compare_T=100,
                    compare_seeds=2),
        scale=ScaleGrid(base=dict(preset="tiny", eval_batches=2, log_every=4, **_RUN), sizes=("tiny", "small"),
                        ratios=(0.003, 0.006), max_ratio={"small": 0.003}, batch_size={"tiny": 2, "small": 2},
                        block_size=32, optimizers=("adamw", "muon"), lrs={"adamw": (1e-3, 3e-3), "muon": (0.01, 0.02)},
                        momentum={"adamw": 0.9, "muon": 0.95}, seeds=2, lr_extend=1, evals=4),
    ),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    return PRESETS[name]
