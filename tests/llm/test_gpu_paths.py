"""The GPU paths, checked on the CPU (issue 25): what a collective receives, the process-group start,
the RNG state, the host syncs of a training call, checkpoints with --ckpt-every 0, --deterministic,
--compile and the one-call-late divergence check.

No GPU here: the checks that need one use the ``meta`` device (tensors with shapes and no data: any
host read of one raises) or a fake device check (torch.cuda's functions replaced by recorders).
"""

import json
import types

import pytest
import torch

from delaylab.errors import Diverged
from delaylab.llm import checkpoint
from delaylab.llm.run import setup as run_setup
from delaylab.llm.model import GPT, Block
from delaylab.llm.run import trainer as trainer_module
from delaylab.llm.run.setup import checkpoint_at
from delaylab.llm.run.trainer import Trainer, train

CASES = {"adamw": dict(), "adamw-ef": dict(delay=1, correction="ef"),
         "muon-ef-damp": dict(optimizer="muon", delay=1, correction="ef,damp"),
         "adamw-dc-asgd": dict(delay=1, correction="dc-asgd"), "sgd-predict": dict(optimizer="sgd", delay=1,
                                                                                  correction="predict"),
         "adamw-ef-bf16-moe": dict(delay=1, correction="ef", ef_dtype="bfloat16", moe_experts=4),
         "adamw-dc-asgd-a": dict(delay=1, correction="dc-asgd-a"), "sgd-lookahead": dict(optimizer="sgd", delay=1,
                                                                                        correction="lookahead"),
         "lmo-delayed": dict(optimizer="lmo", delay=2), "adamw-ef-per-stage": dict(delay=[1, 0], correction="ef",
                                                                                   tie_embeddings=False)}


@pytest.mark.parametrize("case", CASES)
def test_a_training_call_reads_nothing_from_the_device(quick, corpus, monkeypatch, case):
    """On the meta device any host read (.item(), float(), bool(), .tolist()) raises, so a call that
    runs there, forward to optimizer step, holds no host sync. The loss is read one call late by
    ``_value``, which the test replaces; every tensor the replicas' mean receives is on the device."""
    seen = []

    def mean(value, group, what):
        seen.append((value.device, what))
        return value

    monkeypatch.setattr(trainer_module, "_value", lambda call: 1.0)
    monkeypatch.setattr(trainer_module, "mean", mean)
    monkeypatch.setattr(run_setup, "DEVICE_KINDS", ("cpu", "cuda", "meta"))
    trainer = Trainer(quick(device="meta", **CASES[case]), corpus)
    trainer.dp, trainer.setup.mesh = 2, types.SimpleNamespace(dp_group=None)  # as a replica: the loss goes
    # through the (recording) mean
    assert next(trainer.model.parameters()).device.type == "meta"
    for _ in range(4):
        trainer.step(wait=False)
    assert trainer.updates == 4 - max(trainer.opt.delays)
    assert seen and all(d.type == "meta" for d, _ in seen)
    with pytest.raises((RuntimeError, NotImplementedError)):  # the check has teeth: a host read fails here
        float(next(trainer.model.parameters()).detach().sum())


def test_validation_and_the_weight_check_hand_the_collective_a_device_tensor(quick, corpus, monkeypatch):
    """The evaluation all-reduce once took a CPU tensor, which NCCL refuses ("No backend type
    associated with device type cpu"). Here the model stays on the CPU but the run's device is
    ``meta``: a tensor made for the collective without ``device=`` would land on the CPU."""
    seen = []

    def mean(value, group, what):
        seen.append((value.device.type, what))
        return torch.ones_like(value, device="cpu")

    trainer = Trainer(quick(), corpus)
    monkeypatch.setattr(trainer_module, "mean", mean)
    trainer.dp, trainer.device = 2, torch.device("meta")
    trainer.setup.mesh = types.SimpleNamespace(dp_group=None)
    trainer.evaluate()
    assert trainer.weights_finite()
    assert [d for d, _ in seen] == ["meta", "meta"], seen


