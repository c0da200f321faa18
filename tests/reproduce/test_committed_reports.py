"""The committed reports (docs/reproduce/<preset>/) are recomputed from their own ``runs.jsonl`` by
tests/reproduce/recompute.py (plain Python, no delaylab), and the README and docs/reproduction.md
quote those recomputed numbers: a report regenerated without updating the docs, or a doc edited by
hand, fails here."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import anchors as A  # noqa: E402
import recompute as R  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
REPORTS = sorted(p.parent for p in (ROOT / "docs" / "reproduce").glob("*/report.json")
                 if (p.parent / "runs.jsonl").exists())
MOMENTUM = {"adamw": 0.9, "muon": 0.95}


def _close(a, b, tol=1e-9):
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def _same_interval(a, b):
    return (a is None and b is None) or (a is not None and b is not None and all(map(_close, a, b)))


def _share(value, ci) -> str:
    return f"{value:.0f}%" + (f" [{ci[0]:.0f}, {ci[1]:.0f}]" if ci else " (unbounded)")


def _ratio(value, ci, spec=".2g") -> str:
    return format(value, spec) + (f" [{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else " (unbounded)")


def _gap(m, ci) -> str:
    return f"{m:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]"


def _tokens_variant(size: str, point: str) -> str:
    """The run variant of a tokens-axis point named as the report names it (``20:1 constant lr``)."""
    ratio, kind = point.split(" ", 1)
    kind = "wide" if "batch" in kind else kind.split()[0]
    return f"tokens-{size}-{ratio.removesuffix(':1')}tpp-{kind}"


def recomputed(folder: Path) -> dict[str, str]:
    """Check every headline number of ``folder/report.json`` against ``runs.jsonl`` and return the
    strings the docs quote, keyed by what they are (a gap: ``+0.123 [+0.045, +0.201]``; a share:
    ``42% [30, 55]``)."""
    rep = json.loads((folder / "report.json").read_text())
    runs = R.load(folder / rep["runs_file"])
    parts = {p["key"]: p for p in rep["parts"]}
    quoted = {}
    if "optimizers" in parts:
        for row in parts["optimizers"]["rows"]:
            m, ci = R.gap_at_best_sync_lr(runs, row["optimizer"], row["momentum"])
            assert _close(m, row["gap"]["mean"]) and _same_interval(ci, row["gap"]["ci"]), row["optimizer"]
            quoted[f"{row['optimizer']} gap"] = _gap(m, ci)
            for mode, o in row["overhead"].items():
                got = R.overhead(runs, row["optimizer"], mode, row["momentum"])
                if o["ci"] is None:
                    assert got is None, (row["optimizer"], mode)
                    continue
                assert _close(got[0], o["mean"]) and _same_interval(got[1], o["ci"]), (row["optimizer"], mode)
                quoted[f"{row['optimizer']} {mode} overhead"] = f"{got[0]:.2f} [{got[1][0]:.2f}, {got[1][1]:.2f}]"
                per = R.overhead_per_seed(runs, row["optimizer"], mode, row["momentum"])
                assert [k for _, k in per] == o["lengths"], (row["optimizer"], mode)
                quoted[f"{row['optimizer']} {mode} overhead per seed"] = ", ".join(f"{v:.2f} in {k:g}x" for v, k in per)
    diff = (parts.get("optimizers") or {}).get("adamw_vs_muon")
    if diff:
        m, ci = R.difference_of_gaps(runs, "adamw", "muon", MOMENTUM)
        assert _close(m, diff["at_sync_lr"]["mean"]) and _same_interval(ci, diff["at_sync_lr"]["ci"])
        quoted["adamw - muon gap"] = _gap(m, ci)
        g = {o: R.gaps(runs, o, R.best_lr(runs, o, "sync", MOMENTUM[o]), MOMENTUM[o]) for o in ("adamw", "muon")}
        ratio, rci = R.paired_ratio(g["adamw"], g["muon"])
        assert _close(ratio, diff["ratio"]["ratio"]) and _same_interval(rci, diff["ratio"]["ci"])
        quoted["adamw / muon gap ratio"] = _ratio(ratio, rci)
        for pair in parts["optimizers"]["lr_robustness"]["adamw-muon"]["pairs"]:
            la, lb = pair["lrs"]
            m, ci = R.gap_difference_at(runs, "adamw", la, "muon", lb, MOMENTUM)
            assert _close(m, pair["mean"]) and _same_interval(ci, pair["ci"]), pair["lrs"]
            quoted[f"adamw - muon gap at {la:g}/{lb:g}"] = _gap(m, ci)
    if "mitigations" in parts:
        for row in parts["mitigations"]["rows"]:
            if "sync-start_recovered" in row:
                variant = row["runs"]["sync-start"][0].split("/")[1]
                value, ci = R.recovery_at_best(runs, row["optimizer"], row["momentum"], "sync-start", variant)
                rec = row["sync-start_recovered"]
                assert _close(value, rec["ratio_of_means"]) and _same_interval(ci, rec["ci"]), row["optimizer"]
                quoted[f"{row['optimizer']} sync-start"] = _share(value, ci)
            value, ci = R.ef_recovery(runs, row["optimizer"], row["momentum"])
            rec = row["ef_recovered"]
            assert _close(value, rec["ratio_of_means"]) and _same_interval(ci, rec["ci"]), row["optimizer"]
            quoted[f"{row['optimizer']} ef"] = _share(value, ci)
        for e in parts["mitigations"]["ef_by_lr"]:
            seeds = {int(f.rsplit("_s", 1)[1]) for f in e["runs"]["ef"]}
            value, ci = R.ef_recovery_at(runs, e["optimizer"], e["lr"], MOMENTUM[e["optimizer"]], seeds)
            rec = e["recovered"]
            assert _close(value, rec["ratio_of_means"]) and _same_interval(ci, rec["ci"]), (e["optimizer"], e["lr"])
            quoted[f"{e['optimizer']} ef at {e['lr']:g}"] = _share(value, ci)
        for t in parts["mitigations"]["ef_tuned"]:
            value, ci = R.ef_recovery(runs, t["optimizer"], MOMENTUM[t["optimizer"]], tuned=True)
            assert _close(value, t["recovered"]) and _same_interval(ci, t["ci"]), t["optimizer"]
            quoted[f"{t['optimizer']} ef tuned"] = _share(value, ci)
    if "momentum" in parts:
        for opt, change in parts["momentum"]["changes"].items():
            moms = [r["momentum"] for r in parts["momentum"]["rows"] if r["optimizer"] == opt]
            m, ci = R.momentum_change(runs, opt, moms[0], moms[-1])
            assert _close(m, change["mean"]) and _same_interval(ci, change["ci"]), opt
            quoted[f"{opt} momentum change"] = _gap(m, ci)
    if "learning_rate" in parts:
        for opt, optima in parts["learning_rate"]["optima"].items():
            got, shift = R.lr_shift(runs, opt, MOMENTUM[opt]), optima["delayed"]
            if shift["censored"]:
                assert got is None, opt
                quoted[f"{opt} lr shift"] = "censored"
                continue
            assert _close(got[0], shift["ratio"]) and _same_interval(got[1], shift["ci"]), opt
            quoted[f"{opt} lr shift"] = f"x{got[0]:.2g}" + (f" [{got[1][0]:.2g}, {got[1][1]:.2g}]" if got[1] else "")
    if "schedules" in parts:
        folders = {r["folder"]: r for r in runs if r.get("kind", "gpt") == "gpt"}
        for row in parts["schedules"]["rows"]:
            if "vs_2bw" not in row:
                continue
            # 2BW's runs are a folder of their own (cpu-small) or the main grid's delayed runs (cpu-quick)
            twobw = next(folders[r["runs"]["2bw"][0]] for r in parts["schedules"]["rows"]
                         if r["optimizer"] == row["optimizer"] and r["schedule"] == "2bw")
            depth = len(row["delays"])
            m, ci = R.schedule_difference(runs, row["optimizer"], row["lr"], MOMENTUM[row["optimizer"]], depth,
                                          variant=twobw["variant"], twobw_mode=twobw["mode"])
            assert _close(m, row["vs_2bw"]["mean"]) and _same_interval(ci, row["vs_2bw"]["ci"]), row["schedule"]
            quoted[f"{row['optimizer']} pipedream-{depth} - 2bw"] = _gap(m, ci)
    if "scale" in parts:
        for e in parts["scale"]["rows"]:
            for opt, st in e["optimizers"].items():
                m, ci = R.axis_gap(runs, opt, e["size"], e["tokens_per_param"], MOMENTUM[opt])
                assert _close(m, st["gap"]["mean"]) and _same_interval(ci, st["gap"]["ci"]), (opt, e["size"])
                quoted[f"{opt} {e['size']} {e['tokens_per_param']:g}"] = _gap(m, ci)
                if st.get("recovered"):
                    share, sci = R.axis_ef(runs, opt, e["size"], e["tokens_per_param"], MOMENTUM[opt])
                    assert _close(share, st["recovered"]["ratio_of_means"]), (opt, e["size"])
                    assert _same_interval(sci, st["recovered"]["ci"]), (opt, e["size"])
                    quoted[f"{opt} ef {e['size']} {e['tokens_per_param']:g}"] = _share(share, sci)
            if e.get("gap_ratio"):
                ratio, rci = R.axis_gap_ratio(runs, e["size"], e["tokens_per_param"], MOMENTUM)
                assert _close(ratio, e["gap_ratio"]["ratio"]) and _same_interval(rci, e["gap_ratio"]["ci"]), e["size"]
                quoted[f"adamw / muon gap ratio {e['size']} {e['tokens_per_param']:g}"] = _ratio(ratio, rci)
        for e in parts["scale"]["rows"]:  # the confounds the docs name: the scan's margin, the gap along a run
            for opt in e["optimizers"]:
                margin, sd = R.scan_margin(runs, opt, e["size"], e["tokens_per_param"], MOMENTUM[opt])
                quoted[f"{opt} {e['size']} {e['tokens_per_param']:g} scan"] = f"{margin:.3f} at one seed, against a seed SD of {sd:.3f}"
                for x, g in R.gap_along(runs, opt, e["size"], e["tokens_per_param"], MOMENTUM[opt]):
                    quoted[f"{opt} {e['size']} {e['tokens_per_param']:g} gap at {100 * x:.0f}%"] = \
                        f"{g:+.3f} at {100 * x:.0f}%"
        # a gap's change from the first to the last point: along tokens/param at one size, along size at one ratio
        changes = [(t, [(t["size"], r) for r in (t["ratios"][0], t["ratios"][-1])],
                    f"{t['size']} change {t['ratios'][0]:g} -> {t['ratios'][-1]:g}")
                   for t in parts["scale"]["trends"].values()]
        changes += [(t, [(z, t["ratio"]) for z in (t["sizes"][0], t["sizes"][-1])],
                     f"{t['ratio']:g} change {t['sizes'][0]} -> {t['sizes'][-1]}")
                    for t in parts["scale"]["sizes"].values()]
        for t, ends, name in changes:
            if t["quantity"].endswith("_gap") and t["change"]["ci"]:
                opt = t["quantity"][:-4]
                d, ci = R.axis_change(runs, opt, *ends, MOMENTUM[opt])
                assert _close(d, t["change"]["delta"]) and _same_interval(ci, t["change"]["ci"]), t["quantity"]
                quoted[f"{opt} {name}"] = _gap(d, ci)
    if "tokens" in parts:
        part = parts["tokens"]
        for e in part["rows"]:
            variant = f"tokens-{e['size']}-{e['tokens_per_param']:g}tpp-{e['kind']}"
            assert {m: R.tokens_best(runs, variant, m) for m in ("sync", "delayed")} == e["best"], variant
            reads = R.tokens_reads(runs, variant)
            for read, per in reads.items():
                m, ci = R.t_interval(list(per.values()))
                got = e["reads"][read]["gap"]
                assert _close(m, got["mean"]) and _same_interval(ci, got["ci"]), (variant, read)
                quoted[f"tokens {e['size']} {e['tokens_per_param']:g} {e['kind']} {read}"] = _gap(m, ci)
            m, ci = R.t_interval(list(R.tokens_closing(runs, variant).values()))
            assert _close(m, e["closing"]["mean"]) and _same_interval(ci, e["closing"]["ci"]), variant
            quoted[f"tokens {e['size']} {e['tokens_per_param']:g} {e['kind']} closing"] = _gap(m, ci)
            assert _close(R.mean(list(reads["end"].values())), e["gap"]["mean"])
        for sep in part["separations"]:  # paired by seed: both points' runs of a seed share its init
            a, b = (R.tokens_closing(runs, v) if sep["quantity"] == "closing" else R.tokens_reads(runs, v)["end"]
                    for v in (_tokens_variant(sep["size"], sep["from"]), _tokens_variant(sep["size"], sep["to"])))
            d, ci = R.paired_change(a, b)
            assert _close(d, sep["delta"]) and _same_interval(ci, sep["ci"]), (sep["size"], sep["name"])
            quoted[f"tokens {sep['size']} {sep['name']}"] = _gap(d, ci)
    if "toy" in parts:
        held, n = R.toy_holds(runs)
        assert parts["toy"]["headline"].startswith(f"{held}/{n} settings")
        quoted["toy"] = f"{held}/{n}"
    if "delays" in parts:
        # an interpolated lr by the row's own lr (the field part shares those folders, other lrs beside it)
        given = {(r["setting"], r["optimizer"], r["mode"]): None if r["tuned"] else r["lr"]
                 for r in parts["delays"]["rows"]}
        for row in parts["delays"]["rows"]:
            sync_variant = row["runs"]["sync"][0].split("/")[1]  # llm/<variant>/cells/<run>
            here = (row["setting"], row["optimizer"])
            per, (m, ci) = R.delay_gap(runs, row["optimizer"], row["setting"], row["mode"], row["momentum"],
                                       sync_variant, given[(*here, row["mode"])])
            assert _close(m, row["gap"]["mean"], 1e-12) and _same_interval(ci, row["gap"]["ci"])
            quoted[f"{row['optimizer']} {row['setting']} {row['mode']} gap"] = _gap(m, ci)
            if row["setting"] == "uniform-0-4" and row["mode"] == "delayed":
                # the random delay against tau = 2 (its mean), as a share of tau = 2's gap
                fixed, _ = R.delay_gap(runs, row["optimizer"], "tau-2", "delayed", row["momentum"], sync_variant)
                d = [per[s] - fixed[s] for s in per if s in fixed]
                m, ci = R.t_interval(d)
                quoted[f"{row['optimizer']} uniform-0-4 - tau-2"] = _gap(m, ci)
                # as a share of tau = 2's gap: Fieller's interval of the ratio of the paired means
                seeds = sorted(set(per) & set(fixed))
                r, rci = R.fieller([per[s] - fixed[s] for s in seeds], [fixed[s] for s in seeds])
                quoted[f"{row['optimizer']} uniform-0-4 - tau-2 share"] = (
                    f"{100 * r:+.0f}% [{100 * rci[0]:+.0f}%, {100 * rci[1]:+.0f}%] (95% Fieller)")
            if "recovered" in row:
                rec, rci = R.delay_recovery(runs, row["optimizer"], row["setting"], row["mode"], row["momentum"],
                                            sync_variant, (given[(*here, "delayed")], given[(*here, row["mode"])]))
                assert _close(rec, row["recovered"]["ratio_of_means"]) and _same_interval(rci, row["recovered"]["ci"])
                quoted[f"{row['optimizer']} {row['setting']} {row['mode']} recovers"] = _share(rec, rci)
    if "field" in parts:  # the field's claims (docs/field.md): each row from the run folders it names
        for row in parts["field"]["rows"]:
            value, ci = R.field_claim(runs, row)
            if row["value"] is None:
                assert value is None, row["claim"]
                continue
            assert _close(value, row["value"]) and _same_interval(ci, row["interval"]), row["claim"]
            quoted[f"field: {row['claim']}"] = (_share(value, ci).replace(" (unbounded)", " unbounded") if row["unit"] == "%" else _ratio(value, ci, ".2f")
                                                if row["unit"] == "x" and row["inputs"]["kind"] == "ratio" else
                                                _gap(value, ci) if ci else f"{value:+.3f} (no interval)")
            quoted[f"field state: {row['claim']}"] = row["state"]
        ex = parts["field"].get("examination") or {}
        for e in ex.get("curve", []):  # Muon's gap at each tau under each lr rule
            for rule, inputs in e["inputs"].items():
                m, ci = R.field_claim(runs, {"inputs": inputs})
                assert _close(m, e[rule]["mean"]) and _same_interval(ci, e[rule]["ci"]), (e["setting"], rule)
                quoted[f"field curve {rule} tau {e['tau']}"] = _gap(m, ci)
        for e in ex.get("prediction", []):
            v, ci = R.field_claim(runs, {"inputs": e["inputs"]})
            assert _close(v, e["ratio_of_means"]) and _same_interval(ci, e["ci"]), (e["setting"], e["mode"])
            quoted[f"field {e['mode']} {e['setting']}"] = _share(v, ci)
    return quoted


@pytest.mark.skipif(not REPORTS, reason="no committed report with runs.jsonl")
@pytest.mark.parametrize("folder", REPORTS, ids=[p.name for p in REPORTS])
def test_a_committed_report_is_its_runs_jsonl(folder):
    quoted = recomputed(folder)
    assert quoted
    # the docs quote the recomputed numbers, each at its place: the report's folder lists, per doc, every
    # quoted key with the anchors it stands at (a table cell, a paragraph, a claim: tests/reproduce/anchors.py)
    wanted = folder / "quoted.json"
    if wanted.exists():
        for doc, keys in json.loads(wanted.read_text()).items():
            text = (ROOT / doc).read_text()
            for key, places in keys.items():
                assert places, f"{doc}: {key} names no place"
                for anchor in places:
                    assert A.quotes(A.region(text, anchor), quoted[key]), \
                        f"{doc} does not quote {key} = {quoted[key]} at {anchor}"


def _rule(interval, region) -> str:
    """The verdict rule written out again: inside the claimed region agrees, outside disagrees."""
    lo, hi = interval
    r_lo, r_hi = (-math.inf if region[0] is None else region[0]), (math.inf if region[1] is None else region[1])
    if hi < r_lo or lo > r_hi:
        return "disagrees"
    return "agrees" if r_lo < lo and hi < r_hi else "undetermined"


def _scores(rep: dict):
    for part in rep["parts"]:
        for v in part["verdicts"]:
            if v.get("score"):
                yield part["id"], v["score"]
        for n in part.get("theory_numbers", []):
            if n.get("score"):
                yield part["id"], n["score"]


@pytest.mark.parametrize("folder", REPORTS, ids=[p.name for p in REPORTS])
def test_every_stored_verdict_follows_the_one_rule(folder):
    """No "agrees" whose interval crosses its region's edge; every state is the rule's on the stored
    interval and region (a bare point with no tolerance cannot agree)."""
    rep = json.loads((folder / "report.json").read_text())
    if not list(_scores(rep)):
        pytest.skip("this report scores nothing (the tokens axis: notes only)")
    n = 0
    for part, sc in _scores(rep):
        blocked = sc["censored"] or sc["issues"] or sc.get("lr_dependent") or sc["interval"] is None
        if blocked or sc["predicted"] is None:
            assert sc["state"] == "undetermined", (part, sc["claim"])
            continue
        p, tol = sc["predicted"], sc.get("tolerance") or 0.0
        region = tuple(p) if isinstance(p, list) else (p - tol, p + tol)
        assert sc["state"] == _rule(sc["interval"], region), (part, sc["claim"], sc["interval"], region)
        n += 1
    assert n > 0


@pytest.mark.parametrize("name", ["cpu-small", "cpu-quick"])
def test_the_order_claim_is_held_to_every_indistinguishable_lr(name):
    """Finding 1's AdamW-Muon order at every pair of lrs the sync data cannot tell from each optimum,
    recomputed from runs.jsonl over every seed the pair shares (the best cells have the power rule's
    extra seeds); the verdict is undetermined unless every pair's state is the same."""
    folder = ROOT / "docs" / "reproduce" / name
    rep = json.loads((folder / "report.json").read_text())
    runs = R.load(folder / rep["runs_file"])
    part = next(p for p in rep["parts"] if p["key"] == "optimizers")
    near = {o: R.indistinguishable(runs, o, MOMENTUM[o]) for o in ("adamw", "muon")}
    for row in part["rows"]:
        if row["optimizer"] in near:
            assert row["indistinguishable_lrs"] == near[row["optimizer"]], row["optimizer"]
    stored = part["lr_robustness"]["adamw-muon"]["pairs"]
    assert [p["lrs"] for p in stored] == [[a, b] for a in near["adamw"] for b in near["muon"]]
    states = set()
    for p in stored:
        m, ci = R.gap_difference_at(runs, "adamw", p["lrs"][0], "muon", p["lrs"][1], MOMENTUM)
        assert _close(m, p["mean"]) and _same_interval(ci, p["ci"]), p["lrs"]
        a, b = (R.gaps(runs, o, lr, MOMENTUM[o]) for o, lr in zip(("adamw", "muon"), p["lrs"]))
        assert p["n"] == len(set(a) & set(b)) and p["seeds"] == sorted(set(a) & set(b)), p["lrs"]
        states.add(_rule(ci, (0, None)))
    v = next(v for v in part["verdicts"] if v["claim"] == "adamw degrades more than muon")
    assert v["score"]["lr_dependent"] == (len(states) > 1)
    if len(states) > 1:
        assert v["state"] == "undetermined"
