"""The claims registry: every reading of measured data that README.md and docs/ state.

A reading is a sentence that says what the data show: an order ("AdamW's gap is larger than
Muon's"), a trend ("the gap grows with tau"), a factor ("more updates at the same tokens shrink
the gap"). Each is a :class:`Claim`: its statement (said as an assertion), the report whose data
it reads, its 95% interval, its claimed region, the rule, and its verdict under the report's one
rule (:func:`delaylab.reproduce.verdicts.state`: agrees only inside the region, disagrees outside,
undetermined otherwise, and undetermined where an optimum it rests on is censored or its state
differs across the lrs the data cannot tell from the optimum). Its ``text`` is the sentence the
docs print, rendered from the verdict: an undetermined or disagreeing claim says so in words.

Pages hold each rendering between markers, ``<!-- claim:ID -->...<!-- /claim -->``, and whole
tables between ``<!-- table:ID -->...<!-- /table -->``; :func:`render_page` writes them,
``delaylab reproduce claims --render`` rewrites every page, and tests/reproduce/test_claims.py
fails where a committed page differs from its rendering or states a reading outside a marker.

Claims read the committed reports (``docs/reproduce/<preset>/report.json``, itself the report's
Ledger built and tested against its ``runs.jsonl``) and the other committed results they name.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from delaylab import stats
from delaylab.errors import ConfigError
from delaylab.reproduce import stats as S
from delaylab.reproduce import verdicts as V
from delaylab.reproduce.findings import trend_score

WORD = {V.AGREES: "agrees", V.DISAGREES: "disagrees", V.UNDETERMINED: "undetermined"}


@dataclass
class Claim:
    id: str
    report: str  # the committed data it reads, relative to the repository root
    statement: str  # the reading, said as an assertion
    interval: list | None  # the 95% interval scored (None: no bounded interval)
    region: list  # [lo, hi], None for an open side
    verdict: str  # agrees / disagrees / undetermined
    measured: float | None
    rule: str  # how the interval was formed and held
    why: str  # why an undetermined claim is undetermined ("" otherwise)
    text: str  # the sentence the docs print

    def json(self) -> dict:
        return asdict(self)


def _fmt(x, spec) -> str:
    return "n/a" if x is None else format(x, spec)


def _interval_text(ci, spec) -> str:
    return "(no bounded interval)" if ci is None else f"[{format(ci[0], spec)}, {format(ci[1], spec)}]"


def make(id: str, report: str, statement: str, measured, interval, region, *, spec: str = "+.3f",
         n: int | None = None, unit: str = "", rule: str = "95% t interval over seeds", censored: bool = False,
         lr_dependent: bool = False, issues=(), detail: str = "", says: dict | None = None) -> Claim:
    """A claim scored by the one rule, and its sentence. ``says``: per verdict a template with
    ``{ev}`` (the evidence: value, interval, seeds and ``detail``) and ``{why}``; by default the
    statement, then the verdict in words wherever it is not "agrees"."""
    sc = V.score(statement, interval, tuple(region), measured=measured, censored=censored, issues=issues,
                 lr_dependent=lr_dependent)
    verdict, why = sc["state"], V.why(sc)
    if why == "depends on the lr choice: see the lr line":
        why = "it depends on the lr choice"
    ev = f"{_fmt(measured, spec)}{unit} {_interval_text(interval, spec.lstrip('+') if unit == '%' else spec)}"
    ev += (f" over {n} seeds" if n else "") + (f"; {detail}" if detail else "")
    default = {V.AGREES: "{statement}: {ev}", V.UNDETERMINED: "{statement}: undetermined, {why} ({ev})",
               V.DISAGREES: "{statement}: the data disagree ({ev})"}
    text = {**default, **(says or {})}[verdict].format(statement=statement, ev=ev, why=why)
    return Claim(id, report, statement, None if interval is None else list(interval), list(region), verdict,
                 measured, rule, why, text)


def _sample_claim(id, report, statement, s: dict, region, **kw) -> Claim:
    return make(id, report, statement, s.get("mean", s.get("delta")), s.get("ci"), region, n=s.get("n"), **kw)


def _share_claim(id, report, statement, rec: dict, region, **kw) -> Claim:
    return make(id, report, statement, rec.get("ratio_of_means"), rec.get("ci"), region, spec=".0f", unit="%",
                n=rec.get("n"), rule="95% Fieller interval of the ratio of mean gaps, paired by seed", **kw)


# -- the reports' own scored verdicts -------------------------------------------------------------


def slug(text: str) -> str:
    """A claim's id from its words: ``adamw, depth 4: 2BW (tau = 1) beats ...`` -> ``adamw-depth-4-2bw-tau-1-beats-...``."""
    return re.sub(r"[^a-z0-9+]+", "-", text.lower()).strip("-")


