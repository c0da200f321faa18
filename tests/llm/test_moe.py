"""The mixture-of-experts MLP (``delaylab.llm.model.MoE``): routing, capacity and the load-balancing
loss against plain-Python computations in float64, a one-expert MoE against the dense MLP, the
parameter counts by hand, and the MoE in every engine (simulator, data parallel, pipeline), each
against the one-process run to 1e-10 in float64."""

import json
import math

import pytest
import torch
from torch import nn

from delaylab.cli import main
from delaylab.errors import ConfigError
from delaylab.llm.config import Config
from delaylab.llm import checkpoint
from delaylab.llm.model import GPT, MLP, GPTConfig, MoE, moe_load, preset
from delaylab.llm.pipeline.stages import Stage
from delaylab.llm.run.rank import run_jobs
from delaylab.llm.run.trainer import Trainer, train, train_replicas
from delaylab.optim import LMOMomentum, build_optimizer

TOL = 1e-10


def moe_layer(E: int, k: int, capacity_factor: float = 4.0, coef: float = 0.01, grad_accum: int = 1,
              d: int = 8) -> MoE:
    """A float64 MoE layer with weights of std 0.5, so that the router's choices are clear-cut."""
    cfg = GPTConfig(n_layer=1, n_head=1, d_model=d, mlp_hidden=6, moe_experts=E, moe_top_k=k,
                    moe_capacity_factor=capacity_factor, moe_aux_loss_coef=coef)
    torch.manual_seed(0)
    layer = MoE(cfg, grad_accum).double()
    for p in layer.parameters():
        nn.init.normal_(p, std=0.5)
    return layer


def expert_by_hand(mlp: MLP, v: torch.Tensor) -> torch.Tensor:
    """One token through one GELU expert: down @ gelu(up @ v), gelu written out."""
    u = mlp.up.weight @ v
    return mlp.down.weight @ (0.5 * u * (1 + torch.erf(u / math.sqrt(2))))


def route_by_hand(layer: MoE, x: torch.Tensor):
    """Top-k routing in loops: softmax gates, GShard's priority (every first choice, in sequence
    order, before any second choice), at most C assignments per expert and sequence, the Switch
    loss E * sum_e f_e P_e per sequence. Returns (output, dropped share, aux loss)."""
    B, T, _ = x.shape
    E, k = layer.n_experts, layer.top_k
    C = min(T, math.ceil(layer.capacity_factor * T * k / E))
    out, dropped, aux = torch.zeros_like(x), 0, 0.0
    for b in range(B):
        p = []
        for t in range(T):
            logits = [float(layer.router.weight[e].detach() @ x[b, t]) for e in range(E)]
            z = sum(math.exp(v) for v in logits)
            p.append([math.exp(v) / z for v in logits])
        choices = [sorted(range(E), key=lambda e: -p[t][e])[:k] for t in range(T)]
        taken = [0] * E
        for j in range(k):
            for t in range(T):
                e = choices[t][j]
                if taken[e] < C:
                    taken[e] += 1
                    out[b, t] += p[t][e] * expert_by_hand(layer.experts[e], x[b, t])
                else:
                    dropped += 1
        f = [sum(e in choices[t] for t in range(T)) / (T * k) for e in range(E)]
        P = [sum(p[t][e] for t in range(T)) / T for e in range(E)]
        aux += E * sum(f[e] * P[e] for e in range(E)) / B
    return out, dropped / (B * T * k), aux


@pytest.mark.parametrize("E,k", [(4, 2), (3, 1), (3, 3)])
@pytest.mark.parametrize("capacity_factor", [0.5, 1.0, 4.0])
def test_routing_capacity_and_aux_loss_match_a_loop_reference(E, k, capacity_factor):
    layer = moe_layer(E, k, capacity_factor)
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    want, dropped, aux = route_by_hand(layer, x)
    got = layer(x)
    diff = (got - want).abs().max().item()
    print(f"E={E} k={k} capacity factor {capacity_factor}: max |diff| {diff:.3g}, dropped {dropped:.3f}")
    assert diff <= 1e-12, f"max |diff| {diff:.3g}"
    assert abs(layer.dropped.item() - dropped) <= 1e-15
    assert abs(layer.aux_loss.item() - aux) <= 1e-12
    C = layer.capacity(7)
    if E * C < 7 * k:  # fewer slots than assignments: some must be dropped
        assert dropped > 0
    if C == 7:  # an expert can take every token: nothing is dropped
        assert dropped == 0


