"""`delaylab llm spectrum RUN`: the curvature spectrum and gradient noise of a run, for the NQM.

At each checkpoint on disk (the simulator keeps the last two), on held-out batches (the run's
fixed validation windows, never trained on):

* the Hessian's spectral density by stochastic Lanczos quadrature (:mod:`delaylab.theory.slq`),
  Hessian-vector products by double backward through the model in float64;
* for AdamW also the density of ``D^(1/2) H D^(1/2)``, ``D = 1 / (sqrt(v_hat) + eps)`` from the
  checkpoint's second moment: the NQM's fixed diagonal preconditioner (Adam near a minimum with
  its second moment frozen, as :mod:`delaylab.theory.stability` models it);
* the gradient noise: the trace of the per-sequence gradient covariance (and its preconditioned
  trace), from one gradient per held-out sequence.

The file (JSON) is what ``delaylab theory nqm --spectrum`` reads; :func:`to_nqm` turns one
checkpoint of it into the NQM's nodes.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from delaylab.errors import ConfigError, MissingFile
from delaylab.theory.assumptions import TorchObjective

from delaylab.theory.nqm import SPECTRUM_FORMAT as FORMAT


def load_run(folder: Path):
    """(resolved config, checkpoint root, steps on disk) of a run folder; one-line errors without them."""
    from delaylab.llm import checkpoint
    from delaylab.llm.config import Config
    from delaylab.llm.run.folder import require_folder

    if not (folder / "config.json").is_file():
        raise MissingFile(f"{folder}: not a run folder (config.json missing)")
    cfg = Config.from_dict(require_folder(folder)).resolved("simulator")
    root = folder / checkpoint.ROOT
    steps = checkpoint.steps_on_disk(root) if root.is_dir() else []
    if not steps:
        raise MissingFile(f"{folder}: no checkpoint (train with --ckpt-every N)")
    return cfg, root, steps


def _adam_preconditioner(model, opt) -> list[torch.Tensor] | None:
    """D = 1 / (sqrt(v_hat) + eps) per parameter from AdamW's state, or None (another optimizer)."""
    inner = getattr(opt, "inner", opt)
    if not isinstance(inner, torch.optim.AdamW):
        return None
    out = []
    group_of = {id(p): g for g in inner.param_groups for p in g["params"]}
    for p in model.parameters():
        st, g = inner.state.get(p), group_of[id(p)]
        if not st or "exp_avg_sq" not in st:
            raise ConfigError("the checkpoint's AdamW has no second moment for a parameter")
        beta2, k = g["betas"][1], float(st["step"])
        vhat = st["exp_avg_sq"].double() / (1 - beta2 ** k)
        out.append(1.0 / (vhat.sqrt() + g["eps"]))
    return out


def measure(run: str | Path, probes: int = 4, lanczos_steps: int = 30, batches: int = 4, noise_sequences: int = 64,
            seed: int = 0, progress=None) -> dict:
    """The spectrum file's content for the run in ``run`` (see module doc)."""
    from delaylab.llm import checkpoint
    from delaylab.llm.model import GPT
    from delaylab.llm.run.setup import build_delayed_optimizer, load_data
    from delaylab.theory.slq import slq

    if probes < 1 or lanczos_steps < 2 or batches < 1 or noise_sequences < 2:
        raise ConfigError("probes >= 1, lanczos steps >= 2, batches >= 1 and noise sequences >= 2")
    t0 = time.perf_counter()
    folder = Path(run)
    cfg, root, steps = load_run(folder)
    data = load_data(cfg)
    mcfg = cfg.model_config(data.vocab_size)
    B, T = cfg.data.batch_size, mcfg.block_size
    held = data.val_batches(batches, B, T)
    need = math.ceil(noise_sequences / B)
    seqs = [(x[i:i + 1], y[i:i + 1]) for x, y in data.val_batches(max(need, 1), B, T) for i in range(B)][:noise_sequences]
    out = {"format": FORMAT, "run": str(folder), "optimizer": cfg.optim.optimizer, "config": _run_summary(cfg),
           "slq": {"probes": probes, "steps": lanczos_steps, "seed": seed},
           "held_out": {"hessian_sequences": batches * B, "noise_sequences": len(seqs), "block_size": T},
           "d_model": mcfg.d_model, "vocab_size": data.vocab_size, "checkpoints": []}
    torch.manual_seed(cfg.run.seed)  # the run's initial weights: the NQM's starting loss
    with torch.no_grad():
        init = GPT(mcfg).double()
        out["init_val_loss"] = float(sum(init(torch.as_tensor(x), torch.as_tensor(y))[1] for x, y in held) / len(held))
    for step in steps:
        part = checkpoint.load_part(root, step, 0)
        model = GPT(mcfg)
        model.load_state_dict(part["model"])
        opt = build_delayed_optimizer(model, cfg)
        opt.load_state_dict(part["optimizer"])
        precond = _adam_preconditioner(model, opt)
        model = model.double().eval()
        obj, point, hvp = hessian(model, held)
        n = sum(b.size for b in point)
        loss = obj.loss(point)
        grad_sq = float(sum((g**2).sum() for g in obj.grad(point)))
        nodes, w = slq(hvp, n, probes, lanczos_steps, seed)
        rec = {"step": step, "val_loss": loss, "n_params": n, "grad_sq": grad_sq,
               "hessian": {"nodes": nodes.tolist(), "weights": w.tolist()}}
        if precond is not None:
            d = torch.cat([t.reshape(-1) for t in precond]).sqrt().numpy()
            pn, pw = slq(lambda v: d * hvp(d * v), n, probes, lanczos_steps, seed)
            rec["precond"] = {"nodes": pn.tolist(), "weights": pw.tolist()}
        obj = None  # free the double-backward graph before the per-sequence gradients
        per_seq = TorchObjective(model, _lm_loss, seqs)
        # one gradient per held-out sequence: the per-example noise
        G = np.stack([np.concatenate([g.ravel() for g in per_seq.stoch_grad(point, i)]) for i in range(len(seqs))])
        dev = G - G.mean(0)
        rec["noise_trace"] = float((dev**2).sum() / (len(seqs) - 1))
        if precond is not None:
            rec["noise_trace_precond"] = float(((dev**2) * torch.cat([t.reshape(-1) for t in precond]).numpy()).sum()
                                               / (len(seqs) - 1))
        out["checkpoints"].append(rec)
        if progress:
            progress(f"checkpoint {step}: loss {loss:.4f}, top eigenvalue {nodes.max():.4g}, "
                     f"noise trace {rec['noise_trace']:.4g}")
    out["seconds"] = time.perf_counter() - t0
    return out