def report_verdicts(name: str, rep: dict) -> list[Claim]:
    """Every scored verdict and scored theory number of a report, as stored (the report's parts score
    them by the same rule)."""
    out = []
    for part in rep["parts"]:
        scored = [(v["claim"], v["score"], v["line"]) for v in part.get("verdicts", [])
                  if isinstance(v, dict) and v.get("score")]
        scored += [(f"theory: {n['quantity']}", n["score"], f"theory: {n['quantity']}: " + _fmt(n["measured"], ".3g")
                    + f" {_interval_text(n['ci'], '.3g')} against {n['source']} -> {n['score']['state']}"
                    + (f" ({V.why(n['score'])})" if V.why(n["score"]) else ""))
                   for n in part.get("theory_numbers", []) if n.get("score")]
        for claim, sc, line in scored:
            lo, hi = V.region(sc["predicted"], sc.get("tolerance"))
            region = [None if math.isinf(lo) else lo, None if math.isinf(hi) else hi]
            out.append(Claim(f"{name}.{part['key']}.{slug(claim)}", f"docs/reproduce/{name}", claim, sc["interval"],
                             region, sc["state"], sc.get("measured"), "the report's scored verdict", V.why(sc), line))
    return out


# -- the readings, report by report ---------------------------------------------------------------


def _part(rep: dict, key: str) -> dict:
    return next(p for p in rep["parts"] if p["key"] == key)


def _order(name: str, rep: dict, model: str) -> list[Claim]:
    """Finding 1's order, AdamW's gap above Muon's, held to every lr pair the sync data cannot tell
    from the optima (each pair over the seeds it shares)."""
    part = _part(rep, "optimizers")
    d, rob = part["adamw_vs_muon"]["at_sync_lr"], part["lr_robustness"]["adamw-muon"]
    by = {r["optimizer"]: r for r in part["rows"]}
    pairs = "; ".join(f"{x['lrs'][0]:g}/{x['lrs'][1]:g} {S.fmt(x['mean'])} {S.ci_text(x)} over {x['n']} seeds"
                      + ("" if rob["holds"] else f" ({x['state']})") for x in rob["pairs"])
    return [_sample_claim(
        f"{name}.order", f"docs/reproduce/{name}", f"on the {model} GPT AdamW's delay gap is larger than Muon's", d,
        (0, None), censored=bool(by["adamw"]["censored"] or by["muon"]["censored"]), lr_dependent=not rob["holds"],
        rule="paired t over the seeds both best cells share; held to every lr pair the sync data cannot tell "
             "from the optima, each over the seeds that pair shares",
        detail=f"at the best sync lrs; AdamW - Muon at every lr pair the sync data cannot tell from the optima: "
               f"{pairs}",
        says={V.AGREES: "{statement}, at the best sync lrs and at every lr pair the sync data cannot tell from "
                        "them ({ev})",
              V.UNDETERMINED: "whether {statement} is undetermined: {why} ({ev})"})]


def cpu_small(name: str, rep: dict) -> list[Claim]:
    return _order(name, rep, "0.14M")


def cpu_quick(name: str, rep: dict) -> list[Claim]:
    return _order(name, rep, "0.86M")


def cpu_tokens(name: str, rep: dict) -> list[Claim]:
    part = _part(rep, "scale")
    out = []
    for key, t in part["trends"].items():
        opt = t["quantity"].removesuffix("_gap")
        if not t["quantity"].endswith("_gap") or not t["change"]["ci"]:
            continue
        a, b = t["ratios"][0], t["ratios"][-1]
        out.append(_sample_claim(
            f"{name}.{t['size']}.{opt}-gap-shrinks", f"docs/reproduce/{name}",
            f"on the {t['size']} GPT {opt}'s gap shrinks from {a:g} to {b:g} tokens per parameter", t["change"],
            (None, 0), rule="paired t over the seeds both points share (one model, the same seeds)",
            detail="fixed batch: more tokens is more updates, a longer decay and another lr"))
    for key, t in part["sizes"].items():
        opt = t["quantity"].removesuffix("_gap")
        if not t["quantity"].endswith("_gap") or not t["change"]["ci"]:
            continue
        out.append(_sample_claim(
            f"{name}.{t['ratio']:g}.{opt}-gap-grows-with-size", f"docs/reproduce/{name}",
            f"at {t['ratio']:g} tokens per parameter {opt}'s gap grows from {t['sizes'][0]} to {t['sizes'][-1]}",
            t["change"], (0, None), rule="Welch's t (two models: independent runs)"))
    return out


