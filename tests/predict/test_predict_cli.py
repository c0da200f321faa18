"""`delaylab predict gap|pilot` on run folders made by a short `delaylab llm train`, and their one-line
errors (exit 2) for the bad inputs: no val curve, a pilot longer than the run, mismatched configs."""

from __future__ import annotations

import json

import pytest

from delaylab.cli import main
from delaylab.predict import publish

QUICK = ["--preset", "tiny", "--batch-size", "4", "--block-size", "32", "--eval-batches", "1", "--threads", "1",
         "--steps", "20", "--eval-every", "2", "--optimizer", "adamw", "--lr", "0.002"]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A finished sync run, sync and delayed pilots (stopped after 2 of 20 updates), one pilot at another
    lr, and a run that stopped before its first validation."""
    root = tmp_path_factory.mktemp("runs")
    made = {"sync": [], "sync_pilot": ["--stop-at", "2"], "delayed_pilot": ["--delay", "1", "--stop-at", "2"],
            "other_lr": ["--delay", "1", "--stop-at", "2", "--lr", "0.004"],
            "no_val": ["--stop-at", "1", "--eval-every", "10"]}
    for name, extra in made.items():  # a flag given twice: the last value counts
        assert main(["llm", "train", *QUICK, *extra, "--out", str(root / name), "--json"]) == 0
    return root


def test_gap_prints_the_prediction_its_interval_and_the_held_out_score(runs, capsys):
    code, out, err = run(capsys, "predict", "gap", "--sync", runs / "sync", "--delay", "2", "--json")
    assert code == 0 and err == ""
    r = json.loads(out)  # exactly one JSON object
    fitted = publish.load_fitted()
    assert r["predictor"] == fitted["sync_only"]["name"] and r["mean_delay"] == 2
    lo, hi = r["interval"]
    assert lo <= r["gap"] <= hi
    assert r["held_out"]["within_x2"] == fitted["sync_only"]["held_out"]["within_x2"]
    code, text, _ = run(capsys, "predict", "gap", "--sync", runs / "sync", "--delay", "3,2,1,0", "--correction", "ef")
    assert code == 0 and "within x2 on" in text and "of held-out cells" in text
    # a longer delay costs more under the fitted law (gap ~ tau), all else equal
    code, out4, _ = run(capsys, "predict", "gap", "--sync", runs / "sync", "--delay", "4", "--json")
    assert json.loads(out4)["gap"] > r["gap"]


def test_pilot_prints_the_prediction(runs, capsys):
    code, out, err = run(capsys, "predict", "pilot", "--sync", runs / "sync_pilot", "--delayed", runs / "delayed_pilot",
                         "--steps", "20", "--json")
    assert code == 0 and err == ""
    r = json.loads(out)
    assert r["pilot_updates"] == 2 and r["predictor"] == publish.load_fitted()["pilot"]["name"]
    sync = [json.loads(x) for x in (runs / "sync_pilot" / "metrics.jsonl").read_text().splitlines()]
    delayed = [json.loads(x) for x in (runs / "delayed_pilot" / "metrics.jsonl").read_text().splitlines()]
    at = {m["step"]: m["val_loss"] for m in sync if "val_loss" in m}
    gap = [m["val_loss"] - at[m["step"]] for m in delayed if "val_loss" in m and m["step"] == 2]
    assert r["pilot_gap"] == pytest.approx(gap[0], abs=1e-12)  # read from the runs' own validations
    assert r["interval"][0] <= r["gap"] <= r["interval"][1]


@pytest.mark.parametrize("argv,msg", [
    (["gap", "--sync", "{no_val}"], "no validation in metrics.jsonl"),
    (["gap", "--sync", "{delayed_pilot}"], "not a sync run"),
    (["gap", "--sync", "{sync_pilot}"], "has not finished"),
    (["gap", "--sync", "{sync}", "--delay", "0"], "needs a delay of 1 or more"),
    (["gap", "--sync", "{sync}", "--correction", "magic"], "--correction"),
    (["gap", "--sync", "{missing}"], "no such run folder"),
    (["pilot", "--sync", "{sync}", "--delayed", "{delayed_pilot}", "--steps", "10"], "longer than the run"),
    (["pilot", "--sync", "{sync_pilot}", "--delayed", "{delayed_pilot}", "--steps", "40"], "not --steps 40"),
    (["pilot", "--sync", "{sync_pilot}", "--delayed", "{other_lr}", "--steps", "20"], "mismatched"),
    (["pilot", "--sync", "{sync_pilot}", "--delayed", "{sync_pilot}", "--steps", "20"], "not a delayed run"),
    (["pilot", "--sync", "{sync_pilot}", "--delayed", "{no_val}", "--steps", "20"], "no validation"),
])
def test_bad_input_is_one_line_exit_2(runs, capsys, argv, msg):
    args = [a.format(**{k: runs / k for k in ("no_val", "delayed_pilot", "sync_pilot", "sync", "other_lr", "missing")})
            for a in argv]
    code, out, err = run(capsys, "predict", *args)
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and out == ""


def test_llm_train_predict_at_stops_a_pilot_and_prints_the_prediction(runs, tmp_path, capsys):
    out = tmp_path / "pilot"
    code, stdout, err = run(capsys, "llm", "train", *QUICK, "--delay", "1", "--predict-at", "0.1",
                            "--predict-sync", runs / "sync_pilot", "--out", out, "--json")
    assert code == 0
    r = json.loads(stdout)  # one JSON object: the prediction, not the run's summary
    by_hand = json.loads(run(capsys, "predict", "pilot", "--sync", runs / "sync_pilot", "--delayed", runs / "delayed_pilot",
                             "--steps", "20", "--json")[1])
    assert r["gap"] == by_hand["gap"] and r["pilot_updates"] == 2  # the same pilot as delayed_pilot, bit for bit
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 2  # stopped at 10% of 20 updates


@pytest.mark.parametrize("extra,msg", [
    (["--predict-at", "0.1"], "needs --predict-sync"),
    (["--predict-sync", "x"], "needs --predict-at"),
    (["--predict-at", "1.5", "--predict-sync", "x"], "must be in (0, 1)"),
    (["--predict-at", "0.1", "--predict-sync", "x", "--stop-at", "3"], "drop --stop-at"),
])
def test_llm_train_predict_at_bad_input(tmp_path, capsys, extra, msg):
    code, out, err = run(capsys, "llm", "train", *QUICK, "--delay", "1", *extra, "--out", tmp_path / "r")
    assert code == 2 and msg in err and len(err.strip().splitlines()) == 1 and out == ""
    assert not (tmp_path / "r").exists()
