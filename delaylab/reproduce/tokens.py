"""Part 10 of the report: the tokens-per-parameter axis with its confounds pulled apart (issue 36),
from the runs of :func:`delaylab.reproduce.plan.tokens_axis`.

The first tokens axis (cpu-tokens) moved four things at once: tokens, updates (the batch was
fixed), the lr's decay (the gap closed during the cosine tail) and the lr (one seed's sync scan,
reused by the delayed runs). Here, at each model size:

- **more tokens, same updates**: 2 tokens per parameter against 20 with a 10x batch (``wide``);
- **more updates, same tokens**: 20 tokens per parameter at the 10x batch against the plain batch;
- **the lr's decay**: 20 tokens per parameter under cosine against a constant lr, and the gap read
  at every validation of both: at the peak lr (the first validation after warmup), at mid-run and
  at the end. ``closing`` is the per-seed gap at the peak minus the gap at the end.

Every point's sync and delayed lrs are tuned over all its seeds (each mode its own best by the
mean); a gap is the per-seed (same init, same batches) delayed - sync difference at the two best
lrs. A separation compares two points of one size over the seeds they share (a seed fixes the
init at both), so it is a paired difference with its 95% t interval. Each is scored as a claim in
one direction by the one verdict rule, and held to the findings' lr-robustness rule: it is
recomputed at every pair of lrs the data cannot tell from each point's optima (both modes, both
points), and where the state differs across them it is undetermined (lr-dependent).
"""

from __future__ import annotations

from itertools import product

from delaylab.llm.config import warmup_updates
from delaylab.reproduce import stats as S
from delaylab.reproduce.findings import indistinguishable
from delaylab.reproduce.presets import Preset
from delaylab.reproduce.verdicts import part_states, qualitative, state

TITLE = "The tokens axis, unconfounded: tokens, updates and the lr's decay"
READS = ("peak", "mid", "end")  # the validations the gap is read at (read_points), in run order


def _curves(rows: list[dict], mode: str, lr: float) -> dict[int, list[dict]]:
    """``{seed: [metrics line with val_loss, ...]}`` of one mode's runs at one lr, in step order."""
    return {r["seed"]: [m for m in r["metrics"] if m.get("val_loss") is not None]
            for r in rows if r["mode"] == mode and r["lr"] == lr}


def read_points(steps: int, warmup: int, val_steps: list[int]) -> dict[str, int]:
    """Which validation stands for each read: ``peak``, the first at or after the warmup's end
    (the lr at its peak, within the cosine's first percents); ``mid``, the nearest to half the run;
    ``end``, the last. Values are indices into ``val_steps``."""
    peak = next(i for i, s in enumerate(val_steps) if s >= warmup)
    mid = min(range(len(val_steps)), key=lambda i: (abs(val_steps[i] - steps / 2), i))
    return {"peak": peak, "mid": mid, "end": len(val_steps) - 1}


