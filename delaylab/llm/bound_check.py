"""`delaylab theory check RUN`: the bound of a run's own optimizer against the run itself.

The run is replayed from its config (the simulator is a pure function of it: batch ``c`` is
``dataset.batch(c, ...)`` of the run's seed), and the replayed weights are checked against every
checkpoint on disk, so what is measured is the run's own trajectory x_0, x_1, ..., x_T. Along it,
with f the mean loss on ``held`` held-out batches (float64, eval mode):

* the gradient norm ||grad f(x_t)||_* in the bound's norm at every ``every``-th update, and the
  loss f(x_t);
* L two ways (:mod:`delaylab.theory.assumptions`): secants between consecutive measured points,
  and the curvature by Hessian-vector power iteration at the probes (update 0, the checkpoints
  on disk and every ``probe_every``-th update);
* sigma at the probes: the Euclidean spread of ``samples`` stochastic gradients, each on a fresh
  training batch of one update's size (batches the run never drew);
* Delta: f(x_0) - 0 (cross-entropy is >= 0), the upper estimate the bound is evaluated at, and
  f(x_0) - min_t f(x_t), the lower one; G0 = ||grad f(x_0)||_*; rho from the shapes; the step
  norms eta_t measured (LMO methods) or lr / (1 - momentum) (SGD).

Which bound (:func:`coverage`): Theorem 1 (or its Nesterov / Lion forms) for the LMO methods
(``lmo``, ``muon``, ``lion``), in the norm of their LMO, with a schedule handled by
docs/theory.md#step-size-schedules (the bound at eta_max and T_eff = sum_t eta_t / eta_max bounds
the eta_t-weighted mean); Theorem 4 for ``sgd`` at a constant step; nothing for AdamW and the
other adaptive methods. What a theorem does not model (AdamW's share of a Muon run, weight decay,
a correction, a schedule for SGD) makes the verdict "cannot be evaluated", with the bound still
shown as if it applied.

The verdict compares the measured (weighted) mean with the bound at the larger of the two lower
estimates of L: "holds" then holds at any larger L too (the bounds grow with L); "violated" is
said at the estimated constants, with the L the bound would need to hold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from delaylab.errors import ConfigError
from delaylab.theory import assumptions as A
from delaylab.theory.bound import Bound, evaluate
from delaylab.theory.bounds import lmo_bound, sgdm_bound

VERDICTS = ("holds", "violated", "cannot be evaluated")
ADAPTIVE = ("adamw", "soap", "adan", "mars")


@dataclass
class Coverage:
    """Which theorem speaks about a run, over which parameters, and what it leaves out."""

    optimizer: str
    theorem: str | None
    bound: Bound | None
    norm: str
    params: list  # the parameters the theorem is about (the measured block)
    beta: float | None
    tau: int
    eta: float | None = None  # a constant step fixed by the config (SGD); None: measured (LMO)
    gaps: list[str] = field(default_factory=list)  # what the theorem does not model: no verdict
    caveats: list[str] = field(default_factory=list)  # approximations that leave the verdict standing


def _parts(opt) -> list:
    inner = getattr(opt, "inner", opt)
    return list(getattr(inner, "optimizers", [inner]))


def max_delay(cfg) -> int:
    dist = cfg.delay_distribution()
    return int(dist.max) if dist is not None else int(max(cfg.delays))


def coverage(cfg, model, opt) -> Coverage:
    """The theorem for the run of ``cfg`` whose model and (Delayed) optimizer are given."""
    from delaylab.optim import LMOMomentum

    name, tau = cfg.optim.optimizer, max_delay(cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    gaps, caveats = [], []
    if cfg.delay.correction != "none":
        gaps.append(f"the correction {cfg.delay.correction!r} (Theorem 3 covers EF for LMO methods with a measured "
                    "direction drift, which this check does not measure)")
    if cfg.delay_distribution() is not None or len(set(cfg.delays)) > 1 or cfg.delay.sync_start or cfg.delay.sync_cooldown:
        caveats.append(f"the delay varies; the bound is taken at its largest, tau = {tau} (Lemma 3's bias grows "
                       "with each update's delay)")
    if cfg.model.dropout > 0:
        caveats.append(f"the run trains with dropout {cfg.model.dropout:g}; f and its gradients are measured in eval "
                       "mode (no dropout)")
    if cfg.model.moe_experts:
        caveats.append("MoE routing (top-k) is not smooth: L can be larger than any estimate near a routing switch")
    parts = _parts(opt)
    decay = [g["weight_decay"] for o in parts for g in o.param_groups if g.get("weight_decay", 0) > 0]
    if name in ("lmo", "muon"):
        lmos = [o for o in parts if isinstance(o, (LMOMomentum, torch.optim.Muon))]
        block = [p for o in lmos for g in o.param_groups for p in g["params"]]
        g0 = lmos[0].param_groups[0]
        beta = float(g0.get("beta", g0.get("momentum", 0.0)))
        nesterov = bool(g0.get("nesterov", False))
        norm = g0.get("norm", "spectral")
        if name == "muon" and len(block) < len(params):
            n_rest = sum(p.numel() for p in params) - sum(p.numel() for p in block)
            gaps.append(f"AdamW moves the embeddings, head, norms and biases ({n_rest} of "
                        f"{sum(p.numel() for p in params)} parameters), which no theorem here models "
                        "(`--optimizer lmo` runs the analysed method on every parameter)")
        if name == "muon" or g0.get("method") == "newton-schulz":
            caveats.append("Newton-Schulz approximates the LMO (singular values of the step near, not at, 1); "
                           "eta_t is the measured step norm")
        if name == "muon" or g0.get("scale") == "muon":
            caveats.append("Muon scales each matrix's step by sqrt(max(1, rows/cols)): eta_t is the largest")
        theorem = "Theorem 1" + (" (Nesterov)" if nesterov else "")
        bound = lmo_bound(tau, nesterov=nesterov, norm=norm)
        if decay:
            gaps.append(f"decoupled weight decay {max(decay):g} (the step is then not eta LMO(c); train with "
                        "--weight-decay 0)")
        return Coverage(name, theorem, bound, norm, block, beta, tau, gaps=gaps, caveats=caveats)
    if name == "lion":
        g0 = parts[0].param_groups[0]
        beta1, beta2 = (float(b) for b in g0["betas"])
        if decay:
            gaps.append(f"decoupled weight decay {max(decay):g} (the step is then not eta sign(c); train with "
                        "--weight-decay 0)")
        return Coverage(name, "Theorem 1 (Lion's momentum)", lmo_bound(tau, norm="sign", lion_beta1=beta1), "sign",
                        params, beta2, tau, gaps=gaps, caveats=caveats)
    if name == "sgd":
        g0 = parts[0].param_groups[0]
        beta, lr = float(g0.get("momentum", 0.0)), cfg.resolved_lr()
        s = cfg.lr_schedule
        from delaylab.llm.config import warmup_updates

        if s.lr_schedule != "constant" or warmup_updates(cfg.run.steps, s.warmup) > 0:
            gaps.append(f"the lr schedule ({s.lr_schedule}, {warmup_updates(cfg.run.steps, s.warmup)} warmup updates): "
                        "Theorem 4 is proved for a constant step (train with --lr-schedule constant --warmup 0)")
        if g0.get("nesterov") or g0.get("dampening", 0):
            gaps.append("Nesterov or dampened SGD (Theorem 4 is the EMA form of plain heavy-ball momentum)")
        if decay:
            gaps.append(f"weight decay {max(decay):g}")
        return Coverage(name, "Theorem 4", sgdm_bound(tau), "euclidean", params, beta, tau,
                        eta=lr / (1 - beta), gaps=gaps, caveats=caveats)
    gaps.append(f"no theorem here bounds {name}: its step is scaled per coordinate by running second moments, "
                "neither an LMO of a fixed norm nor a fixed linear step. What the theory does say about it is local: "
                "near a minimum, with the preconditioner frozen, a delay shrinks the stable eta*lambda from "
                "2(1+beta)/(1-beta) to about 1 (`delaylab theory stability --method adam`), and the NQM predicts its "
                "loss gap (`delaylab llm spectrum` then `delaylab theory nqm`)")
    return Coverage(name, None, None, "euclidean", params, None, tau, gaps=gaps, caveats=caveats)


def _check_replay(model, part: dict, step: int) -> float:
    """Largest |replayed - saved| weight at a checkpoint; one-line error beyond rounding."""
    saved = part["model"]
    worst, scale = 0.0, 0.0
    for name, t in model.state_dict().items():
        s = saved[name].to(t.device, t.dtype)
        worst = max(worst, float((t - s).abs().max()) if t.numel() else 0.0)
        scale = max(scale, float(s.abs().max()) if s.numel() else 0.0)
    if worst > 1e-3 * max(scale, 1e-12):
        raise ConfigError(f"the replay does not reproduce the checkpoint of update {step} (largest weight difference "
                          f"{worst:.3g}): the run's config, data or code has changed since it was trained")
    return worst


def _objective(model64, batches, names_cov):
    """A TorchObjective over the covered parameters of the float64 measurement model."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def loss_fn(m, b):
        with sdpa_kernel(SDPBackend.MATH):  # the fused CPU attention has no double backward
            return m(b[0], b[1])[1]

    params = [p for n, p in model64.named_parameters() if n in names_cov]
    return A.TorchObjective(model64, loss_fn, batches, params=params)


