"""The delay gap of dense vs mixture-of-experts GPTs (issue 28, point 4): the report part.

Reads the ``delaylab llm sweep`` folders of docs/beyond.md's commands (one per model, each with
an lr scan on seed 0 and the tuned cells on 4 seeds), and writes

* a Markdown table per model and optimizer: sync / delayed / delayed + EF final validation loss
  (mean over seeds), the gap delayed - sync paired by seed with its 95% t interval, EF's
  recovery ``mean(delayed - EF) / mean(delayed - sync)`` with its 95% Fieller interval (ratio of
  two paired means), and the differences of gaps between models (Welch t interval);
* the router's load imbalance over training (``moe_imbalance`` in metrics.jsonl, mean over the
  layers), sync vs delayed vs EF, and its late-training mean paired by seed;
* a figure, and ``runs.jsonl`` (one JSON object per run, the fields of delaylab.reproduce's
  runs.jsonl where they apply: kind, optimizer, mode, sweep_mode, correction, delay, lr, momentum,
  seed, preset, model, params, active_params, steps, batch_size, block_size, tokens,
  tokens_per_param, val_loss, diverged, val_curve as [tokens, val_loss] pairs).

    python scripts/beyond_moe.py --runs /work/runs/i28/moe --md table.md --figure docs/figures/beyond_moe.png \
        --jsonl docs/beyond/moe-cpu/runs.jsonl

The intervals are delaylab.stats' (t, Welch, Fieller).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from delaylab import stats
from delaylab.llm import metrics

MODELS = {  # folder -> label; the dense models match the MoE's active and total parameter counts
    "dense_h256": "dense, h = 256 (matches the MoE's active parameters)",
    "moe_e4k1_h256": "MoE, E = 4, k = 1, h = 256",
    "dense_h1024": "dense, h = 1024 (matches the MoE's total parameters)",
}
SHORT = {"dense_h256": "dense-active", "moe_e4k1_h256": "MoE", "dense_h1024": "dense-total"}
MODES = ("sync", "delayed", "ef")


def t_interval(x: np.ndarray) -> list:
    return stats.t_interval(list(x))


def read_cells(folder: Path) -> list[dict]:
    cells = []
    for cell in sorted((folder / "cells").iterdir()):
        s = cell / "summary.json"
        if not s.is_file():
            continue
        summary = json.loads(s.read_text())
        config = json.loads((cell / "config.json").read_text())
        metrics = [json.loads(line) for line in (cell / "metrics.jsonl").read_text().splitlines()]
        cells.append({"name": cell.name, "summary": summary, "config": config, "metrics": metrics})
    return cells


def active_params(config: dict) -> tuple[int, int]:
    from delaylab.llm.config import Config
    from delaylab.llm.model import GPT

    model = GPT(Config.from_dict(config).model_config(256))
    return model.num_params(), model.num_params(active=True)


def tuned_lr(cells: list[dict], optimizer: str) -> float:
    """The lr of the scan (sync, seed 0) with the lowest final validation loss."""
    scan = [c for c in cells if c["summary"]["optimizer"] == optimizer and c["summary"]["mode"] == "sync"
            and c["summary"]["seed"] == 0]
    return min(scan, key=lambda c: c["summary"]["val_loss"])["summary"]["lr"]


def mode_of(c: dict) -> str:
    s = c["summary"]
    return "sync" if s["mode"] == "sync" else ("ef" if s["correction"] == "ef" else "delayed")


def imbalance_curve(c: dict, key: str = "moe_imbalance") -> list[tuple[int, float]]:
    return [(m["step"], float(np.mean(m[key]))) for m in c["metrics"] if key in m]


def analyse(runs: Path) -> dict:
    out = {"models": {}, "scan": {}}
    for key in (k for k in MODELS if (runs / k / "cells").is_dir()):
        cells = read_cells(runs / key)
        total, active = active_params(cells[0]["config"])
        out["models"][key] = {"total": total, "active": active, "rows": {}}
        for opt in ("adamw", "muon"):
            lr = tuned_lr(cells, opt)
            out["scan"][f"{key}/{opt}"] = sorted((c["summary"]["lr"], c["summary"]["val_loss"]) for c in cells
                                                 if c["summary"]["optimizer"] == opt and mode_of(c) == "sync"
                                                 and c["summary"]["seed"] == 0)
            mine = [c for c in cells if c["summary"]["optimizer"] == opt and c["summary"]["lr"] == lr]
            by = {m: {c["summary"]["seed"]: c for c in mine if mode_of(c) == m} for m in MODES}
            seeds = sorted(set.intersection(*(set(v) for v in by.values())))
            loss = {m: np.array([by[m][s]["summary"]["val_loss"] for s in seeds]) for m in MODES}
            gap = loss["delayed"] - loss["sync"]
            rec = metrics.recovery(*({s: float(v) for s, v in zip(seeds, loss[m])} for m in MODES))
            row = {"lr": lr, "seeds": seeds, **{m: loss[m].tolist() for m in MODES},
                   "gap": gap.tolist(), "gap_mean": float(gap.mean()), "gap_ci": t_interval(gap),
                   "recovery": rec["ratio_of_means"], "recovery_ci": rec["ci"], "recovery_set": rec["set"]}
            if key.startswith("moe"):
                late = {}
                for m in MODES:
                    curves = [imbalance_curve(by[m][s]) for s in seeds]
                    steps = [st for st, _ in curves[0]]
                    row[f"imbalance_{m}"] = {"steps": steps,
                                             "mean": np.mean([[v for _, v in cv] for cv in curves], 0).tolist()}
                    half = len(steps) // 2
                    late[m] = np.array([np.mean([v for _, v in cv[half:]]) for cv in curves])
                    row[f"imbalance_late_{m}"] = late[m].tolist()
                    row[f"dropped_late_{m}"] = [float(np.mean([v for _, v in imbalance_curve(by[m][s], "moe_dropped")[half:]]))
                                                for s in seeds]
                diff = late["delayed"] - late["sync"]
                row["imbalance_late_delayed_minus_sync"] = {"mean": float(diff.mean()), "ci": t_interval(diff)}
                diff = late["ef"] - late["sync"]
                row["imbalance_late_ef_minus_sync"] = {"mean": float(diff.mean()), "ci": t_interval(diff)}
            out["models"][key]["rows"][opt] = row
    comps = {}
    for opt in ("adamw", "muon"):
        g = {k: np.array(out["models"][k]["rows"][opt]["gap"]) for k in out["models"]}
        for other in (k for k in ("dense_h256", "dense_h1024") if k in g):
            comps[f"{opt}: MoE - {SHORT[other]}"] = {"mean": float(g["moe_e4k1_h256"].mean() - g[other].mean()),
                                                    "ci": stats.welch_interval(list(g[other]),
                                                                                 list(g["moe_e4k1_h256"]))}
    out["gap_differences"] = comps
    return out


def fmt_ci(ci, spec="+.3f") -> str:
    return "undetermined" if ci is None else f"[{ci[0]:{spec}}, {ci[1]:{spec}}]"


def resolved(ci) -> str:
    return "undetermined" if ci is None else ("resolved" if ci[0] > 0 or ci[1] < 0 else "not resolved")


def markdown(a: dict) -> str:
    lines = ["| model (total / active params) | optimizer | lr | sync | delayed | delayed + EF | gap [95% t] | "
             "EF recovers [95% Fieller] |", "|---|---|---|---|---|---|---|---|"]
    for key in a["models"]:
        m = a["models"][key]
        for opt, r in m["rows"].items():
            name = {"adamw": "AdamW", "muon": "Muon"}[opt]
            rec = f"{r['recovery']:.0f}% " + ("[undetermined]" if r["recovery_ci"] is None else
                                               f"[{r['recovery_ci'][0]:.0f}, {r['recovery_ci'][1]:.0f}]")
            lines.append(f"| {SHORT[key]} ({m['total'] / 1e6:.2f}M / {m['active'] / 1e6:.2f}M) | {name} | {r['lr']:g} | "
                         f"{np.mean(r['sync']):.3f} | {np.mean(r['delayed']):.3f} | {np.mean(r['ef']):.3f} | "
                         f"{r['gap_mean']:+.3f} {fmt_ci(r['gap_ci'])} | {rec} |")
    lines += ["", "| difference of gaps (Welch 95%) | mean | interval | |", "|---|---|---|---|"]
    for name, d in a["gap_differences"].items():
        lines.append(f"| {name} | {d['mean']:+.3f} | {fmt_ci(d['ci'])} | {resolved(d['ci'])} |")
    rows = a["models"]["moe_e4k1_h256"]["rows"]
    lines += ["", "| router imbalance E max_e f_e (1 = balanced, 4 = all on one expert), mean of the last half of "
              "training | sync | delayed | EF | delayed - sync [95% t, paired] | EF - sync | share dropped over "
              "capacity: sync / delayed / EF |", "|---|---|---|---|---|---|---|"]
    for opt, r in rows.items():
        d, e = r["imbalance_late_delayed_minus_sync"], r["imbalance_late_ef_minus_sync"]
        lines.append(f"| {opt} | {np.mean(r['imbalance_late_sync']):.3f} | {np.mean(r['imbalance_late_delayed']):.3f} | "
                     f"{np.mean(r['imbalance_late_ef']):.3f} | {d['mean']:+.3f} {fmt_ci(d['ci'])} | "
                     f"{e['mean']:+.3f} {fmt_ci(e['ci'])} | "
                     + " / ".join(f"{100 * np.mean(r[f'dropped_late_{m}']):.0f}%" for m in MODES) + " |")
    return "\n".join(lines) + "\n"


def figure(a: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, mid, right) = plt.subplots(1, 3, figsize=(15, 4))
    width = 0.25
    for i, key in enumerate(a["models"]):
        for j, opt in enumerate(("adamw", "muon")):
            r = a["models"][key]["rows"][opt]
            x = j + (i - 1) * width
            lo, hi = r["gap_ci"]
            left.bar(x, r["gap_mean"], width, color=f"C{i}", label=SHORT[key] if j == 0 else None)
            left.errorbar(x, r["gap_mean"], yerr=[[r["gap_mean"] - lo], [hi - r["gap_mean"]]], color="k", capsize=3)
            left.plot([x] * len(r["gap"]), r["gap"], "k.", ms=3)
    left.set_xticks([0, 1], ["AdamW", "Muon"])
    left.set_ylabel("delay gap: delayed - sync val loss")
    left.set_title("delay gap (tau = 1), 95% t interval, seeds as dots")
    left.legend(fontsize=8)
    left.grid(True, axis="y", alpha=0.3)
    for ax, opt in ((mid, "adamw"), (right, "muon")):
        r = a["models"]["moe_e4k1_h256"]["rows"][opt]
        for m, style in zip(MODES, ("-", "--", ":")):
            c = r[f"imbalance_{m}"]
            ax.plot(c["steps"], c["mean"], style, label=m)
        ax.set_xlabel("update")
        ax.set_ylabel("router imbalance E max_e f_e (mean of layers, seeds)")
        ax.set_title(f"MoE router load, {opt}")
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def runs_jsonl(runs: Path, path: Path) -> int:
    lines = []
    for key in MODELS:
        for c in read_cells(runs / key):
            s, cfg = c["summary"], c["config"]
            total, active = active_params(cfg)
            curve = [[m["tokens"], m["val_loss"]] for m in c["metrics"] if "val_loss" in m]
            lines.append(json.dumps({
                "kind": "gpt", "optimizer": s["optimizer"], "mode": s["mode"], "sweep_mode": mode_of(c),
                "correction": s["correction"], "delay": s["delay"], "folder": f"{key}/cells/{c['name']}",
                "batch_size": cfg["data"]["batch_size"], "block_size": cfg["model"]["block_size"],
                "diverged": s["val_loss"] is None,
                "lr": s["lr"], "momentum": s["momentum"], "seed": s["seed"], "preset": s["preset"], "model": key,
                "mlp_hidden": cfg["model"]["mlp_hidden"], "moe_experts": cfg["model"]["moe_experts"],
                "moe_top_k": cfg["model"]["moe_top_k"], "params": total, "active_params": active,
                "steps": s["steps"], "tokens": s["tokens"], "tokens_per_param": s["tokens"] / total,
                "val_loss": s["val_loss"], "val_curve": curve}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, required=True, help="the folder holding the three sweep folders")
    p.add_argument("--md", type=Path, help="write the tables here")
    p.add_argument("--figure", type=Path)
    p.add_argument("--jsonl", type=Path)
    p.add_argument("--json", type=Path, help="write the analysis as JSON")
    args = p.parse_args()
    a = analyse(args.runs)
    text = markdown(a)
    print(text)
    if args.md:
        args.md.write_text(text)
    if args.figure:
        figure(a, args.figure)
    if args.jsonl:
        print(f"{runs_jsonl(args.runs, args.jsonl)} runs -> {args.jsonl}")
    if args.json:
        args.json.write_text(json.dumps(a, indent=1))


if __name__ == "__main__":
    main()
