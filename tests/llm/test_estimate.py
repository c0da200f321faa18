"""`delaylab llm train --dry-run`: the parameter count against the model's own, each memory term against
a hand count and against what the optimizer, the delay queue, the correctors and autograd really keep,
the time against its formula; and a dry run trains nothing and writes nothing."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from delaylab.cli import main
from delaylab.llm.config import Config
from delaylab.llm.estimate import ASSUMED_MFU, activation_bytes, estimate, memory, planned
from delaylab.llm.model import GPT
from delaylab.llm.model_config import preset
from delaylab.optim import OPTIMIZERS

TINY = dict(preset="tiny", batch_size=2, block_size=16, steps=10, threads=1, progress=False, device="cpu")


def _cfg(**kw) -> Config:
    return planned(Config.from_dict({**TINY, **kw}))


@pytest.mark.parametrize("kw", [{}, {"mlp": "swiglu", "n_layer": 3}, {"tie_embeddings": True, "preset": "small"},
                                {"moe_experts": 4, "moe_top_k": 2}])
def test_parameter_count_is_the_models(kw):
    cfg = _cfg(**kw)
    torch.manual_seed(0)
    model = GPT(cfg.model_config(256), cfg.data.grad_accum)  # on the CPU, as the trainer builds it
    assert estimate(cfg)["parameters"] == sum(p.numel() for p in model.parameters())


def test_memory_against_a_hand_count():
    """tiny (2 layers, d 64, 4 heads, GELU 256, byte vocabulary 256) at context 16, 2 sequences,
    AdamW with delay 1 and EF, float32 on the CPU."""
    cfg = _cfg(delay=1, correction="ef")
    n = 135488 - 64 * 64 + 16 * 64  # the preset's count at context 64, with 16 positions instead
    m = memory(cfg)
    assert m["params"] == m["grads"] == 4 * n
    assert m["optimizer"] == 2 * 4 * n  # exp_avg and exp_avg_sq
    assert m["delay_queue"] == 1 * 4 * n and m["correctors"] == 4 * n  # one queued gradient, the EF buffer
    per_layer = 32 * 64 + 8 * 256 + 4 * (4 + 4)  # bytes per token
    assert m["activations"] == 2 * 16 * (2 * per_layer + 8 * 64 + 8 * 256 + 16)
    assert m["total"] == 4 * n * 6 + m["activations"]
    # D = 2 replicas: half the rows each; FSDP2 shards the rest
    sharded = memory(_cfg(dp=2, dp_shard=True, delay=1, correction="ef"))
    assert sharded["activations"] == m["activations"] // 2 and sharded["params"] == 4 * n // 2


def _state_bytes(obj) -> int:
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size() if obj.ndim > 0 else 0
    if isinstance(obj, dict):
        return sum(_state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_state_bytes(v) for v in obj)
    return 0


def _leaves(opt):
    parts = getattr(opt, "optimizers", None)
    return [leaf for o in parts for leaf in _leaves(o)] if parts else [opt]


@pytest.mark.parametrize("name", OPTIMIZERS)
@pytest.mark.parametrize("correction", ["ef", "dc-asgd-a", "predict"])
def test_optimizer_queue_and_corrector_terms_are_what_the_optimizer_keeps(name, correction):
    """After a few steps of the real Delayed optimizer on tiny: the inner optimizer's state, the queued
    gradients and the correctors' state (Delayed.corrector_bytes) equal the estimate's terms."""
    from delaylab.llm.run.setup import build_delayed_optimizer

    if name in ("lion", "soap", "adan", "mars"):
        pytest.importorskip("pytorch_optimizer")
    if name == "soap" and correction != "ef":
        pytest.skip("one correction is enough for SOAP's slow steps")
    cfg = _cfg(optimizer=name, delay=2, correction=correction, steps=50)
    torch.manual_seed(0)
    model = GPT(cfg.model_config(256), cfg.data.grad_accum)
    opt = build_delayed_optimizer(model, cfg)
    for _ in range(12):  # SOAP builds its preconditioners at its 10th step
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        opt.step()
    est = memory(cfg)
    assert sum(_state_bytes(leaf.state) for leaf in _leaves(opt.inner)) == est["optimizer"], name
    assert _state_bytes([st.get("queue", []) for st in opt.state.values()]) == est["delay_queue"]
    assert opt.corrector_bytes() == est["correctors"]


def _saved_bytes(mc, rows: int, regime: str) -> int:
    """Bytes of the tensors autograd keeps for the backward of one forward and loss (parameters aside)."""
    torch.manual_seed(0)
    model = GPT(mc).to(torch.float64 if regime == "float64" else torch.float32)
    autocast = regime == "bfloat16"
    x = torch.randint(0, mc.vocab_size, (rows, mc.block_size))
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = max(seen.get(t.untyped_storage().data_ptr(), 0),
                                                   t.untyped_storage().nbytes())
        return t

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            model(x, x)
    return sum(v for ptr, v in seen.items() if ptr not in params)


@pytest.mark.parametrize("regime", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("shape", [dict(), dict(mlp="swiglu"), dict(mlp="gelu", mlp_hidden=96, n_layer=3),
                                   dict(mlp="swiglu", mlp_hidden=160, n_head=2)])
def test_activations_are_what_autograd_saves(regime, shape):
    """The activation term less the logits' gradient (allocated in the backward, not saved) equals the
    saved tensors' bytes of a forward, float32, float64 or under the CPU's bf16 autocast, to 0.1%
    (what the count leaves out: the 260 bytes of the position ids)."""
    from delaylab.llm.mfu import matmul_params

    mc = replace(preset("tiny", vocab_size=256), block_size=32, **shape)
    rows = 3
    scale = 2 if regime == "float64" else 1
    gradient = 4 * scale * mc.vocab_size * rows * mc.block_size
    predicted = activation_bytes(mc, rows, regime, matmul_params(GPT(mc))) - gradient
    measured = _saved_bytes(mc, rows, regime)
    assert predicted == pytest.approx(measured, rel=1e-3)


def test_time_is_its_formula_with_a_given_peak():
    e = estimate(_cfg(peak_tflops=2.0, steps=100))
    t = e["time"]
    assert t["peak_source"] == "--peak-tflops" and t["assumed_mfu"] == ASSUMED_MFU
    tokens = 100 * 2 * 16
    assert e["tokens"] == {"per_update": 32, "updates": 100, "total": tokens}
    assert t["seconds"] == pytest.approx(t["flops_per_token"] * tokens / (2.0e12 * ASSUMED_MFU), rel=1e-12)


def test_cli_dry_run_trains_nothing_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["llm", "train", "--preset", "tiny", "--batch-size", "2", "--block-size", "16", "--steps", "10",
            "--device", "cpu", "--delay", "1", "--correction", "ef", "--out", str(out), "--dry-run"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("\n") == 1 and captured.err == ""
    e = json.loads(captured.out)
    assert e["dry_run"] is True and e["parameters"] == 135488 - 48 * 64
    assert e["config"]["delay"]["correction"] == "ef" and e["memory"]["correctors"] == 4 * e["parameters"]
    assert not out.exists()
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "dry run: nothing is trained" in text and f"parameters: {e['parameters']:,}" in text
    assert "memory per process (estimate): params" in text and "time (estimate):" in text
    assert not out.exists()
    # planned for a GPU this host need not have: bf16 activations, and no time without a peak
    assert main(["llm", "train", "--preset", "tiny", "--device", "cuda", "--dry-run", "--json"]) == 0
    gpu = json.loads(capsys.readouterr().out)
    assert gpu["memory"]["activations_in"] == "bfloat16 autocast"
    if not torch.cuda.is_available():
        assert gpu["time"]["seconds"] is None
