"""A nanoGPT-style decoder built as ``embed -> blocks -> head`` so it splits into pipeline stages.

- ``GPT.embed``: token + learned position embedding, ``idx[B, T] -> h[B, T, d]``.
- ``GPT.blocks``: an ``nn.ModuleList`` of pre-norm transformer blocks, each ``h -> h``.
- ``GPT.head``: final norm + ``lm_head``, ``h -> logits[B, T, V]``.

A pipeline stage is any contiguous piece of that chain (``embed`` + ``blocks[:k]``, ...,
``blocks[j:]`` + ``head``); :func:`lm_loss` is the one place the loss is computed.

Parameter names are what ``delaylab.optim.build_optimizer("muon", model)`` routes on:
everything under ``embed.`` or ``head.`` (and every non-2-D tensor: norms, biases) goes to
AdamW, the 2-D matrices inside ``blocks.`` go to Muon. Block parameters therefore never
contain the words "embed" or "head" (attention heads live in ``attn.q/k/v/proj``).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn as nn
import torch.nn.functional as F
from delaylab.errors import ConfigError


@dataclass
class GPTConfig:
    vocab_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 128
    block_size: int = 128  # context length
    mlp: str = "gelu"  # "gelu" (4d hidden) or "swiglu" (8d/3 hidden, rounded up to 64)
    tie_embeddings: bool = False
    dropout: float = 0.0
    n_kv_head: int | None = None  # grouped-query attention; None = n_head (plain multi-head)
    mlp_hidden: int | None = None  # None = the mlp's usual width (see ``hidden``)
    bias: bool = False  # biases in Linear layers and LayerNorms

    def __post_init__(self) -> None:
        if self.mlp not in ("gelu", "swiglu"):
            raise ConfigError(f"unknown mlp {self.mlp!r} (choose gelu or swiglu)")
        for name in ("vocab_size", "n_layer", "n_head", "d_model", "block_size"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_head:
            raise ConfigError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if self.n_head % self.kv_heads:
            raise ConfigError(f"n_head={self.n_head} is not divisible by n_kv_head={self.kv_heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout}")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def hidden(self) -> int:
        if self.mlp_hidden:
            return self.mlp_hidden
        if self.mlp == "gelu":
            return 4 * self.d_model
        # SwiGLU has three matrices instead of two: 8d/3 keeps the parameter count of a 4d GELU MLP.
        return 64 * math.ceil(8 * self.d_model / 3 / 64)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"unknown GPTConfig fields: {', '.join(sorted(unknown))}")
        return cls(**d)


# Presets. vocab_size is the model's default; the trainer sets it from the tokenizer
# (256 for the byte-level one). The GPU sizes follow the SmolLM2-135M and SmolLM-360M
# shapes (Llama-style: SwiGLU, grouped-query attention, tied embeddings), the model sizes
# the paper reports: at vocab 49152, 134.5M and 361.8M parameters besides the position
# table, SmolLM's own counts (tests/llm/test_model.py checks them). Learned position
# embeddings stand in for RoPE to keep one embedding module; they add block_size * d
# parameters (1.2M / 2.0M).
PRESETS: dict[str, GPTConfig] = {
    # CI: a run of a few hundred steps takes seconds on one core.
    "tiny": GPTConfig(n_layer=2, n_head=4, d_model=64, block_size=64),
    # The CPU benchmark of the issue: a 4-layer byte-level GPT, d=128, context 128.
    "small": GPTConfig(n_layer=4, n_head=4, d_model=128, block_size=128),
    # The top of the CPU scale axis (delaylab reproduce): a few M parameters, 3.6x small.
    "medium": GPTConfig(n_layer=5, n_head=4, d_model=192, block_size=128),
    "135m": GPTConfig(
        vocab_size=49152, n_layer=30, n_head=9, n_kv_head=3, d_model=576, block_size=2048,
        mlp="swiglu", mlp_hidden=1536, tie_embeddings=True,
    ),
    "360m": GPTConfig(
        vocab_size=49152, n_layer=32, n_head=15, n_kv_head=5, d_model=960, block_size=2048,
        mlp="swiglu", mlp_hidden=2560, tie_embeddings=True,
    ),
}


def preset(name: str, **overrides) -> GPTConfig:
    """A copy of preset ``name`` with ``overrides`` applied (e.g. ``vocab_size=256``)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    return replace(PRESETS[name], **overrides)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.n_kv = cfg.n_head, cfg.kv_heads
        self.hd = cfg.d_model // cfg.n_head
        # Separate q/k/v matrices, so Muon orthogonalizes each one rather than a fused qkv.
        self.q = nn.Linear(cfg.d_model, self.n_head * self.hd, bias=cfg.bias)
        self.k = nn.Linear(cfg.d_model, self.n_kv * self.hd, bias=cfg.bias)
        self.v = nn.Linear(cfg.d_model, self.n_kv * self.hd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_head, self.hd).transpose(1, 2)  # (B, nh, T, hd)
        k = self.k(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)  # (B, nkv, T, hd)
        v = self.v(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0,
            enable_gqa=self.n_kv != self.n_head,
        )
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        self.up = nn.Linear(cfg.d_model, cfg.hidden, bias=cfg.bias)
        if self.swiglu:
            self.gate = nn.Linear(cfg.d_model, cfg.hidden, bias=cfg.bias)
        self.down = nn.Linear(cfg.hidden, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.gate(x)) * self.up(x) if self.swiglu else F.gelu(self.up(x))
        return self.down(h)


class Block(nn.Module):
    """Pre-norm residual block: ``h + attn(norm(h))``, then ``h + mlp(norm(h))``."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.drop(self.attn(self.norm1(h)))
        return h + self.drop(self.mlp(self.norm2(h)))


class Embedding(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        return self.drop(self.tok(idx) + self.pos(pos))  # (B, T, d)


class Head(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))  # (B, T, V)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy, in float32 at least (bf16 autocast logits are cast up;
    a float64 model keeps float64)."""
    wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(wide.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.embed = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.head = Head(cfg)
        if cfg.tie_embeddings:
            self.head.lm_head.weight = self.embed.tok.weight
        self.apply(self._init_weights)
        # GPT-2's scaled init: each residual branch's output matrix gets std / sqrt(2 n_layer),
        # so the residual stream's variance does not grow with depth.
        for block in self.blocks:
            for w in (block.attn.proj.weight, block.mlp.down.weight):
                nn.init.normal_(w, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        if idx.shape[1] > self.config.block_size:
            raise ConfigError(f"sequence length {idx.shape[1]} > block_size {self.config.block_size}")
        h = self.embed(idx)
        for block in self.blocks:
            h = block(h)
        logits = self.head(h)
        return logits, (lm_loss(logits, targets) if targets is not None else None)

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters, each tied tensor counted once; ``non_embedding`` drops the position table."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.embed.pos.weight.numel() if non_embedding else n


def stage_ranges(n_layer: int, n_stages: int) -> list[range]:
    """Contiguous block ranges, as even as possible; earlier stages take the remainder."""
    q, r = divmod(n_layer, n_stages)
    sizes = [q + (i < r) for i in range(n_stages)]
    starts = [sum(sizes[:i]) for i in range(n_stages)]
    return [range(s, s + n) for s, n in zip(starts, sizes)]


def autocast(device: torch.device | str):
    """bf16 autocast on GPU; a no-op on CPU, where the model runs in float32."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