def cpu_tokens_2(name: str, rep: dict) -> list[Claim]:
    """The tokens axis's separations, each scored in its direction and held to every near-optimal lr pair."""
    part = _part(rep, "tokens")
    params = {r["size"]: r["params"] for r in part["rows"]}
    out = []
    for sep in part["separations"]:
        lr = ", ".join(f"{v} of {sum(sep['lr_states'].values())} near-optimal lr pairs {k}"
                       for k, v in sep["lr_states"].items())
        out.append(make(
            f"{name}.{sep['size']}.{sep['name'].replace(': ', '-').replace(' ', '-')}", f"docs/reproduce/{name}",
            f"on the {params[sep['size']] / 1e6:.3f}M GPT, {sep['what']}: the "
            + ("gap's closing" if sep["quantity"] == "closing" else "gap") + f" {sep['claim']}", sep["delta"],
            sep["ci"], sep["region"],
            n=sep["n"], lr_dependent=len(sep["lr_states"]) > 1,
            rule="paired t over the seeds both points share, held to every pair of lrs the data cannot tell from "
                 "each point's optima", detail=f"{sep['from']} -> {sep['to']} at the tuned lrs; {lr}",
            says={V.UNDETERMINED: "{statement}: undetermined, {why} ({ev})"}))
    return out


def _per_seed(row: dict, key: str = "gap") -> dict[int, float | None]:
    """``{seed: value}`` of a delay-axis row's per-seed gap (values in seed order over the seeds its
    sync and mode runs share)."""
    mode = next(m for m in row["runs"] if m != "sync")
    seeds = sorted(set(S.seeds_of(row["runs"]["sync"])) & set(S.seeds_of(row["runs"][mode])))
    return dict(zip(seeds, row[key]["values"]))


def _paired(a: dict, b: dict) -> dict:
    """``b - a`` per seed over the seeds both have: the sample with its t interval."""
    return S.sample(stats.paired(a, b)[1])