def test_capacity_drops_by_hand_count_first_choices_first():
    """E = 4, k = 2, T = 6, capacity factor 1: C = ceil(6 * 2 / 4) = 3 slots per expert.

    Tokens 0-3 rank the experts 0 > 1 > 2 > 3, tokens 4-5 rank 1 > 0 > 2 > 3. First choices
    first: expert 0 takes tokens 0, 1, 2 (token 3's first choice is dropped), expert 1 takes
    tokens 4, 5; then second choices: token 0's goes to expert 1's last slot, tokens 1-3's
    (expert 1) and 4-5's (expert 0) are dropped. 6 of 12 assignments dropped; token 3 keeps
    nothing and passes through the residual alone. (In token order instead, tokens 0-2 would
    fill expert 1 with their second choices and drop the first choices of tokens 4 and 5.)
    """
    layer = moe_layer(4, 2, capacity_factor=1.0)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[:, :2] = torch.tensor([[2.0, 1.0], [1.0, 2.0], [0.0, 0.0], [-1.0, -1.0]])
    x = torch.zeros(1, 6, 8, dtype=torch.float64)
    x[0, :4, 0] = 1.0
    x[0, 4:, 1] = 1.0
    x[0, :, 2:] = torch.randn(6, 6, dtype=torch.float64)  # different tokens, the same ranking
    out = layer(x)[0]
    p = torch.softmax(x[0] @ layer.router.weight.T, -1)
    ex = [lambda t, e=e: layer.experts[e](x[0, t]) for e in range(4)]
    want = [p[0, 0] * ex[0](0) + p[0, 1] * ex[1](0), p[1, 0] * ex[0](1), p[2, 0] * ex[0](2),
            torch.zeros(8, dtype=torch.float64), p[4, 1] * ex[1](4), p[5, 1] * ex[1](5)]
    for t in range(6):
        torch.testing.assert_close(out[t], want[t], rtol=0, atol=1e-14)
    assert torch.equal(out[3], torch.zeros(8, dtype=torch.float64))
    assert layer.dropped.item() == 0.5
    assert layer.load.tolist() == [0.5, 0.5, 0.0, 0.0]  # every token chose experts 0 and 1
    assert moe_load(nn.Sequential(layer))["moe_imbalance"] == [2.0]  # E / k: the most unbalanced top-2


@pytest.mark.parametrize("coef,grad_accum", [(0.01, 1), (0.3, 4)])
def test_aux_loss_gradient_is_coef_over_m_times_the_formulas(coef, grad_accum):
    layer = moe_layer(4, 2, capacity_factor=1.0, coef=coef, grad_accum=grad_accum)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    (layer(x) * 0).sum().backward()  # no LM gradient: the router's gradient is the aux loss's alone
    W = layer.router.weight.detach().clone().requires_grad_(True)
    probs = torch.softmax(x @ W.T, -1)  # [B, T, E]
    top = probs.topk(2, -1).indices
    f = torch.stack([(top == e).any(-1).double().mean(-1) / 2 for e in range(4)], -1)  # T*k assignments
    aux = (4 * (f * probs.mean(1)).sum(-1)).mean()
    (want,) = torch.autograd.grad(aux, W)
    torch.testing.assert_close(layer.router.weight.grad, coef / grad_accum * want, rtol=1e-12, atol=1e-15)
    assert abs(layer.aux_loss.item() - aux.item()) <= 1e-14
    for e in layer.experts:  # the aux loss reaches the router only
        assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in e.parameters())


