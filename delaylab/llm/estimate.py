"""What a run will take, before it runs (``delaylab llm train --dry-run``): the parameters, the tokens,
the memory of one process and the time, from the resolved config alone; nothing is trained and no
data is read (the vocabulary comes from the tokenizer's setting: 256 bytes, the BPE target, or a
tokenizer file's own).

**Memory of one process** (bytes; ``p`` the parameter element size, 4 in float32; ``N`` the
parameters it holds, ``N / D`` with ``--dp-shard`` over ``D`` replicas)::

    params + grads + optimizer + delay queue + correctors + activations
    = N p + N p + S p + tau N p + C + A

* ``S``: the optimizer's state elements, per parameter element: AdamW 2 (both moments), Muon 1 on the
  hidden matrices (momentum) and 2 on the rest (AdamW), Lion 1, Adan 4, MARS 3, SGD 1 (0 without
  momentum), LMO 1, SOAP 2 plus ``2 (m^2 + n^2)`` per m x n matrix (its two Kronecker factors and
  their eigenbases; a side over 10000 gets none), rotated Adam 2 plus ``2 (m^2 + n^2)`` per hidden
  m x n matrix (the same four) -- what each keeps after a step, counted in the
  tests against the optimizers' own state;
* ``tau N p``: the gradients :class:`~delaylab.optim.Delayed` queues (``tau`` the largest delay; a
  variable delay keeps ``max tau`` weight versions instead, one more with prediction or look-ahead);
* ``C``: what the correctors keep per parameter (:meth:`~delaylab.optim.Delayed.corrector_bytes`):
  EF's buffer (in ``--ef-dtype``), DC-ASGD's ``tau`` weight snapshots (and DC-ASGD-a's mean square),
  the last update of prediction and look-ahead;
* ``A``: what one microbatch of ``b`` sequences (the replica's rows) of ``T`` tokens keeps for its
  backward, plus the logits' gradient: ``b T (L (c_d d + c_h h + 4 (4 + H)) + e d + 8 V + 16)`` bytes,
  with ``L`` layers, width ``d``, MLP width ``h``, ``H`` heads and vocabulary ``V``. In float32
  ``c_d = 32``, ``c_h = 8`` (GELU) or 16 (SwiGLU) and ``e = 8``: per layer eight ``d``-vectors per
  token (the two norms' inputs and outputs, q, k, v, the attention's output and its projection's
  input; the fused attention keeps no T x T scores), the MLP's two (GELU) or four (SwiGLU)
  ``h``-vectors, the norms' statistics and the attention's log-sum-exp; outside the layers the final
  norm's input and output, the float32 logits twice (their log-softmax, then their gradient) and the
  token ids. Under the bf16 autocast (CUDA) ``c_d = 24``, ``c_h = 4`` (GELU) or ``c_d = 26``,
  ``c_h = 8`` (SwiGLU), ``e = 6`` (the matrix products' inputs in bf16, the residual stream and the
  norms in float32), and the autocast's bf16 copies of the matrix weights add ``2 N_mm`` bytes (``N_mm``
  the weights of :func:`delaylab.llm.mfu.matmul_params`). float64 doubles every term but the ids.
  These are this model's counts, fitted to and checked against the tensors autograd saves
  (saved-tensor hooks; float32, float64, and the CPU's bf16 autocast, whose casting of these
  operations CUDA's is taken to follow: not checked on a GPU here) in tests/llm/test_estimate.py.
  Dropout masks and MoE layers are not counted; the allocator's caching, workspaces and
  fragmentation come on top.

**Time**: ``F x tokens / (devices x peak x MFU)`` with ``F`` the training FLOPs per token of
:mod:`delaylab.llm.mfu` (6 N + 12 L d T), an assumed MFU of 0.3 (the figure scripts/gpu_validate.py
plans with) and the peak of ``--peak-tflops``, else the known GPU's bf16 dense figure, else this
CPU's measured float32 matrix-product rate. Validation, checkpoints and start-up come on top.
"""

from __future__ import annotations

import math

import torch

from delaylab.llm.config import Config

ASSUMED_MFU = 0.3
SOAP_MAX_PRECONDITION_DIM = 10000  # pytorch_optimizer's SOAP default max_precondition_dim
_ELEMENTS = {"adamw": 2, "lion": 1, "adan": 4, "mars": 3, "lmo": 1}


def planned(cfg: Config) -> Config:
    """``cfg`` resolved for the simulator and checked as :func:`~delaylab.llm.run.setup.resolve` does,
    except that the GPUs it names need not be on this host (a run planned for another machine)."""
    from delaylab.llm.distributed.world import launched_sizes
    from delaylab.llm.run.setup import check_engine

    world, local = launched_sizes()
    cfg = cfg.resolved("simulator", world)
    check_engine(cfg, "simulator", max(torch.cuda.device_count(), 1 << 16) if _on_cuda(cfg) else
                 torch.cuda.device_count(), local)
    return cfg


