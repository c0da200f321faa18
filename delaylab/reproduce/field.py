"""Part 11 of the report: the field's claims about delayed training, scored side by side (docs/field.md).

Each claim of the papers and reports below is a row of :func:`claims`, the one function that scores
them: the quantity measured on this preset's runs, its 95% interval (Student-t for a mean or a paired
difference, Welch's for two independent samples, Fieller's for a ratio of paired means or a recovered
share), the claim's region (:data:`delaylab.reproduce.presets.FIELD_REGIONS`, stated before any run;
None for an open side) and the verdict of the one rule (:func:`delaylab.reproduce.verdicts.score`),
with the reason the data can give where the verdict is not "agrees" and a one-line caveat.
The rows are what a claims registry registers (``source``, ``claim``, ``interval``, ``region``,
``state``).

Sources (facts from their public papers and reports):

- Jung, Shin, Lee, "Mitigating Staleness in Asynchronous Pipeline Parallelism via Basis Rotation",
  ICML 2026, arXiv 2602.03515: Adam's delay penalty grows with the misalignment of the Hessian's
  eigenbasis and the coordinate axes; Adam in a rotated basis keeps delayed updates useful, and
  its advantage grows with pipeline depth (76.8% fewer iterations than the best asynchronous baseline
  at 1B, 81.7% at 3B with 32 stages);
- marin's delayed-gradient study (marin-community/marin #6423, #6431, June 2026): Muon's gap
  +0.14 / +0.35 / +0.85 / +1.50 / +2.57 at tau 2 / 4 / 8 / 16 / 32, about linear; weight prediction
  along the applied update closes 53% / 45% / 19% at tau 2 / 8 / 16, along the raw momentum it is
  worse than nothing; DC-ASGD recovers <= 3%; a per-stage profile (6 stages, the last fresh) costs
  +0.086 against +0.282 for a uniform tau = 5 (3.3x less); the iso-loss token overhead falls with
  the budget (1.33x at 6k updates, 1.16x at 15k);
- Sadiev, Maranjyan, Ilin, Richtarik, "Ringmaster LMO", arXiv 2605.18174: asynchronous LMO/Muon
  momentum that discards gradients staler than a threshold converges faster under heterogeneous
  delays;
- Ajanthan et al., "Nesterov Method for Asynchronous Pipeline Parallel Optimization", ICML 2025:
  the look-ahead variant surpasses the synchronous baseline (up to 1B);
- the seed paper (arXiv 2606.30634): EF recovers 50-90% of the gap; 2BW's constant delay beats
  PipeDream's per-stage delays at depth (its momentum finding is the cpu-small report's).
"""

from __future__ import annotations

from delaylab.llm import metrics
from delaylab.reproduce import plan as P
from delaylab.reproduce import stats as S
from delaylab.reproduce.delays import censored_lr
from delaylab.reproduce.presets import FIELD_REGIONS, Preset
from delaylab.reproduce.verdicts import AGREES, part_states, score, verdict, why

TITLE = "The field's claims about delayed training, scored side by side"

SOURCES = {
    "rotation": "Jung, Shin, Lee, basis rotation (ICML 2026, arXiv 2602.03515)",
    "marin": "marin's delayed-gradient study (marin #6423 / #6431, June 2026)",
    "ringmaster": "Sadiev, Maranjyan, Ilin, Richtarik, Ringmaster LMO (arXiv 2605.18174)",
    "nesterov": "Ajanthan et al., Nesterov method for asynchronous PP (ICML 2025)",
    "seed": "the seed paper (arXiv 2606.30634)",
}
# The scale each source measured at, for the reasons a disagreement can have.
THEIR_SCALE = {
    "rotation": "GPT models up to 3B parameters, up to 32 stages",
    "marin": "a mixture-of-experts GPT (marin's Grug MoE) trained with Muon for 6k-15k updates on TPUs",
    "ringmaster": "NanoChat pretraining with heterogeneous workers",
    "nesterov": "GPT models up to 1B parameters, 8 stages",
    "seed": "360M parameters on FineWeb-Edu (10B MoE for EF)",
}
# The scores this report cannot make, with why (shown as notes, not scored).
NOT_SCORED = [
    ("rotation", "76.8% fewer iterations than the best asynchronous baseline at 1B, 81.7% at 3B (P = 32)",
     "iterations to a target loss at 1B and 3B: not measurable on a 2-core CPU; the direction is scored above"),
    ("marin", "the gap at tau 16 and 32 (+1.50, +2.57); prediction closes 19% at tau 16",
     "tau above 8 is not run (the tiny model's 220 updates)"),
    ("seed", "momentum shrinks the gap", "the cpu-small report's finding 3, not rerun here"),
]