def test_every_expert_gets_a_gradient_when_no_token_reaches_it():
    layer = moe_layer(4, 2)
    with torch.no_grad():
        layer.router.weight[3] = -5.0  # x > 0 below: expert 3 is last for every token
    x = torch.rand(2, 6, 8, dtype=torch.float64) + 0.1
    out = layer(x)
    assert layer.load[3].item() == 0.0
    out.square().sum().backward()
    for e, expert in enumerate(layer.experts):
        for name, p in expert.named_parameters():
            assert p.grad is not None, (e, name)
            assert torch.equal(p.grad, torch.zeros_like(p)) == (e == 3), (e, name)
    assert layer.router.weight.grad[3].abs().max() > 0  # the router still learns about it


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_one_expert_moe_equals_the_dense_mlp_in_float64(mlp):
    """E = 1, k = 1, C = T: the gate is softmax over one logit, 1, and the expert sees every token
    in order. The dense weights are copied into the expert; outputs, the LM loss and every
    gradient agree (the aux loss, 1 whatever the weights, adds a zero gradient and no loss)."""
    torch.manual_seed(0)
    dense = GPT(preset("tiny", mlp=mlp)).double()
    moe = GPT(preset("tiny", mlp=mlp, moe_experts=1, moe_top_k=1, moe_capacity_factor=1.0)).double()
    renamed = {n.replace(".mlp.", ".mlp.experts.0."): v for n, v in dense.state_dict().items()}
    result = moe.load_state_dict(renamed, strict=False)
    assert sorted(result.missing_keys) == ["blocks.0.mlp.router.weight", "blocks.1.mlp.router.weight"]
    assert not result.unexpected_keys
    idx = torch.randint(0, 256, (3, 64))
    logits_d, loss_d = dense(idx, idx)
    logits_m, loss_m = moe(idx, idx)
    loss_d.backward()
    loss_m.backward()
    grads_m = dict(moe.named_parameters())
    diffs = [(logits_d - logits_m).abs().max().item(), abs(loss_d.item() - loss_m.item())]
    diffs += [(p.grad - grads_m[n.replace(".mlp.", ".mlp.experts.0.")].grad).abs().max().item()
              for n, p in dense.named_parameters()]
    print(f"one-expert MoE vs dense ({mlp}): max |diff| {max(diffs):.3g}")
    assert max(diffs) <= 1e-12
    for i in range(2):
        assert torch.equal(grads_m[f"blocks.{i}.mlp.router.weight"].grad, torch.zeros(1, 64, dtype=torch.float64))


def counts_by_hand(name: str, E: int, k: int) -> tuple[int, int]:
    """(total, active) parameters of a GELU preset with E experts of width h, counted by hand:
    per block 4 d^2 attention, 2 norms, an E x d router, E experts of 2 d h; token and position
    tables, the final norm and an untied lm_head outside. A token is active in k of the E experts."""
    c = preset(name)
    d, h, L, V, T = c.d_model, c.hidden, c.n_layer, c.vocab_size, c.block_size
    total = L * (4 * d * d + 2 * d + E * d + E * 2 * d * h) + V * d + T * d + d + V * d
    return total, total - L * (E - k) * 2 * d * h


@pytest.mark.parametrize("name", ["tiny", "small"])
@pytest.mark.parametrize("E,k", [(4, 2), (8, 2)])
def test_total_and_active_parameter_counts_by_hand(name, E, k):
    model = GPT(preset(name, moe_experts=E, moe_top_k=k))
    total, active = counts_by_hand(name, E, k)
    print(f"{name} E={E} k={k}: total {total}, active {active}")
    assert (model.num_params(), model.num_params(active=True)) == (total, active)
    pos = preset(name).block_size * preset(name).d_model
    assert model.num_params(non_embedding=True, active=True) == active - pos
    dense = GPT(preset(name))
    assert dense.num_params(active=True) == dense.num_params()


def test_muon_orthogonalizes_each_expert_matrix_and_gives_the_router_to_adamw():
    model = GPT(preset("tiny", moe_experts=4, moe_top_k=2))
    for module in (model, Stage(model, 1, 2)):  # the whole model, and a pipeline stage
        opt = build_optimizer("muon", module)
        muon = {id(p) for o in opt.optimizers if isinstance(o, (torch.optim.Muon, LMOMomentum))  # bf16 / float32 NS
                for g in o.param_groups for p in g["params"]}
        names = dict(module.named_parameters())
        experts = [n for n in names if ".experts." in n]
        assert experts and all(id(names[n]) in muon and names[n].ndim == 2 for n in experts)
        routers = [n for n in names if n.endswith("router.weight")]
        assert routers and not any(id(names[n]) in muon for n in routers)
        assert all(id(p) in {id(q) for g in opt.param_groups for q in g["params"]} for p in names.values())


