"""The paper's optimizers by name, with the usual parameter split, as one torch Optimizer each.

``build_optimizer(name, model_or_params, **hparams)``:

=======  =================================================================================
adamw    torch.optim.AdamW; weight decay on >= 2-D params only (nanoGPT's split)
muon     torch.optim.Muon on hidden 2-D matrices + AdamW on embeddings, head, norms, biases;
         float64 matrices get the same method with Newton-Schulz in float64 (LMOMomentum), and
         so do float32 ones in float32 where bfloat16 is slow (``ns_dtype``, below)
lion     pytorch_optimizer.Lion        (Chen et al. 2023)
soap     pytorch_optimizer.SOAP        (Vyas et al. 2024)
adan     pytorch_optimizer.Adan        (Xie et al. 2022)
mars     pytorch_optimizer.MARS        (Yuan et al. 2024)
rotated-adam  delaylab.optim.RotatedAdam (Jung et al. 2026, basis rotation: Adam in the eigenbasis of the
         gradient's Kronecker factors) on hidden 2-D matrices + AdamW on the rest, muon's split
sgd      torch.optim.SGD with momentum
lmo      delaylab.optim.LMOMomentum    (the method the theory analyses; spectral by default)
=======  =================================================================================

On CUDA parameters AdamW (muon's too) and SGD get torch's fused kernels (``fused=True``) unless
``foreach`` or ``fused`` is given; torch.optim.Muon has neither, and pytorch_optimizer's classes use
their ``torch._foreach_*`` path by default.

Common hyperparameters: ``lr``, ``weight_decay``, ``momentum`` (each optimizer's momentum knob:
AdamW/SOAP/Adan/MARS beta1, Lion beta2 (its momentum buffer's decay), Muon and SGD momentum,
LMO beta), ``betas``; anything else goes to the optimizer's constructor. For ``muon``,
``adam_lr``, ``adam_betas`` and ``adam_weight_decay`` set the AdamW part.

``ns_dtype`` (``muon``, ``lmo``): the dtype of the Newton-Schulz iteration, ``"bfloat16"`` (torch's
Muon, bit for bit), ``"float32"`` (the same iteration in float32, :class:`LMOMomentum`) or
``"auto"`` (the default): bfloat16 on a GPU and on a CPU that computes bfloat16 natively (AVX512-BF16
or AMX, as torch's cpuinfo reports), float32 elsewhere, where bfloat16 products run about 30x slower
than float32 ones (measured on an AVX2 host: 1.6 against 46.7 GFLOP/s). float64 parameters always
iterate in float64.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from delaylab.errors import ConfigError, MissingExtra, install_hint
from delaylab.optim.combined import CombinedOptimizer
from delaylab.optim.lmo_momentum import LMOMomentum

# Defaults are starting points for small GPTs, not tuned values; sweeps override lr.
DEFAULTS: dict[str, dict[str, Any]] = {
    "adamw": dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1),
    "muon": dict(lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.0,
                 adam_lr=1e-3, adam_betas=(0.9, 0.95), adam_weight_decay=0.0),
    "lion": dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1),
    "soap": dict(lr=3e-3, betas=(0.95, 0.95), weight_decay=0.01, precondition_frequency=10),
    "adan": dict(lr=1e-3, betas=(0.98, 0.92, 0.99), weight_decay=0.02),
    "mars": dict(lr=3e-3, betas=(0.95, 0.99), weight_decay=0.0),
    # AdamW's betas and decay, so that AdamW against rotated-adam isolates the rotation
    "rotated-adam": dict(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, precondition_frequency=10),
    "sgd": dict(lr=0.1, momentum=0.9, weight_decay=0.0),
    "lmo": dict(lr=0.02, beta=0.95, norm="spectral"),
}
OPTIMIZERS = tuple(DEFAULTS)
THIRD_PARTY = {"lion": "Lion", "soap": "SOAP", "adan": "Adan", "mars": "MARS"}
_BETA1_MOMENTUM = ("adamw", "soap", "adan", "mars", "rotated-adam")
_NO_MUON_NAME_PARTS = ("embed", "head", "wte", "wpe", "lm_head")


def _named_params(model_or_params) -> tuple[list[tuple[str, torch.Tensor]], set[int]]:
    """(name, param) pairs of trainable params, and ids of params that must not go to Muon."""
    if isinstance(model_or_params, nn.Module):
        model = model_or_params
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        excluded = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
        excluded |= {id(p) for n, p in named if any(part in n for part in _NO_MUON_NAME_PARTS)}
        # any submodule may name its own (delaylab.llm.model.MoE: the router), found in a pipeline stage too
        excluded |= {id(p) for m in model.modules() if hasattr(m, "no_muon_parameters")
                     for p in m.no_muon_parameters()}
        return named, excluded
    if isinstance(model_or_params, torch.Tensor):
        model_or_params = [model_or_params]
    if not isinstance(model_or_params, Iterable):
        raise TypeError("build_optimizer needs an nn.Module or an iterable of tensors")
    params = list(model_or_params)
    if params and isinstance(params[0], dict):
        raise TypeError("pass a model or a flat list of tensors; build param groups yourself otherwise")
    return [(f"param{i}", p) for i, p in enumerate(params) if p.requires_grad], set()


def _decay_groups(named, weight_decay: float) -> list[dict]:
    decay = [p for _, p in named if p.ndim >= 2]
    no_decay = [p for _, p in named if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return [g for g in groups if g["params"]]


def _third_party(name: str):
    try:
        import pytorch_optimizer
    except ImportError:
        raise MissingExtra(
            f"optimizer {name!r} needs the pytorch-optimizer package: {install_hint('optimizers')}"
        ) from None
    return getattr(pytorch_optimizer, THIRD_PARTY[name])


def _on_cuda(params) -> bool:
    return bool(params) and all(p.is_cuda for p in params)


def _fused(named, hp: dict) -> dict:
    """``fused=True`` (torch's one-kernel update of a whole param group) when every parameter is on
    CUDA and the caller chose no kernel; elsewhere torch's default (the single-tensor step on the CPU,
    which the tests pin bit for bit)."""
    if "fused" in hp or "foreach" in hp or not _on_cuda([p for _, p in named]):
        return {}
    return {"fused": True}


def _construct(cls, groups, name: str, **kwargs) -> Optimizer:
    try:
        return cls(groups, **kwargs)
    except TypeError as err:
        raise ConfigError(f"bad hyperparameters for {name}: {err}") from None


NS_DTYPES = ("auto", "bfloat16", "float32")


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bfloat16 products in hardware (torch's cpuinfo: AVX512-BF16 or AMX).
    ``DELAYLAB_CPU_NATIVE_BF16=0`` (or 1) says otherwise: a test run of the other kind of host."""
    forced = os.environ.get("DELAYLAB_CPU_NATIVE_BF16")
    if forced in ("0", "1"):
        return forced == "1"
    cpu = torch.cpu
    return bool(getattr(cpu, "_is_avx512_bf16_supported", lambda: False)()
                or getattr(cpu, "_is_amx_tile_supported", lambda: False)())