# -- reading the runs -----------------------------------------------------------------------------------
#
# A measured quantity is a linear combination of final val losses, per seed: ``terms`` = [(coefficient,
# runs of one cell, one per seed), ...]. Each row keeps its terms as run folders (``inputs``), so that
# tests/reproduce/test_committed_reports.py recomputes it from runs.jsonl alone.


def _losses(L, runs) -> dict[int, float | None]:
    return {r["seed"]: r["val_loss"] for r in L.records(runs)}


def _combo(L, terms) -> dict[int, float | None]:
    """Per seed ``sum(c * val_loss)`` over the seeds every term has (None where a run diverged)."""
    per = [(c, _losses(L, runs)) for c, runs in terms]
    seeds = sorted(set.intersection(*(set(x) for _, x in per)))
    return {s: None if any(x[s] is None for _, x in per) else sum(c * x[s] for c, x in per) for s in seeds}


def _folders(terms) -> list:
    return [[c, [r.folder for r in runs]] for c, runs in terms]


def _neg(terms):
    return [(-c, runs) for c, runs in terms]


def _values(d: dict) -> list:
    return [d[k] for k in sorted(d)]


class _Runs:
    """The cells a claim reads: the delay axis's by (setting, optimizer, mode), the field part's by name."""

    def __init__(self, L):
        self.L, self.p = L, L.preset
        self.cells = L.delay_axis["cells"]
        self.field = L.decided["field_axis"][1] if "field_axis" in L.decided else None

    def has(self, setting: str, opt: str, mode: str) -> bool:
        return (setting, opt, mode) in self.cells

    def cell(self, setting: str, opt: str, mode: str) -> list:
        return self.cells[(setting, opt, mode)]

    def loss(self, setting: str, opt: str, mode: str) -> dict:
        return _losses(self.L, self.cells[(setting, opt, mode)])

    def gap(self, setting: str, opt: str, mode: str = "delayed", runs=None) -> list:
        """Terms of ``mode`` (or of ``runs``) minus the setting's sync cell."""
        return [(1.0, runs if runs is not None else self.cell(setting, opt, mode)),
                (-1.0, self.cell(setting, opt, "sync"))]

    def issues(self, *keys) -> list[str]:
        return S.issues_of([row for k in keys if k in self.cells for row in self.L.records(self.cells[k])])

    def censored(self, *keys) -> bool:
        return censored_lr(self.L, *keys)

    def blocks(self, *keys, grids=()) -> dict:
        """What keeps a claim on these cells (and field ``grids``) from agreeing or disagreeing: the
        protocol's breaches and censored lr optima (:func:`delaylab.reproduce.verdicts.state`)."""
        return {"issues": self.issues(*keys),
                "censored": self.censored(*keys) or any(any(gr["censored"].values()) for gr in grids)}

    def scale(self) -> str:
        """The base model's size and tokens per parameter, from one of its sync runs."""
        runs = self.cells.get((self._uniform()[0].name, self.p.delays.optimizers[0], "sync"), [])
        line = next((x for x in self.L.lines if x.get("folder") in {r.folder for r in runs}), None)
        if line is None or not line.get("params"):
            return "this model"
        return f"{line['params'] / 1e6:.2f}M parameters, {line['tokens_per_param']:.2f} tokens per parameter"

    def _uniform(self):
        return sorted((s for s in self.p.delays.settings if isinstance(s.delay, int) and not s.model),
                      key=lambda s: s.delay)