def point_record(L, size: str, ratio: float, kind: str, point: dict) -> dict:
    """One point: its grid, the two modes' best lrs, the final gap and the gap along the run."""
    rows = L.records(point["runs"], curves=True)
    base = point["base"]
    best = point["best"]
    sync, delayed = _curves(rows, "sync", best["sync"]), _curves(rows, "delayed", best["delayed"])
    seeds = sorted(set(sync) & set(delayed))
    steps_at = [m["step"] for m in sync[seeds[0]]]
    along = []
    for i, step in enumerate(steps_at):
        vals = [delayed[s][i]["val_loss"] - sync[s][i]["val_loss"] for s in seeds]
        along.append({"step": step, "tokens": sync[seeds[0]][i]["tokens"], "fraction": step / base["steps"],
                      "lr_factor": sync[seeds[0]][i]["lr"] / best["sync"], "gap": S.sample(vals)})
    reads = read_points(base["steps"], warmup_updates(base["steps"], base.get("warmup")), steps_at)
    gap_at = {k: [along[i]["gap"]["values"][j] for j in range(len(seeds))] for k, i in reads.items()}
    final = {m: {s: c[-1]["val_loss"] for s, c in cur.items()} for m, cur in (("sync", sync), ("delayed", delayed))}
    params = L.summary(point["runs"][0])["params"]
    t = L.preset.tokens
    near = {m: indistinguishable(rows, t.optimizer, t.momentum, best[m], mode=m) for m in ("sync", "delayed")}
    return {
        "size": size, "params": params, "tokens_per_param": ratio, "kind": kind, "batch_size": base["batch_size"],
        "updates": base["steps"], "tokens": sync[seeds[0]][-1]["tokens"], "lr_schedule": base["lr_schedule"],
        "lrs": point["lrs"], "extended": point["extended"], "best": best, "censored": point["censored"],
        "seeds": len(seeds), "sync": S.sample([final["sync"][s] for s in seeds]),
        "delayed": S.sample([final["delayed"][s] for s in seeds]),
        "gap": S.sample([final["delayed"][s] - final["sync"][s] for s in seeds]),
        "along": along, "reads": {k: {"index": i, **along[i]} for k, i in reads.items()},
        "closing": S.sample([a - b for a, b in zip(gap_at["peak"], gap_at["end"])]),
        "issues": S.issues_of(rows), "seed_ids": seeds, "near_lrs": near,
        "at_near_lrs": [_at_lrs(rows, ls, ld, reads) for ls, ld in product(near["sync"], near["delayed"])],
    }


def _at_lrs(rows: list[dict], sync_lr: float, delayed_lr: float, reads: dict[str, int]) -> dict:
    """Per seed, the final gap and the closing (peak - end) with sync at ``sync_lr`` and delayed at
    ``delayed_lr``: the quantities a separation compares, at one pair of near-optimal lrs."""
    sync, delayed = _curves(rows, "sync", sync_lr), _curves(rows, "delayed", delayed_lr)
    seeds = sorted(set(sync) & set(delayed))

    def gap(s, k):
        return delayed[s][reads[k]]["val_loss"] - sync[s][reads[k]]["val_loss"]

    return {"lrs": [sync_lr, delayed_lr], "seed_ids": seeds, "gap": [gap(s, "end") for s in seeds],
            "closing": [gap(s, "peak") - gap(s, "end") for s in seeds]}


def separations(p: Preset, table: dict) -> list[dict]:
    """Per size, each factor moved alone (and the old axis's two together): ``{"name", "what", "from",
    "to", "quantity", "first", "second", "delta", "ci", "n", "sign", "claim", "region", "state",
    "lr_states"}``; ``delta`` = second - first paired by seed; ``claim`` the direction scored."""
    t = p.tokens
    lo, hi = min(t.ratios), max(t.ratios)
    k, w = f"{hi / lo:g}x", f"{t.wide_batch / t.batch_size:g}x"
    kinds = {"cosine": "cosine", "wide": f"cosine, {w} batch", "constant": "constant lr"}
    up, down = (0, None), (None, 0)
    pairs = (  # (name, what changes, first point, second point, the quantity compared, the direction claimed)
        ("tokens and updates", f"{k} tokens and {k} updates (the old axis)", (lo, "cosine"), (hi, "cosine"), "gap",
         down),
        ("tokens", f"{k} tokens, same updates ({w} batch)", (lo, "cosine"), (hi, "wide"), "gap", up),
        ("updates", f"{k} updates, same tokens", (hi, "wide"), (hi, "cosine"), "gap", down),
        ("decay: final gap", f"cosine decay against a constant lr, at {hi:g}:1", (hi, "constant"), (hi, "cosine"),
         "gap", down),
        ("decay: closing", "the gap's closing from peak lr to the end, cosine against constant",
         (hi, "constant"), (hi, "cosine"), "closing", up),
    )
    out = []
    for size in t.sizes:
        for name, what, (ra, ka), (rb, kb), q, region in pairs:
            a, b = table[(size, ra, ka)], table[(size, rb, kb)]
            d = S.paired_change(a[q]["values"], a["seed_ids"], b[q]["values"], b["seed_ids"])
            ci = d["ci"]
            at_lrs = [state(S.paired_change(x[q], x["seed_ids"], y[q], y["seed_ids"])["ci"], region)
                      for x in a["at_near_lrs"] for y in b["at_near_lrs"]]
            censored = any(pt["censored"].get(m) for pt in (a, b) for m in ("sync", "delayed"))
            out.append({"size": size, "name": name, "what": what, "quantity": q,
                        "from": f"{ra:g}:1 {kinds[ka]}", "to": f"{rb:g}:1 {kinds[kb]}",
                        "first": a[q]["mean"], "second": b[q]["mean"], "delta": d["mean"], "ci": ci, "n": d["n"],
                        "sign": 0 if ci is None else 1 if ci[0] > 0 else -1 if ci[1] < 0 else 0,
                        "claim": "grows" if region == up else "shrinks", "region": list(region),
                        "state": state(ci, region, censored=censored, lr_dependent=len(set(at_lrs)) > 1),
                        "lr_states": {x: at_lrs.count(x) for x in sorted(set(at_lrs))}})
    return out