def test_the_moe_path_compiles_without_graph_breaks():
    """fullgraph=True fails on any graph break: fixed capacities keep every shape static."""
    torch.manual_seed(0)
    model = GPT(preset("tiny", moe_experts=4, moe_top_k=2, moe_capacity_factor=1.0))
    idx = torch.randint(0, 256, (2, 64))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    compiled(idx, idx)[1].backward()
    got = [p.grad.clone() for p in model.parameters()]
    stats = moe_load(model)
    model.zero_grad()
    model(idx, idx)[1].backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(got, model.parameters()))
    assert stats == moe_load(model)


def small_run(**kw) -> Config:
    base = dict(preset="tiny", moe_experts=4, moe_top_k=2, moe_capacity_factor=1.0, batch_size=4, block_size=32,
                steps=6, eval_every=3, eval_batches=1, log_every=3, ckpt_every=3, dtype="float64", device="cpu",
                threads=1, progress=False)
    return Config.from_dict({**base, **kw})


def one_process(cfg: Config) -> Trainer:
    trainer = Trainer(cfg)
    while trainer.updates < trainer.cfg.run.steps:
        trainer.step()
    return trainer


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[n] - b[n]).abs().max().item() for n in a)


def test_the_simulator_trains_an_moe_and_logs_the_router_load(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("DELAYLAB_CACHE", str(tmp_path / "cache"))
    code = main(["llm", "train", "--preset", "tiny", "--moe-experts", "4", "--moe-top-k", "2", "--steps", "20",
                 "--eval-batches", "2", "--threads", "1", "--log-every", "5", "--out", str(tmp_path / "run"),
                 "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["steps"] == 20
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert summary["val_loss"] < math.log(256) - 0.5 and lines[-1]["train_loss"] < lines[0]["train_loss"] - 0.3
    for line in lines:
        assert len(line["moe_imbalance"]) == 2 and all(1 <= v <= 2 for v in line["moe_imbalance"])  # E / k = 2
        assert all(0 <= v < 1 for v in line["moe_dropped"]) and all(0 < v <= 4 for v in line["moe_aux"])
    assert summary["params"] == counts_by_hand("tiny", 4, 2)[0]


def test_resume_of_an_moe_run_is_bit_exact(tmp_path):
    cfg = small_run(dtype="float32", optimizer="adamw", delay=1, correction="ef", steps=8, ckpt_every=4)
    full = train(cfg, tmp_path / "full")
    train(cfg, tmp_path / "part", stop_at=4)
    resumed = train(cfg, tmp_path / "part", resume=True)
    assert resumed["val_loss"] == full["val_loss"]
    a, b = (checkpoint.read(tmp_path / d)["model"] for d in ("full", "part"))
    assert all(torch.equal(a[n], b[n]) for n in a)
    metrics = [(tmp_path / d / "metrics.jsonl").read_text().splitlines() for d in ("full", "part")]
    strip = [[{k: v for k, v in json.loads(line).items() if k != "time"} for line in m] for m in metrics]
    assert strip[0] == strip[1]  # the router statistics included


DP_CASES = {"muon-delayed": dict(optimizer="muon", delay=1),
            "adamw-ef-fsdp2": dict(optimizer="adamw", delay=1, correction="ef", dp_shard=True)}


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_two_data_parallel_replicas_equal_one_process_in_float64(tmp_path):
    jobs = [(small_run(dp=2, grad_accum=2, **kw), tmp_path / name) for name, kw in DP_CASES.items()]
    train_replicas(jobs)

    for name, kw in DP_CASES.items():
        ref = one_process(small_run(grad_accum=2, **kw))
        assert any(v > 0 for v in moe_load(ref.model)["moe_dropped"])  # the capacity was binding
        got = checkpoint.read(tmp_path / name)["model"]
        diff = max_diff(got, ref.model.state_dict())
        print(f"dp=2 vs one process, {name}: max |diff| {diff:.3g}")
        assert diff <= TOL, f"{name}: max |diff| {diff:.3g}"
        no_aux = one_process(small_run(grad_accum=2, moe_aux_loss_coef=0.0, **kw))
        assert max_diff(got, no_aux.model.state_dict()) > 1e-6  # the aux loss reached the replicas' gradients


PIPELINE_CASES = {"muon": dict(optimizer="muon"), "adamw-ef": dict(optimizer="adamw", correction="ef")}


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_the_pipeline_equals_the_simulator_with_experts_inside_each_stage(tmp_path):
    cfgs = {name: small_run(schedule="2bw", stages=2, grad_accum=4, batch_size=2, block_size=16, eval_every=50,
                            ckpt_every=0, **kw).resolved("pipeline") for name, kw in PIPELINE_CASES.items()}
    run_jobs([(c, tmp_path / name) for name, c in cfgs.items()])
    for name, c in cfgs.items():
        got = torch.load(tmp_path / name / "model.pt", map_location="cpu", weights_only=True)
        # the simulator of the same flags: --delay 1 --grad-accum 4
        ref = one_process(small_run(delay=1, grad_accum=4, batch_size=2, block_size=16, **PIPELINE_CASES[name]))
        sync = one_process(small_run(delay=0, grad_accum=4, batch_size=2, block_size=16,
                                     optimizer=PIPELINE_CASES[name]["optimizer"]))
        no_aux = one_process(small_run(delay=1, grad_accum=4, batch_size=2, block_size=16, moe_aux_loss_coef=0.0,
                                       **PIPELINE_CASES[name]))
        diff = max_diff(got, ref.model.state_dict())
        print(f"pipeline 2bw P=2 vs simulator, {name}: max |diff| {diff:.3g}")
        assert diff <= TOL, f"{name}: max |diff| {diff:.3g}"
        # the tolerance resolves the delay and the aux loss; the capacity was binding
        assert min(max_diff(got, sync.model.state_dict()), max_diff(got, no_aux.model.state_dict())) > 1e-6
        assert any(v > 0 for v in moe_load(ref.model)["moe_dropped"])


@pytest.mark.parametrize("bad,match", [
    (dict(moe_experts=2, moe_top_k=3), "moe_top_k must be in"), (dict(moe_experts=-1), "moe_experts must be >= 0"),
    (dict(moe_experts=4, moe_capacity_factor=0.0), "moe_capacity_factor"),
    (dict(moe_experts=4, moe_aux_loss_coef=-1.0), "moe_aux_loss_coef"), (dict(mlp_hidden=0), "mlp_hidden"),
])
def test_bad_moe_settings_are_one_line_config_errors(bad, match):
    with pytest.raises(ConfigError, match=match):
        Config.from_dict(preset="tiny", **bad).resolved()


def test_a_dense_config_builds_the_dense_mlp_and_no_buffers():
    model = GPT(Config.from_dict(preset="tiny").model_config(256))
    assert all(type(b.mlp) is MLP for b in model.blocks)
    assert moe_load(model) == {} and not list(model.buffers())  # DDP has no buffers to broadcast


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_one_expert_moe_trains_like_the_dense_model_in_float64(name):
    """The equality above, through training: 6 updates of ``Delayed(build_optimizer(name), delay=1,
    ef)`` from the same weights on the same batches. Each expert matrix is its own parameter (Muon
    orthogonalizes it as it does the dense MLP's), the router's gradient is exactly 0 (a softmax
    over one logit), so the expert follows the dense MLP step by step."""
    from delaylab.optim import Delayed

    torch.manual_seed(0)
    dense = GPT(preset("tiny")).double()
    moe = GPT(preset("tiny", moe_experts=1, moe_top_k=1, moe_capacity_factor=1.0)).double()
    moe.load_state_dict({n.replace(".mlp.", ".mlp.experts.0."): v for n, v in dense.state_dict().items()}, strict=False)
    start = [p.detach().clone() for p in dense.parameters()]
    opts = [Delayed(build_optimizer(name, m, lr=0.01), delay=1, corrections="ef") for m in (dense, moe)]
    gen = torch.Generator().manual_seed(1)
    for _ in range(7):  # 6 updates after the one fill call
        idx = torch.randint(0, 256, (2, 64), generator=gen)
        for model, opt in zip((dense, moe), opts):
            model(idx, idx)[1].backward()
            opt.step()
            opt.zero_grad()
    moved = max((p - q).abs().max().item() for p, q in zip(dense.parameters(), start))
    got = dict(moe.named_parameters())
    diff = max((p - got[n.replace(".mlp.", ".mlp.experts.0.")]).abs().max().item() for n, p in dense.named_parameters())
    print(f"one-expert MoE vs dense after 6 updates ({name}, delay 1 + EF): max |diff| {diff:.3g}")
    assert diff <= 1e-12 and moved > 1e-3