def cpu_delays(name: str, rep: dict) -> list[Claim]:
    part = _part(rep, "delays")
    by = {(r["setting"], r["optimizer"], r["mode"]): r for r in part["rows"]}
    report = f"docs/reproduce/{name}"
    opts = sorted({r["optimizer"] for r in part["rows"]})
    uniform = sorted({r["mean_delay"] for r in part["rows"] if r["setting"].startswith("tau-")})
    taus = [int(t) for t in uniform]
    lo, hi = f"tau-{taus[0]}", f"tau-{taus[-1]}"

    def cens(*rows) -> bool:  # an lr a row ran at rests on an optimum at its grid's edge (interpolated: its sources')
        return any(r["rests_on_censored"] for r in rows)

    out = []
    for opt in opts:  # the gap grows from the shortest to the longest delay
        a, b = by[(lo, opt, "delayed")], by[(hi, opt, "delayed")]
        out.append(_sample_claim(f"{name}.{opt}.gap-grows", report,
                                 f"{opt}'s gap grows from tau {taus[0]} to tau {taus[-1]}",
                                 _paired(_per_seed(a), _per_seed(b)), (0, None), censored=cens(a, b),
                                 rule="paired t over the seeds both settings share"))
    for t in taus:  # AdamW's gap above Muon's at each tau (a seed's runs share init and batches)
        a, m = by[(f"tau-{t}", "adamw", "delayed")], by[(f"tau-{t}", "muon", "delayed")]
        out.append(_sample_claim(f"{name}.order.tau-{t}", report,
                                 f"at tau {t} AdamW's gap is larger than Muon's",
                                 _paired(_per_seed(m), _per_seed(a)), (0, None), censored=cens(a, m),
                                 rule="paired t over the seeds both optimizers share"))
    ratio = next(n for n in part["theory_numbers"] if n["quantity"] == f"muon: gap at {hi} / gap at {lo}")
    out.append(make(f"{name}.muon.sublinear", report,
                    f"Muon's gap grows slower than linearly in tau (its gap at tau {taus[-1]} over tau {taus[0]}'s "
                    f"is below {taus[-1] / taus[0]:g})", ratio["measured"], ratio["ci"], (None, taus[-1] / taus[0]),
                    spec=".3g", rule="95% Fieller interval of the ratio of mean gaps, paired by seed",
                    censored=cens(by[(lo, "muon", "delayed")], by[(hi, "muon", "delayed")]),
                    detail="each mode's lr tuned at both taus"))
    rand = sorted({r["setting"] for r in part["rows"] if r["delay_dist"]})
    for setting in rand:
        for opt in opts:
            r = by[(setting, opt, "delayed")]
            twin = by[(f"tau-{r['mean_delay']:g}", opt, "delayed")]
            d = _paired(_per_seed(twin), _per_seed(r))
            seeds = sorted(set(_per_seed(r)) & set(_per_seed(twin)))
            share = stats.fieller([_per_seed(r)[k] - _per_seed(twin)[k] for k in seeds],
                                  [_per_seed(twin)[k] for k in seeds])
            share_text = (f"as a share of tau {r['mean_delay']:g}'s gap {100 * share['ratio']:+.0f}% "
                          + (f"[{100 * share['ci'][0]:+.0f}%, {100 * share['ci'][1]:+.0f}%]" if share["ci"]
                             else stats.fmt_set(stats.map_set(share["set"], 100.0), "+.0f")) + " (95% Fieller)")
            out.append(_sample_claim(
                f"{name}.{opt}.{setting}-vs-mean", report,
                f"a random delay ({r['delay_dist']}) costs {opt} more than the constant delay of its mean "
                f"(tau {r['mean_delay']:g})", d, (0, None), censored=cens(r, twin),
                rule="paired t over the seeds both settings share; the share: Fieller", detail=share_text,
                says={V.UNDETERMINED: "whether {statement} is undetermined: the difference is not resolved from 0, "
                                      "a non-rejection, not an equality ({ev})"}))
    for opt in opts:  # how the single correctors' shares move with tau
        for mode in ("ef", "predict"):
            pts = [{"tau": t, "gap": by[(f"tau-{t}", opt, mode)]["recovered"]["ratio_of_means"],
                    "gap_ci": by[(f"tau-{t}", opt, mode)]["recovered"]["ci"], "sync": 1.0} for t in taus]
            label = {"ef": "EF", "predict": "weight prediction"}[mode]
            statement = f"{label} recovers a smaller share of {opt}'s gap as tau grows"
            rows = [by[(f"tau-{t}", opt, m)] for t in taus for m in ("delayed", mode)]
            if any(p["gap_ci"] is None for p in pts):
                out.append(make(f"{name}.{opt}.{mode}-share-falls", report, statement, None, None, (None, 0),
                                rule="every step of the tau sweep", detail="a share at some tau has no bounded "
                                "interval: " + ", ".join(f"tau {p['tau']} {_fmt(p['gap'], '.0f')}%" for p in pts)))
                continue
            sc, step = trend_score(statement, pts, "tau", relative=False, increasing=False)
            out.append(make(f"{name}.{opt}.{mode}-share-falls", report, statement, sc["measured"], sc["interval"],
                            (None, 0), spec="+.0f", unit=" points", censored=cens(*rows),
                            rule="every step of the tau sweep, each step's interval [lo' - hi, hi' - lo] from the two "
                                 "Fieller intervals (conservative); the step that decides is shown",
                            detail="shares " + ", ".join(f"tau {p['tau']} {p['gap']:.0f}% [{p['gap_ci'][0]:.0f}, "
                                                         f"{p['gap_ci'][1]:.0f}]" for p in pts)
                            + f"; deciding step {step}"))
    for opt in opts:  # EF + prediction: a share of the gap at the shortest delay, a loss at the longer ones
        for t in taus:
            r = by[(f"tau-{t}", opt, "ef+predict")]
            helps = t == taus[0]
            out.append(_share_claim(
                f"{name}.{opt}.ef+predict.tau-{t}", report,
                f"EF + prediction {'recovers part of' if helps else 'adds to'} {opt}'s gap at tau {t}",
                r["recovered"], (0, None) if helps else (None, 0),
                censored=cens(r, by[(f"tau-{t}", opt, "delayed")]),
                detail=f"lr {r['lr']:g}" + (" (censored at the grid's edge)" if r["censored"] else "")))
    return out


