import math

import pytest
import torch
import torch.nn.functional as F

from delaylab.errors import ConfigError
from delaylab.llm.model import GPT, GPTConfig, PRESETS, lm_loss, preset


def tiny(**kw):
    torch.manual_seed(0)
    return GPT(preset("tiny", **kw))


def test_forward_shapes_and_initial_loss_near_uniform():
    model = tiny()
    idx = torch.randint(0, 256, (3, 64))
    logits, loss = model(idx, idx)
    assert logits.shape == (3, 64, 256)
    # Small init: the prediction is close to uniform, so the loss is close to ln V.
    assert abs(loss.item() - math.log(256)) < 0.05
    assert model(idx)[1] is None


def test_causal_future_tokens_do_not_change_past_logits():
    model = tiny()
    idx = torch.randint(0, 256, (2, 32))
    changed = idx.clone()
    changed[:, 20:] = (changed[:, 20:] + 7) % 256
    a, b = model(idx)[0], model(changed)[0]
    torch.testing.assert_close(a[:, :20], b[:, :20], rtol=0, atol=0)
    assert (a[:, 20] - b[:, 20]).abs().max() > 1e-4


def test_stages_compose_to_the_full_forward_bitwise():
    model = tiny(n_layer=4)
    idx = torch.randint(0, 256, (2, 16))
    full = model(idx)[0]
    h = model.embed(idx)  # stage 0: embed + blocks[:1]
    h = model.blocks[0](h)
    for block in model.blocks[1:3]:  # stage 1
        h = block(h)
    logits = model.head(model.blocks[3](h))  # stage 2
    assert torch.equal(full, logits)


def manual_attention(attn, x, n_head, n_kv):
    B, T, C = x.shape
    hd = C // n_head
    q = (x @ attn.q.weight.T).view(B, T, n_head, hd).transpose(1, 2)
    k = (x @ attn.k.weight.T).view(B, T, n_kv, hd).transpose(1, 2)
    v = (x @ attn.v.weight.T).view(B, T, n_kv, hd).transpose(1, 2)
    rep = n_head // n_kv  # query head i reads kv head i // rep
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v
    return y.transpose(1, 2).reshape(B, T, C) @ attn.proj.weight.T


@pytest.mark.parametrize("n_kv", [None, 2, 1])
def test_attention_matches_a_hand_written_causal_softmax(n_kv):
    model = tiny(n_head=4, n_kv_head=n_kv).double()
    attn = model.blocks[0].attn
    x = torch.randn(2, 10, 64, dtype=torch.float64)
    torch.testing.assert_close(attn(x), manual_attention(attn, x, 4, n_kv or 4), rtol=1e-10, atol=1e-12)


def test_swiglu_mlp_is_silu_gate_times_up():
    model = tiny(mlp="swiglu").double()
    mlp = model.blocks[0].mlp
    assert mlp.up.weight.shape == (192, 64)  # 8 * 64 / 3 = 170.7, rounded up to 64
    x = torch.randn(5, 64, dtype=torch.float64)
    want = (F.silu(x @ mlp.gate.weight.T) * (x @ mlp.up.weight.T)) @ mlp.down.weight.T
    torch.testing.assert_close(mlp(x), want)


def test_lm_loss_is_mean_negative_log_likelihood():
    logits = torch.randn(2, 5, 11)
    targets = torch.randint(0, 11, (2, 5))
    logp = logits.log_softmax(-1)
    want = -logp.gather(-1, targets[..., None]).mean()
    torch.testing.assert_close(lm_loss(logits, targets), want)


def test_tied_embeddings_share_one_tensor():
    untied, tied = tiny(), tiny(tie_embeddings=True)
    assert tied.head.lm_head.weight is tied.embed.tok.weight
    assert untied.num_params() - tied.num_params() == 256 * 64


def expected_params(cfg: GPTConfig) -> int:
    """Non-position parameters counted by hand: per block 2 norms, q/k/v/proj, the MLP."""
    d, hd = cfg.d_model, cfg.d_model // cfg.n_head
    attn = 2 * d * d + 2 * d * cfg.kv_heads * hd
    mlp = (3 if cfg.mlp == "swiglu" else 2) * d * cfg.hidden
    per_block = 2 * d + attn + mlp
    embeddings = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    return cfg.n_layer * per_block + embeddings + d


@pytest.mark.parametrize("name,published", [("135m", 134.5e6), ("360m", 361.8e6)])
def test_gpu_presets_have_the_paper_model_sizes(name, published):
    cfg = PRESETS[name]
    with torch.device("meta"):
        model = GPT(cfg)
    n = model.num_params(non_embedding=True)
    assert n == expected_params(cfg)
    assert abs(n - published) < 0.05e6


@pytest.mark.parametrize("experts", [0, 4])
def test_parameter_names_route_matrices_of_blocks_to_muon(experts):
    model = tiny(tie_embeddings=False, moe_experts=experts)
    for name, p in model.named_parameters():
        outside_blocks = name.startswith(("embed.", "head."))
        assert outside_blocks == ("embed" in name or "head" in name), name
        if name.startswith("blocks."):
            assert p.ndim == 2 or "norm" in name, name


def test_bad_configs_raise_value_error():
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")
    with pytest.raises(ValueError, match="mlp"):
        GPTConfig(mlp="relu")
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(d_model=130, n_head=4)
    with pytest.raises(ValueError, match="block_size"):
        tiny()(torch.zeros(1, 65, dtype=torch.long))


def test_the_config_and_the_command_line_take_their_presets_from_the_one_list():
    import argparse
    import subprocess
    import sys

    from delaylab.commands.reproduce import register
    from delaylab.llm.config import leaf_fields
    from delaylab.reproduce.presets import PRESETS as REPRODUCE_PRESETS

    assert leaf_fields()["preset"][1].metadata["choices"] == tuple(PRESETS)
    sub = argparse.ArgumentParser().add_subparsers()
    register(sub)
    help_text = sub.choices["reproduce"].format_help()
    assert all(name in help_text for name in REPRODUCE_PRESETS)
    # the list is plain data: the config reads it without loading torch
    code = "import sys, delaylab.llm.config; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_grad_accum_is_the_runs_and_an_old_model_config_that_carries_it_still_reads():
    """M (microbatches per update) is a training knob: the run passes it to GPT (the MoE aux loss
    scale), the model config holds the shape alone; a model config saved with it reads without it."""
    old = {**preset("tiny").to_dict(), "grad_accum": 4}
    assert GPTConfig.from_dict(old) == preset("tiny") and "grad_accum" not in preset("tiny").to_dict()
    moe = GPT(preset("tiny", moe_experts=2, moe_top_k=1), grad_accum=4)
    assert {b.mlp.aux_scale for b in moe.blocks} == {0.01 / 4}
    with pytest.raises(ConfigError, match="grad_accum"):
        GPT(preset("tiny"), grad_accum=0)
    with pytest.raises(ConfigError, match="unknown GPTConfig fields"):
        GPTConfig.from_dict({**old, "n_layers": 2})