def vocab_size(cfg: Config) -> int:
    """The vocabulary the model will have: 256 bytes, the BPE target, or a tokenizer file's size."""
    from delaylab.llm.data import load_tokenizer_file, tokenizer_file

    path = tokenizer_file(cfg.data.tokenizer)
    if path is not None:
        return load_tokenizer_file(path).vocab_size
    return cfg.data.vocab_size if cfg.data.tokenizer == "bpe" else 256


def meta_model(cfg: Config):
    """The run's model on the meta device (shapes only: no memory, no initialisation time)."""
    from delaylab.llm.model import GPT

    with torch.device("meta"):
        return GPT(cfg.model_config(vocab_size(cfg)), cfg.data.grad_accum)


def optimizer_elements(cfg: Config, model) -> int:
    """``S``: state elements the optimizer keeps (module docstring), over the parameters it steps."""
    from delaylab.optim.registry import _named_params

    name = cfg.optim.optimizer
    named, excluded = _named_params(model)
    params = [p for _, p in named]
    if name in _ELEMENTS:
        return _ELEMENTS[name] * sum(p.numel() for p in params)
    if name == "sgd":
        momentum = cfg.optim.momentum if cfg.optim.momentum is not None else 0.9  # the registry's default
        return sum(p.numel() for p in params) if momentum > 0 else 0
    if name == "muon":
        return sum(p.numel() * (1 if p.ndim == 2 and id(p) not in excluded else 2) for p in params)
    if name == "rotated-adam":  # hidden matrices: Adam's two moments, the Kronecker factors L, R and their bases
        return sum(2 * p.numel() + (2 * (p.shape[0] ** 2 + p.shape[1] ** 2) if p.ndim == 2 and id(p) not in excluded
                                    else 0) for p in params)
    if name == "soap":
        return sum(2 * p.numel() + (2 * sum(s * s for s in p.shape if s <= SOAP_MAX_PRECONDITION_DIM)
                                    if p.ndim >= 2 else 0) for p in params)
    raise ValueError(f"no state count for optimizer {name!r}")


def largest_delay(cfg: Config) -> tuple[int, bool]:
    """(tau, variable): the largest delay any parameter sees, and whether it is a distribution."""
    dist = cfg.delay_distribution()
    if dist is not None:
        return dist.max(), True
    return max(cfg.delays), False


def corrector_elements(cfg: Config, n: int, p: int) -> int:
    """``C`` in bytes for ``n`` parameter elements of ``p`` bytes: every corrector's per-parameter keys."""
    tau, _ = largest_delay(cfg)
    total = 0
    for c in cfg.correctors():
        for key in c.keys:
            if key == "ef_buffer":
                total += n * (2 if cfg.delay.ef_dtype == "bfloat16" else p)
            elif key == "snapshots":  # a weight copy beside each queued gradient
                total += tau * n * p
            else:  # dc_ms, u_last
                total += n * p
    return total


def _param_bytes(cfg: Config) -> int:
    return 8 if cfg.model.dtype == "float64" else 4


def _on_cuda(cfg: Config) -> bool:
    dev = cfg.run.device
    return dev.startswith("cuda") or (dev == "auto" and torch.cuda.is_available())


# Bytes per token: (c_d, c_h) per layer by MLP, and e outside the layers (module docstring).
_ACTIVATIONS = {"float32": ({"gelu": (32, 8), "swiglu": (32, 16)}, 8),
                "bfloat16": ({"gelu": (24, 4), "swiglu": (26, 8)}, 6)}


def activation_bytes(mc, rows: int, regime: str, matmul_params: float = 0) -> int:
    """``A`` for a model of ``mc`` on ``rows`` sequences; ``regime``: float32, float64 or bfloat16
    (autocast, which also keeps bf16 copies of the ``matmul_params`` matrix weights)."""
    s = 2 if regime == "float64" else 1
    per_mlp, outside = _ACTIVATIONS["bfloat16" if regime == "bfloat16" else "float32"]
    c_d, c_h = per_mlp[mc.mlp]
    layer = s * (c_d * mc.d_model + c_h * mc.hidden + 4 * (4 + mc.n_head))
    per_token = mc.n_layer * layer + s * (outside * mc.d_model + 8 * mc.vocab_size) + 16
    copies = 2 * matmul_params if regime == "bfloat16" else 0
    return int(rows * mc.block_size * per_token + copies)


def memory(cfg: Config, model=None) -> dict:
    """The memory of one process, each term in bytes, and ``total`` (module docstring)."""
    model = meta_model(cfg) if model is None else model
    p, D = _param_bytes(cfg), cfg.parallel.dp
    n = sum(t.numel() for t in model.parameters())
    n_held = math.ceil(n / D) if cfg.parallel.dp_shard else n
    tau, variable = largest_delay(cfg)
    names = {c.name for c in cfg.correctors()}
    versions = tau + (1 if names & {"predict", "lookahead"} else 0) if variable else tau
    mc = model.config
    rows = math.ceil(cfg.data.batch_size / D)  # this replica's rows of a microbatch
    from delaylab.llm.mfu import matmul_params

    activations = activation_bytes(mc, rows, "bfloat16" if _on_cuda(cfg) else cfg.model.dtype, matmul_params(model))
    opt = optimizer_elements(cfg, model) * p
    parts = {
        "params": n_held * p,
        "grads": n_held * p,
        "optimizer": math.ceil(opt / D) if cfg.parallel.dp_shard else opt,
        "delay_queue": versions * n_held * p,
        "correctors": corrector_elements(cfg, n_held, p),
        "activations": activations,
    }
    return {**parts, "total": sum(parts.values()), "param_bytes": p, "activations_in": "bfloat16 autocast" if _on_cuda(cfg) else cfg.model.dtype,
            "rows_per_microbatch": rows, "delay": tau, "variable_delay": variable}


