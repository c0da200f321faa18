"""A nanoGPT-style decoder built as ``embed -> blocks -> head`` so it splits into pipeline stages.

- ``GPT.embed``: token + learned position embedding, ``idx[B, T] -> h[B, T, d]``.
- ``GPT.blocks``: an ``nn.ModuleList`` of pre-norm transformer blocks, each ``h -> h``.
- ``GPT.head``: final norm + ``lm_head``, ``h -> logits[B, T, V]``.

A pipeline stage is any contiguous piece of that chain (``embed`` + ``blocks[:k]``, ...,
``blocks[j:]`` + ``head``); :func:`lm_loss` is the one place the loss is computed.

With ``moe_experts = E > 0`` each block's MLP is a mixture of E experts (:class:`MoE`, top-k
token-choice routing); its load-balancing loss reaches the backward through the hidden states,
so every engine trains it without knowing it exists, and :func:`moe_load` reads the router's load.

Parameter names are what ``delaylab.optim.build_optimizer("muon", model)`` routes on:
everything under ``embed.`` or ``head.`` (and every non-2-D tensor: norms, biases) goes to
AdamW, the 2-D matrices inside ``blocks.`` go to Muon (but an MoE router, which names itself
through ``no_muon_parameters``). Block parameters therefore never contain the words "embed" or
"head" (attention heads live in ``attn.q/k/v/proj``).
"""

from __future__ import annotations

import contextlib
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from delaylab.errors import ConfigError
from delaylab.llm.model_config import PRESETS, GPTConfig, preset  # noqa: F401  (re-exported)


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


class _AttachAuxLoss(torch.autograd.Function):
    """``h`` unchanged in the forward; the backward passes ``h``'s gradient through and gives
    ``aux`` the gradient ``scale``, as if ``scale * aux`` had been added to the loss.

    The idea of Megatron-LM's ``MoEAuxLossAutoScaler``: the aux loss rides on the activations,
    so whoever backpropagates them (a trainer's ``loss.backward()``, a pipeline stage's
    ``out.backward(grad)``, DDP, FSDP2) backpropagates it too, once per microbatch.
    """

    @staticmethod
    def forward(ctx, h: torch.Tensor, aux: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(aux)
        ctx.scale = scale
        return h

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, ctx.scale), None


