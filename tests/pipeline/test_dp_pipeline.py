"""DP x PP: D data-parallel replicas of every stage equal one replica on the whole microbatch.

Each replica takes its 1/D rows of every microbatch and the replicas average a stage's gradients
before its update, so the run is the single-replica run up to the reassociation of that average:
in float64 the weights agree to 1e-10 with the same config at D=1 and with the single-process
simulator (which runs the whole batch in one process).
"""

import json
import re
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from delaylab.cli import main
from delaylab.llm.checkpoint import steps_on_disk
from delaylab.llm.run.rank import run_jobs, train_pipeline

from pipeline_helpers import kill_when_running, load_model, max_abs_diff, reference_model, small, start_ranks

pytestmark = pytest.mark.dist

TOL = 1e-10


def f64(**kw):
    return small(dtype="float64", **kw)


def single(cfg):
    """The same config on one replica: the simulator then runs the whole batch in one process."""
    return cfg.replace(dp=1).resolved("pipeline")


# One launch of 2 stages x 2 replicas runs these back to back: every schedule but pipedream (P=3 below).
JOBS = {
    "2bw-adamw-ef": f64(schedule="2bw", stages=2, dp=2, grad_accum=2, optimizer="adamw", correction="ef",
                        ckpt_every=4),
    "1f1b-muon": f64(schedule="1f1b", stages=2, dp=2, grad_accum=2, optimizer="muon"),
    "gpipe-adamw": f64(schedule="gpipe", stages=2, dp=2, grad_accum=2, optimizer="adamw"),
    "torch-gpipe-sgd": f64(schedule="torch-gpipe", stages=2, dp=2, grad_accum=2, optimizer="sgd"),
    "torch-1f1b-adamw": f64(schedule="torch-1f1b", stages=2, dp=2, grad_accum=2, optimizer="adamw"),
    "2bw-tied-sgd": f64(schedule="2bw", stages=2, dp=2, grad_accum=2, optimizer="sgd", tie_embeddings=True),
}


@pytest.fixture(scope="module")
def dp_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp")
    summaries = run_jobs([(cfg, root / name) for name, cfg in JOBS.items()])
    return root, dict(zip(JOBS, summaries))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", sorted(JOBS))
def test_dp2_equals_the_simulator_on_the_whole_batch(dp_runs, name):
    root, summaries = dp_runs
    cfg = JOBS[name]
    got = load_model(root / name)
    assert summaries[name]["dp"] == 2 and summaries[name]["steps"] == 10
    assert all(v.dtype == torch.float64 for v in got.values())
    diff = max_abs_diff(got, reference_model(single(cfg)))
    print(f"D=2 {name} vs the simulator: max |diff| {diff:.3g}")
    assert diff <= TOL, f"{name}: max |diff| {diff:.3g}"
    if cfg.model_config(256).tie_embeddings:  # summed per replica, averaged over replicas: still one matrix
        assert torch.equal(got["embed.tok.weight"], got["head.lm_head.weight"])


@pytest.mark.timeout(300)
def test_dp2_2bw_equals_dp1_and_the_replicas_hold_identical_state(dp_runs, tmp_path):
    root, summaries = dp_runs
    name = "2bw-adamw-ef"
    one = train_pipeline(single(JOBS[name]), tmp_path / "dp1")
    assert one["dp"] == 1
    diff = max_abs_diff(load_model(root / name), load_model(tmp_path / "dp1"))
    print(f"D=2 vs D=1 {name}: max |diff| {diff:.3g}")
    assert diff <= TOL
    # The training loss is the whole microbatch's (averaged over replicas): the same curve.
    d2 = [json.loads(line)["train_loss"] for line in open(root / name / "metrics.jsonl")]
    d1 = [json.loads(line)["train_loss"] for line in open(tmp_path / "dp1" / "metrics.jsonl")]
    assert len(d2) == len(d1) == 2 and max(abs(a - b) for a, b in zip(d1, d2)) < 1e-6
    # Replica 0 saves for both (one file per stage): their weights, EF buffers and Adam moments agree.
    for name, s in summaries.items():
        digests = s["state_digests"]
        assert len(digests) == 2 and all(len(set(per_stage)) == 1 for per_stage in digests), name
        assert digests[0][0] != digests[1][0]
    assert sorted(p.name for p in (root / "2bw-adamw-ef" / "ckpt" / "step_0000010").iterdir()) == \
        ["stage_0", "stage_1"]


def test_the_tolerance_resolves_the_semantics():
    """A delay of 1 vs 0 on the same D=2 config moves the weights by far more than TOL."""
    cfg = single(JOBS["2bw-adamw-ef"])
    sync = reference_model(cfg.replace(schedule="1f1b", delay=None, correction="none").resolved("pipeline"))
    assert max_abs_diff(reference_model(cfg), sync) > 1e-4


@pytest.mark.timeout(300)
def test_dp2_pp3_pipedream_equals_per_stage_delays_2_1_0(tmp_path):
    cfg = f64(schedule="pipedream", stages=3, dp=2, grad_accum=1, optimizer="adamw", steps=6)
    summary = train_pipeline(cfg, tmp_path / "pd")
    assert summary["delay"] == [2, 1, 0] and summary["dp"] == 2
    assert all(len(set(d)) == 1 for d in summary["state_digests"])
    ref = single(cfg).replace(schedule=None, delay=[2, 1, 0]).resolved()  # the simulator's own flags
    diff = max_abs_diff(load_model(tmp_path / "pd"), reference_model(ref))
    print(f"D=2 P=3 pipedream vs the simulator with delays 2,1,0: max |diff| {diff:.3g}")
    assert diff <= TOL