def measure(run: str | Path, every: int = 1, probe_every: int = 0, held: int = 2, samples: int = 8,
            iters: int = 20, seed: int = 0, progress=None) -> dict:
    """Replay the run in ``run`` and measure it (module doc); returns the JSON-able result."""
    from delaylab.llm import checkpoint
    from delaylab.llm.model import GPT
    from delaylab.llm.run.trainer import Trainer
    from delaylab.llm.spectrum import load_run

    if every < 1 or held < 1 or samples < 2 or iters < 1 or probe_every < 0:
        raise ConfigError("every >= 1, held >= 1, samples >= 2, iters >= 1 and probe-every >= 0")
    t0 = time.perf_counter()
    folder = Path(run)
    cfg, root, on_disk = load_run(folder)
    if checkpoint.part_path(root, on_disk[-1], 1).exists():
        raise ConfigError(f"{folder}: a pipeline run's checkpoints (one part per stage); theory check replays the "
                          "single-process simulator (`delaylab llm train`)")
    if cfg.parallel.dp > 1:
        raise ConfigError(f"{folder}: a data-parallel run (dp = {cfg.parallel.dp}); theory check replays one process")
    say = progress or (lambda line: None)
    trainer = Trainer(cfg)
    cfg, T = trainer.cfg, trainer.cfg.run.steps
    cov = coverage(cfg, trainer.model, trainer.opt)
    covered = {n for n, p in trainer.model.named_parameters() if any(p is q for q in cov.params)}
    n_cov, n_all = sum(p.numel() for p in cov.params), sum(p.numel() for p in trainer.model.parameters())

    with torch.random.fork_rng(devices=[]):  # the replay's random stream stays the run's
        model64 = GPT(trainer.model_cfg, cfg.data.grad_accum)
    model64 = model64.to(device=trainer.device, dtype=torch.float64).eval()
    block = trainer.block
    rows = trainer.setup.rows
    held_batches = [rows(torch.as_tensor(x), torch.as_tensor(y))
                    for x, y in trainer.data.val_batches(held, cfg.data.batch_size, block)]
    M, B = cfg.data.grad_accum, cfg.data.batch_size
    first_fresh = (T + max_delay(cfg) + 1) * M  # microbatch indices the run never drew

    def fresh(i):
        xs, ys = zip(*(trainer.data.batch(first_fresh + i * M + j, B, block, cfg.run.seed) for j in range(M)))
        return rows(torch.cat([torch.as_tensor(x) for x in xs]), torch.cat([torch.as_tensor(y) for y in ys]))

    fresh_batches = [fresh(i) for i in range(samples)]
    probes = sorted({0, T, *[s for s in on_disk if s <= T], *(range(0, T + 1, probe_every) if probe_every else [])})

    def point():
        with torch.no_grad():
            for p64, p in zip(model64.parameters(), trainer.model.parameters()):
                p64.copy_(p)
        return [p.detach().cpu().numpy().copy() for n, p in model64.named_parameters() if n in covered]

    steps, norms, losses, etas = [], [], [], []
    secants, curv, sig = [], {}, {}
    prev = None  # (point, gradient) of the last measured update
    x_prev = [p.detach().clone() for p in cov.params]
    replay_diff, checked = 0.0, []
    last_said = time.perf_counter()
    k = 0
    while True:
        measured = k < T and k % every == 0
        if measured or k in probes:
            x = point()
            obj = _objective(model64, held_batches, covered)
            g, fx = obj.grad(x), obj.loss(x)
            if measured:
                steps.append(k)
                norms.append(A.dual_norm(g, cov.norm))
                losses.append(fx)
                if prev is not None:
                    r = A.secant(x, prev[0], g, prev[1], cov.norm)
                    if r is not None:
                        secants.append((prev[2], k, r))
                prev = (x, g, k)
            if k in probes:
                curv[k] = A.curvature_at(obj.hvp, x, cov.norm, iters=iters, seed=seed + k)[0]
                stoch = _objective(model64, fresh_batches, covered)
                sig[k] = A.estimate_sigma(stoch.stoch_grad, [x], samples).value
                say(f"update {k}/{T}: loss {fx:.4f}, ||grad f||_* {A.dual_norm(g, cov.norm):.4g}, "
                    f"curvature {curv[k]:.4g}, sigma {sig[k]:.4g} ({time.perf_counter() - t0:.0f} s)")
            if k == 0:
                G0, f0 = A.dual_norm(g, cov.norm), fx
        if k in on_disk:
            replay_diff = max(replay_diff, _check_replay(trainer.model, checkpoint.load_part(root, k, 0), k))
            checked.append(k)
        if k >= T:
            break
        before = trainer.updates
        while trainer.updates == before:  # a delayed run's first calls only fill the queue
            trainer.step(wait=True)
        k = trainer.updates
        with torch.no_grad():  # the step norm of update k-1 on the covered block
            etas.append(A.primal_norm([p - q for p, q in zip(cov.params, x_prev)], cov.norm))
            x_prev = [p.detach().clone() for p in cov.params]
        if time.perf_counter() - last_said > 30:
            say(f"update {k}/{T} replayed ({time.perf_counter() - t0:.0f} s)")
            last_said = time.perf_counter()
    return _result(folder, cfg, cov, T, n_cov, n_all, steps, norms, losses, etas, secants, curv, sig, G0, f0,
                   checked, replay_diff, dict(every=every, probe_every=probe_every, held=held, samples=samples,
                                              iters=iters, seed=seed), time.perf_counter() - t0)