def _per_stage(p: Preset):
    """``(profile, uniform tau = P - 1, 2BW)`` settings on one model, each None where absent."""
    g = p.delays
    out = []
    for s in g.settings:
        if not isinstance(s.delay, tuple):
            continue
        twin = next((u for u in g.settings if u.delay == max(s.delay) and u.model == s.model), None)
        two_bw = next((u for u in g.settings if u.delay == 1 and u.model == s.model), None)
        out.append((s, twin, two_bw))
    return out


# -- one claim row ----------------------------------------------------------------------------------------


def _row(key: str, source: str, claim: str, where: str, value, interval, *, unit: str, measured: str, inputs: dict,
         issues=(), censored: bool = False, caveat: str, alternative: str = "") -> dict:
    region = FIELD_REGIONS[key]
    sc = score(claim, interval, list(region), measured=value, issues=issues, censored=censored)
    reason = ""
    if sc["state"] != AGREES:
        reason = why(sc) or "the interval lies outside the claimed region"
        reason += f"; at this scale: {alternative}" if alternative else ""
    return {"key": key, "source": source, "cited": SOURCES[source], "claim": claim, "setting": where,
            "measured": measured, "value": value, "interval": interval, "region": list(region), "unit": unit,
            "state": sc["state"], "reason": reason, "caveat": caveat, "inputs": inputs, "score": sc}


def _sample_row(L, key, source, claim, where, terms, *, issues, censored=False, caveat, alternative=""):
    s = S.sample(_values(_combo(L, terms)))
    measured = f"{S.fmt(s['mean'])} {S.ci_text(s)} over {s['n']} seeds"
    return _row(key, source, claim, where, s["mean"], s["ci"], unit="val loss", measured=measured, issues=issues,
                censored=censored, caveat=caveat, alternative=alternative, inputs={"kind": "mean", "terms": _folders(terms)})


def _share_row(L, key, source, claim, where, sync, delayed, fix, *, issues, censored=False, caveat, alternative=""):
    rec = metrics.recovery(_losses(L, sync), _losses(L, delayed), _losses(L, fix))
    text = "n/a" if rec["ratio_of_means"] is None else f"{rec['ratio_of_means']:.0f}% {S.ci_text(rec, '.0f')}"
    return _row(key, source, claim, where, rec["ratio_of_means"], rec["ci"], unit="%",
                measured=f"{text} over {rec['n']} seeds", issues=issues, censored=censored, caveat=caveat,
                alternative=alternative,
                inputs={"kind": "share", **{k: [r.folder for r in v] for k, v in
                                            (("sync", sync), ("delayed", delayed), ("fix", fix))}})


def _ratio_row(L, key, source, claim, where, num, den, *, issues, censored=False, caveat, alternative=""):
    r = metrics.mean_ratio(_combo(L, num), _combo(L, den))
    text = "n/a" if r["ratio"] is None else (f"{r['ratio']:.2f}" + (
        f" [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]" if r.get("ci") else " (Fieller's set unbounded)"))
    return _row(key, source, claim, where, r["ratio"], r.get("ci"), unit="x", measured=f"{text} over "
                f"{len(r['seeds'])} seeds", issues=issues, censored=censored, caveat=caveat, alternative=alternative,
                inputs={"kind": "ratio", "num": _folders(num), "den": _folders(den)})


def _change_text(ch: dict, spec="+.3f") -> str:
    ci = "[n/a]" if ch["ci"] is None else f"[{S.fmt(ch['ci'][0], spec)}, {S.fmt(ch['ci'][1], spec)}]"
    return f"{S.fmt(ch['delta'], spec)} {ci} (Welch)"


