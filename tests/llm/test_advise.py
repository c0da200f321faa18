"""`delaylab llm advise`: time per update of every schedule against the bubble formulas."""

import json

import pytest

from delaylab.cli import main
from delaylab.errors import ConfigError
from delaylab.llm.advise import Overheads, advise
from delaylab.llm.pipeline.cost_model import Costs


@pytest.mark.parametrize("P,M,F,B,W,v", [(4, 8, 1.0, 2.0, 1.0, 2), (2, 4, 0.5, 1.5, 0.3, 4), (3, 3, 1.0, 1.0, 0.0, 3)])
def test_equal_stages_and_free_sends_give_the_textbook_times(P, M, F, B, W, v):
    r = advise(P, M, Costs.make(P, F, B), weight_grad=W, chunks=v, updates=100,
               overheads=Overheads(1.2, 1.5, "given"))
    t = {row["schedule"]: row["seconds_per_update"] for row in r["rows"]}
    flush = (P - 1) * (F + B)
    assert t["gpipe"] == pytest.approx(M * (F + B) + flush)
    assert t["1f1b"] == pytest.approx(M * (F + B) + flush)
    assert t["2bw"] == pytest.approx(M * (F + B))
    assert t["pipedream"] == pytest.approx(M * (F + B))  # one unit of M microbatches per update
    assert t["interleaved-1f1b"] == pytest.approx(M * (F + B) + flush / v)
    assert t["zb-h1"] == pytest.approx(M * (F + B) + (P - 1) * (F + B - 2 * W))
    by = {row["schedule"]: row for row in r["rows"]}
    assert by["2bw"]["time_to_target_s"] == pytest.approx(t["2bw"] * 100 * 1.2)
    assert by["pipedream"]["time_to_target_s"] == pytest.approx(t["pipedream"] * 100 * 1.5)
    assert by["1f1b"]["time_to_target_s"] == pytest.approx(t["1f1b"] * 100)
    assert (by["2bw"]["weight_versions"], by["pipedream"]["weight_versions"], by["pipedream"]["delay"]) == (2, P, P - 1)
    assert by["gpipe"]["activations_in_flight"] == M and by["1f1b"]["activations_in_flight"] == min(M, P)
    assert by["1f1b"]["bubble"] == pytest.approx(flush / t["1f1b"])


def test_the_verdict_follows_the_overhead():
    costs = Costs.make(4, 1.0, 2.0)
    cheap = advise(4, 8, costs, overheads=Overheads(1.05, None, "given"))
    dear = advise(4, 8, costs, overheads=Overheads(1.5, None, "given"))
    assert cheap["best"] == "2bw" and cheap["async_speedup"] > 1
    assert dear["best"] != "2bw" and dear["async_speedup"] < 1
    assert dear["pipedream_overhead_assumed"]


def test_bad_costs_are_one_line_errors():
    with pytest.raises(ConfigError, match="weight-gradient time"):
        advise(2, 4, Costs.make(2, 1.0, 2.0), weight_grad=3.0)
    with pytest.raises(ConfigError, match="stages >= 2"):
        advise(1, 4, Costs.make(1, 1.0, 2.0))


def test_cli_given_costs_json_and_figure(tmp_path, capsys):
    png = tmp_path / "advise.png"
    code = main(["llm", "advise", "--stages", "4", "--microbatches", "8", "--forward", "1", "--backward", "2",
                 "--overhead", "1.1", "--steps", "10", "--figure", str(png), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and png.stat().st_size > 0
    assert out["costs_source"] == "given" and [r["schedule"] for r in out["rows"]][-2:] == ["2bw", "pipedream"]


def test_cli_measures_costs_by_default(capsys):
    code = main(["llm", "advise", "--preset", "tiny", "--stages", "2", "--batch-size", "2", "--block-size", "16",
                 "--device", "cpu", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["costs_source"].startswith("measured on cpu")
    assert out["costs"]["forward"] > 0 and out["overhead_source"].startswith("assumed")


def test_cli_half_given_costs_are_refused(capsys):
    assert main(["llm", "advise", "--forward", "1"]) == 2
    assert "give both --forward and --backward" in capsys.readouterr().err


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_costs_from_a_pipeline_run_are_checked_against_its_measured_time(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["llm", "pipeline", "--stages", "2", "--schedule", "1f1b", "--preset", "tiny", "--steps", "6",
                 "--batch-size", "2", "--block-size", "16", "--eval-batches", "1", "--device", "cpu",
                 "--out", str(run), "--json"]) == 0
    capsys.readouterr()
    assert main(["llm", "advise", "--stages", "2", "--microbatches", "4", "--costs-from", str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    check = out["check"]
    assert check["schedule"] == "1f1b" and check["measured_s"] > 0
    # the model's prediction from the run's own per-action costs, against the run's own clock
    assert check["measured_over_predicted"] == pytest.approx(check["measured_s"] / check["predicted_s"])
    assert out["costs_source"] == f"measured in {run}"
    assert main(["llm", "advise", "--stages", "3", "--costs-from", str(run)]) == 2