def _weights(cov: Coverage, steps: list[int], etas: list[float], T: int) -> np.ndarray:
    """The weight of each measured update in the bound's mean (module doc)."""
    if cov.bound is not None and cov.bound.power == 2:  # Theorem 4: the mean over t of |grad f(x_{max(t-tau,0)})|^2
        counts = np.zeros(T)
        for t in range(T):
            counts[max(t - cov.tau, 0)] += 1
        return counts[steps]
    return np.asarray(etas)[steps]


def _result(folder, cfg, cov, T, n_cov, n_all, steps, norms, losses, etas, secants, curv, sig, G0, f0,
            checked, replay_diff, settings, seconds) -> dict:
    L = {"secant": max((r for _, _, r in secants), default=None), "curvature": max(curv.values())}
    L = {k: v for k, v in L.items() if v is not None}
    rho = A.rho([tuple(p.shape) for p in cov.params], cov.norm)
    sigma = max(sig.values())
    delta_hi, delta_lo = f0, max(f0 - min(losses), 0.0)
    power = cov.bound.power if cov.bound is not None else 1
    values = np.asarray(norms) ** power
    w = _weights(cov, steps, etas, T)
    if cov.eta is not None:
        eta, T_eff = cov.eta, float(T)
    else:
        eta = max(etas)
        T_eff = float(sum(etas) / eta) if eta > 0 else float(T)
    measured_mean = float((w * values).sum() / w.sum()) if w.sum() > 0 else float(values.mean())
    constants = {"L": L, "sigma": sigma, "rho": rho, "G0": G0, "Delta": delta_hi, "Delta_lower": delta_lo,
                 "eta": eta, "T": T, "T_eff": T_eff, "beta": cov.beta, "tau": cov.tau, "norm": cov.norm}
    bound_at, verdict, why, L_needed = {}, None, "", None
    if cov.bound is not None:
        base = dict(sigma=sigma, rho=rho, G0=G0, Delta=delta_hi, T=T_eff, eta=eta, beta=cov.beta, tau=cov.tau,
                    norm=cov.norm)
        for k, v in L.items():
            ev = evaluate(cov.bound, **base, L=v)
            bound_at[k] = {"L": v, "value": ev.value if ev.valid else None, "terms": ev.terms if ev.valid else None,
                           "valid": ev.valid}
        L_top = max(L.values())
        top = evaluate(cov.bound, **base, L=L_top)
        if cov.gaps:
            verdict, why = "cannot be evaluated", "; ".join(cov.gaps)
            if top.valid:
                why += (f". As if it applied: the measured mean {measured_mean:.4g} is "
                        f"{'below' if measured_mean <= top.value else 'above'} the bound {top.value:.4g} "
                        f"at L = {L_top:.4g}")
        elif not top.valid:
            verdict = "cannot be evaluated"
            why = (f"the step eta = {eta:.4g} is beyond {cov.theorem}'s cap at L = {L_top:.4g}: the bound says nothing "
                   "(a larger L only lowers the cap)")
        elif measured_mean <= top.value:
            verdict = "holds"
            why = (f"the measured mean {measured_mean:.4g} is below the bound {top.value:.4g} at L = {L_top:.4g}, a "
                   "lower estimate: at the true L, larger, the bound is larger still")
        else:
            verdict = "violated"
            L_needed = _L_needed(cov.bound, base, L_top, measured_mean)
            why = (f"the measured mean {measured_mean:.4g} is above the bound {top.value:.4g} at the estimated "
                   f"constants; L is a lower estimate, and the bound would hold "
                   + (f"from L = {L_needed:.4g}" if L_needed is not None else "at no L (the step's cap comes first)"))
    else:
        verdict, why = "cannot be evaluated", "; ".join(cov.gaps)
    return {
        "run": str(folder), "optimizer": cov.optimizer, "theorem": cov.theorem,
        "bound": None if cov.bound is None else cov.bound.name,
        "metric": None if cov.bound is None else cov.bound.metric,
        "power": power, "norm": cov.norm, "params": {"measured": n_cov, "total": n_all},
        "gaps": cov.gaps, "caveats": cov.caveats, "constants": constants,
        "bound_at": bound_at, "measured_mean": measured_mean, "verdict": verdict, "why": why, "L_needed": L_needed,
        "along": {"step": steps, "grad_norm": norms, "loss": losses, "eta": etas,
                  "secant": [{"from": a, "to": b, "L": r} for a, b, r in secants],
                  "curvature": {str(k): v for k, v in curv.items()}, "sigma": {str(k): v for k, v in sig.items()}},
        "replay": {"checkpoints": checked, "max_weight_diff": replay_diff},
        "settings": settings, "seconds": seconds,
        "sides": {"L": "lower (both estimates)", "sigma": "sigma^2 unbiased per probe, max over probes",
                  "Delta": "upper: f(x_0) - 0", "Delta_lower": "lower: f(x_0) - min of the measured losses",
                  "measured_mean": "biased high by the held-out batches' noise (Jensen)"},
    }