class MoE(nn.Module):
    """A mixture of ``E`` MLP experts with token-choice top-``k`` routing, in place of the MLP.

    - **Router**: ``p = softmax(router(x))`` over the E experts (the softmax in float32 at least), each token
      goes to its k most probable experts, and expert e's output is weighted by ``p_e`` itself:
      the gates are *not* renormalized over the top k (Switch Transformer's choice, Fedus et al.
      2022, JMLR 23(120), eq. 2: with k = 1 renormalized gates would all be 1 and the router
      would get no gradient from the LM loss).
    - **Groups and capacity**: tokens are routed per sequence (a GShard "group", Lepikhin et al.
      2021, ICLR, Algorithm 1, of S = T tokens). Each expert takes at most
      ``C = min(T, ceil(moe_capacity_factor * T * k / E))`` assignments per sequence, every
      token's first choice before any token's second one, and within a choice in sequence order
      (GShard's priority). An assignment over capacity is dropped: it adds nothing, and a token
      with all k dropped passes through the block's residual connection unchanged. Routing by
      sequence keeps data parallelism exact: a replica holds whole sequences.
    - **Load-balancing loss** (Switch, eq. 4-6, for top-k): per sequence
      ``aux = E * sum_e f_e * P_e`` with ``f_e`` the share of the sequence's T*k assignments
      that chose expert e (before capacity) and ``P_e`` the mean router probability of e (1 when
      both are uniform; E when, with k = 1, all goes to one expert), averaged over the
      sequences. Its gradient, scaled by ``moe_aux_loss_coef / grad_accum``, joins the backward
      through :class:`_AttachAuxLoss`; the loss the model returns (and every engine reports)
      stays the LM loss.
    - **Experts** are separate :class:`MLP` modules, each with its own 2-D matrices, so Muon
      orthogonalizes each expert's matrix on its own. All of them run on every call on their
      fixed-size slot buffers ``[B, C, d]`` (empty slots are zeros), so every expert is in the
      autograd graph (a zero gradient, never None, when no token came: DDP needs no
      ``find_unused_parameters``, the delay queue sees the same parameters every call) and the
      shapes do not depend on the routing (no host sync; ``torch.compile(fullgraph=True)``).
    - **The router matrix goes to AdamW under Muon** (:meth:`no_muon_parameters`, which
      ``build_optimizer`` honours): Muon is for hidden layers' matrices (Jordan 2024,
      https://kellerjordan.github.io/posts/muon/, and torch.optim.Muon's docs), the router is a
      small E-way classifier over the hidden state; marin's MoE Muon runs put only the expert
      MLP matrices on Muon (marin-community/marin#5517). Moonlight's example code (Liu et al.
      2025, arXiv:2502.16982) gives every 2-D matrix but the embedding and head to Muon:
      practice varies.
    - **Load statistics** of the last training forward, non-persistent buffers (not in the
      state_dict): ``load[e]``, the share of assignments that chose e (before capacity),
      ``dropped``, the share dropped over capacity, and ``aux_loss`` (unscaled); :func:`moe_load`
      reads them. DDP broadcasts replica 0's buffers before each forward, which then overwrites
      them: harmless, one small collective.
    """

    def __init__(self, cfg: GPTConfig, grad_accum: int = 1):
        super().__init__()
        self.n_experts, self.top_k = cfg.moe_experts, cfg.moe_top_k
        self.capacity_factor = cfg.moe_capacity_factor
        self.aux_scale = cfg.moe_aux_loss_coef / grad_accum
        self.router = nn.Linear(cfg.d_model, cfg.moe_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg) for _ in range(cfg.moe_experts))
        self.register_buffer("load", torch.zeros(cfg.moe_experts), persistent=False)
        self.register_buffer("dropped", torch.zeros(()), persistent=False)
        self.register_buffer("aux_loss", torch.zeros(()), persistent=False)

    def capacity(self, T: int) -> int:
        """Slots per expert and sequence of ``T`` tokens."""
        if self.capacity_factor * self.top_k >= self.n_experts:  # every assignment fits (no overflow of a huge factor)
            return T
        return min(T, math.ceil(self.capacity_factor * T * self.top_k / self.n_experts))

    def no_muon_parameters(self) -> list[nn.Parameter]:
        return [self.router.weight]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        E, k, C = self.n_experts, self.top_k, self.capacity(T)
        probs = self.router(x).softmax(-1, dtype=torch.promote_types(x.dtype, torch.float32))  # [B, T, E]
        gate, expert = probs.topk(k, dim=-1)  # [B, T, k]
        # Assignments in priority order: all first choices (in sequence order), then all second ones.
        expert = expert.transpose(1, 2).reshape(B, k * T)
        gate = gate.transpose(1, 2).reshape(B, k * T)
        chose = torch.zeros(B, k * T, E, dtype=torch.long, device=x.device).scatter_(-1, expert[..., None], 1)
        # each assignment's place in its expert's queue
        position = chose.cumsum(1).gather(-1, expert[..., None]).squeeze(-1) - 1
        kept = position < C
        # Dispatch into [B, E*C (+1 spare row for the dropped), d] slots, run each expert on its C slots.
        slot = torch.where(kept, expert * C + position, E * C)
        token = x.repeat(1, k, 1)  # assignment i carries token i % T
        slots = x.new_zeros(B, E * C + 1, d).scatter(1, slot[..., None].expand(-1, -1, d), token)
        slots = slots[:, : E * C].view(B, E, C, d)
        y = torch.stack([f(slots[:, e]) for e, f in enumerate(self.experts)], 1).view(B, E * C, d)
        # Combine: each assignment's expert output times its gate (0 when dropped), summed over the k.
        picked = y.gather(1, slot.clamp(max=E * C - 1)[..., None].expand(-1, -1, d))
        weight = torch.where(kept, gate, 0.0).to(y.dtype)
        out = (picked * weight[..., None]).view(B, k, T, d).sum(1)

        f = chose.sum(1).to(probs.dtype) / (k * T)  # [B, E]: share of each sequence's assignments
        aux = E * (f * probs.mean(1)).sum(-1).mean()
        if self.training:
            with torch.no_grad():
                self.load.copy_(f.mean(0))
                self.dropped.copy_(1 - kept.to(self.dropped.dtype).mean())
                self.aux_loss.copy_(aux)
        if torch.is_grad_enabled() and self.aux_scale > 0:
            out = _AttachAuxLoss.apply(out, aux, self.aux_scale)
        return out


def moe_load(model: nn.Module) -> dict:
    """The router load of every MoE layer in ``model`` (a GPT or a pipeline stage), at its last
    training forward, one list entry per layer: ``moe_imbalance``, the most loaded expert's share
    over the mean share (``E * max_e load_e``, before capacity: 1 balanced, E / k when every
    token chose the same k experts),
    ``moe_dropped``, the share of assignments dropped over capacity, and ``moe_aux``, the
    load-balancing loss (unscaled). ``{}`` for a dense model; one host sync otherwise (a call for
    the metrics line, not for every step)."""
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    if not layers:
        return {}
    stats = torch.stack([torch.stack([m.n_experts * m.load.max(), m.dropped, m.aux_loss]) for m in layers])
    imbalance, dropped, aux = stats.T.tolist()
    return {"moe_imbalance": imbalance, "moe_dropped": dropped, "moe_aux": aux}