# -- the claims ------------------------------------------------------------------------------------------


def claims(L) -> list[dict]:
    """Every claim of the field this preset's runs can score, as rows (see the module docstring).
    ``L``: a :class:`~delaylab.reproduce.ledger.Ledger` of a preset with a delay axis (and a field part
    for the claims that need one); a claim whose runs the preset lacks is left out."""
    R = _Runs(L)
    p, g = R.p, R.p.delays
    uniform = R._uniform()
    lo, hi = uniform[0], uniform[-1]
    scale = R.scale()
    rows: list[dict] = []
    opts = g.optimizers

    # basis rotation
    if "adamw" in opts and "rotated-adam" in opts:
        def advantage(setting):
            return R.gap(setting, "adamw") + _neg(R.gap(setting, "rotated-adam"))

        alt = f"{scale} against {THEIR_SCALE['rotation']}"
        keys = [(s.name, o, m) for s in (lo, hi) for o in ("adamw", "rotated-adam") for m in ("sync", "delayed")]
        rows.append(_sample_row(
            L, "rotation_gap_smaller", "rotation", f"rotated Adam's gap is smaller than AdamW's (tau {hi.delay})",
            f"{hi.name}: AdamW gap - rotated-Adam gap", advantage(hi.name), **R.blocks(*keys),
            caveat="each optimizer's delayed run at its own tuned lr; rotated Adam's bases refreshed every 10 "
                   "updates, as in the paper's runs", alternative=alt))
        rows.append(_sample_row(
            L, "rotation_grows_with_depth", "rotation", f"rotated Adam's advantage grows with the delay (tau "
            f"{lo.delay} -> {hi.delay})", f"(AdamW - rotated) gap at {hi.name} minus at {lo.name}",
            advantage(hi.name) + _neg(advantage(lo.name)), **R.blocks(*keys),
            caveat="the delay grows with pipeline depth in the paper's asynchronous PP; here tau is set directly",
            alternative=alt))
        stages = [s for s, _, _ in _per_stage(p) if all(R.has(s.name, o, "delayed") for o in ("adamw", "rotated-adam"))]
        if len(stages) >= 2:
            small, big = stages[0], stages[-1]
            first, second = advantage(small.name), advantage(big.name)
            ch = S.change(S.sample(_values(_combo(L, first))), S.sample(_values(_combo(L, second))))
            rows.append(_row("rotation_grows_with_pipeline", "rotation",
                             f"rotated Adam's advantage grows with pipeline depth (PipeDream P = {len(small.delay)} "
                             f"-> {len(big.delay)})", f"(AdamW - rotated) gap at {big.name} minus at {small.name}",
                             ch["delta"], ch["ci"], unit="val loss", measured=_change_text(ch),
                             inputs={"kind": "welch", "first": _folders(first), "second": _folders(second)},
                             **R.blocks(*[(s.name, o, m) for s in (small, big) for o in ("adamw", "rotated-adam")
                                               for m in ("sync", "delayed")]),
                             caveat="the two depths are two models (4 and 8 layers) at the 2-layer model's lrs",
                             alternative=alt))

    # marin
    if "muon" in opts:
        rows += _marin(R, L, lo, hi, scale)

    # Ringmaster
    field = R.field
    if field is not None and field["random"]:
        f = p.field
        drop = P.field_drop_mode(p)
        plain, thresh = field["random"]["delayed"]["cell"], field["random"][drop]["cell"]
        calls = [x.get("calls") for x in L.lines if x.get("folder") in {r.folder for r in thresh}]
        spent = (f"; drop:{f.drop} computed {sum(calls) / len(calls) / plain[0].base['steps']:.2f}x the gradients "
                 "it applied" if calls and None not in calls else "")
        rows.append(_sample_row(
            L, "drop_faster", "ringmaster", f"discarding gradients staler than {f.drop} updates converges faster "
            f"({f.random}, {f.optimizer})", f"{P.field_setting(p).name}: delayed - drop:{f.drop} val loss, equal "
            "updates, each at its tuned lr", [(1.0, plain), (-1.0, thresh)],
            issues=S.issues_of(L.records(plain + thresh)),
            censored=any(any(rec["grid"]["censored"].values()) for rec in field["random"].values()),
            caveat="compared at equal updates (the discarded gradients stand for slow workers' compute)" + spent,
            alternative=f"{scale}; i.i.d. delays in updates, no worker model, against {THEIR_SCALE['ringmaster']}"))

    # Nesterov look-ahead
    for s in [x for x, _, _ in _per_stage(p)] + [lo]:
        for opt in opts:
            if R.has(s.name, opt, "lookahead"):
                rows.append(_sample_row(
                    L, "lookahead_beats_sync", "nesterov", f"the look-ahead variant surpasses synchronous training "
                    f"({opt}, {s.name})", f"{s.name}: lookahead - sync val loss", R.gap(s.name, opt, "lookahead"),
                    **R.blocks((s.name, opt, "sync"), (s.name, opt, "lookahead")),
                    caveat="delaylab's look-ahead is the NAG point x - 0.99 u_last for any optimizer, not the "
                           "paper's NAdam-based update",
                    alternative=f"{scale} against {THEIR_SCALE['nesterov']}"))

    # the seed paper
    for opt in opts:
        if R.has(lo.name, opt, "ef"):
            rows.append(_share_row(L, "ef_recovers", "seed", f"EF recovers 50-90% of the gap ({opt}, {lo.name})",
                                   f"{lo.name}: EF's share of the delayed gap", *(R.cell(lo.name, opt, m) for m in
                                                                                 ("sync", "delayed", "ef")),
                                   **R.blocks(*[(lo.name, opt, m) for m in ("sync", "delayed", "ef")]),
                                   caveat="each mode at its own lr (tuned at tau 1)",
                                   alternative=f"{scale} against {THEIR_SCALE['seed']}"))
    for s, _, two_bw in _per_stage(p):
        for opt in opts:
            if two_bw is not None and R.has(two_bw.name, opt, "delayed") and R.has(s.name, opt, "delayed"):
                rows.append(_sample_row(
                    L, "two_bw_beats_pipedream", "seed", f"2BW's constant delay beats PipeDream's per-stage delays "
                    f"({opt}, P = {len(s.delay)})", f"{s.name} - {two_bw.name} val loss",
                    [(1.0, R.cell(s.name, opt, "delayed")), (-1.0, R.cell(two_bw.name, opt, "delayed"))],
                    **R.blocks((s.name, opt, "delayed"), (two_bw.name, opt, "delayed")),
                    caveat="the per-stage model's lrs are the 2-layer model's (not tuned on it)",
                    alternative=f"{scale} against {THEIR_SCALE['seed']}"))
    return rows