@pytest.mark.timeout(300)
def test_resume_after_a_stop_equals_the_uninterrupted_run(dp_runs, tmp_path):
    root, _ = dp_runs
    full = root / "2bw-adamw-ef"
    folder = tmp_path / "stopped"
    stopped = train_pipeline(JOBS["2bw-adamw-ef"], folder, stop_at=5)  # a logging step: the same metrics lines
    assert stopped["status"] == "stopped" and steps_on_disk(folder / "ckpt") == [4, 5]
    # Another D is another run.
    with pytest.raises(ValueError, match="another config: dp=1 vs 2"):
        train_pipeline(single(JOBS["2bw-adamw-ef"]), folder, resume=True)
    run = subprocess.run([sys.executable, "-m", "delaylab", "llm", "pipeline", "--resume", str(folder), "--json"],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    resumed = json.loads(run.stdout)
    assert resumed["resumed_from"] == 5 and resumed["steps"] == 10 and resumed["dp"] == 2
    assert max_abs_diff(load_model(folder), load_model(full)) == 0.0

    def lines(path):
        return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in open(path)]

    assert lines(folder / "metrics.jsonl") == lines(full / "metrics.jsonl")


@pytest.mark.timeout(180)
def test_a_rank_killed_in_a_dp_group_ends_every_rank_within_60s_naming_it(tmp_path):
    # Rank 3 is stage 1 of replica 1: rank 1 (stage 1, replica 0) shares only its dp group, rank 2 only
    # its pipeline, rank 0 neither.
    P, D, victim = 2, 2, 3
    store = dist.TCPStore("127.0.0.1", 0, P * D + 1, True, wait_for_workers=False)
    procs = start_ranks(tmp_path, P, D, store.port)
    try:
        for r, (rc, msg, elapsed) in kill_when_running(tmp_path, procs, victim).items():
            assert rc == 1 and elapsed < 60, msg
            assert f"rank {r} (stage {r % P}, replica {r // P}) stopped: rank {victim} failed" in msg, msg
            assert "Traceback" not in msg and len(msg.strip().splitlines()) == 1, msg
    finally:
        for p, err in procs:
            if p.poll() is None:
                p.kill()
            err.close()


@pytest.mark.parametrize("world,flags,message", [
    (3, ["--dp", "2"], "3 processes for 2 stages x 2 data-parallel replicas: start exactly P x D = 4 ranks"),
    (3, [], "3 processes for 2 stages x 1 data-parallel replicas"),
    (8, ["--dp", "2"], "(or give --dp 4)"),
])
def test_a_world_that_is_not_p_times_d_is_one_line_before_any_process_group(
        world, flags, message, tmp_path, capsys, monkeypatch):
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world)}.items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "run"
    argv = ["llm", "pipeline", "--stages", "2", *flags, "--batch-size", "4", "--device", "cpu", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists() and not dist.is_initialized()


@pytest.mark.parametrize("flags,message", [
    (["--dp", "3", "--batch-size", "4"], "batch_size 4 does not split over 3 data-parallel replicas"),
    (["--dp", "2", "--dp-shard", "true"], "--dp-shard (FSDP2) is for `delaylab llm train`"),
])
def test_bad_dp_flags_are_one_line_before_any_process(flags, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["llm", "pipeline", "--stages", "2", *flags, "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_diverging_dp_run_stops_every_rank_before_the_update_and_keeps_its_checkpoints(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["llm", "pipeline", "--stages", "2", "--dp", "2", "--preset", "tiny", "--optimizer", "sgd", "--lr", "1e6",
            "--steps", "20", "--batch-size", "2", "--block-size", "16", "--ckpt-every", "1", "--device", "cpu",
            "--out", str(out)]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    # Both last stages (ranks 1 and 3) see the same averaged loss and stop before its last gradient leaves.
    match = re.search(r"pipeline stopped: rank ([13]) failed \(Diverged: loss is nan at update (\d+)\)", err)
    assert match, err
    k = int(match.group(2))
    assert not (out / "summary.json").exists()
    # No stage applied update k (step k+1); the checkpoints before it are kept.
    assert steps_on_disk(out / "ckpt") and max(steps_on_disk(out / "ckpt")) <= k


def test_blame_of_a_collective_waits_for_a_rank_that_saw_who_died():
    """A failed all-reduce of more than two ranks cannot say which member died: it defers to a claim
    that names one, and names no rank if none comes."""
    from delaylab.llm.distributed.launch import _FAILED_KEY, blame
    from delaylab.llm.distributed.world import PeerFailure

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        vague = PeerFailure(None, "averaging the gradients of update 3 over ranks [0, 2, 4]", RuntimeError("reset"))
        t0 = time.time()
        who, why, ours = blame(0, vague, timeout_s=0.5)
        assert (who, ours) == (None, True) and "over ranks [0, 2, 4]" in why
        assert time.time() - t0 >= 0.5  # it waited for a better claim first
        dist.distributed_c10d._get_default_store().delete_key(_FAILED_KEY)  # a new run
        precise = PeerFailure(5, "receiving the gradient of microbatch 9 from rank 5", RuntimeError("reset"))
        assert blame(1, precise, timeout_s=0.5)[:2] == (5, "seen by rank 1: receiving the gradient of microbatch 9 "
                                                          "from rank 5 failed: reset")
        who, why, ours = blame(0, vague, timeout_s=0.5)
        assert (who, ours) == (5, False) and "seen by rank 1" in why
    finally:
        dist.destroy_process_group()