class Block(nn.Module):
    """Pre-norm residual block: ``h + attn(norm(h))``, then ``h + mlp(norm(h))``."""

    def __init__(self, cfg: GPTConfig, grad_accum: int = 1):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MoE(cfg, grad_accum) if cfg.moe_experts else MLP(cfg)
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
    """The model of ``cfg``. ``grad_accum`` is the run's microbatches per update, M (a training knob,
    not the model's shape): the engines backpropagate loss / M, so an MoE's load-balancing loss
    gradient takes ``moe_aux_loss_coef / M`` alike (no engine knows the aux loss)."""

    def __init__(self, cfg: GPTConfig, grad_accum: int = 1):
        super().__init__()
        if grad_accum < 1:
            raise ConfigError(f"grad_accum must be >= 1, got {grad_accum}")
        self.config = cfg
        self.embed = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg, grad_accum) for _ in range(cfg.n_layer))
        self.head = Head(cfg)
        if cfg.tie_embeddings:
            self.head.lm_head.weight = self.embed.tok.weight
        self.apply(self._init_weights)
        # GPT-2's scaled init: each residual branch's output matrix gets std / sqrt(2 n_layer),
        # so the residual stream's variance does not grow with depth.
        for block in self.blocks:
            downs = [m.down.weight for m in block.mlp.modules() if isinstance(m, MLP)]  # MLP or experts
            for w in (block.attn.proj.weight, *downs):
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

    def num_params(self, non_embedding: bool = False, active: bool = False) -> int:
        """Parameters, each tied tensor counted once; ``non_embedding`` drops the position table.

        ``active``: the parameters one token passes through, k of the E experts of every MoE
        layer (the router and everything outside the experts counted whole); the nominal k,
        whatever capacity drops. A dense model's active count is its total.
        """
        n = sum(p.numel() for p in self.parameters())
        if active:
            for moe in (m for m in self.modules() if isinstance(m, MoE)):
                n -= (moe.n_experts - moe.top_k) * sum(p.numel() for p in moe.experts[0].parameters())
        return n - self.embed.pos.weight.numel() if non_embedding else n


def stage_ranges(n_layer: int, n_stages: int) -> list[range]:
    """Contiguous block ranges, as even as possible; earlier stages take the remainder."""
    q, r = divmod(n_layer, n_stages)
    sizes = [q + (i < r) for i in range(n_stages)]
    starts = [sum(sizes[:i]) for i in range(n_stages)]
    return [range(s, s + n) for s, n in zip(starts, sizes)]


def compile_blocks(module: nn.Module, backend: str | None = None) -> int:
    """``torch.compile`` every transformer :class:`Block` of ``module`` (a GPT or a pipeline stage),
    in place (``nn.Module.compile``: the parameter names and the state dict are unchanged), with
    ``fullgraph=True`` (a graph break is an error, not a slow path). The blocks are alike, so the
    first one's graph serves them all: one compilation of one block, forward and backward, instead
    of the whole model's. ``backend``: default ``$DELAYLAB_COMPILE_BACKEND``, else ``inductor``
    (the dry run of scripts/gpu_validate.sh uses ``aot_eager``: the same graph capture, no C++
    compiler). Returns how many blocks were compiled."""
    backend = backend or os.environ.get("DELAYLAB_COMPILE_BACKEND", "inductor")
    blocks = [m for m in module.modules() if isinstance(m, Block)]
    for block in blocks:
        block.compile(backend=backend, fullgraph=True)
    return len(blocks)


@contextlib.contextmanager
def eager_blocks(module: nn.Module):
    """Inside, the blocks :func:`compile_blocks` compiled run eagerly (``nn.Module.compile`` keeps the
    compiled call in ``_compiled_call_impl``; None restores the plain one). An evaluation runs in
    eval mode (dropout off) without autograd: both are guards of the training graph, so a compiled
    evaluation would compile every block's code again (forward only, tens of seconds with
    inductor at 360m) for a few batches."""
    saved = [(b, b._compiled_call_impl) for b in module.modules()
             if isinstance(b, Block) and getattr(b, "_compiled_call_impl", None) is not None]
    for b, _ in saved:
        b._compiled_call_impl = None
    try:
        yield
    finally:
        for b, compiled in saved:
            b._compiled_call_impl = compiled


def autocast_dtype(device: torch.device | str) -> torch.dtype | None:
    """What :func:`autocast` computes the matrix products in on ``device``; None: no autocast."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else None


def autocast(device: torch.device | str):
    """bf16 autocast on GPU; a no-op on CPU, where the model runs in float32."""
    device = torch.device(device)
    dtype = autocast_dtype(device)
    if dtype is not None:
        return torch.autocast(device.type, dtype=dtype)
    return contextlib.nullcontext()