def resolve_ns_dtype(choice, device) -> torch.dtype:
    """The Newton-Schulz dtype for ``choice`` (``auto``/``bfloat16``/``float32`` or a dtype) on ``device``."""
    if isinstance(choice, torch.dtype):
        return choice
    if choice not in NS_DTYPES:
        raise ConfigError(f"ns_dtype must be one of {', '.join(NS_DTYPES)}, got {choice!r}")
    if choice == "auto":
        native = torch.device(device).type != "cpu" or cpu_has_native_bf16()
        return torch.bfloat16 if native else torch.float32
    return getattr(torch, choice)


def _muon_in_param_dtype(params: list[torch.Tensor], hp: dict, ns_dtype: torch.dtype | None = None) -> LMOMomentum:
    """``torch.optim.Muon(params, **hp)`` with the Newton-Schulz iteration in ``ns_dtype`` (None: the
    params' own).

    LMOMomentum with these settings is torch's Muon operation for operation (see its
    docstring); only ``ns_dtype`` differs. Muon options it does not model are refused.
    """
    hp = dict(hp)
    eps, adjust = hp.pop("eps", 1e-7), hp.pop("adjust_lr_fn", None)
    if eps != 1e-7 or adjust not in (None, "original"):
        raise ConfigError(
            "muon with Newton-Schulz outside bfloat16 (float32 or float64) supports only the default eps "
            f"and adjust_lr_fn; got eps={eps}, adjust_lr_fn={adjust!r}"
        )
    hp["beta"] = hp.pop("momentum")
    return _construct(
        LMOMomentum, params, "muon",
        norm="spectral", method="newton-schulz", scale="muon", ns_dtype=ns_dtype, **hp,
    )