def hessian(model, batches) -> tuple[TorchObjective, list[np.ndarray], object]:
    """``(objective, point, hvp)``: the mean loss of ``model`` on ``batches`` (``(x, y)`` pairs) as a
    :class:`~delaylab.theory.assumptions.TorchObjective` (one double-backward code for this and
    ``theory check``: its loss, gradient, Hessian-vector products and per-sequence gradients), the
    model's weights as its point, and ``hvp``: a flat numpy vector ``v`` to ``H v`` there, the
    product stochastic Lanczos quadrature takes."""
    obj = TorchObjective(model, _lm_loss, batches)
    point = obj.point()
    cuts = np.cumsum([b.size for b in point])[:-1]

    def hvp(v: np.ndarray) -> np.ndarray:
        parts = [c.reshape(b.shape) for c, b in zip(np.split(v, cuts), point)]
        return np.concatenate([h.ravel() for h in obj.hvp(point, parts)])

    return obj, point, hvp


def _lm_loss(model, batch):
    """The model's loss on a held-out (x, y), with the attention that has a double backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):  # the fused CPU attention has no double backward
        return model(torch.as_tensor(batch[0]), torch.as_tensor(batch[1]))[1]


def _run_summary(cfg) -> dict:
    """The run's settings the NQM needs (the schedule is the one delaylab.theory.nqm.lr_factors repeats)."""
    s = cfg.lr_schedule
    return {"optimizer": cfg.optim.optimizer, "lr": cfg.resolved_lr(), "momentum": cfg.optimizer_kwargs().get(
        "momentum", (cfg.optimizer_kwargs().get("betas") or [None])[0]), "steps": cfg.run.steps,
        "batch_size": cfg.data.batch_size * cfg.data.grad_accum, "lr_schedule": s.lr_schedule, "warmup": s.warmup,
        "min_lr_ratio": s.min_lr_ratio, "wsd_decay": s.wsd_decay, "delay": cfg.delay.delay,
        "correction": cfg.delay.correction}


def plot(spec: dict, path: str) -> None:
    """Histogram of the densities (|eigenvalue| on a log axis, multiplicity-weighted), per checkpoint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from delaylab._io import save_figure

    kinds = [k for k in ("hessian", "precond") if k in spec["checkpoints"][0]]
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        for i, c in enumerate(spec["checkpoints"]):
            nodes, w = np.asarray(c[kind]["nodes"]), np.asarray(c[kind]["weights"])
            pos = nodes > 0
            lo = max(nodes[pos].min(), nodes[pos].max() * 1e-8)
            bins = np.geomspace(lo, nodes.max() * 1.01, 40)
            ax.hist(nodes[pos], bins=bins, weights=w[pos], histtype="step", color=f"C{i}",
                    label=f"step {c['step']} (negative mass {w[~pos].sum() / w.sum():.1%})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("eigenvalue" + (" of D^1/2 H D^1/2" if kind == "precond" else " of H"))
        ax.set_ylabel("directions (SLQ)")
        ax.set_title(f"{spec['optimizer']}: {'preconditioned ' if kind == 'precond' else ''}Hessian density")
        ax.legend(fontsize=7)
    save_figure(fig, path, dpi=110, bbox_inches="tight")
    plt.close(fig)