def _marin(R: _Runs, L, lo, hi, scale: str) -> list[dict]:
    p, field = R.p, R.field
    rows = []
    alt = f"{scale} against {THEIR_SCALE['marin']}"
    two = next((s for s in R._uniform() if s.delay == 2), None)
    if two is not None and two is not hi and R.has(two.name, "muon", "delayed"):
        syncs = [(two.name, "muon", "sync"), (hi.name, "muon", "sync")]
        curves = {"the protocol's lrs": (R.gap(two.name, "muon"), R.gap(hi.name, "muon"), R.blocks(
            (two.name, "muon", "delayed"), (hi.name, "muon", "delayed"), *syncs))}
        if field is not None and two.name in field["retuned"]:
            rec = field["retuned"][two.name]
            curves["the lr tuned at every tau"] = (R.gap(two.name, "muon", runs=rec["cell"]), R.gap(hi.name, "muon"),
                                                   R.blocks((hi.name, "muon", "delayed"), *syncs, grids=[rec["grid"]]))
        if field is not None and two.name in field["held"] and hi.name in field["held"]:
            curves["the lr held at tau 1's"] = (R.gap(two.name, "muon", runs=field["held"][two.name]),
                                                R.gap(hi.name, "muon", runs=field["held"][hi.name]),
                                                R.blocks((lo.name, "muon", "delayed"), *syncs))
        ratios = {how: metrics.mean_ratio(_combo(L, g_hi), _combo(L, g_two)) for how, (g_two, g_hi, _) in curves.items()}
        others = ", ".join(f"{S.fmt(r['ratio'], '.2f')} with {how}" for how, r in ratios.items())
        for how, (g_two, g_hi, blocks) in curves.items():
            if how == "the protocol's lrs" and len(curves) > 1:
                continue  # with the lr tuned at every tau it is the protocol's curve
            rows.append(_ratio_row(
                L, "muon_linear", "marin", f"Muon's gap grows about linearly in tau: gap(tau {hi.delay}) / gap(tau 2) "
                f"({how})", f"{hi.name} / {two.name}", g_hi, g_two, **blocks,
                caveat="linear is 4; marin measured 0.85 / 0.14 = 6.1 with one lr for every tau",
                alternative=f"{alt}; the ratio is {others}"))
    for s in ([hi] if two is None or two is hi else [two, hi]):
        for mode, key in (("predict", "predict_closes"), ("predict-momentum", "raw_momentum_worse")):
            cell = (field or {}).get("raw_momentum", {}).get(s.name) if mode == "predict-momentum" else (
                R.cell(s.name, "muon", mode) if R.has(s.name, "muon", mode) else None)
            if cell is None:
                continue
            claim = ("weight prediction along the applied update closes about half of Muon's gap"
                     if mode == "predict" else "prediction along the raw momentum is worse than no correction")
            lrs = f"{mode} ran at lr {cell[0].cell.lr:g}, delayed at lr {R.cell(s.name, 'muon', 'delayed')[0].cell.lr:g}"
            rows.append(_share_row(L, key, "marin", f"{claim} ({s.name})", f"{s.name}: {mode}'s share of the gap",
                                   R.cell(s.name, "muon", "sync"), R.cell(s.name, "muon", "delayed"), cell,
                                   **R.blocks(*[(s.name, "muon", m) for m in ("sync", "delayed", "predict")]),
                                   caveat="marin: 53% at tau 2, 45% at tau 8" if mode == "predict" else
                                   "the raw momentum extrapolated as tau lr m, at prediction's lr",
                                   alternative=f"{alt}; {lrs}"))
    if R.has(hi.name, "muon", "dc-asgd-a"):
        rows.append(_share_row(L, "dc_asgd_small", "marin", f"DC-ASGD recovers at most 3% of Muon's gap ({hi.name})",
                               f"{hi.name}: DC-ASGD-a's share of the gap",
                               *(R.cell(hi.name, "muon", m) for m in ("sync", "delayed", "dc-asgd-a")),
                               **R.blocks(*[(hi.name, "muon", m) for m in ("sync", "delayed", "dc-asgd-a")]),
                               caveat="the adaptive form (lambda0 = 2), as marin's EMA variant", alternative=alt))
    for s, twin, _ in _per_stage(p):
        if twin is not None and R.has(twin.name, "muon", "delayed") and R.has(s.name, "muon", "delayed"):
            rows.append(_ratio_row(
                L, "per_stage_milder", "marin", f"a per-stage profile (last stage fresh) costs about 3.3x less than a "
                f"uniform delay of its depth (P = {len(s.delay)})", f"gap at {twin.name} / gap at {s.name}",
                R.gap(twin.name, "muon"), R.gap(s.name, "muon"),
                **R.blocks(*[(x.name, "muon", m) for x in (s, twin) for m in ("sync", "delayed")]),
                caveat=f"marin: 6 stages against tau 5; here {len(s.delay)} stages against tau {twin.delay}",
                alternative=alt))
    if field is not None and len(field["budgets"]) >= 2:
        rows.append(_overhead_row(R, L, alt))
    return rows


