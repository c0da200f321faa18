"""The event-driven simulator against the closed-form bubble model, and the timeline reductions."""

import math
import random
import statistics

import pytest

from delaylab.llm.pipeline.schedules import Action, Schedule
from delaylab.llm.pipeline.cost_model import Costs, predict, simulate
from delaylab.llm.pipeline.timeline import Event, Timeline, plot_timeline

CASES = [(P, M) for P in (2, 3, 4) for M in (P - 1, 4, 8) if M >= 1]


@pytest.mark.parametrize("P,M", CASES)
def test_equal_stages_free_sends_reproduce_the_bubble_model(P, M):
    rng = random.Random(P * 10 + M)
    f, b = rng.uniform(0.5, 2.0), rng.uniform(0.5, 3.0)
    costs = Costs.make(P, f, b)
    two_bw = predict("2bw", P, M, costs)
    assert math.isclose(two_bw["seconds_per_batch"], M * (f + b), rel_tol=1e-12)
    assert two_bw["bubble"] == pytest.approx(0.0, abs=1e-12)
    for name in ("gpipe", "1f1b"):
        sync = predict(name, P, M, costs)
        assert math.isclose(sync["seconds_per_batch"], (M + P - 1) * (f + b), rel_tol=1e-12)
        assert math.isclose(sync["seconds_per_batch"] / two_bw["seconds_per_batch"], (M + P - 1) / M)
        for idle in sync["idle_fraction"]:
            assert idle == pytest.approx((P - 1) / (M + P - 1), abs=1e-12)


@pytest.mark.parametrize("P", [2, 3, 4])
def test_pipedream_has_no_bubble_and_one_unit_per_update(P):
    out = predict("pipedream", P, 1, Costs.make(P, 1.0, 2.5))
    assert out["seconds_per_batch"] == pytest.approx(3.5)
    assert out["bubble"] == pytest.approx(0.0, abs=1e-12)


def test_flush_free_throughput_is_set_by_the_slowest_stage_plus_its_update():
    f, b, u = [1.0, 1.5, 0.5], [2.0, 3.0, 1.0], [0.2, 0.3, 0.1]
    out = predict("2bw", 3, 4, Costs.make(3, f, b, u))
    slowest = max(4 * (fs + bs) + us for fs, bs, us in zip(f, b, u))
    assert out["seconds_per_batch"] == pytest.approx(slowest)
    # The fastest stage waits for the others: idle = 1 - its work / the period.
    assert out["idle_fraction"][2] == pytest.approx(1 - (4 * 1.5 + 0.1) / slowest)


@pytest.mark.parametrize("P,M", [(2, 4), (3, 2), (4, 8)])
def test_gpipe_send_latency_adds_two_pipeline_traversals(P, M):
    f, b, c = 1.0, 2.0, 0.25
    out = predict("gpipe", P, M, Costs.make(P, f, b, send=c))
    assert out["seconds_per_batch"] == pytest.approx((M + P - 1) * (f + b) + 2 * (P - 1) * c)


def test_whole_run_makespan_of_one_gpipe_batch():
    # One batch: fill + drain by hand. Stage 1 starts F0 at f, ends the last B at
    # f + M f + M b; stage 0 then runs its backwards: one b after each arrival, last at +b.
    P, M, f, b = 2, 3, 1.0, 2.0
    tl = simulate(Schedule("gpipe", P, M, 1), Costs.make(P, f, b))
    assert tl.makespan == pytest.approx((M + P - 1) * (f + b))
    assert [(e.op, e.n, e.start) for e in tl.events[1]][:3] == [("F", 0, 1.0), ("F", 1, 2.0), ("F", 2, 3.0)]


def test_deadlock_and_out_of_order_messages_are_detected():
    # Both stages wait for the other first.
    lists = [[Action("B", 0, 0, recv=1)], [Action("F", 0, 0, recv=0, send=None)]]
    with pytest.raises(RuntimeError, match="deadlocks"):
        simulate(lists, Costs.make(2, 1, 1))
    swapped = [
        [Action("F", 0, 0, send=1), Action("F", 1, 0, send=1)],
        [Action("F", 1, 0, recv=0), Action("F", 0, 0, recv=0)],
    ]
    with pytest.raises(RuntimeError, match="expects F1 from stage 0 but the next message on that channel is F0"):
        simulate(swapped, Costs.make(2, 1, 1))
    with pytest.raises(ValueError, match="3 entries for 2 stages"):
        Costs.make(2, [1, 2, 3], 1)


def test_steady_state_of_a_hand_made_timeline():
    # Stage 0: updates end at 2, 5, 8, 11; busy 2 of every 3 seconds. Stage 1: always busy.
    ev0, ev1 = [], []
    for k in range(4):
        t = 3 * k
        ev0 += [Event(0, "F", k, t, t, t + 1.5), Event(0, "U", k, t + 1.5, t + 1.5, t + 2)]
        ev1 += [Event(1, "F", k, t - 1, t - 1, t + 1.5), Event(1, "U", k, t + 1.5, t + 1.5, t + 2)]
    st = Timeline([ev0, ev1]).steady_state(skip=1)  # window: U1..U2 = (5, 8]
    assert st["seconds_per_batch_per_stage"] == [3.0, 3.0]
    assert st["idle_fraction"] == pytest.approx([1 / 3, 0.0])
    assert st["bubble"] == pytest.approx(1 / 6)
    with pytest.raises(ValueError, match="too few updates"):
        Timeline([ev0[:4], ev1[:4]]).steady_state(skip=1)


def test_timeline_round_trips_and_plots(tmp_path):
    tl = simulate(Schedule("2bw", 3, 2, 4), Costs.make(3, 1.0, 2.0))
    back = Timeline.from_list(tl.to_list(), 3)
    assert back.events == tl.events
    costs = back.costs()
    assert costs["forward"] == [1.0] * 3 and costs["backward"] == [2.0] * 3
    fig = plot_timeline(tl, title="2bw")
    fig.savefig(tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_costs_measured_from_a_timeline_recover_the_simulated_ones():
    f, b, u, c = [1.0, 1.5], [2.0, 2.5], [0.25, 0.5], 0.125
    tl = simulate(Schedule("1f1b", 2, 4, 5), Costs.make(2, f, b, u, send=c))
    got = Costs.measured(tl)
    assert got == Costs.make(2, f, b, u, send=c)
    # Replaying the measured costs predicts the same run.
    assert simulate(Schedule("1f1b", 2, 4, 5), got).events == tl.events


def test_message_latency_counts_only_the_wait_after_both_sides_were_ready():
    # stage 0 sends F0 at t=1.0; stage 1 is ready at 1.0 and starts at 1.25: latency 0.25.
    # F1 is sent at 2.0, stage 1 becomes ready only at 3.0 and starts at 3.5: 0.5, not 1.5.
    # F2 arrives while stage 1 is busy (no wait): not counted.
    s0 = [Event(0, "F", 0, 0.0, 0.0, 1.0), Event(0, "F", 1, 1.0, 1.0, 2.0), Event(0, "F", 2, 2.0, 2.0, 2.5)]
    s1 = [Event(1, "F", 0, 1.0, 1.25, 3.0), Event(1, "F", 1, 3.0, 3.5, 4.0), Event(1, "F", 2, 4.0, 4.0, 5.0)]
    assert Timeline([s0, s1]).message_latency() == pytest.approx(statistics.median([0.25, 0.5]))