MOE_MODELS = {"dense_h256": "dense-active", "moe_e4k1_h256": "MoE", "dense_h1024": "dense-total"}


def moe_cpu(root: Path) -> list[Claim]:
    """Dense vs MoE under a one-step delay (docs/beyond.md): each model's gap at its tuned lr (the lr
    its delayed runs used), and the MoE's gap against each dense model's (two models: Welch's t)."""
    report = "docs/beyond/moe-cpu"
    lines = [json.loads(x) for x in (root / report / "runs.jsonl").read_text().splitlines() if x.strip()]
    gaps = {}
    for model in MOE_MODELS:
        for opt in ("adamw", "muon"):
            mine = [x for x in lines if x["model"] == model and x["optimizer"] == opt]
            lr = next(x["lr"] for x in mine if x["mode"] == "delayed")
            by = {m: {x["seed"]: x["val_loss"] for x in mine if x["mode"] == m and x["lr"] == lr
                      and x["correction"] == ("ef" if m == "ef" else "none")} for m in ("sync", "delayed")}
            gaps[(model, opt)] = list(_paired(by["sync"], by["delayed"])["values"])
    out = []
    for opt in ("adamw", "muon"):
        for dense, region in (("dense_h256", (0, None)), ("dense_h1024", (0, None) if opt == "muon" else (None, 0))):
            a, b = gaps[(dense, opt)], gaps[("moe_e4k1_h256", opt)]
            word = "larger" if region == (0, None) else "smaller"
            out.append(make(f"moe-cpu.{opt}.moe-vs-{MOE_MODELS[dense]}", report,
                            f"under {'AdamW' if opt == 'adamw' else 'Muon'} the MoE's delay gap is {word} than the "
                            f"{MOE_MODELS[dense]} dense model's", stats.sample(b)["mean"] - stats.sample(a)["mean"],
                            stats.welch_interval(a, b), region, rule="Welch's t (two models share batches, not init)",
                            detail=f"MoE {stats.sample(b)['mean']:+.3f} against {stats.sample(a)['mean']:+.3f}, "
                                   f"{len(b)} and {len(a)} seeds"))
    return out


def cpu_field(name: str, rep: dict) -> list[Claim]:
    """The field's claims are the report's own scored verdicts (part 11, delaylab/reproduce/field.py)."""
    return []


SOURCES = {"cpu-small": cpu_small, "cpu-quick": cpu_quick, "cpu-tokens": cpu_tokens, "cpu-tokens-2": cpu_tokens_2,
           "cpu-delays": cpu_delays, "cpu-field": cpu_field}


def repository_root() -> Path:
    """The checkout whose docs hold the committed reports: the current directory or the package's parent."""
    for d in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (d / "docs" / "reproduce").is_dir():
            return d
    raise ConfigError("no committed reports found: run from a delaylab checkout (docs/reproduce/ is missing)")