def _overhead_row(R: _Runs, L, alt: str) -> dict:
    """The overhead at the shortest budget minus at the longest: per seed the first run (1x, then the longer
    reruns) that reaches its sync run's final loss; Welch over the two budgets' seeds."""
    f, budgets = R.p.field, sorted(R.field["budgets"].items())
    (short, a), (long_, b) = budgets[0], budgets[-1]
    per = {k: [x["overhead"]["overhead"] if x["overhead"] else None for x in v.values()] for k, v in ((short, a),
                                                                                                     (long_, b))}
    ch = S.change(S.sample(per[long_]), S.sample(per[short]))
    reached = all(v is not None for vs in per.values() for v in vs)
    def mean(k):
        return "not reached" if None in per[k] else f"{S.fmt(S.sample(per[k])['mean'], '.2f')}x"

    text = _change_text(ch, "+.2f") + f"; overhead {mean(short)} at {short:g}x the updates, {mean(long_)} at {long_:g}x"
    runs = [r for v in (a, b) for x in v.values() for r in (x["sync"], *x["runs"])]
    return _row("overhead_falls", "marin", f"the iso-loss token overhead falls with the budget ({f.budget_setting}, "
                f"{f.optimizer})", f"overhead at {short:g}x minus at {long_:g}x the updates",
                ch["delta"] if reached else None, ch["ci"] if reached else None, unit="x",
                measured=text if reached else "a seed's delayed run never reached its sync loss: " + text,
                inputs={"kind": "overhead", **{name: [[x["sync"].folder, [r.folder for r in x["runs"]]]
                                                      for x in v.values()] for name, v in (("second", a),
                                                                                          ("first", b))}},
                **{**R.blocks((f.budget_setting, f.optimizer, "delayed"), (f.budget_setting, f.optimizer, "sync")),
                   "issues": S.issues_of(L.records(runs))},
                caveat="both budgets at the shorter one's lrs; marin: 1.33x at 6k updates, 1.16x at 15k",
                alternative=alt)


