"""Pipeline schedules as pure data: one list of actions per stage, no processes involved.

An action is ``F(n)`` (forward of microbatch ``n``), ``B(n)`` (its backward) or ``U(k)``
(the stage's ``k``-th optimizer update). ``n`` is a *global* microbatch counter that is never
reset per batch; microbatch ``n`` belongs to group ``n // M`` (a group is the data of one
update: a batch of ``M`` microbatches). Every action also names the weight version it reads
(``F``/``B``) or writes (``U``), and the neighbour stage it receives from before computing
and sends to afterwards. The executor (``executor.py``) interprets these lists and nothing
else, so the four schedules run through one code path and differ only here.

Weight versions. ``V_k`` is a stage's weights after ``k`` updates. Every schedule here is
"group ``g`` runs on ``V_{g - tau_s}``" for a per-stage delay ``tau_s``, with
``V_{-j} := V_0`` (a start-up that fills the pipeline with the initial weights):

========== ======================= ====================================================
schedule   tau_s                   what it is
========== ======================= ====================================================
gpipe      0                       all F of a batch, then all B, then U (flush each batch)
1f1b       0                       warm-up ``P-1-s`` F, then F/B pairs, cool-down, U (flush)
2bw        1 on every stage        PipeDream-2BW: 1F1B order across batch boundaries, no
                                   flush; batch b runs on ``V_{b-1}``; needs ``M >= P-1``
pipedream  ``P-1-s``               PipeDream (weight stashing): one update per microbatch;
                                   ``M = 1``, i.e. the whole batch is the pipeline's unit
========== ======================= ====================================================

In ``delaylab.optim.Delayed`` terms: update ``k`` of stage ``s`` applies the gradient of
group ``k`` taken at ``V_{max(0, k - tau_s)}``. So ``gpipe``/``1f1b`` are ``delay=0``,
``2bw`` is ``delay=1`` and ``pipedream`` is the per-group ``delay=[P-1, P-2, ..., 0]``
with one param group per stage.

Why ``pipedream`` has ``tau_s = P-1-s``: in 1F1B order stage ``s`` runs ``F(m + w_s)``
right before ``B(m)``, with ``w_s = P-1-s`` forwards in flight, and updates after every
``B``. When ``F(m)`` starts, the updates from ``B(0) .. B(m - w_s - 1)`` are done: ``m - w_s``
of them. Weight stashing makes ``B(m)`` use that same version, so the gradient applied by
update ``m`` was taken ``w_s`` updates earlier. 2BW instead pins one version per *batch*:
its ``M`` microbatches all read ``V_{b-1}``, so two versions are live at most, and the
delay is one update on every stage, however deep the pipeline.

Why ``2bw`` needs ``M >= P-1``: stage ``s``'s update ``b`` follows ``F(bM + M - 1 + w_s)``,
and overwrites the slot of ``V_{b-1}`` with ``V_{b+1}``. No forward of batch ``b+2`` (the
first reader of ``V_{b+1}``) may run before that: ``(b+2)M > bM + M - 1 + w_s``, i.e.
``M >= w_s``, with ``w_0 = P-1`` the binding case (the paper's ``m >= d``).

Warm-up and cool-down. Each stage keeps ``tau_s + 1`` weight slots; version ``v`` lives in
slot ``v mod (tau_s + 1)``, and at the start all slots hold ``V_0`` (this is
``V_{-j} = V_0``). The flush-free schedules have one warm-up at the start of the run (or of a
resumed run) and one cool-down at its end. ``T`` steps means groups ``0 .. T-1`` on every
stage and ``T`` updates per stage; the single-process ``Delayed`` run with the same result
takes ``T + max_s tau_s`` calls, its last gradients never applied (``Delayed``'s convention;
the pipeline simply never computes them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator
from delaylab.errors import ConfigError
from delaylab.llm.config import schedule_delays

SCHEDULES = ("gpipe", "1f1b", "2bw", "pipedream")


@dataclass(frozen=True)
class Action:
    """One step of a stage: ``op`` in ``F``, ``B``, ``U``.

    ``n``: the microbatch (``F``/``B``) or the update index (``U``). ``version``: the weight
    version read (``F``/``B``) or written (``U``: ``n + 1``). ``recv``/``send``: the stage a
    tensor comes from before the compute / goes to after it (``None``: no message).
    """

    op: str
    n: int
    version: int
    recv: int | None = None
    send: int | None = None

    def __str__(self) -> str:
        if self.op == "U":
            return f"U{self.n}>v{self.version}"
        return f"{self.op}{self.n}@v{self.version}"


@dataclass(frozen=True)
class Schedule:
    """The action lists of schedule ``name`` for ``stages`` stages and ``microbatches`` per update.

    ``steps``: updates of every stage (groups ``0 .. steps-1``); ``start``: the first group,
    for a run resumed after update ``start - 1``.
    """

    name: str
    stages: int
    microbatches: int
    steps: int
    start: int = 0

    def __post_init__(self) -> None:
        check_config(self.name, self.stages, self.microbatches)
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1, got {self.steps}")
        if not 0 <= self.start < self.steps:
            raise ConfigError(f"start must be in [0, steps={self.steps}), got {self.start}")

    # -- the delay model --------------------------------------------------------------------
    def delay(self, stage: int) -> int:
        """``tau_s``: how many updates older than the current weights a stage's gradients are."""
        return schedule_delays(self.name, self.stages)[stage]

    def delays(self) -> list[int]:
        return schedule_delays(self.name, self.stages)

    def slots(self, stage: int) -> int:
        """Weight slots the stage keeps (versions live at once, at most)."""
        return self.delay(stage) + 1

    def group(self, n: int) -> int:
        return n // self.microbatches

    def version(self, stage: int, n: int) -> int:
        return self.group(n) - self.delay(stage)

    def updates(self) -> range:
        """The groups every stage forwards, backwards and applies (one update each)."""
        return range(self.start, self.steps)

    @property
    def calls(self) -> int:
        """``Delayed.step()`` calls of the single-process run with the same result (from ``start``)."""
        return self.steps - self.start + max(self.delays())

    # -- the action lists ---------------------------------------------------------------------
    def actions(self, stage: int) -> list[Action]:
        return list(self.iter_actions(stage))

    def iter_actions(self, stage: int) -> Iterator[Action]:
        """Stage ``stage``'s actions in order, generated lazily (a long run has millions)."""
        if not 0 <= stage < self.stages:
            raise ConfigError(f"stage must be in [0, {self.stages}), got {stage}")
        return (self._action(stage, op, n) for op, n in self._order(stage))

    def _order(self, s: int) -> Iterator[tuple[str, int]]:
        M = self.microbatches
        w = self.stages - 1 - s  # forwards in flight at stage s in 1F1B order
        if self.name in ("gpipe", "1f1b"):
            for b in self.updates():
                mbs = range(b * M, (b + 1) * M)
                if self.name == "gpipe":
                    yield from (("F", n) for n in mbs)
                    yield from (("B", n) for n in mbs)
                else:
                    yield from _interleave(mbs, mbs, min(w, M))
                yield ("U", b)
        else:  # flush-free: one warm-up and one cool-down for the whole run
            mbs = range(self.start * M, self.steps * M)
            for op, n in _interleave(mbs, mbs, min(w, len(mbs))):
                yield (op, n)
                if op == "B" and n % M == M - 1:  # the group's last backward
                    yield ("U", self.group(n))

    def _action(self, s: int, op: str, n: int) -> Action:
        P = self.stages
        if op == "U":
            return Action("U", n, n + 1)
        v = self.version(s, n)
        if op == "F":
            return Action("F", n, v, recv=s - 1 if s > 0 else None, send=s + 1 if s < P - 1 else None)
        return Action("B", n, v, recv=s + 1 if s < P - 1 else None, send=s - 1 if s > 0 else None)

    # -- printing ---------------------------------------------------------------------------
    def __str__(self) -> str:
        head = (
            f"{self.name}: P={self.stages} M={self.microbatches} steps={self.steps}"
            + (f" start={self.start}" if self.start else "")
            + f" delays={self.delays()}"
        )
        rows = [f"stage {s}: " + " ".join(map(str, self.iter_actions(s))) for s in range(self.stages)]
        return "\n".join([head, *rows])


