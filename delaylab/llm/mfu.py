"""Model FLOPs utilization: the FLOPs a token costs, the device's peak, and their ratio.

FLOPs per token of a training step (forward + backward), the count of the PaLM paper (Chowdhery
et al. 2022, arXiv:2204.02311, Appendix B), which torchtitan and nanoGPT use too::

    6 N + 12 L d T                       (the convention: "mfu")

``N`` the parameters that take part in a matrix multiplication (every ``nn.Linear``: attention
q/k/v/proj, the MLP, the lm_head even when tied to the embedding, an MoE router; not the
embedding lookups, norms or biases), ``L`` layers, ``d`` the model width and ``T`` the context:
2 FLOPs per multiply-add, the backward twice the forward, and ``12 L d T`` the attention scores and
their weighted sum over the full ``T x T`` matrix (causal masking not discounted, as in the paper).
A causal kernel (flash attention) computes only the blocks on and below the diagonal, about half of
that matrix, so the FLOPs it executes are::

    6 N + 6 L d T                        (causal: "mfu_causal")

the attention term halved, as FlashAttention's benchmark counts a causal run (its ``flops()`` in
Dao-AILab/flash-attention, ``benchmarks/benchmark_flash_attention.py``: ``// 2`` when causal). Both are
reported, each named (:data:`MFU_NAMES`): the convention's is comparable with torchtitan's and
nanoGPT's figures, the causal one is the utilization of what the kernels ran; at ``360m`` and
T = 2048 the convention's is 1.17 times the causal one. An MoE layer counts its router and ``k`` of
its ``E`` experts (the active parameters), whatever capacity pads or drops.
``tests/llm/test_mfu.py`` checks both counts by hand and the convention against torch's own FLOP
counter.

MFU = tokens/s x FLOPs per token / (devices x peak FLOP/s). The peak is ``--peak-tflops`` when
given, else the bf16 dense tensor-core figure of a known GPU (:data:`PEAK_TFLOPS`, matched on
``torch.cuda.get_device_name``), else unknown (the CPU): MFU is then not reported.
"""

from __future__ import annotations

import torch
from torch import nn

# bf16 dense tensor-core TFLOPS, by a substring of the device name (first match wins: the
# specific names before their family). NVIDIA's datasheets give these figures "with sparsity";
# dense is half of that (their footnote):
#   H200: https://www.nvidia.com/en-us/data-center/h200/  (SXM 1,979; NVL 1,671 with sparsity)
#   H100: https://www.nvidia.com/en-us/data-center/h100/  (SXM 1,979; NVL 1,671; PCIe 1,513 with sparsity)
#   A100: https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/
#         nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf  (BF16 312, 624 with sparsity)
PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200 NVL", 835.5),
    ("H200", 989.5),
    ("H100 NVL", 835.5),
    ("H100 PCIe", 756.5),
    ("H100", 989.5),
    ("A100", 312.0),
)


def matmul_params(model: nn.Module) -> float:
    """``N``: the weights of the model's matrix multiplications, an MoE layer's experts at k / E."""
    from delaylab.llm.model import MoE

    experts = {}  # id of an expert's Linear -> the share of tokens it sees (k / E)
    for moe in (m for m in model.modules() if isinstance(m, MoE)):
        for lin in (m for m in moe.experts.modules() if isinstance(m, nn.Linear)):
            experts[id(lin)] = moe.top_k / moe.n_experts
    return sum(m.weight.numel() * experts.get(id(m), 1.0) for m in model.modules() if isinstance(m, nn.Linear))


# The two counts' names, as records and tables print them (the module docstring).
MFU_NAMES = {"mfu": "6 N + 12 L d T (convention: PaLM, torchtitan, nanoGPT)",
             "mfu_causal": "6 N + 6 L d T (causal: the attention a causal kernel runs)"}


def flops_per_token(model_cfg, causal: bool = False) -> float:
    """Training FLOPs per token of a GPT of ``model_cfg`` (a :class:`~delaylab.llm.model.GPTConfig`):
    ``6 N + 12 L d T``, or with ``causal`` ``6 N + 6 L d T`` (the module docstring)."""
    from delaylab.llm.model import GPT

    with torch.device("meta"):  # the shapes only: no memory, no init time at 360m
        model = GPT(model_cfg)
    c = model_cfg
    return 6 * matmul_params(model) + (6 if causal else 12) * c.n_layer * c.d_model * c.block_size


def mfu_both(tokens_per_s: float | None, model_cfg, devices: int, peak: float | None) -> dict:
    """``{"mfu": ..., "mfu_causal": ...}``: :func:`mfu` under each count of :data:`MFU_NAMES`."""
    return {name: mfu(tokens_per_s, flops_per_token(model_cfg, causal=name == "mfu_causal"), devices, peak)
            for name in MFU_NAMES}


def peak_tflops(device: torch.device, override: float | None = None) -> float | None:
    """The device's peak TFLOPS: ``override``, else the table's figure for a known GPU, else None."""
    if override is not None:
        return float(override)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((tf for key, tf in PEAK_TFLOPS if key in name), None)


def mfu(tokens_per_s: float | None, flops: float, devices: int, peak: float | None) -> float | None:
    """The share of ``devices`` x ``peak`` TFLOPS that ``tokens_per_s`` tokens of ``flops`` each use."""
    if tokens_per_s is None or peak is None:
        return None
    return tokens_per_s * flops / (devices * peak * 1e12)


def matmul_tflops(device: torch.device, n: int = 1024, dtype=torch.float32, reps: int = 20) -> float:
    """The best rate of an ``n x n`` matrix product on ``device`` over ``reps`` fenced runs, in TFLOPS: the
    peak a CPU has no datasheet figure for (benchmarks/trainer_throughput.py, ``llm train --dry-run``)."""
    import time

    def fence():
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)

    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        fence()
        t0 = time.perf_counter()
        a @ b
        fence()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e12