# -- the report part ---------------------------------------------------------------------------------------


def field(L) -> dict:
    rows = claims(L)
    verdicts = [verdict("paper", r["claim"], _region_text(r), r["measured"], r["score"]) for r in rows]
    counts: dict = {}
    for r in rows:
        counts.setdefault(r["source"], []).append(r["state"])
    headline = "; ".join(f"{src}: " + ", ".join(f"{st.count(x)} {x}" for x in ("agrees", "disagrees", "undetermined")
                                                  if st.count(x)) for src, st in counts.items())
    return {"id": 11, "key": "field", "title": TITLE,
            "paper": "Claims of the field on delayed training, each from its authors' own stack: "
                     + "; ".join(SOURCES.values()) + ".",
            "theory": "Not the theory's: each row is a claim of another paper or report, scored under this protocol.",
            "rows": rows, "verdicts": verdicts, "theory_numbers": [], "headline": headline,
            "not_scored": [{"source": s, "claim": c, "why": w} for s, c, w in NOT_SCORED],
            "examination": examination(L), **part_states(verdicts, [])}


def _region_text(r: dict) -> str:
    lo, hi = r["region"]
    if lo is None:
        return f"below {hi:g}"
    if hi is None:
        return f"above {lo:g}"
    return f"{lo:g} to {hi:g}"


