"""The schedules' action lists, checked directly: coverage, order, messages, weight versions."""

from collections import Counter

import pytest

from delaylab.llm.pipeline import schedules
from delaylab.llm.pipeline.schedules import SCHEDULES, Schedule, check_config


def configs():
    for P in (1, 2, 3, 4):
        for M in (1, 2, 3, 4, 8):
            for name in SCHEDULES:
                if name == "2bw" and M < P - 1 or name == "pipedream" and M != 1:
                    continue
                for steps in (P + 2, P + 5):
                    for start in (0, 2):
                        yield name, P, M, steps, start


CONFIGS = list(configs())


def expected_version(name, P, M, s, n):
    """The schedule semantics, written independently of schedules.py."""
    b = n // M
    return {"gpipe": b, "1f1b": b, "2bw": b - 1, "pipedream": n - (P - 1 - s)}[name]


@pytest.mark.parametrize("name,P,M,steps,start", CONFIGS)
def test_every_microbatch_forwarded_and_backwarded_once_and_updates_in_order(name, P, M, steps, start):
    sched = Schedule(name, P, M, steps, start)
    for s in range(P):
        acts = sched.actions(s)
        groups = range(start, steps)
        f = [a.n for a in acts if a.op == "F"]
        b = [a.n for a in acts if a.op == "B"]
        assert Counter(f) == Counter(range(start * M, steps * M)), (s, f)
        assert Counter(b) == Counter(n for g in groups for n in range(g * M, (g + 1) * M)), (s, b)
        pos = {(a.op, a.n): i for i, a in enumerate(acts)}
        assert all(pos[("F", n)] < pos[("B", n)] for n in b)
        ups = [a for a in acts if a.op == "U"]
        assert [u.n for u in ups] == list(groups)
        for u in ups:  # an update follows every backward of its group, and no later one
            assert u.version == u.n + 1
            last = max(pos[("B", n)] for n in range(u.n * M, (u.n + 1) * M))
            assert pos[("U", u.n)] > last
            assert all(pos[("B", n)] > pos[("U", u.n)] for n in b if n // M > u.n)


@pytest.mark.parametrize("name,P,M,steps,start", CONFIGS)
def test_sends_and_receives_of_neighbours_match_one_to_one_in_order(name, P, M, steps, start):
    sched = Schedule(name, P, M, steps, start)
    acts = [sched.actions(s) for s in range(P)]
    for s in range(P):
        for a in acts[s]:
            assert a.recv in (None, s - 1 if a.op == "F" else s + 1)
            assert a.send in (None, s + 1 if a.op == "F" else s - 1)
            if a.op == "F":
                assert (a.recv is None) == (s == 0) and (a.send is None) == (s == P - 1)
            if a.op == "B":
                assert (a.recv is None) == (s == P - 1) and (a.send is None) == (s == 0)
            if a.op == "U":
                assert a.recv is None and a.send is None
    for s in range(P - 1):
        down = [a.n for a in acts[s] if a.send == s + 1]
        assert down == [a.n for a in acts[s + 1] if a.recv == s]
        assert all(a.op == "F" for a in acts[s] if a.send == s + 1)
        up = [a.n for a in acts[s + 1] if a.send == s]
        assert up == [a.n for a in acts[s] if a.recv == s + 1]
        assert all(a.op == "B" for a in acts[s + 1] if a.send == s)


def replay_versions(sched, s):
    """Replay a stage's weight slots; return the most versions live at once.

    Slot ``v mod (tau+1)`` holds version ``v``; at the start every slot holds V_0 (as
    versions -tau..0), and a run resumed at group ``start`` begins with the versions
    ``start - tau .. start`` that the checkpoint after update ``start - 1`` holds. A forward must find its version in place, a backward must find it
    still there, and an update may overwrite only a slot no microbatch in flight is using.
    """
    tau = sched.delay(s)
    k = tau + 1
    slot = {v % k: v for v in range(sched.start - tau, sched.start + 1)}
    in_flight, newest, most = {}, sched.start, 1
    for a in sched.actions(s):
        if a.op == "F":
            assert slot[a.version % k] == a.version, f"stage {s}: {a} finds v{slot[a.version % k]}"
            in_flight[a.n] = a.version
        elif a.op == "B":
            assert in_flight.pop(a.n) == a.version
            assert slot[a.version % k] == a.version, f"stage {s}: {a}'s weights were overwritten"
        else:
            assert a.version == newest + 1
            overwritten = slot[a.version % k]
            assert overwritten not in in_flight.values(), f"stage {s}: {a} overwrites v{overwritten} in use"
            slot[a.version % k] = newest = a.version
        most = max(most, len(set(in_flight.values()) | {newest}))
    return most


@pytest.mark.parametrize("name,P,M,steps,start", CONFIGS)
def test_weight_versions(name, P, M, steps, start):
    sched = Schedule(name, P, M, steps, start)
    for s in range(P):
        for a in sched.actions(s):
            if a.op in "FB":
                assert a.version == expected_version(name, P, M, s, a.n)
        most = replay_versions(sched, s)
        assert most <= {"gpipe": 1, "1f1b": 1, "2bw": 2, "pipedream": P - s}[name]


@pytest.mark.parametrize("P", [2, 3, 4])
def test_pipedream_delay_derived_from_the_action_list(P):
    """Weight stashing reads the newest weights at F(n): count the updates before it."""
    sched = Schedule("pipedream", P, 1, 12)
    for s in range(P):
        done = 0
        for a in sched.actions(s):
            if a.op == "U":
                done += 1
            elif a.op == "F":
                assert max(0, a.version) == done  # V_{-j} = V_0
                assert a.n - done == min(a.n, sched.delay(s)) == min(a.n, P - 1 - s)


def test_2bw_rejects_too_few_microbatches_and_the_bound_is_tight(monkeypatch):
    with pytest.raises(ValueError, match="microbatches >= stages - 1"):
        Schedule("2bw", 4, 2, 5)
    replay_versions(Schedule("2bw", 4, 3, 5), 0)  # M = P-1 is enough
    # Without the check, M = P-2 starts batch b+2 before V_{b+1} exists.
    monkeypatch.setattr(schedules, "check_config", lambda *a, **k: None)
    with pytest.raises(AssertionError, match="F4@v1 finds v-1"):
        replay_versions(Schedule("2bw", 4, 2, 5), 0)


@pytest.mark.parametrize(
    "args,match",
    [
        (("zb", 2, 4), "unknown schedule"),
        (("2bw", 0, 4), "stages must be >= 1"),
        (("1f1b", 2, 0), "microbatches must be >= 1"),
        (("pipedream", 2, 4), "microbatches=1"),
        (("gpipe", 5, 4, 4), "only 4 layers"),
    ],
)
def test_bad_configurations_raise_one_line_value_errors(args, match):
    with pytest.raises(ValueError, match=match) as err:
        check_config(*args)
    assert "\n" not in str(err.value)


def test_printed_2bw_schedule_matches_the_hand_derived_order():
    text = str(Schedule("2bw", 2, 1, 3))
    assert text.splitlines() == [
        "2bw: P=2 M=1 steps=3 delays=[1, 1]",
        # warm-up F0; steady F(n+1) B(n) U(n); cool-down B2 U2. Batch b reads V_{b-1}.
        "stage 0: F0@v-1 F1@v0 B0@v-1 U0>v1 F2@v1 B1@v0 U1>v2 B2@v1 U2>v3",
        "stage 1: F0@v-1 B0@v-1 U0>v1 F1@v0 B1@v0 U1>v2 F2@v1 B2@v1 U2>v3",
    ]


@pytest.mark.parametrize("name,P,M,steps,start", [c for c in CONFIGS if c[3] == c[1] + 5])
def test_a_stop_at_k_runs_every_stage_through_the_list_of_a_run_that_ends_at_k(name, P, M, steps, start):
    """Preemption (delaylab.llm.distributed.preempt): the ranks agree on K before any of them begins
    group K, and every stage's executor then skips the groups >= K of its list. What remains must be
    the list of a run of K steps, whose messages pair up and which stop_at runs (and resumes) exactly.
    The executor's own filter is the one checked, with a gate that says no from group K on."""
    from types import SimpleNamespace

    from delaylab.llm.pipeline.executor import StageExecutor

    full = Schedule(name, P, M, steps, start)
    for K in range(start + 1, steps + 1):
        asked = []

        def gate(g, K=K):
            asked.append(g)
            return g < K

        for s in range(P):
            ex = SimpleNamespace(schedule=full, index=s, gate=gate)
            assert list(StageExecutor._actions(ex)) == Schedule(name, P, M, K, start).actions(s), (K, s)
        assert all(g > start for g in asked)  # the first group is entered before the gate exists