def test_the_process_group_starts_on_the_ranks_gpu(monkeypatch):
    """NCCL: the rank's GPU is made current before the group starts and handed to it as device_id."""
    from delaylab.llm.distributed import world

    calls = []
    monkeypatch.setattr(world.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", torch.device(d))))
    monkeypatch.setattr(world.dist, "init_process_group",
                        lambda backend, **kw: calls.append(("init", backend, kw.get("device_id"))))
    world.start(torch.device("cuda", 1), 60.0)
    assert calls == [("set_device", torch.device("cuda", 1)), ("init", "nccl", torch.device("cuda", 1))]
    calls.clear()
    world.start(torch.device("cpu"), 60.0)
    assert calls == [("init", "gloo", None)]


def test_the_rng_state_touches_only_the_runs_device(monkeypatch):
    """get_rng_state_all() would open a CUDA context on every GPU of the node from every rank."""
    calls = []
    state = torch.zeros(16, dtype=torch.uint8)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda d: calls.append(("get", d)) or state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, d: calls.append(("set", d)))
    for name in ("get_rng_state_all", "set_rng_state_all", "manual_seed_all"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, name=name: calls.append((name,)))
    saved = checkpoint.rng_state(torch.device("cuda", 3))
    checkpoint.set_rng_state(saved, torch.device("cuda", 3))
    assert calls == [("get", torch.device("cuda", 3)), ("set", torch.device("cuda", 3))]
    calls.clear()
    checkpoint.set_rng_state(checkpoint.rng_state(torch.device("cpu")), torch.device("cpu"))
    assert calls == []


# -- checkpoints ---------------------------------------------------------------------------------
def test_when_a_checkpoint_is_written():
    from delaylab.llm.config import Config

    def at(end, **kw):
        cfg = Config.from_dict(steps=10, **kw)
        return [k for k in range(1, end + 1) if checkpoint_at(k, end, cfg)]

    assert at(10, ckpt_every=4) == [4, 8, 10]  # the last update too, as before
    assert at(10, ckpt_every=4, ckpt_final=False) == [4, 8]
    assert at(10, ckpt_every=0) == []  # none unless asked (GBs at 135m / 360m)
    assert at(10, ckpt_every=0, ckpt_final=True) == [10]
    assert at(6, ckpt_every=0) == [6]  # a stop always writes one: the run continues from it
    assert at(6, ckpt_every=4, ckpt_final=False) == [4, 6]


def test_ckpt_every_0_writes_no_checkpoint_unless_asked(quick, corpus, tmp_path):
    train(quick(steps=4), tmp_path / "none", dataset=corpus)
    assert not (tmp_path / "none" / "ckpt").exists()
    train(quick(steps=4, ckpt_final=True), tmp_path / "final", dataset=corpus)
    assert checkpoint.steps_on_disk(tmp_path / "final" / "ckpt") == [4]
    stopped = train(quick(steps=4), tmp_path / "stop", stop_at=2, dataset=corpus)
    assert stopped["status"] == "stopped" and checkpoint.steps_on_disk(tmp_path / "stop" / "ckpt") == [2]
    resumed = train(quick(steps=4), tmp_path / "stop", resume=True, dataset=corpus)
    assert resumed["val_loss"] == json.loads((tmp_path / "none" / "summary.json").read_text())["val_loss"]