def examination(L) -> dict:
    """marin's disagreement with the delay axis, taken apart: Muon's gap at each tau under three lr
    rules (each mode's tuned-or-interpolated lr, lr tuned at every tau, lr held at tau 1's), and the
    shares closed by prediction along the update and along the raw momentum."""
    R = _Runs(L)
    if "muon" not in R.p.delays.optimizers:
        return {}
    field = R.field or {"held": {}, "retuned": {}, "raw_momentum": {}}
    out: dict = {"curve": [], "prediction": []}

    for s in R._uniform():
        entry = {"setting": s.name, "tau": s.delay, "lr": R.cell(s.name, "muon", "delayed")[0].cell.lr, "inputs": {}}
        cells = {"protocol": None}
        if s.name in field["retuned"]:
            cells["tuned"] = field["retuned"][s.name]["cell"]
            entry["tuned_lr"] = field["retuned"][s.name]["grid"]["best"]["delayed"]
        if s.name in field["held"]:
            cells["held"] = field["held"][s.name]
            entry["held_lr"] = field["held"][s.name][0].cell.lr
        for rule, runs in cells.items():
            terms = R.gap(s.name, "muon", runs=runs)
            entry[rule] = S.sample(_values(_combo(L, terms)))
            entry["inputs"][rule] = {"kind": "mean", "terms": _folders(terms)}
        out["curve"].append(entry)
        for mode in ("predict", "predict-momentum"):
            cell = field["raw_momentum"].get(s.name) if mode == "predict-momentum" else R.cells.get(
                (s.name, "muon", mode))
            if cell:
                rec = metrics.recovery(R.loss(s.name, "muon", "sync"), R.loss(s.name, "muon", "delayed"),
                                       _losses(L, cell))
                out["prediction"].append({"setting": s.name, "mode": mode, "lr": cell[0].cell.lr,
                                          **{k: rec[k] for k in ("ratio_of_means", "ci", "set", "n")},
                                          "inputs": {"kind": "share", "fix": [r.folder for r in cell], **{
                                              m: [r.folder for r in R.cell(s.name, "muon", m)]
                                              for m in ("sync", "delayed")}}})
    return out


def markdown_lines(part: dict) -> list[str]:
    """The part's tables (markdown renders its verdict lines after them)."""
    def cell(x):
        return "" if x is None else f"{x:g}"

    lines = ["| source | claim | measured (95%) | claimed region | verdict | reason / caveat |", "|---|---|---|---|---|---|"]
    for r in part["rows"]:
        region = f"[{cell(r['region'][0]) or '-inf'}, {cell(r['region'][1]) or '+inf'}] {r['unit']}"
        lines.append(f"| {r['source']} | {r['claim']} | {r['measured']} | {region} | {r['state']} | "
                     f"{r['reason'] + '. ' if r['reason'] else ''}{r['caveat']} |")
    lines += ["", "Not scored here: " + "; ".join(f"{x['source']}: {x['claim']} ({x['why']})"
                                                  for x in part["not_scored"]) + "."]
    ex = part.get("examination") or {}
    if ex.get("curve"):
        lines += ["", "Muon's gap against tau under three lr rules (95% t; lr in brackets):", "",
                  "| tau | the protocol's lr | lr tuned at this tau | lr held at tau 1's |", "|---|---|---|---|"]
        for e in ex["curve"]:
            def gap(key, lr):
                return "-" if key not in e else f"{S.fmt(e[key]['mean'])} {S.ci_text(e[key])} ({e[lr]:g})"
            lines.append(f"| {e['tau']} | {gap('protocol', 'lr')} | {gap('tuned', 'tuned_lr')} | "
                         f"{gap('held', 'held_lr')} |")
    if ex.get("prediction"):
        lines += ["", "Share of Muon's gap closed by prediction (95% Fieller):", "",
                  "| setting | along | lr | closes |", "|---|---|---|---|"]
        for e in ex["prediction"]:
            share = "n/a" if e["ratio_of_means"] is None else f"{e['ratio_of_means']:.0f}% {S.ci_text(e, '.0f')}"
            along = "the applied update" if e["mode"] == "predict" else "the raw momentum"
            lines.append(f"| {e['setting']} | {along} | {e['lr']:g} | {share} |")
    return lines
