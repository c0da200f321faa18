"""FLOPs per token and MFU: the formula against hand counts and against torch's own FLOP counter."""

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from delaylab.llm import mfu
from delaylab.llm.model import GPT, preset
from delaylab.llm.run.trainer import train


def counted_flops_per_token(cfg) -> float:
    """torch's FlopCounterMode over one forward + backward (attention on the math backend, which
    it counts: two batched matmuls), per token."""
    torch.manual_seed(0)
    model = GPT(cfg)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.block_size))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(x, x)[1].backward()
    return counter.get_total_flops() / x.numel()


def test_flops_per_token_by_hand():
    # tiny: L = 2, d = 64, T = 64, GELU MLP 4d, vocab 256, untied: per block q, k, v, proj (4 d^2) and
    # the MLP (8 d^2); the lm_head d V.
    n = 2 * (4 * 64 * 64 + 8 * 64 * 64) + 64 * 256
    assert mfu.flops_per_token(preset("tiny", vocab_size=256)) == 6 * n + 12 * 2 * 64 * 64
    # 135m (SmolLM2-135M's shape): GQA k, v of 3 of 9 heads, SwiGLU 1536, the tied lm_head counted
    # (its matrix product happens; the embedding lookup is not one).
    d, L, T, V = 576, 30, 2048, 49152
    n = L * (2 * d * d + 2 * d * (d // 3) + 3 * d * 1536) + d * V
    assert mfu.flops_per_token(preset("135m")) == 6 * n + 12 * L * d * T


@pytest.mark.parametrize("name,kw", [("tiny", {}), ("135m", dict(n_layer=2, block_size=128, vocab_size=256))])
def test_flops_per_token_is_what_torch_counts(name, kw):
    cfg = preset(name, **{"vocab_size": 256, **kw})
    assert counted_flops_per_token(cfg) == mfu.flops_per_token(cfg)


def test_an_moe_counts_its_active_experts():
    """k of E experts per token; torch's counter sees every expert run on its capacity's slots
    (E * C slot rows per sequence of T), so the two differ by exactly that factor on the experts."""
    cfg = preset("tiny", vocab_size=256, moe_experts=4, moe_top_k=2, moe_capacity_factor=1.25)
    expert = 2 * 64 * 256  # one expert's GELU MLP
    rest = 2 * (4 * 64 * 64 + 64 * 4) + 64 * 256  # attention, routers, lm_head
    attention = 12 * 2 * 64 * 64
    assert mfu.flops_per_token(cfg) == 6 * (rest + 2 * 2 * expert) + attention  # 2 layers, k = 2
    C = 40  # min(T, ceil(1.25 * 64 * 2 / 4))
    assert counted_flops_per_token(cfg) == 6 * (rest + 2 * 4 * C / 64 * expert) + attention


def test_the_peak_table_and_its_override(monkeypatch):
    cuda = torch.device("cuda", 0)
    for name, want in [("NVIDIA H200", 989.5), ("NVIDIA H100 80GB HBM3", 989.5), ("NVIDIA H100 PCIe", 756.5),
                       ("NVIDIA H100 NVL", 835.5), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100-PCIE-40GB", 312.0),
                       ("NVIDIA GeForce RTX 4090", None)]:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda d, name=name: name)
        assert mfu.peak_tflops(cuda) == want, name
    assert mfu.peak_tflops(torch.device("cpu")) is None
    assert mfu.peak_tflops(cuda, 123.0) == mfu.peak_tflops(torch.device("cpu"), 123.0) == 123.0
    assert mfu.mfu(1e6, 1e9, 2, 500.0) == pytest.approx(1e15 / 1e15)
    assert mfu.mfu(None, 1e9, 1, 500.0) is None and mfu.mfu(1e6, 1e9, 1, None) is None


def test_the_summary_reports_steady_tokens_per_s_and_mfu(quick, corpus):
    s = train(quick(steps=10, peak_tflops=0.5), dataset=corpus)
    assert s["timed_updates"] == 10 - 3  # the first three updates are the warm-up
    assert s["flops_per_token"] == mfu.flops_per_token(preset("tiny", vocab_size=256, block_size=32))
    assert s["peak_tflops"] == 0.5
    assert s["mfu"] == pytest.approx(s["tokens_per_s"] * s["flops_per_token"] / 0.5e12, rel=1e-12)
    assert 0 < s["mfu"] < 1
    plain = train(quick(steps=10), dataset=corpus)
    assert plain["peak_tflops"] is None and plain["mfu"] is None and plain["tokens_per_s"] > 0  # the CPU


def test_the_timing_is_fenced_by_device_synchronizations(quick, corpus, monkeypatch):
    """tokens/s on a GPU needs a synchronize where the clock starts (after the warm-up), around each
    pause (validation, checkpoint) and where it stops; the CPU's synchronize is recorded here."""
    from delaylab.llm.run import trainer as trainer_module

    events = []
    monkeypatch.setattr(trainer_module.Trainer, "synchronize", lambda self: events.append(self.updates))
    train(quick(steps=10, eval_every=5, log_every=5, ckpt_every=0), dataset=corpus)
    # the clock starts after update 3; validation at 5 and 10 is fenced on both sides; the stop at 10
    assert events == [3, 5, 5, 10, 10, 10]


def test_both_counts_by_hand_and_their_ratio_at_360m():
    """The convention (6 N + 12 L d T) and the causal count (6 N + 6 L d T), each by hand."""
    n = 2 * (4 * 64 * 64 + 8 * 64 * 64) + 64 * 256  # tiny, as above
    tiny = preset("tiny", vocab_size=256)
    assert mfu.flops_per_token(tiny, causal=True) == 6 * n + 6 * 2 * 64 * 64
    # 360m at the byte vocabulary (what a device run trains): GQA k, v of 5 of 15 heads, SwiGLU 2560,
    # the tied lm_head 960 x 256 counted.
    d, L, T, V = 960, 32, 2048, 256
    n = L * (2 * d * d + 2 * d * (d // 3) + 3 * d * 2560) + d * V
    cfg = preset("360m", vocab_size=V)
    full, causal = 6 * n + 12 * L * d * T, 6 * n + 6 * L * d * T
    assert mfu.flops_per_token(cfg) == full and mfu.flops_per_token(cfg, causal=True) == causal
    assert full / causal == pytest.approx(1.1666, abs=1e-4)  # the convention's MFU is 17% above the causal one
    both = mfu.mfu_both(1e4, cfg, 1, 989.5)
    assert list(both) == list(mfu.MFU_NAMES) == ["mfu", "mfu_causal"]
    assert both == {"mfu": pytest.approx(1e4 * full / 989.5e12, rel=1e-12),
                    "mfu_causal": pytest.approx(1e4 * causal / 989.5e12, rel=1e-12)}
    assert mfu.mfu_both(None, cfg, 1, 989.5) == {"mfu": None, "mfu_causal": None}
