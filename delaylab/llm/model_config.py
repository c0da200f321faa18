"""The GPT's shape: :class:`GPTConfig` and the named presets, the one list of model sizes.

Plain data (no torch), so the run config (:mod:`delaylab.llm.config`) and the command line take
their ``--preset`` choices from :data:`PRESETS` without loading torch; :mod:`delaylab.llm.model`
builds the modules.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

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
    # Mixture of experts (see MoE): E experts per MLP, 0 = the dense MLP; each token goes to k.
    moe_experts: int = 0
    moe_top_k: int = 2
    moe_capacity_factor: float = 1.25  # slots per expert and sequence: ceil(factor * T * k / E), <= T
    moe_aux_loss_coef: float = 0.01  # Switch Transformer's alpha

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
        if self.mlp_hidden is not None and self.mlp_hidden < 1:
            raise ConfigError(f"mlp_hidden must be >= 1, got {self.mlp_hidden}")
        if self.moe_experts < 0:
            raise ConfigError(f"moe_experts must be >= 0, got {self.moe_experts}")
        if self.moe_experts:
            if not 1 <= self.moe_top_k <= self.moe_experts:
                raise ConfigError(f"moe_top_k must be in [1, moe_experts={self.moe_experts}], "
                                  f"got {self.moe_top_k}")
            if not (0 < self.moe_capacity_factor < math.inf):
                raise ConfigError(f"moe_capacity_factor must be > 0, got {self.moe_capacity_factor}")
            if not (0 <= self.moe_aux_loss_coef < math.inf):
                raise ConfigError(f"moe_aux_loss_coef must be >= 0, got {self.moe_aux_loss_coef}")

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
        """From :meth:`to_dict`'s dict. One written when the model config still carried
        ``grad_accum`` (a training knob, now the run config's alone: the engines pass it to
        :class:`~delaylab.llm.model.GPT`) is read without it."""
        d = {k: v for k, v in d.items() if k != "grad_accum"}
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
    # The bottom of the tokens-per-parameter axis (cpu-tokens-2): tiny's shape at d = 32 and 48
    # (43k and 83k parameters at vocab 256 and context 64, against tiny's 135k).
    "nano": GPTConfig(n_layer=2, n_head=4, d_model=32, block_size=64),
    "micro": GPTConfig(n_layer=2, n_head=4, d_model=48, block_size=64),
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
