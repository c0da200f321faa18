"""A pipeline stage: a contiguous piece of ``GPT.embed -> GPT.blocks -> GPT.head``.

The blocks are split by :func:`delaylab.llm.model.stage_ranges` (the same split the
single-process simulator uses for per-stage delays), the first stage also owns the
embedding, the last one the head and the loss. Parameter names are the full model's
(``blocks.5.attn.q.weight``), so ``build_optimizer`` routes them as it does for the whole
model (Muon vs AdamW) and the stages' state dicts merge into a ``GPT`` state dict. With tied
embeddings the first and the last stage each hold the shared matrix (as ``embed.tok.weight``
and ``head.lm_head.weight``); the engine sums its two gradients before every update, so the
two copies stay equal.
"""

from __future__ import annotations

import torch
from torch import nn

from delaylab.errors import ConfigError
from delaylab.llm.model import GPT, stage_ranges


class Stage(nn.Module):
    """Stage ``index`` of ``stages``: holds (not copies) the model's modules it needs."""

    def __init__(self, model: GPT, index: int, stages: int):
        super().__init__()
        layers = stage_ranges(len(model.blocks), stages)[index]
        if not layers:
            raise ConfigError(f"{stages} stages but the model has only {len(model.blocks)} layers")
        self.index, self.stages = index, stages
        self.first, self.last = index == 0, index == stages - 1
        self.layers = layers
        self.embed = model.embed if self.first else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layers})
        self.head = model.head if self.last else None

    def tied_name(self) -> str:
        """This stage's name of the tied embedding / lm_head matrix (first or last stage)."""
        return "embed.tok.weight" if self.first else "head.lm_head.weight"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids ``[B, T]`` (first stage) or activations ``[B, T, d]`` in; activations or logits out."""
        h = self.embed(x) if self.embed is not None else x
        for block in self.blocks.values():
            h = block(h)
        return self.head(h) if self.head is not None else h


def optimizer_factory(cfg):
    """``make(module, tau)``: a pipeline stage's optimizer, with its correctors at the stage's lag ``tau``."""
    from delaylab.optim import Delayed, build_optimizer
    from delaylab.optim.corrections import for_stage

    hp = cfg.optimizer_kwargs()

    def make(module, tau: int):
        inner = build_optimizer(cfg.optim.optimizer, module, **hp)
        if cfg.delay.correction != "none":
            # The stage's gradients are stale already: its correctors at the stage's lag, no queue.
            return Delayed(inner, delay=0, corrections=for_stage(cfg.delay.correction, tau))
        return inner

    return make
