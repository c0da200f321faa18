import json
import math

import pytest
import torch

from delaylab.errors import ConfigError, Diverged
from delaylab.llm import checkpoint
from delaylab.llm.model import GPT
from delaylab.llm.config import lr_factor
from delaylab.llm.model import stage_ranges
from delaylab.llm.run.trainer import Trainer, train
from delaylab.optim import LMOMomentum


def weights(trainer):
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.parametrize("opt,correction,delay", [("muon", "ef", 1), ("adamw", "dc-asgd", 2), ("adamw", "none", [1, 0]),
                                                 ("muon", "predict", 1)])
def test_resume_is_bit_exact(quick, corpus, tmp_path, opt, correction, delay):
    cfg = quick(optimizer=opt, correction=correction, delay=delay, steps=12, eval_every=6, ckpt_final=True)
    full = train(cfg, tmp_path / "full", dataset=corpus)
    part = train(cfg, tmp_path / "part", stop_at=5, dataset=corpus)
    assert part["status"] == "stopped" and part["steps"] == 5
    assert not (tmp_path / "part" / "summary.json").exists()
    resumed = train(cfg, tmp_path / "part", resume=True, dataset=corpus)
    for key in ("val_loss", "train_loss", "steps", "calls", "tokens"):
        assert resumed[key] == full[key], key  # to the last bit
    a, b = checkpoint.read(tmp_path / "full"), checkpoint.read(tmp_path / "part")
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k

    def lines(d):
        return [{k: v for k, v in json.loads(line).items() if k != "time"}
                for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]

    assert lines("full") == lines("part")  # nothing logged twice across the resume


