"""The timing cost model: an event-driven replay of a schedule's action lists with per-action costs.

Each stage runs its actions in order. An action that receives a message starts when both the
stage is free and the message has arrived; a sent message arrives ``send`` seconds after
the sender's compute ends, and the sender does not wait for it (the engine's sends are
asynchronous). Messages on one channel (stage ``a`` to stage ``b``) are consumed in the
order they were sent, as gloo and NCCL match them, so a schedule whose sends and receives
disagree in order fails here instead of deadlocking on a real machine.

With equal stages and free sends this reproduces the bubble model exactly: a flushing
schedule (``gpipe``, ``1f1b``) needs ``(M + P - 1)(f + b)`` per batch, ``2bw``
``M (f + b)`` (tests/pipeline/test_cost_model.py). With per-stage costs measured on the
engine it predicts batch time and bubble fraction for any ``P`` and ``M``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

from delaylab.errors import ConfigError
from delaylab.llm.pipeline.schedules import Action, Schedule
from delaylab.llm.pipeline.timeline import Event, Timeline


def _per_stage(value: float | Sequence[float], stages: int, name: str) -> tuple[float, ...]:
    values = [float(value)] * stages if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) != stages:
        raise ConfigError(f"{name} has {len(values)} entries for {stages} stages")
    if any(not v >= 0 for v in values):
        raise ConfigError(f"{name} costs must be >= 0, got {values}")
    return tuple(values)


@dataclass(frozen=True)
class Costs:
    """Seconds per action: ``forward``/``backward``/``update`` per stage, ``send`` per message."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    update: tuple[float, ...]
    send: float = 0.0

    @classmethod
    def make(cls, stages: int, forward, backward, update=0.0, send: float = 0.0) -> "Costs":
        """Scalars apply to every stage; sequences give one value per stage."""
        if not send >= 0:
            raise ConfigError(f"send cost must be >= 0, got {send}")
        return cls(
            _per_stage(forward, stages, "forward"),
            _per_stage(backward, stages, "backward"),
            _per_stage(update, stages, "update"),
            float(send),
        )

    def of(self, stage: int, op: str) -> float:
        return {"F": self.forward, "B": self.backward, "U": self.update}[op][stage]

    @classmethod
    def measured(cls, timeline: Timeline) -> "Costs":
        """Median per-stage compute times and the message latency of a (real) run's timeline."""
        c = timeline.costs()
        return cls.make(timeline.stages, c["forward"], c["backward"], c["update"], timeline.message_latency())


def simulate(schedule: Schedule | Sequence[Sequence[Action]], costs: Costs) -> Timeline:
    """Replay ``schedule`` (or explicit per-stage action lists) with ``costs``; raise on deadlock."""
    lists = [schedule.actions(s) for s in range(schedule.stages)] if isinstance(schedule, Schedule) else [
        list(a) for a in schedule
    ]
    P = len(lists)
    if len(costs.forward) != P:
        raise ConfigError(f"costs are for {len(costs.forward)} stages, the schedule has {P}")
    channels: dict[tuple[int, int], deque] = {}  # (src, dst) -> deque of (op, n, arrival)
    ptr, clock = [0] * P, [0.0] * P
    events: list[list[Event]] = [[] for _ in range(P)]
    while True:
        progressed = False
        for s in range(P):
            while ptr[s] < len(lists[s]):
                a = lists[s][ptr[s]]
                start = clock[s]
                if a.recv is not None:
                    queue = channels.get((a.recv, s))
                    if not queue:
                        break  # not sent yet: another stage has to move first
                    op, n, arrival = queue[0]
                    if (op, n) != (a.op, a.n):
                        raise RuntimeError(
                            f"stage {s} expects {a.op}{a.n} from stage {a.recv} but the next "
                            f"message on that channel is {op}{n}"
                        )
                    queue.popleft()
                    start = max(start, arrival)
                end = start + costs.of(s, a.op)
                if a.send is not None:
                    channels.setdefault((s, a.send), deque()).append((a.op, a.n, end + costs.send))
                events[s].append(Event(s, a.op, a.n, clock[s], start, end))
                clock[s] = end
                ptr[s] += 1
                progressed = True
        if all(ptr[s] == len(lists[s]) for s in range(P)):
            break
        if not progressed:
            stuck = [f"stage {s} at {lists[s][ptr[s]]}" for s in range(P) if ptr[s] < len(lists[s])]
            raise RuntimeError("schedule deadlocks: " + ", ".join(stuck))
    left = {k: list(q) for k, q in channels.items() if q}
    if left:
        raise RuntimeError(f"messages sent but never received: {left}")
    return Timeline(events)


def predict(name: str, stages: int, microbatches: int, costs: Costs) -> dict:
    """Steady-state ``seconds_per_batch``, ``bubble`` and per-stage idle fractions of a schedule.

    Simulates enough updates that ``stages`` of them at either end (warm-up, cool-down) can be
    left out of the window.
    """
    skip = stages
    timeline = simulate(Schedule(name, stages, microbatches, 2 * skip + 6), costs)
    return {**timeline.steady_state(skip=skip), "makespan": timeline.makespan}