def estimate(cfg: Config) -> dict:
    """Parameters, tokens, memory and time of ``cfg`` (a config resolved for the simulator)."""
    from delaylab.llm import mfu

    model = meta_model(cfg)
    mc = model.config
    n = sum(t.numel() for t in model.parameters())
    d, r = cfg.data, cfg.run
    per_update = d.batch_size * d.grad_accum * mc.block_size
    flops = mfu.flops_per_token(mc)
    if r.peak_tflops is not None:
        peak, source = r.peak_tflops, "--peak-tflops"
    elif _on_cuda(cfg):  # planned for a GPU: its datasheet figure, if this host has it
        peak = mfu.peak_tflops(cfg.torch_device()) if torch.cuda.is_available() else None
        source = "the GPU's bf16 dense figure (NVIDIA's datasheet)" if peak is not None else None
    else:
        if r.threads:
            torch.set_num_threads(r.threads)
        peak = mfu.matmul_tflops(torch.device("cpu"), n=1024, reps=5)
        source = f"this CPU's measured float32 1024^3 matmul rate, {torch.get_num_threads()} thread(s)"
    devices = cfg.parallel.dp
    seconds = (flops * per_update * r.steps / (devices * peak * 1e12 * ASSUMED_MFU)) if peak else None
    return {
        "dry_run": True,
        "config": cfg.to_dict(),
        "model": {**mc.to_dict(), "kv_heads": mc.kv_heads, "hidden": mc.hidden},
        "parameters": n,
        "parameters_matmul": int(mfu.matmul_params(model)),
        "vocab_size": mc.vocab_size,
        "tokens": {"per_update": per_update, "updates": r.steps, "total": per_update * r.steps},
        "memory": memory(cfg, model),
        "time": {"seconds": seconds, "flops_per_token": flops, "devices": devices, "peak_tflops": peak,
                 "peak_source": source, "assumed_mfu": ASSUMED_MFU},
    }


def _gb(x: float) -> str:
    return f"{x / 1e9:.3g} GB" if x >= 1e8 else f"{x / 1e6:.3g} MB"


def render(e: dict) -> str:
    """The dry run as text: the resolved config by section, then the estimates and their formulas."""
    from delaylab._progress import duration

    lines = ["dry run: nothing is trained; the resolved config:"]
    for section, fields in e["config"].items():
        lines.append(f"  {section}: " + " ".join(f"{k}={v}" for k, v in fields.items()))
    g = e["model"]
    lines.append(f"  the model: {g['n_layer']} layers, d {g['d_model']}, {g['n_head']} heads ({g['kv_heads']} kv), "
                 f"{g['mlp']} {g['hidden']}, context {g['block_size']}, vocabulary {e['vocab_size']}"
                 + (", tied embeddings" if g["tie_embeddings"] else "")
                 + (f", {g['moe_experts']} experts (top {g['moe_top_k']})" if g["moe_experts"] else ""))
    t, m, tm = e["tokens"], e["memory"], e["time"]
    lines.append(f"parameters: {e['parameters']:,} ({e['parameters_matmul']:,} in matrix products; vocabulary "
                 f"{e['vocab_size']})")
    lines.append(f"tokens: {t['updates']:,} updates x {t['per_update']:,} = {t['total']:,}")
    terms = ("params", "grads", "optimizer", "delay_queue", "correctors", "activations")
    lines.append("memory per process (estimate): " + " + ".join(f"{k.replace('_', ' ')} {_gb(m[k])}" for k in terms)
                 + f" = {_gb(m['total'])}")
    lines.append(f"  = N p + N p + S p + tau N p + C + b T (L (c_d d + c_h h + 4 (4 + H)) + e d + 8 V + 16), with "
                 f"p = {m['param_bytes']}, tau = {m['delay']}, b = {m['rows_per_microbatch']}, activations in "
                 f"{m['activations_in']} (delaylab/llm/estimate.py); allocator overheads not included")
    if tm["seconds"] is None:
        lines.append("time: no estimate (no peak known for this device: give --peak-tflops)")
    else:
        lines.append(f"time (estimate): {tm['flops_per_token']:.3g} FLOPs/token x {t['total']:,} tokens / "
                     f"({tm['devices']} x {tm['peak_tflops']:.4g} TFLOPS x MFU {tm['assumed_mfu']}) = "
                     f"{duration(tm['seconds'])} of training (peak: {tm['peak_source']}); validation, "
                     "checkpoints and start-up come on top")
    return "\n".join(lines)