def test_sync_mode_is_a_plain_pytorch_loop(quick, corpus):
    cfg = quick(optimizer="adamw", lr=3e-3, warmup=2)
    trainer = Trainer(cfg, corpus)
    torch.manual_seed(cfg.seed)
    model = GPT(trainer.model_cfg)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: lr_factor(k, cfg))
    for c in range(cfg.steps):
        x, y = corpus.batch(c, cfg.batch_size, 32, cfg.seed)
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        trainer.step()
    for (name, a), b in zip(trainer.model.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name


def test_delayed_sgd_uses_batch_k_at_the_weights_of_update_k_minus_tau(quick, corpus):
    """x_{k+1} = x_k - lr * grad f(x_{max(0, k - tau)}; batch k), written out by hand."""
    lr, tau, steps = 0.5, 2, 6
    cfg = quick(optimizer="sgd", lr=lr, momentum=0.0, lr_schedule="constant", warmup=0,
                delay=tau, steps=steps)
    trainer = Trainer(cfg, corpus)
    history = [[p.detach().clone() for p in trainer.model.parameters()]]
    model = GPT(trainer.model_cfg)
    while trainer.updates < steps:
        trainer.step()
    assert trainer.calls == steps + tau
    for k in range(steps):
        for p, v in zip(model.parameters(), history[max(0, k - tau)]):
            p.data.copy_(v)
            p.grad = None
        x, y = corpus.batch(k, cfg.batch_size, 32, cfg.seed)
        model(x, y)[1].backward()
        history.append([h - lr * p.grad for h, p in zip(history[k], model.parameters())])
    for a, b in zip(trainer.model.parameters(), history[steps]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # and the delay mattered: plain SGD ends elsewhere
    sync = Trainer(quick(optimizer="sgd", lr=lr, momentum=0.0, lr_schedule="constant", warmup=0, steps=steps), corpus)
    while sync.updates < steps:
        sync.step()
    assert max((a - b).abs().max() for a, b in zip(sync.model.parameters(), history[steps])) > 1e-3


def test_per_stage_delays_hold_back_the_early_stages(quick, corpus):
    cfg = quick(optimizer="muon", delay=[1, 0], steps=3)
    trainer = Trainer(cfg, corpus)
    before = weights(trainer)
    trainer.step()  # stage 0 (embed, blocks.0) only queues; stage 1 (blocks.1, head) updates
    after = weights(trainer)
    for name in before:
        moved = not torch.equal(before[name], after[name])
        assert moved == name.startswith(("blocks.1.", "head.")), name
    while trainer.updates < 3:
        trainer.step()
    assert trainer.calls == 4 and trainer.opt.group_updates == [3] * len(trainer.opt.param_groups)
    assert stage_ranges(5, 2) == [range(0, 3), range(3, 5)]


def test_each_stage_follows_the_lr_schedule_by_its_own_update_count(quick, corpus):
    """With delays [2, 0] the first stage's k-th update (on call k + 2) still gets lr_factor(k),
    as each stage's scheduler gives it in the pipeline engine; the inner optimizer is watched."""
    cfg = quick(optimizer="sgd", lr=0.1, momentum=0.0, delay=[2, 0], steps=6, warmup=2)
    trainer = Trainer(cfg, corpus)
    inner = trainer.opt.inner
    seen = [[] for _ in inner.param_groups]
    step = inner.step

    def watched(*a, **kw):
        for i, g in enumerate(inner.param_groups):
            if any(p.grad is not None for p in g["params"]):
                seen[i].append(g["lr"])
        return step(*a, **kw)

    inner.step = watched
    while trainer.updates < cfg.steps:
        trainer.step()
    want = [0.1 * lr_factor(k, cfg) for k in range(cfg.steps)]
    assert want[:-2] != want[2:]  # warmup + cosine: an lr indexed by call (k + 2) would differ
    assert all(lrs == pytest.approx(want, rel=1e-12) for lrs in seen), seen


def test_n_layer_overrides_the_preset_depth(quick, corpus):
    cfg = quick(preset="tiny", n_layer=8, delay=list(range(7, -1, -1)), steps=2,
                tie_embeddings=False)
    trainer = Trainer(cfg, corpus)
    assert len(trainer.model.blocks) == 8 and trainer.opt.delays[0] == 7
    while trainer.updates < 2:
        trainer.step()
    assert trainer.calls == 2 + 7


def test_muon_gets_exactly_the_hidden_matrices(quick, corpus):
    trainer = Trainer(quick(optimizer="muon", muon_ns_dtype="bfloat16"), corpus)
    muon, adamw = trainer.opt.inner.optimizers
    assert isinstance(muon, torch.optim.Muon)
    f32 = Trainer(quick(optimizer="muon", muon_ns_dtype="float32"), corpus).opt.inner.optimizers[0]
    assert isinstance(f32, LMOMomentum) and f32.param_groups[0]["ns_dtype"] == torch.float32
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    got = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    want = {n for n, p in trainer.model.named_parameters() if n.startswith("blocks.") and p.ndim == 2}
    assert got == want


def test_lr_schedules_by_hand(quick):
    cfg = quick(steps=11, warmup=0, min_lr_ratio=0.1)  # cosine from update 0 to update 10
    assert lr_factor(0, cfg) == 1.0
    assert lr_factor(10, cfg) == pytest.approx(0.1)
    assert lr_factor(5, cfg) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    warm = quick(steps=100, warmup=10)
    assert [lr_factor(k, warm) for k in (0, 4, 9)] == pytest.approx([0.1, 0.5, 1.0])
    wsd = quick(steps=10, warmup=0, lr_schedule="wsd", wsd_decay=0.5, min_lr_ratio=0.0)
    assert [lr_factor(k, wsd) for k in range(10)] == pytest.approx([1] * 5 + [0.8, 0.6, 0.4, 0.2, 0.0])


def test_a_nan_loss_stops_and_keeps_the_last_good_checkpoint(quick, corpus, tmp_path):
    cfg = quick(optimizer="sgd", lr=1e4, momentum=0.0, lr_schedule="constant", warmup=0, steps=50, ckpt_every=1)
    with pytest.raises(Diverged, match="loss is (nan|inf)") as err:
        train(cfg, tmp_path, dataset=corpus)
    assert "\n" not in str(err.value) and "last good checkpoint" in str(err.value)
    summary = json.loads((tmp_path / "summary.json").read_text())
    ckpt = checkpoint.read(tmp_path)
    # the weights of update `steps` gave the NaN; the kept checkpoint is the update before
    assert summary["status"] == "diverged" and ckpt["calls"] == summary["steps"] - 1 >= 1
    model = GPT(Trainer(cfg, corpus).model_cfg)
    model.load_state_dict(ckpt["model"])
    x, y = corpus.batch(ckpt["calls"], cfg.batch_size, 32, cfg.seed)
    assert torch.isfinite(model(x, y)[1])  # the loss the run computed there was finite
    assert not list((tmp_path / "ckpt").glob("*/*.pending"))


def test_refuses_to_overwrite_or_resume_another_config(quick, corpus, tmp_path):
    cfg = quick(steps=2, ckpt_final=True)
    train(cfg, tmp_path, dataset=corpus)
    def snapshot():
        return {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}

    before = snapshot()
    with pytest.raises(ValueError, match="already holds a run"):
        train(cfg, tmp_path, dataset=corpus)
    with pytest.raises(ValueError, match="another config: lr"):
        train(quick(steps=2, lr=0.5, ckpt_final=True), tmp_path, resume=True, dataset=corpus)
    assert snapshot() == before
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        train(cfg, tmp_path / "empty", resume=True, dataset=corpus)


@pytest.mark.parametrize("bad,match", [
    (dict(preset="huge"), "unknown preset"), (dict(optimizer="rmsprop"), "unknown optimizer"),
    (dict(delay=-1), "delay must be"), (dict(lr=0.0), "lr must be > 0"), (dict(steps=0), "steps must be >= 1"),
    (dict(correction="ef"), "needs a delay"), (dict(delay=[1, 0, 0]), "3 stages but the model has only 2"),
    (dict(n_layer=0), "n_layer must be >= 1"), (dict(delay=1, schedule="gpipe"), "contradicts schedule"),
    (dict(device="cuda:7"), "no CUDA device|GPUs needed"),
])
def test_bad_configs_are_config_errors(quick, bad, match):
    from delaylab.llm.run.setup import resolve

    with pytest.raises(ConfigError, match=match):
        resolve(quick(**bad), "simulator")


def test_gradient_accumulation_averages_the_microbatch_gradients(quick, corpus):
    lr = 0.1
    cfg = quick(optimizer="sgd", lr=lr, momentum=0.0, lr_schedule="constant", warmup=0, grad_accum=2, steps=1)
    trainer = Trainer(cfg, corpus)
    model = GPT(trainer.model_cfg)
    model.load_state_dict(trainer.model.state_dict())
    trainer.step()
    grads = []
    for j in range(2):  # call 0 reads microbatches 0 and 1
        model.zero_grad()
        x, y = corpus.batch(j, cfg.batch_size, 32, cfg.seed)
        model(x, y)[1].backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, p, g0, g1 in zip(trainer.model.parameters(), model.parameters(), *grads):
        torch.testing.assert_close(a, p - lr * (g0 + g1) / 2, rtol=1e-5, atol=1e-7)
    assert trainer.tokens_per_update == 2 * 4 * 32


def test_sync_start_and_cooldown_reach_the_optimizer(quick, corpus):
    def final_val(**kw):
        return train(quick(steps=6, **kw), dataset=corpus)["val_loss"]

    sync, delayed = final_val(), final_val(delay=1)
    assert sync != delayed
    assert final_val(delay=1, sync_start=6) == sync  # every update undelayed
    assert final_val(delay=1, sync_cooldown=6) == sync
    partial = final_val(delay=1, sync_start=3)
    assert partial not in (sync, delayed)
    s = train(quick(delay=2, steps=6, sync_start=3), dataset=corpus)
    assert s["calls"] == 8  # 3 sync updates, a fill of 2 calls, 3 delayed updates


@pytest.mark.parametrize("name", ["lion", "soap", "adan", "mars"])
def test_third_party_optimizers_train_delayed_with_ef(quick, corpus, name):
    pytest.importorskip("pytorch_optimizer")
    cfg = quick(optimizer=name, delay=1, correction="ef", steps=3)
    trainer = Trainer(cfg, corpus)
    before = weights(trainer)
    while trainer.updates < 3:
        trainer.step()
    assert trainer.calls == 4
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_prediction_runs_the_forward_at_shifted_weights(quick, corpus):
    """With --correction predict, a steady-state call's loss is the loss at x - tau * u_last,
    and the weights come back before the update."""
    trainer = Trainer(quick(correction="predict", delay=1, dtype="float64", device="cpu"), corpus)
    for _ in range(3):
        trainer.step()
    model, opt = trainer.model, trainer.opt
    x = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(opt.state[p]["u_last"])
        xb, yb = trainer.setup.rows(*trainer.data.batch(trainer.calls, 4, trainer.block, 0))
        want = model(xb, yb)[1].item()
        for n, p in model.named_parameters():
            p.copy_(x[n])
    assert trainer.step() == pytest.approx(want, rel=0, abs=1e-12)


@pytest.mark.parametrize("correction,ef_dtype,per_float", [("ef", "float32", 4), ("ef", "bfloat16", 2),
                                                           ("predict", "float32", 4), ("damp", "float32", 0)])
def test_summary_reports_the_corrector_bytes(quick, corpus, correction, ef_dtype, per_float):
    s = train(quick(correction=correction, ef_dtype=ef_dtype, delay=1, steps=3, device="cpu"), dataset=corpus)
    assert s["corrector_bytes"] == per_float * s["params"]


def test_train_loss_counts_the_batches_whose_gradients_were_applied(quick, corpus, tmp_path):
    """Delay 2 with a 2-update cooldown over 6 updates: calls 0, 1 fill the queue; calls 2-5 apply
    batches 0-3; the cooldown drops batch 4's queued gradient and calls 6, 7 apply batches 6, 7
    (undelayed). A line's train_loss is the mean loss of those batches since the last line, and
    tokens count only them."""
    cfg = quick(delay=2, sync_cooldown=2, steps=6, log_every=3, eval_every=6)
    trainer = Trainer(cfg, corpus)
    losses, applied = [], []
    while trainer.updates < 6:
        losses.append(trainer.step())
        applied.append(trainer.applied_loss)
    assert trainer.calls == 8
    assert applied == [None, None, *losses[0:4], losses[6], losses[7]]
    train(cfg, tmp_path, dataset=corpus)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [3, 6] and [r["calls"] for r in lines] == [5, 8]
    assert [r["tokens"] for r in lines] == [3 * 4 * 32, 6 * 4 * 32]
    assert lines[0]["train_loss"] == pytest.approx(sum(losses[0:3]) / 3, rel=1e-12)
    assert lines[1]["train_loss"] == pytest.approx((losses[3] + losses[6] + losses[7]) / 3, rel=1e-12)


def test_per_stage_delays_log_each_step_once(quick, corpus, tmp_path):
    """With delays [1, 0] the first call updates the last stage only: no step is complete yet, so no
    line for step 0 (there was one before the accounting of issue 26)."""
    s = train(quick(delay=[1, 0], steps=4, log_every=1, eval_every=4, tie_embeddings=False), tmp_path,
              dataset=corpus)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    assert (s["steps"], s["calls"], s["tokens"]) == (4, 5, 4 * 4 * 32)
