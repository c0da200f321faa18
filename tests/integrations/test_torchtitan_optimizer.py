"""DelayedOptimizersContainer / DelayedLRSchedulersContainer inside torchtitan's own machinery."""

import copy

import pytest
import torch
from torch import nn

pytest.importorskip("torchtitan", reason="torchtitan is not installed (pip install -e '.[titan]')")

from torchtitan.components.checkpoint import CheckpointManager  # noqa: E402
from torchtitan.components.optimizer import ParamGroupConfig  # noqa: E402
from torchtitan.components.optimizer.utils import get_flat_optim_state_dict, init_optim_state  # noqa: E402

from delaylab.errors import ConfigError  # noqa: E402
from delaylab.integrations.torchtitan import DelayedLRSchedulersContainer, DelayedOptimizersContainer  # noqa: E402
from delaylab.optim import Delayed  # noqa: E402

ADAMW = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
CALLS = 12


class Tiny(nn.Module):
    """torchtitan's module names (tok_embeddings, layers.N, norm, lm_head) at toy size."""

    def __init__(self, layers: int = 2):
        super().__init__()
        self.tok_embeddings = nn.Embedding(10, 4)
        self.layers = nn.ModuleDict({str(i): nn.Linear(4, 4) for i in range(layers)})
        self.norm = nn.LayerNorm(4)
        self.lm_head = nn.Linear(4, 10)

    def forward(self, x):
        h = self.tok_embeddings(x)
        for layer in self.layers.values():
            h = torch.tanh(layer(h))
        return self.lm_head(self.norm(h))


def model(seed: int = 0) -> Tiny:
    torch.manual_seed(seed)
    return Tiny()


def backward(m: nn.Module, t: int) -> None:
    x = torch.randint(0, 10, (3, 5), generator=torch.Generator().manual_seed(t))
    m(x).square().mean().backward()


def container(m, **kw):
    cfg = DelayedOptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name="AdamW", optimizer_kwargs=dict(ADAMW))],
        implementation="for-loop", **kw)
    opt = cfg.build(model_parts=[m])
    lrs = DelayedLRSchedulersContainer.Config(warmup_steps=3, decay_ratio=0.5).build(optimizers=opt, training_steps=CALLS)
    return opt, lrs


def reference(m, delay, groups=None, **kw):
    """Plain ``Delayed(AdamW)`` with torchtitan's param-group layout (names, for-loop)."""
    named = dict(m.named_parameters())
    groups = groups or [list(named)]
    inner = torch.optim.AdamW([{"params": [named[n] for n in names], "param_names": names, "foreach": False,
                                "fused": False, **ADAMW} for names in groups])
    return Delayed(inner, delay=delay, **kw)


def set_lrs(ref, lam):
    """The simulator's rule: each group's lr is the peak times the factor of its own update count."""
    for g, k in zip(ref.param_groups, ref.group_updates):
        g["lr"] = ADAMW["lr"] * lam(k)


def train(opt, lrs, m, calls, start=0):
    for t in range(start, calls):
        backward(m, t)
        opt.step()
        lrs.step()
        opt.zero_grad()


def lockstep(opt, lrs, m, ref, r):
    """The container and the reference ``Delayed`` on the same batches, call by call (yields t)."""
    lam = lrs.schedulers[0].lr_lambdas[0]  # torchtitan's warmup/stable/decay factor
    set_lrs(ref, lam)
    for t in range(CALLS):
        train(opt, lrs, m, t + 1, start=t)
        backward(r, t)
        ref.step()
        ref.zero_grad()
        set_lrs(ref, lam)
        yield t, lam


def assert_same_weights(a: nn.Module, b: nn.Module):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p, q), name


def test_steps_equal_plain_delayed_bit_for_bit_with_ef_and_the_lr_per_update():
    m, r = model(), model()
    opt, lrs = container(m, delay=1, correction="ef")
    for t, lam in lockstep(opt, lrs, m, reference(r, 1, corrections="ef"), r):
        d = opt.optimizers[0]
        # One advance per update: the fill call (t = 0) leaves the schedule where it was.
        assert d.num_updates == t and lrs.schedulers[0].last_epoch == t
        assert d.param_groups[0]["lr"] == ADAMW["lr"] * lam(t)
    assert_same_weights(m, r)
    assert opt.optimizers[0].state_dict()["delayed"]["updates"] == [CALLS - 1]


@pytest.mark.parametrize("spec", [dict(correction="ef,damp"), dict(corrections=["dc-asgd", "ef"])])
def test_a_list_of_correctors_steps_as_plain_delayed_bit_for_bit(spec):
    """Any valid corrector list, given as a comma string or a list, as ``Delayed(corrections=...)``."""
    m, r = model(), model()
    opt, lrs = container(m, delay=1, **spec)
    names = spec.get("correction") or ",".join(spec["corrections"])
    for _ in lockstep(opt, lrs, m, reference(r, 1, corrections=names), r):
        pass
    assert_same_weights(m, r)
    assert opt.optimizers[0].correction == Delayed(torch.optim.SGD([nn.Parameter(torch.zeros(1))]), 1, names).correction


def test_a_plain_scheduler_would_run_one_update_ahead():
    """What DelayedLRSchedulersContainer prevents: torchtitan's own container steps per call."""
    from torchtitan.components.optimizer import LRSchedulersContainer

    m = model()
    opt, _ = container(m, delay=1)
    plain = LRSchedulersContainer.Config(warmup_steps=3, decay_ratio=0.5).build(optimizers=opt, training_steps=CALLS)
    train(opt, plain, m, 4)
    assert opt.optimizers[0].num_updates == 3 and plain.schedulers[0].last_epoch == 4