def _L_needed(bound: Bound, base: dict, L_top: float, target: float) -> float | None:
    """The smallest L >= L_top at which the bound reaches ``target`` (None if it never does)."""
    def value(L):
        ev = evaluate(bound, **base, L=L)
        return ev.value if ev.valid else None

    hi = L_top
    for _ in range(200):
        hi *= 2
        v = value(hi)
        if v is None:
            return None
        if v >= target:
            break
    else:
        return None
    lo = L_top
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        v = value(mid)
        if v is not None and v >= target:
            hi = mid
        else:
            lo = mid
    return hi


def render(r: dict) -> str:
    c = r["constants"]
    lines = [f"{r['run']}: {r['optimizer']}, {c['T']} updates, delay {c['tau']}; "
             f"{r['theorem'] or 'no theorem'}" + (f" ({r['bound']}, {r['norm']} norm, {r['params']['measured']} of "
                                                   f"{r['params']['total']} parameters)" if r["bound"] else "")]
    Ls = ", ".join(f"{k} {v:.4g}" for k, v in c["L"].items())
    lines.append(f"  L ({r['norm']}, lower estimates): {Ls}; sigma {c['sigma']:.4g}; rho {c['rho']:.4g}; "
                 f"G0 {c['G0']:.4g}; Delta {c['Delta']:.4g} (upper; lower {c['Delta_lower']:.4g})")
    if r["bound"]:
        lines.append(f"  eta {c['eta']:.4g}, T_eff {c['T_eff']:.4g}, beta {c['beta']:.4g}")
        for k, b in r["bound_at"].items():
            lines.append(f"  bound at the {k} L: " + (f"{b['value']:.4g}" if b["valid"] else "none (step beyond the "
                                                       "bound's cap)"))
        lines.append(f"  measured mean {'||grad f||^2' if r['power'] == 2 else '||grad f||_*'}: "
                     f"{r['measured_mean']:.4g}")
    else:
        lines.append(f"  measured mean ||grad f||_2: {r['measured_mean']:.4g}")
    for cav in r["caveats"]:
        lines.append(f"  note: {cav}")
    lines.append(f"verdict: {r['verdict']}: {r['why']}")
    return "\n".join(lines)


