"""What a pipeline did when: per-stage events, steady-state batch time, idle (bubble) fractions.

One format for both sources: the cost model's replay (``cost_model.py``) and the real
engine's own clock (``executor.py``), so a prediction and a measurement are reduced by the
same code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from statistics import median
from delaylab.errors import ConfigError, MissingFile


@dataclass(frozen=True)
class Event:
    """Stage ``stage`` computed ``op`` ``n`` (``F``, ``B`` or ``U``) from ``start`` to ``end``.

    ``ready``: when the stage turned to this action (``start - ready`` is time spent waiting
    for a message).
    """

    stage: int
    op: str
    n: int
    ready: float
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass
class Timeline:
    events: list[list[Event]]  # per stage, in execution order

    @property
    def stages(self) -> int:
        return len(self.events)

    @property
    def makespan(self) -> float:
        starts = [e[0].ready for e in self.events if e]
        ends = [e[-1].end for e in self.events if e]
        return max(ends) - min(starts) if ends else 0.0

    def to_list(self) -> list[dict]:
        return [asdict(e) for evs in self.events for e in evs]

    @classmethod
    def from_list(cls, rows: list[dict], stages: int) -> "Timeline":
        events: list[list[Event]] = [[] for _ in range(stages)]
        for r in rows:
            events[r["stage"]].append(Event(**r))
        return cls(events)

    def costs(self) -> dict[str, list[float]]:
        """Median compute time of ``F``, ``B`` and ``U`` per stage (``nan`` if a stage has none)."""
        out: dict[str, list[float]] = {}
        for op, key in (("F", "forward"), ("B", "backward"), ("U", "update")):
            out[key] = [
                median(d) if (d := [e.duration for e in evs if e.op == op]) else float("nan")
                for evs in self.events
            ]
        return out

    def message_latency(self) -> float:
        """Median delay from a send's end (or the receiver's readiness, if later) to the receiver's
        start, over messages it waited for.

        Activations flow from stage ``s`` to ``s+1`` (``F``), gradients back (``B``). A receiver
        that was already waiting starts as soon as the message lands, so the gap is the
        transfer time plus the wake-up; ``0.0`` if no receiver ever waited.
        """
        ends = {(s, e.op, e.n): e.end for s, evs in enumerate(self.events) for e in evs if e.op != "U"}
        gaps = []
        for s, evs in enumerate(self.events):
            for e in evs:
                src = s - 1 if e.op == "F" else s + 1 if e.op == "B" else None
                sent = ends.get((src, e.op, e.n))
                if sent is not None and e.start > e.ready and sent <= e.start:
                    # only the wait after both sides were ready: a receiver that became ready
                    # after the send ended waited on its own posting, not on the wire
                    gaps.append(e.start - max(sent, e.ready))
        return median(gaps) if gaps else 0.0

    def steady_state(self, skip: int = 1) -> dict:
        """Per-batch time and idle fraction between updates, away from warm-up and cool-down.

        Per stage, the window runs from the end of its update ``first + skip`` to the end of
        its update ``last - skip`` (``first``/``last``: the stage's first and last update);
        the batch time is the window's length per update, a stage's idle fraction the share of
        the window it did not compute. ``seconds_per_batch`` averages the stages (in a steady
        state they agree), ``bubble`` averages their idle fractions.
        """
        per_batch, idle = [], []
        for evs in self.events:
            ups = [e for e in evs if e.op == "U"]
            lo, hi = skip, len(ups) - 1 - skip
            if hi <= lo:
                raise ConfigError(
                    f"too few updates ({len(ups)}) for a steady-state window with skip={skip}"
                )
            t0, t1 = ups[lo].end, ups[hi].end
            busy = sum(max(0.0, min(e.end, t1) - max(e.start, t0)) for e in evs)
            per_batch.append((t1 - t0) / (hi - lo))
            idle.append(1.0 - busy / (t1 - t0) if t1 > t0 else 0.0)
        return {
            "seconds_per_batch": sum(per_batch) / len(per_batch),
            "seconds_per_batch_per_stage": per_batch,
            "idle_fraction": idle,
            "bubble": sum(idle) / len(idle),
        }


_COLORS = {"F": "#4C72B0", "B": "#DD8452", "U": "#55A868"}


def plot_timeline(timeline: Timeline, ax=None, title: str | None = None, microbatches: int | None = None):
    """Gantt chart, one row per stage; ``F``/``B`` boxes carry their microbatch number.

    With ``microbatches`` given, the label is the batch number instead, which keeps wide
    charts readable. Returns the figure.
    """
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, nothing global
    from matplotlib.patches import Rectangle

    if ax is None:
        fig = Figure(figsize=(10, 0.6 + 0.45 * timeline.stages), layout="constrained")
        ax = fig.subplots()
    else:
        fig = ax.figure
    t0 = min(e[0].ready for e in timeline.events if e)
    for s, evs in enumerate(timeline.events):
        for e in evs:
            ax.barh(s, e.duration, left=e.start - t0, height=0.8, color=_COLORS[e.op],
                    edgecolor="white", linewidth=0.5)
            if e.op != "U" and e.duration > 0:
                label = e.n // microbatches if microbatches else e.n
                ax.text(e.start - t0 + e.duration / 2, s, str(label), ha="center", va="center",
                        fontsize=6, color="white")
    ax.set_yticks(range(timeline.stages), [f"stage {s}" for s in range(timeline.stages)])
    ax.invert_yaxis()
    ax.set_xlabel("time")
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in _COLORS.values()]
    ax.legend(handles, ["forward", "backward", "update"], loc="lower right", bbox_to_anchor=(1.0, 1.0),
              fontsize=7, ncol=3, frameon=False, borderaxespad=0.1)
    if title:
        ax.set_title(title, fontsize=9, loc="left")
    return fig


def load_timeline(folder) -> tuple["Timeline", dict]:
    """A pipeline run folder's measured timeline and its summary."""
    import json
    from pathlib import Path

    folder = Path(folder)
    if not (folder / "timeline.json").is_file() or not (folder / "summary.json").is_file():
        raise MissingFile(f"{folder}: not a finished `delaylab llm pipeline` run (timeline.json, summary.json)")
    data = json.loads((folder / "timeline.json").read_text())
    return Timeline.from_list(data["events"], data["stages"]), json.loads((folder / "summary.json").read_text())
