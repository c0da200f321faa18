"""Proof of semantics: the multi-process pipeline equals the single-process simulator bit for bit.

One launch per stage count runs every configuration back to back (``run_jobs``), then each
test compares a run's final weights with the single-process reference of the same config.
The prototype's finding holds for every optimizer here: using the optimizer's own update on
the same tensors (re-targeted between weight slots) and the trainer's accumulation order
leaves nothing to round differently, so max |diff| is exactly 0.
"""

import pytest

from delaylab.llm.run.rank import run_jobs

from pipeline_helpers import load_model, max_abs_diff, reference_model, small

pytestmark = pytest.mark.dist

OPTIMIZERS = ("sgd", "adamw", "muon")
CORRECTIONS = ("none", "ef")


def jobs_for(P):
    jobs = {(f"2bw-{o}-{c}"): small(schedule="2bw", stages=P, grad_accum=max(P - 1, 2), optimizer=o, correction=c)
            for o in OPTIMIZERS for c in CORRECTIONS}
    jobs["pipedream-adamw"] = small(schedule="pipedream", stages=P, grad_accum=1, optimizer="adamw", correction="ef")
    if P == 2:  # the synchronous schedules need no more depth to be told apart from 2bw
        jobs["gpipe-muon"] = small(schedule="gpipe", stages=P, grad_accum=3, optimizer="muon")
        jobs["1f1b-adamw"] = small(schedule="1f1b", stages=P, grad_accum=3, optimizer="adamw")
        # torch.distributed.pipelining's runtime on the same stages, data and optimizer.
        jobs["torch-1f1b-adamw"] = small(schedule="torch-1f1b", stages=P, grad_accum=3, optimizer="adamw")
        jobs["torch-gpipe-sgd"] = small(schedule="torch-gpipe", stages=P, grad_accum=2, optimizer="sgd")
    return jobs


@pytest.fixture(scope="module", params=[2, 3, 4], ids=lambda p: f"P{p}")
def pipeline_runs(request, tmp_path_factory):
    P = request.param
    root = tmp_path_factory.mktemp(f"eq{P}")
    jobs = jobs_for(P)
    summaries = run_jobs([(cfg, root / name) for name, cfg in jobs.items()])
    return P, root, jobs, dict(zip(jobs, summaries))


def _check(pipeline_runs, name):
    P, root, jobs, summaries = pipeline_runs
    cfg = jobs[name]
    got, ref = load_model(root / name), reference_model(cfg)
    assert summaries[name]["steps"] == cfg.steps == 10
    assert max_abs_diff(got, ref) == 0.0, f"P={P} {name}"
    return got


@pytest.mark.timeout(240)
@pytest.mark.parametrize("opt", OPTIMIZERS)
@pytest.mark.parametrize("corr", CORRECTIONS)
def test_2bw_equals_delayed_simulator_bitwise(pipeline_runs, opt, corr):
    _check(pipeline_runs, f"2bw-{opt}-{corr}")
    # EF holds one float32 copy of the stage's weights (the size of its gradients), nothing else does
    summary = pipeline_runs[3][f"2bw-{opt}-{corr}"]
    grads = [m["grads"] for m in summary["memory_bytes"]]
    assert summary["corrector_bytes"] == (grads if corr == "ef" else [0] * len(grads))


@pytest.mark.timeout(240)
def test_pipedream_equals_per_stage_delays_bitwise(pipeline_runs):
    _check(pipeline_runs, "pipedream-adamw")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("pipeline_runs", [2], indirect=True, ids=["P2"])
@pytest.mark.parametrize("name", ["gpipe-muon", "1f1b-adamw", "torch-1f1b-adamw", "torch-gpipe-sgd"])
def test_sync_schedules_equal_sync_simulator_bitwise(pipeline_runs, name):
    got = _check(pipeline_runs, name)
    # The check tells the semantics apart: the delayed run of the same config differs.
    delayed = reference_model(small(schedule="2bw", stages=2, grad_accum=3, optimizer=name.split("-")[-1]))
    assert max_abs_diff(got, delayed) > 1e-4


TRAIN_LOSS_RTOL = 1e-6  # float32: a group's losses summed then / M, or each / M then summed


@pytest.mark.timeout(240)
def test_both_engines_report_the_same_tokens_steps_and_train_loss(pipeline_runs, tmp_path):
    """One accounting (docs/llm.md): the simulator of the same config reports what the pipeline does,
    for every schedule (P=2 runs all six): tokens and steps exactly, and every metrics line's
    train_loss to float32 rounding (TRAIN_LOSS_RTOL; the measured figure is printed)."""
    from delaylab.llm.run.trainer import train

    P, root, jobs, summaries = pipeline_runs
    names = [n for n in jobs if not n.startswith("2bw-") or n == "2bw-adamw-ef"]  # one run per schedule
    assert {jobs[n].parallel.schedule for n in names} == ({"2bw", "pipedream", "gpipe", "1f1b", "torch-1f1b",
                                                          "torch-gpipe"} if P == 2 else {"2bw", "pipedream"})
    for name in names:
        sim, pipe = train(jobs[name], tmp_path / name), summaries[name]
        cfg = jobs[name]
        assert sim["steps"] == pipe["steps"] == 10
        assert sim["tokens"] == pipe["tokens"] == 10 * cfg.batch_size * cfg.model_config(256).block_size * cfg.grad_accum
        ours, theirs = (_lines(folder / name) for folder in (tmp_path, root))
        assert [(r["step"], r["tokens"]) for r in ours] == [(r["step"], r["tokens"]) for r in theirs] == \
            [(5, pipe["tokens"] // 2), (10, pipe["tokens"])]
        worst = max(abs(a["train_loss"] / b["train_loss"] - 1) for a, b in zip(ours, theirs))
        print(f"P={P} {name}: train_loss relative difference {worst:.2g}")
        assert worst <= TRAIN_LOSS_RTOL and sim["train_loss"] == ours[-1]["train_loss"]
        if cfg.schedule == "pipedream":  # the same run named by its delays (`llm train --delay 2,1,0`)
            listed = cfg.replace(schedule=None, delay=cfg.delays)
            by_delays = train(listed, tmp_path / f"{name}-delays")
            assert listed.resolved().schedule is None and by_delays["delay"] == pipe["delay"] == list(range(P))[::-1]
            assert (by_delays["steps"], by_delays["tokens"]) == (pipe["steps"], pipe["tokens"])
            untimed = [[{k: v for k, v in r.items() if k != "time"} for r in rs]
                       for rs in (_lines(tmp_path / f"{name}-delays"), ours)]
            assert untimed[0] == untimed[1]  # the schedule's simulator run, line for line, bit for bit


def _lines(folder):
    import json

    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