def conclusion(seps: list[dict]) -> list[str]:
    """One line per factor moved alone: each size's change with its paired interval, the direction
    scored and its state (lr-dependent where the near-optimal lrs disagree)."""
    lines = []
    for name in ("tokens", "updates", "decay: final gap", "decay: closing"):
        mine = [s for s in seps if s["name"] == name]
        lines.append(f"{mine[0]['what']} ({mine[0]['quantity']} {mine[0]['claim']}): " + "; ".join(
            f"{s['size']} {S.fmt(s['delta'])} {S.ci_text(s)} over {s['n']} seeds, {s['state']}"
            + (f" (lr-dependent: {_states(s)})" if len(s["lr_states"]) > 1 else "") for s in mine))
    return lines


def _states(sep: dict) -> str:
    return ", ".join(f"{v} of {sum(sep['lr_states'].values())} lr pairs {k}" for k, v in sep["lr_states"].items())


def tokens(L) -> dict:
    p, table = L.preset, L.tokens_axis
    t = p.tokens
    rows = {key: point_record(L, *key, pt) for key, pt in table.items()}
    seps = separations(p, rows)
    ordered = [rows[k] for k in t.points()]
    headline = "; ".join(f"{r['size']} {r['tokens_per_param']:g}:1 {r['lr_schedule']} batch {r['batch_size']}: "
                         f"{S.fmt(r['gap']['mean'])} {S.ci_text(r['gap'])}" for r in ordered)
    setup = (f"{t.optimizer} sync and delayed (tau = 1) on {', '.join(t.sizes)} at "
             f"{' and '.join(f'{r:g}' for r in t.ratios)} tokens per parameter, batch {t.batch_size} x {t.block_size} "
             f"tokens, cosine after a 5% warmup; at {max(t.ratios):g} also batch {t.wide_batch} (the updates of "
             f"{min(t.ratios):g}:1) and a constant lr after the warmup; {t.seeds} seeds; both modes' lrs tuned at "
             f"every point over the {t.seeds} seeds on {', '.join(f'{x:g}' for x in t.lrs)}, grown at an edge up to "
             f"{t.lr_extend} steps per side; validation on the same {t.val_windows} windows at every point, "
             f"{t.evals} times per run")
    numbers = [qualitative("the gap against tokens, updates and the lr's decay",
                           "no number: the bounds' L and sigma are not measured at each point")]
    return {"id": 10, "key": "tokens", "title": TITLE,
            "paper": "360M at 20 tokens per parameter: AdamW +0.278 (the paper runs one length per size).",
            "theory": "The bounds' delay term scales with the lr and tau in updates, not with tokens; none predicts "
                      "the gap's change with the batch at a fixed update count without L and sigma at each point.",
            "setup": setup, "rows": ordered, "separations": seps, "conclusion": conclusion(seps),
            "verdicts": [], "headline": headline,
            "theory_numbers": numbers, **part_states([], numbers)}