def _rotated_adam(named, excluded, hp: dict) -> Optimizer:
    """RotatedAdam on the hidden matrices, AdamW (the same lr, betas and decay) on the rest."""
    from delaylab.optim.rotated_adam import RotatedAdam

    wd = hp.pop("weight_decay")
    hidden = [p for _, p in named if p.ndim == 2 and id(p) not in excluded]
    rest = [(n, p) for n, p in named if not (p.ndim == 2 and id(p) not in excluded)]
    parts = [_construct(RotatedAdam, hidden, "rotated-adam", weight_decay=wd, **hp)] if hidden else []
    if rest:
        adam = {k: v for k, v in hp.items() if k in ("lr", "betas", "eps")}
        parts.append(_construct(torch.optim.AdamW, _decay_groups(rest, wd), "rotated-adam", **adam, **_fused(rest, adam)))
    return parts[0] if len(parts) == 1 else CombinedOptimizer(parts)


def build_optimizer(name: str, model_or_params, **hparams) -> Optimizer:
    """Build optimizer ``name`` (see the module docstring) over a model or a list of tensors."""
    key = name.lower()
    if key not in DEFAULTS:
        raise ConfigError(f"unknown optimizer {name!r}; expected one of {', '.join(OPTIMIZERS)}")
    hp = {**DEFAULTS[key], **{k: v for k, v in hparams.items() if v is not None}}
    lr = hp.get("lr")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise ConfigError(f"lr must be > 0, got {lr}")
    momentum = hparams.get("momentum")
    if momentum is not None and not 0.0 <= momentum < 1.0:
        raise ConfigError(f"momentum must be in [0, 1), got {momentum}")
    named, excluded = _named_params(model_or_params)
    if not named:
        raise ConfigError("no trainable parameters")
    if key in ("muon", "lmo"):
        hp["ns_dtype"] = resolve_ns_dtype(hp.get("ns_dtype", "auto"), named[0][1].device)
    elif hparams.get("ns_dtype") not in (None, "auto"):
        raise ConfigError(f"ns_dtype is a Newton-Schulz setting (muon, lmo); {name} has none")
    else:
        hp.pop("ns_dtype", None)

    if key in _BETA1_MOMENTUM and momentum is not None:
        hp.pop("momentum")
        hp["betas"] = (momentum, *tuple(hp["betas"])[1:])
    if key == "lion" and momentum is not None:
        hp.pop("momentum")
        hp["betas"] = (hp["betas"][0], momentum)
    if key == "lmo" and momentum is not None:
        hp["beta"] = hp.pop("momentum")

    if key == "adamw":
        wd = hp.pop("weight_decay")
        return _construct(torch.optim.AdamW, _decay_groups(named, wd), key, **hp, **_fused(named, hp))
    if key == "rotated-adam":
        return _rotated_adam(named, excluded, hp)
    if key == "muon":
        adam = {"lr": hp.pop("adam_lr"), "betas": hp.pop("adam_betas"), "weight_decay": hp.pop("adam_weight_decay")}
        hidden = [p for _, p in named if p.ndim == 2 and id(p) not in excluded]
        rest = [(n, p) for n, p in named if not (p.ndim == 2 and id(p) not in excluded)]
        # torch.optim.Muon orthogonalizes in bfloat16 whatever the parameter's dtype; float64
        # matrices (equivalence checks) get the same iteration computed in float64, and float32
        # ones in float32 where ns_dtype says so.
        ns_dtype = hp.pop("ns_dtype")
        native = [p for p in hidden if p.dtype != torch.float64]
        exact = [p for p in hidden if p.dtype == torch.float64]
        parts = []
        if native and ns_dtype == torch.bfloat16:
            parts.append(_construct(torch.optim.Muon, native, key, **hp))
        elif native:
            parts.append(_muon_in_param_dtype(native, hp, ns_dtype))
        if exact:
            parts.append(_muon_in_param_dtype(exact, hp))
        if rest:
            parts.append(_construct(torch.optim.AdamW, _decay_groups(rest, adam.pop("weight_decay")), key, **adam,
                                    **_fused(rest, adam)))
        return parts[0] if len(parts) == 1 else CombinedOptimizer(parts)
    if key == "sgd":
        return _construct(torch.optim.SGD, [p for _, p in named], key, **hp, **_fused(named, hp))
    if key == "lmo":
        return _construct(LMOMomentum, [p for _, p in named], key, **hp)
    wd = hp.pop("weight_decay")
    return _construct(_third_party(key), _decay_groups(named, wd), key, **hp)