def test_init_optim_state_leaves_the_queue_empty_and_the_run_unchanged():
    m, r = model(), model()
    opt, lrs = container(m, delay=1, correction="ef")
    before = copy.deepcopy(m.state_dict())
    flat = opt.state_dict()  # what torchtitan's checkpointer calls: init_optim_state inside
    d = opt.optimizers[0]
    assert d.queue.queued == [0] and not any("queue" in st for st in d.state.values())
    assert "state.layers.0.weight.exp_avg" in flat  # the inner state, materialized for DCP
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    for _ in lockstep(opt, lrs, m, reference(r, 1, corrections="ef"), r):
        pass  # the placeholder state is dropped before the first update
    assert_same_weights(m, r)


def test_the_pitfalls_are_real():
    """torchtitan's helpers on a bare Delayed: the zero step enters the queue, the flattening fails."""
    d = reference(model(), 1)
    init_optim_state(d)
    assert d.queue.queued == [1]
    with pytest.raises(KeyError, match="param_groups"):
        get_flat_optim_state_dict(d)


class Counter:
    """The trainer's own Stateful (step counter) beside the optimizers in a checkpoint."""

    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, sd):
        self.step = sd["step"]


def checkpointer(folder, m, opt, lrs, counter):
    cfg = CheckpointManager.Config(enable=True, folder="ckpt", interval=1, keep_latest_k=0,
                                   last_save_model_only=False)
    return cfg.build(dataloader=None, model_parts=[m], optimizers=opt, lr_schedulers=lrs,
                     states={"train_state": counter}, sd_adapter=None, base_folder=str(folder))


@pytest.mark.parametrize("correction", ["ef", "ef,dc-asgd,damp"])
@pytest.mark.parametrize("stop", [1, 5], ids=["inside-the-fill", "after-it"])
def test_dcp_checkpoint_through_torchtitans_checkpointer_resumes_exactly(tmp_path, stop, correction):
    kw = dict(delay=2, correction=correction)
    whole = model()
    opt, lrs = container(whole, **kw)
    train(opt, lrs, whole, CALLS)

    first = model()
    opt1, lrs1 = container(first, **kw)
    counter = Counter()
    train(opt1, lrs1, first, stop)
    counter.step = stop
    saved_queue = [t.clone() for t in opt1.optimizers[0].state[first.lm_head.weight]["queue"]]
    checkpointer(tmp_path, first, opt1, lrs1, counter).save(curr_step=stop)

    second = model(seed=1)  # other initial weights: everything must come from the checkpoint
    opt2, lrs2 = container(second, **kw)
    counter2 = Counter()
    assert checkpointer(tmp_path, second, opt2, lrs2, counter2).load(step=stop)
    d = opt2.optimizers[0]
    assert counter2.step == stop and d.queue.queued == [min(stop, 2)] and d.queue.updates == [max(0, stop - 2)]
    queue = d.state[second.lm_head.weight]["queue"]
    assert len(queue) == len(saved_queue) and all(torch.equal(a, b) for a, b in zip(queue, saved_queue))
    assert lrs2.schedulers[0].last_epoch == max(0, stop - 2)
    train(opt2, lrs2, second, CALLS, start=stop)
    assert_same_weights(second, whole)


def test_stage_delays_split_one_model_into_torchtitans_stages():
    """PipeDream simulated without pipeline parallelism: two virtual stages, delays [1, 0]."""
    m, r = model(), model()
    opt, lrs = container(m, stage_delays=[1, 0])
    d = opt.optimizers[0]
    names = [g["param_names"] for g in d.param_groups]
    # torchtitan's split of 2 layers over 2 stages: the embedding and layer 0, then layer 1 and the head.
    assert names == [["tok_embeddings.weight", "layers.0.weight", "layers.0.bias"],
                     ["layers.1.weight", "layers.1.bias", "norm.weight", "norm.bias", "lm_head.weight", "lm_head.bias"]]
    assert d.delays == [1, 0]
    for _, lam in lockstep(opt, lrs, m, reference(r, [1, 0], groups=names), r):
        pass
    assert d.group_updates == [CALLS - 1, CALLS]
    assert [g["lr"] for g in d.param_groups] == [ADAMW["lr"] * lam(CALLS - 1), ADAMW["lr"] * lam(CALLS)]
    assert_same_weights(m, r)


def test_a_call_without_gradients_is_not_an_update():
    m = model()
    opt, lrs = container(m, delay=0, correction="ef", ef_lag=1)  # under Schedule2BW: its fill call
    opt.step()
    lrs.step()
    assert not opt.updated and opt.optimizers[0].num_updates == 0 and lrs.schedulers[0].last_epoch == 0


@pytest.mark.parametrize("kw, message", [
    (dict(correction="nope"), "unknown correction"),
    (dict(corrections=["dc-asgd", "dc-asgd-a"]), "cannot be combined"),
    (dict(correction="ef", corrections=["damp"]), "not both"),
    (dict(correction="predict"), "Trainer subclass"),
    (dict(delay=-1), "integers >= 0"),
    (dict(ef_dtype="float16"), "float32 or bfloat16"),
    (dict(stage_delays=[1, 0, 0, 0, 0, 0]), "Number of stages"),
])
def test_bad_configurations_fail_in_one_line(kw, message):
    with pytest.raises(ConfigError, match=message) as err:
        container(model(), **kw)
    assert "\n" not in str(err.value)