def _interleave(fwd: range, bwd: range, warmup: int) -> Iterator[tuple[str, int]]:
    """1F1B order: ``warmup`` forwards, then one forward and one backward in turn, then the rest."""
    yield from (("F", n) for n in fwd[:warmup])
    rest = fwd[warmup:]
    for i, n in enumerate(bwd):
        if i < len(rest):
            yield ("F", rest[i])
        yield ("B", n)


def check_config(name: str, stages: int, microbatches: int, n_layer: int | None = None) -> None:
    """Raise ``ValueError`` (one line) for a configuration no schedule can run."""
    if name not in SCHEDULES:
        raise ConfigError(f"unknown schedule {name!r} (choose from {', '.join(SCHEDULES)})")
    if stages < 1:
        raise ConfigError(f"stages must be >= 1, got {stages}")
    if microbatches < 1:
        raise ConfigError(f"microbatches must be >= 1, got {microbatches}")
    if n_layer is not None and stages > n_layer:
        raise ConfigError(f"{stages} stages but the model has only {n_layer} layers (each stage needs one)")
    if name == "2bw" and microbatches < stages - 1:
        raise ConfigError(
            f"2bw with {stages} stages needs microbatches >= stages - 1 = {stages - 1} "
            f"(two weight versions suffice only then), got {microbatches}"
        )
    if name == "pipedream" and microbatches != 1:
        raise ConfigError(
            "pipedream updates after every pipeline unit; it runs whole batches: use microbatches=1"
        )