def plot(r: dict, path: str) -> None:
    """Measured gradient norms along the run against the bound at each L; the L estimates along it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from delaylab._io import save_figure

    a = r["along"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"wspace": 0.3})
    vals = np.asarray(a["grad_norm"]) ** r["power"]
    ax.plot(a["step"], vals, "o-", ms=3, label="measured " + ("||grad f||_2^2" if r["power"] == 2 else
                                                             f"||grad f||_* ({r['norm']})"))
    ax.axhline(r["measured_mean"], color="C0", ls=":", label=f"measured mean {r['measured_mean']:.3g}")
    for i, (k, b) in enumerate(r["bound_at"].items()):
        if b["valid"]:
            ax.axhline(b["value"], color=f"C{i + 1}", label=f"bound at the {k} L ({b['value']:.3g})")
    ax.set_yscale("log")
    ax.set_xlabel("update")
    ax.set_title(f"{r['optimizer']}: verdict {r['verdict']}", fontsize=10)
    ax.legend(fontsize=7)
    if a["secant"]:
        bx.plot([s["to"] for s in a["secant"]], [s["L"] for s in a["secant"]], "o-", ms=3, label="secant")
    cur = sorted((int(k), v) for k, v in a["curvature"].items())
    bx.plot([k for k, _ in cur], [v for _, v in cur], "s", label="curvature (power iteration)")
    bx.set_xlabel("update")
    bx.set_ylabel(f"L estimate ({r['norm']})")
    bx.set_yscale("log")
    bx.legend(fontsize=7)
    save_figure(fig, path, dpi=110, bbox_inches="tight")
    plt.close(fig)