def test_a_nan_found_one_call_late_keeps_the_last_good_checkpoint(quick, corpus, tmp_path):
    """Checkpoints every 3 updates and the loss checked one call late (no host sync per call): the
    checkpoint whose weights gave the NaN is dropped, the kept one's weights give a finite loss."""
    cfg = quick(optimizer="sgd", lr=10.0, momentum=0.0, lr_schedule="constant", warmup=30, steps=60, ckpt_every=3,
                log_every=100, eval_every=100)  # a NaN at update 14 (measured)
    with pytest.raises(Diverged, match="loss is (nan|inf) at update") as err:
        train(cfg, tmp_path, dataset=corpus)
    summary = json.loads((tmp_path / "summary.json").read_text())
    ckpt = checkpoint.read(tmp_path)
    assert summary["status"] == "diverged" and f"at update {summary['steps']} " in str(err.value)
    assert summary["steps"] >= 7 and ckpt["calls"] % 3 == 0 and ckpt["calls"] <= summary["steps"]
    model = GPT(Trainer(cfg, corpus).model_cfg)
    model.load_state_dict(ckpt["model"])
    x, y = corpus.batch(ckpt["calls"], cfg.batch_size, 32, cfg.seed)
    assert torch.isfinite(model(x, y)[1])
    assert not list((tmp_path / "ckpt").glob("*/*.pending"))


def test_the_late_check_reports_what_the_waiting_loop_reported(quick, corpus, tmp_path):
    """train() (each loss read one call late) writes the metrics a call-by-call loop computes."""
    cfg = quick(delay=2, correction="ef", steps=7, log_every=2, eval_every=7)
    trainer = Trainer(cfg, corpus)
    applied = []
    while trainer.updates < 7:
        trainer.step()
        applied.append(trainer.applied_loss)
    train(cfg, tmp_path, dataset=corpus)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    applied = [a for a in applied if a is not None]
    assert [r["step"] for r in lines] == [2, 4, 6, 7]
    assert [r["train_loss"] for r in lines] == pytest.approx(
        [sum(applied[0:2]) / 2, sum(applied[2:4]) / 2, sum(applied[4:6]) / 2, applied[6]], rel=1e-15)


# -- --deterministic, --compile ---------------------------------------------------------------------
@pytest.fixture
def restore_determinism():
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cuda.cudnn_sdp_enabled(),
              torch.backends.cuda.mem_efficient_sdp_enabled())
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cuda.enable_cudnn_sdp(before[1])
    torch.backends.cuda.enable_mem_efficient_sdp(before[2])


def test_deterministic_sets_torchs_switches_and_changes_no_cpu_result(quick, corpus, monkeypatch,
                                                                      restore_determinism):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(False)  # whatever a test before it in this process left (the fixture restores)
    plain = train(quick(delay=1, correction="ef", moe_experts=4), dataset=corpus)
    assert not torch.are_deterministic_algorithms_enabled()
    det = train(quick(delay=1, correction="ef", moe_experts=4, deterministic=True), dataset=corpus)
    assert torch.are_deterministic_algorithms_enabled()
    import os

    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not torch.backends.cuda.cudnn_sdp_enabled() and not torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
    assert (det["val_loss"], det["train_loss"]) == (plain["val_loss"], plain["train_loss"])  # the CPU already is


def test_compile_compiles_each_block_and_keeps_the_names(quick, corpus, monkeypatch):
    """aot_eager: the graph capture (fullgraph, so a graph break fails) and autograd without a C++
    compiler; the inductor run on the CPU is measured in the README (its figures, its command)."""
    monkeypatch.setenv("DELAYLAB_COMPILE_BACKEND", "aot_eager")
    cfg = quick(delay=1, correction="ef", steps=6, moe_experts=4)
    eager, compiled = Trainer(cfg, corpus), Trainer(cfg.replace(compile=True), corpus)
    blocks = [m for m in compiled.model.modules() if isinstance(m, Block)]
    assert len(blocks) == 2 and all(b._compiled_call_impl is not None for b in blocks)
    assert list(compiled.model.state_dict()) == list(eager.model.state_dict())
    for t in (eager, compiled):
        while t.updates < 6:
            t.step()
    diff = max((a - b).abs().max().item() for a, b in zip(eager.model.parameters(), compiled.model.parameters()))
    assert diff < 1e-5, diff  # the same computation up to float reassociation (measured ~1e-7)
