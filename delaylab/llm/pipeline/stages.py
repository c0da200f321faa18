"""A pipeline stage: a contiguous piece of ``GPT.embed -> GPT.blocks -> GPT.head``.

The blocks are split by :func:`delaylab.llm.train.stage_ranges` (the same split the
single-process simulator uses for per-stage delays), the first stage also owns the
embedding, the last one the head and the loss. Parameter names are the full model's
(``blocks.5.attn.q.weight``), so ``build_optimizer`` routes them as it does for the whole
model (Muon vs AdamW) and the stages' state dicts merge into a ``GPT`` state dict.
"""

from __future__ import annotations

import torch
from torch import nn

from delaylab.llm.model import GPT
from delaylab.llm.train import stage_ranges


class Stage(nn.Module):
    """Stage ``index`` of ``stages``: holds (not copies) the model's modules it needs."""

    def __init__(self, model: GPT, index: int, stages: int):
        super().__init__()
        if model.config.tie_embeddings and stages > 1:
            # The tied matrix would live on the first and the last stage, and its two
            # gradients would have to meet at every update: a cross-stage sync 2BW avoids.
            raise ValueError("a pipeline needs untied embeddings (tie_embeddings=False)")
        layers = stage_ranges(len(model.blocks), stages)[index]
        if not layers:
            raise ValueError(f"{stages} stages but the model has only {len(model.blocks)} layers")
        self.index, self.stages = index, stages
        self.first, self.last = index == 0, index == stages - 1
        self.layers = layers
        self.embed = model.embed if self.first else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layers})
        self.head = model.head if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids ``[B, T]`` (first stage) or activations ``[B, T, d]`` in; activations or logits out."""
        h = self.embed(x) if self.embed is not None else x
        for block in self.blocks.values():
            h = block(h)
        return self.head(h) if self.head is not None else h
