"""Findings' row handling on hand-made rows (no runs): what the report computes from run records."""

import pytest

from delaylab.reproduce import findings


def _row(opt, mode, lr, seed, loss, mom=None):
    return {"optimizer": opt, "mode": mode, "lr": lr, "momentum": mom, "seed": seed, "val_loss": loss,
            "run": f"{opt}_{mode}_{lr}_{seed}"}


def test_tuned_recovery_keeps_each_optimizers_runs_where_lr_grids_overlap():
    """Regression: rows were deduplicated by (mode, lr, seed) only, so Lion's lr-1e-3 runs replaced
    AdamW's (cpu-small's grids overlap at 1e-3). Each mode at its own best lr, by hand."""
    adamw = {  # (mode, lr): per-seed losses; sync best at 1e-3, delayed best at 1e-3, EF best at 2e-3
        ("sync", 1e-3): [2.00, 2.10, 2.05], ("sync", 2e-3): [2.02, 2.12, 2.07],
        ("delayed", 1e-3): [2.40, 2.44, 2.45], ("delayed", 2e-3): [2.60, 2.70, 2.62],
        ("ef", 1e-3): [2.30, 2.35, 2.33], ("ef", 2e-3): [2.10, 2.22, 2.13],
    }
    rows = [_row("adamw", m, lr, s, v, 0.9) for (m, lr), vals in adamw.items() for s, v in enumerate(vals)]
    # Lion at the same lrs and seeds, much worse losses: had they replaced AdamW's, every number moves
    rows += [_row("lion", m, lr, s, 9.0 + s) for (m, lr) in adamw for s in range(3)]
    rows += rows[:6]  # a run read twice (main grid and EF lrs) still counts once
    got = findings._tuned_recovery(rows, "adamw", 0.9)
    sync, delayed, ef = adamw[("sync", 1e-3)], adamw[("delayed", 1e-3)], adamw[("ef", 2e-3)]
    gap = sum(d - s for d, s in zip(delayed, sync)) / 3
    ef_gap = sum(e - s for e, s in zip(ef, sync)) / 3
    assert (got["sync_lr"], got["delayed_lr"], got["ef_lr"]) == (1e-3, 1e-3, 2e-3)
    assert got["recovered"] == pytest.approx(100 * (1 - ef_gap / gap), rel=1e-12)
    assert got["delayed_gap"]["n"] == got["ef_gap"]["n"] == 3


def test_tuned_recovery_carries_only_its_own_optimizers_protocol_issues():
    """Regression (cpu-small v3): AdamW's and Muon's each-mode-tuned EF verdicts were made
    undetermined by Lion's and Adan's protocol breaches, read from every optimizer's rows."""
    rows = [{**_row("adamw", m, lr, s, 2.0 + (m != "sync") * (0.2 - 0.1 * (m == "ef")) + s / 10 + lr, 0.9),
             "issues": []} for m in ("sync", "delayed", "ef") for lr in (1e-3, 2e-3) for s in range(3)]
    lion_issue = "lion momentum 0.99 needs 1000 updates after warmup, has 285"
    rows += [{**_row("lion", m, lr, s, 3.0, None), "issues": [lion_issue]}
             for m in ("sync", "delayed", "ef") for lr in (1e-3, 2e-3) for s in range(3)]
    assert findings._tuned_recovery(rows, "adamw", 0.9)["issues"] == []
    assert findings._tuned_recovery(rows, "lion", None)["issues"] == [lion_issue]
