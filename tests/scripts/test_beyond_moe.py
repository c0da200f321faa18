"""scripts/beyond_moe.py on synthetic sweep folders: the tuned lr, the paired gaps, EF's recovery,
the differences of gaps, the router's late imbalance and runs.jsonl, against numbers by hand."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from delaylab.llm.config import Config

spec = importlib.util.spec_from_file_location("beyond_moe", Path(__file__).parents[2] / "scripts" / "beyond_moe.py")
beyond = importlib.util.module_from_spec(spec)
spec.loader.exec_module(beyond)

MODEL = {"dense_h256": dict(mlp_hidden=32), "moe_e4k1_h256": dict(mlp_hidden=32, moe_experts=4, moe_top_k=1),
         "dense_h1024": dict(mlp_hidden=128)}
GAP = {"dense_h256": 0.30, "moe_e4k1_h256": 0.50, "dense_h1024": 0.31}


def cell(root, model, opt, mode, lr, seed, loss, imbalance=None):
    d = root / model / "cells" / f"{opt}_{mode}_lr{lr:g}_s{seed}"
    d.mkdir(parents=True)
    cfg = Config.from_dict(preset="tiny", optimizer=opt, lr=lr, seed=seed, **MODEL[model])
    (d / "config.json").write_text(json.dumps(cfg.to_dict()))
    delayed = mode != "sync"
    (d / "summary.json").write_text(json.dumps({
        "optimizer": opt, "mode": "delayed" if delayed else "sync", "correction": "ef" if mode == "ef" else "none",
        "delay": int(delayed), "lr": lr, "momentum": None, "seed": seed, "preset": "tiny", "steps": 20,
        "tokens": 2560, "val_loss": loss}))
    lines = [{"step": k, "tokens": 128 * k, "val_loss": loss + 1 / k,
              **({} if imbalance is None else {"moe_imbalance": [imbalance, imbalance], "moe_dropped": [0.1, 0.1]})}
             for k in (5, 10, 15, 20)]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    rng = np.random.default_rng(0)
    for model in MODEL:
        moe = model.startswith("moe")
        for opt in ("adamw", "muon"):
            cell(root, model, opt, "sync", 0.1, 0, 2.5, 1.0 if moe else None)  # a worse lr of the scan
            for s in range(3):
                sync = 2.0 + 0.05 * s
                gap = GAP[model] + 0.02 * rng.standard_normal()
                cell(root, model, opt, "sync", 0.01, s, sync, 1.2 if moe else None)
                cell(root, model, opt, "delayed", 0.01, s, sync + gap, 1.5 + 0.1 * s if moe else None)
                cell(root, model, opt, "ef", 0.01, s, sync + gap * (0.6 + 0.01 * s), 1.3 if moe else None)
    return root


def test_the_analysis_is_its_numbers_by_hand(runs):
    a = beyond.analyse(runs)
    for model in MODEL:
        r = a["models"][model]["rows"]["muon"]
        assert r["lr"] == 0.01 and r["seeds"] == [0, 1, 2]
        gaps = np.array(r["delayed"]) - np.array(r["sync"])
        assert r["gap_mean"] == pytest.approx(gaps.mean()) and abs(r["gap_mean"] - GAP[model]) < 0.05
        ef_gain = np.array(r["delayed"]) - np.array(r["ef"])
        assert r["recovery"] == pytest.approx(100 * ef_gain.mean() / gaps.mean())  # about 39%
        assert r["recovery_ci"][0] < r["recovery"] < r["recovery_ci"][1]
    d = a["gap_differences"]["muon: MoE - dense-total"]
    assert d["mean"] > 0.1 and d["ci"][0] > 0  # the MoE's gap is the larger one, resolved
    moe = a["models"]["moe_e4k1_h256"]["rows"]["adamw"]
    assert moe["imbalance_late_delayed"] == pytest.approx([1.5, 1.6, 1.7])
    assert moe["imbalance_late_delayed_minus_sync"]["mean"] == pytest.approx(0.4)
    table = beyond.markdown(a)
    assert "| MoE (" in table and "| muon: MoE - dense-total |" in table


def test_runs_jsonl_has_one_line_per_run_with_the_fields(runs, tmp_path):
    n = beyond.runs_jsonl(runs, tmp_path / "runs.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert n == len(lines) == 3 * 2 * 10
    first = lines[0]
    for key in ("optimizer", "mode", "correction", "delay", "lr", "momentum", "seed", "preset", "params",
                "active_params", "steps", "tokens", "tokens_per_param", "val_loss", "val_curve"):
        assert key in first, key
    assert first["val_curve"][0] == [640, pytest.approx(first["val_loss"] + 0.2)]
    moe = next(x for x in lines if x["model"] == "moe_e4k1_h256")
    assert moe["active_params"] < moe["params"] and moe["tokens_per_param"] == pytest.approx(2560 / moe["params"])
