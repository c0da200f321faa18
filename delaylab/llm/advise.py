"""Is asynchronous pipelining worth it for my model? Time to a target loss, per schedule.

An asynchronous schedule (PipeDream-2BW, PipeDream) has no flush, so an update takes less time,
but its delay costs extra tokens to reach the same loss (the iso-loss token overhead, measured
by a sweep). The wall time to a target is therefore

    time per update x updates of the synchronous run x token overhead,

with overhead 1 for the synchronous schedules. Time per update comes from the event-driven
cost model (:mod:`delaylab.llm.pipeline.cost_model`) for the schedules the engine runs (GPipe,
1F1B, 2BW, PipeDream), on per-stage costs given or measured. PipeDream takes a whole batch (M
microbatches' tokens) as its unit, so it is simulated with M-fold forward, backward and message
costs and one update per unit. Interleaved 1F1B and ZB-H1 are *modelled*, not run: the
published idle times per update relative to 1F1B's ``(P-1)(F+B)`` are ``1/v`` of it for
interleaved 1F1B with ``v`` chunks per rank (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM") and ``(F+B-2W)/(F+B)`` of it for
ZB-H1, W the weight-gradient part of the backward (Qi et al. 2024, "Zero Bubble Pipeline
Parallelism", arXiv 2401.10241). Those fractions are applied to the idle time the simulator
finds for 1F1B on the same costs (1F1B's time minus 2BW's, which has no steady-state bubble),
so that stage imbalance counts the same way for every schedule.

Memory is reported as weight versions and the microbatches of activations stage 0 holds.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

from delaylab._io import save_figure
from delaylab.errors import ConfigError
from delaylab.llm.pipeline.cost_model import Costs, predict

ENGINE_SCHEDULES = ("gpipe", "1f1b", "2bw", "pipedream")
MODELLED = ("interleaved-1f1b", "zb-h1")
ORDER = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "2bw", "pipedream")


@dataclass(frozen=True)
class Overheads:
    """Iso-loss token overhead of the delayed schedules (sync schedules: 1 by definition).
    ``source`` says where the numbers come from ("given", a sweep folder, or "assumed")."""

    twobw: float = 1.0
    pipedream: float | None = None  # None: as 2BW's (said in the output)
    source: str = "assumed (no overhead given: 1.0)"


def advise(stages: int, microbatches: int, costs: Costs, *, weight_grad: float | None = None, chunks: int = 2,
           updates: int = 1000, overheads: Overheads = Overheads()) -> dict:
    """One row per schedule: time per update, bubble, weight versions, activations in flight,
    delay, token overhead and predicted time to the target (``updates`` synchronous updates)."""
    P, M = stages, microbatches
    if P < 2:
        raise ConfigError(f"advise compares pipeline schedules: give stages >= 2, got {P}")
    if chunks < 1:
        raise ConfigError(f"chunks must be >= 1, got {chunks}")
    for name, v in (("overhead", overheads.twobw), ("pipedream overhead", overheads.pipedream)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"the {name} must be a ratio > 0, got {v}")
    F, B = max(costs.forward), max(costs.backward)  # the slowest stage sets the pace
    if not F + B > 0:
        raise ConfigError("the forward and backward times are both 0: nothing to compare")
    W = B / 2 if weight_grad is None else weight_grad
    if not 0 <= W <= B:
        raise ConfigError(f"the weight-gradient time W must be in [0, B = {B:g}], got {W:g}")
    unit = Costs.make(P, [f * M for f in costs.forward], [b * M for b in costs.backward], list(costs.update),
                      costs.send * M)  # PipeDream's unit: a whole batch
    sim = {name: predict(name, P, M, costs) for name in ENGINE_SCHEDULES if name != "pipedream"}
    sim["pipedream"] = predict("pipedream", P, 1, unit)
    times = {name: r["seconds_per_batch"] for name, r in sim.items()}
    bubble = {name: r["bubble"] for name, r in sim.items()}
    idle = max(0.0, times["1f1b"] - times["2bw"])  # 1F1B's flush, on these costs
    times["interleaved-1f1b"] = times["2bw"] + idle / chunks
    times["zb-h1"] = times["2bw"] + idle * (F + B - 2 * W) / (F + B)
    for name in MODELLED:  # 2BW's imbalance idle, plus what is left of the flush
        bubble[name] = 1 - (1 - bubble["2bw"]) * times["2bw"] / times[name]
    delay = {"2bw": 1, "pipedream": P - 1}
    versions = {"2bw": 2, "pipedream": P}
    activations = {"gpipe": M, "2bw": P, "pipedream": P}  # microbatches stage 0 holds
    pd_overhead = overheads.pipedream if overheads.pipedream is not None else overheads.twobw
    overhead = {"2bw": overheads.twobw, "pipedream": pd_overhead}
    rows = []
    for name in ORDER:
        t = times[name]
        rows.append({
            "schedule": name, "run_by_engine": name in ENGINE_SCHEDULES,
            "seconds_per_update": t, "bubble": bubble[name],
            "weight_versions": versions.get(name, 1), "activations_in_flight": activations.get(name, min(M, P)),
            "delay": delay.get(name, 0), "token_overhead": overhead.get(name, 1.0),
            "time_to_target_s": t * updates * overhead.get(name, 1.0),
        })
    best = min(rows, key=lambda r: r["time_to_target_s"])
    sync_best = min((r for r in rows if r["delay"] == 0), key=lambda r: r["time_to_target_s"])
    return {
        "stages": P, "microbatches": M, "chunks": chunks, "updates": updates,
        "costs": {"forward": F, "backward": B, "weight_grad": W, "weight_grad_assumed": weight_grad is None,
                  "update": max(costs.update), "send": costs.send},
        "overhead_source": overheads.source, "pipedream_overhead_assumed": overheads.pipedream is None,
        "rows": rows, "best": best["schedule"], "best_synchronous": sync_best["schedule"],
        "async_speedup": sync_best["time_to_target_s"] / min(r["time_to_target_s"] for r in rows if r["delay"]),
    }


def render(result: dict) -> str:
    c = result["costs"]
    lines = [f"P={result['stages']} M={result['microbatches']}, per microbatch and stage: F {c['forward']:.4g} s, "
             f"B {c['backward']:.4g} s, W {c['weight_grad']:.4g} s{' (assumed B/2)' if c['weight_grad_assumed'] else ''}"
             f", update {c['update']:.4g} s, send {c['send']:.3g} s",
             f"token overhead: {result['overhead_source']}"
             + ("; PipeDream's taken as 2BW's" if result["pipedream_overhead_assumed"] else ""),
             f"{'schedule':<17} {'s/update':>9} {'bubble':>7} {'versions':>8} {'acts':>5} {'delay':>5} "
             f"{'overhead':>8} {'time to target':>15}"]
    for r in result["rows"]:
        tag = "" if r["run_by_engine"] else "  (modelled)"
        lines.append(f"{r['schedule']:<17} {r['seconds_per_update']:>9.4g} {r['bubble']:>7.1%} {r['weight_versions']:>8} "
                     f"{r['activations_in_flight']:>5} {r['delay']:>5} {r['token_overhead']:>8.3f} "
                     f"{r['time_to_target_s']:>13.4g} s{tag}")
    if "check" in result:
        k = result["check"]
        lines.append(f"check: {k['schedule']} measured {k['measured_s']:.4g} s per update, predicted "
                     f"{k['predicted_s']:.4g} s (x{k['measured_over_predicted']:.3f})")
    verdict = "worth it" if result["async_speedup"] > 1 else "not worth it"
    lines.append(f"best: {result['best']}; async over the best synchronous schedule ({result['best_synchronous']}): "
                 f"x{result['async_speedup']:.3f} ({verdict} at this overhead)")
    return "\n".join(lines)


def plot(result: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bars = ax.bar([r["schedule"] for r in rows], [r["time_to_target_s"] for r in rows],
                  color=["tab:orange" if r["delay"] else "tab:blue" for r in rows])
    for bar, r in zip(bars, rows):
        if not r["run_by_engine"]:
            bar.set_hatch("//")
    ax.set_ylabel("predicted time to target (s)")
    ax.set_title(f"P={result['stages']}, M={result['microbatches']}: blue sync, orange async, hatched modelled",
                 fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