def claims(root: Path | None = None) -> list[Claim]:
    """Every registered claim: each committed report's scored verdicts and the readings of its data."""
    root = root or repository_root()
    out = []
    for name, source in SOURCES.items():
        rep = json.loads((root / "docs" / "reproduce" / name / "report.json").read_text())
        out += report_verdicts(name, rep) + source(name, rep)
    out += moe_cpu(root)
    from delaylab.predict.report import claims as predict_claims  # docs/predict.md: the gap predictors' score

    out += predict_claims(root)
    ids = [c.id for c in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise RuntimeError(f"claim ids registered twice: {', '.join(dup)}")
    return out


# -- pages ----------------------------------------------------------------------------------------

MARKER = re.compile(r"<!-- (claim|table):(\S+) -->(.*?)<!-- /\1 -->", re.S)


def render_page(text: str, by_id: dict[str, Claim], tables: dict | None = None) -> str:
    """``text`` with every marker's content replaced by its claim's sentence (or its table); an id
    no claim has is an error."""
    tables = tables or {}

    def sub(m):
        kind, key = m.group(1), m.group(2)
        if kind == "claim":
            if key not in by_id:
                raise ConfigError(f"no claim {key!r} is registered")
            body = by_id[key].text
        else:
            if key not in tables:
                raise ConfigError(f"no table {key!r} is registered")
            body = "\n" + tables[key] + "\n"
        return f"<!-- {kind}:{key} -->{body}<!-- /{kind} -->"

    return MARKER.sub(sub, text)


def pages(root: Path) -> list[Path]:
    """The pages that may read data: README.md and docs/**/*.md, but not the reports' own report.md
    (generated from report.json as a whole)."""
    docs = sorted(p for p in (root / "docs").rglob("*.md") if "reproduce" not in p.relative_to(root / "docs").parts[:1])
    return [root / "README.md", *docs]


def region_text(region: list) -> str:
    """``> 0``, ``< 8``, ``50 to 90``, ``= 23.2`` (a point: no tolerance stated before the runs)."""
    lo, hi = region
    if lo is not None and hi is not None:
        return f"= {lo:.3g}" if lo == hi else f"{lo:.3g} to {hi:.3g}"
    return f"> {lo:.3g}" if lo is not None else f"< {hi:.3g}" if hi is not None else "any"


def claims_table(found: list[Claim]) -> str:
    """One row per claim: the statement, the value and its 95% interval, the region, the verdict and why."""
    rows = ["| claim | measured, 95% interval | claimed | verdict |", "|---|---|---|---|"]
    for c in found:
        spec = ".3g"
        value = "n/a" if c.measured is None else format(c.measured, spec)
        verdict = c.verdict + (f" ({c.why})" if c.why else "")
        rows.append(f"| {c.statement} | {value} {_interval_text(c.interval, spec)} | {region_text(c.region)} | "
                    f"{verdict} |")
    return "\n".join(rows)


def tables(root: Path, found: list[Claim]) -> dict[str, str]:
    """The rendered tables pages hold (``<!-- table:ID -->``): per report, its findings with their
    verdicts (``NAME.findings``) and every claim it backs (``NAME.claims``)."""
    out = {}
    for name in SOURCES:
        rep = json.loads((root / "docs" / "reproduce" / name / "report.json").read_text())
        rows = ["| # | finding | measured here | reproduced | theory |", "|---|---|---|---|---|"]
        rows += [f"| {r['id']} | {r['finding']} | {r['measured']} | {r['reproduced']} ({r['reproduced_counts']}) | "
                 f"{r['theory_agrees']} |" for r in rep["summary"]]
        out[f"{name}.findings"] = "\n".join(rows)
        out[f"{name}.claims"] = claims_table([c for c in found if c.report == f"docs/reproduce/{name}"])
    out["findings"] = findings_table(root)
    field = json.loads((root / "docs" / "reproduce" / "cpu-field" / "report.json").read_text())
    rows = ["| source | claim | verdict | measured (95%) | claimed region | caveat (one line) |", "|---|---|---|---|---|---|"]
    short = {"rotation": "basis rotation", "marin": "marin", "ringmaster": "Ringmaster LMO",
             "nesterov": "Nesterov async PP", "seed": "seed paper"}
    rows += [f"| {short.get(r['source'], r['source'])} | {r['claim']} | {r['state']} | {r['measured']} | "
             f"{region_text(r['region'])} | {r['reason']} |" for r in _part(field, "field")["rows"]]
    out["cpu-field.field"] = "\n".join(rows)
    return out


def findings_table(root: Path) -> str:
    """The paper's six findings, one row each, with the verdict of every report that scores it."""
    reps = {n: json.loads((root / "docs" / "reproduce" / n / "report.json").read_text()) for n in ("cpu-small", "cpu-quick")}
    small = {r["id"]: r for r in reps["cpu-small"]["summary"]}
    quick = {r["id"]: r for r in reps["cpu-quick"]["summary"]}
    rows = ["| # | the paper's finding | reproduced: cpu-small (0.14M GPT) | cpu-quick (0.86M GPT) |", "|---|---|---|---|"]
    for i, r in sorted(small.items()):
        if i > 6:
            continue
        q = quick.get(i)
        cell = "-" if q is None or q["reproduced"] == "n.a." else f"{q['reproduced']} ({q['reproduced_counts']})"
        rows.append(f"| {i} | {r['finding']} | {r['reproduced']} ({r['reproduced_counts']}) | {cell} |")
    return "\n".join(rows)


def render_pages(root: Path, found: list[Claim], write: bool = False) -> list[str]:
    """The pages (relative paths) whose rendered readings differ from the registry's; rewritten when ``write``."""
    by_id, tabs = {c.id: c for c in found}, tables(root, found)
    changed = []
    for page in pages(root):
        text = page.read_text()
        new = render_page(text, by_id, tabs)
        if new != text:
            changed.append(str(page.relative_to(root)))
            if write:
                page.write_text(new)
    return changed
