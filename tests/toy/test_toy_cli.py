"""`delaylab toy ...` end to end, in process: JSON contracts, files, one-line errors (exit 2)."""

import json

import pytest
import torch

from delaylab.cli import main
from delaylab.commands._plugins import load_optimizer
from delaylab.errors import ConfigError
from delaylab.commands.toy import register  # noqa: F401  (the module under test)
from delaylab.toy.problems import DEFAULT_PROBLEM, PROBLEMS


def run_cli(capsys, *argv):
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def test_list_names_problems_and_methods(capsys):
    rc, out, _ = run_cli(capsys, "toy", "list", "--json")
    data = json.loads(out)
    assert rc == 0 and out.count("\n") == 1
    assert [p["name"] for p in data["problems"]] == list(PROBLEMS)
    assert data["default_problem"] == DEFAULT_PROBLEM == "logdet"
    assert {m["name"] for m in data["methods"]} == {"lmo-spectral", "lmo-sign", "lmo-l2", "sgdm", "adam"}
    logdet = data["problems"][0]
    assert logdet["L"] == {"spectral": 12.0, "sign": 144.0, "l2": 2.0}
    rc, out, _ = run_cli(capsys, "toy", "list")
    assert rc == 0 and "logdet" in out and "lmo-spectral" in out


def test_rates_json_contract(capsys, tmp_path):
    rc, out, _ = run_cli(capsys, "toy", "rates", "--problem", "cauchy", "--method", "lmo-sign", "--delay", "1",
                         "--T", "50,200", "--seeds", "4", "--json", "--out", str(tmp_path / "run"))
    assert rc == 0 and out.count("\n") == 1
    data = json.loads(out)
    for key in ("holds", "slope", "exponent", "points", "seconds"):
        assert key in data
    assert isinstance(data["holds"], bool) and data["exponent"] == pytest.approx(-0.25)
    assert [p["T"] for p in data["points"]] == [50, 200]
    for p in data["points"]:
        assert set(p) >= {"T", "measured", "ci", "bound", "ratio"}
        assert p["ci"][0] <= p["measured"] <= p["ci"][1]
        assert p["ratio"] == pytest.approx(p["measured"] / p["bound"])
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["T"] for x in lines] == [50, 200]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["points"] == data["points"]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["method"] == "lmo-sign"


def test_rates_default_problem_is_the_matrix_problem(capsys):
    rc, out, _ = run_cli(capsys, "toy", "rates", "--method", "lmo-spectral", "--T", "30", "--seeds", "2")
    assert rc == 0 and "rates: logdet, lmo-spectral" in out and "holds:" in out


def test_suite_writes_table_and_figure(capsys, tmp_path):
    md, fig = tmp_path / "results.md", tmp_path / "figs"
    rc, out, _ = run_cli(capsys, "toy", "rates", "--suite", "--problem", "cauchy", "--method", "lmo-l2",
                         "--T", "30,60", "--seeds", "2", "--markdown", str(md), "--plot", str(fig), "--json")
    data = json.loads(out)
    assert rc == 0 and len(data["results"]) == 3 and isinstance(data["holds"], bool)
    table = md.read_text()
    assert "| cauchy | lmo-l2 | sync |" in table and "| cauchy | lmo-l2 | tau=1+EF |" in table
    assert "delaylab toy rates --suite --T 30,60 --seeds 2 --problem cauchy --method lmo-l2" in table
    assert (fig / "toy_rates.png").stat().st_size > 10_000


def test_compare_table_and_files(capsys, tmp_path):
    rc, out, _ = run_cli(capsys, "toy", "compare", "--problem", "cauchy", "--methods", "lmo-sign,adam",
                         "--T", "60", "--seeds", "2", "--plot", str(tmp_path), "--out", str(tmp_path / "o"))
    assert rc == 0
    assert "sync" in out and "EF recovers" in out and out.count("\nlmo-sign") == 1
    assert (tmp_path / "toy_compare.png").exists()
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert [r["method"] for r in summary["rows"]] == ["lmo-sign", "adam"]
    assert len((tmp_path / "o" / "metrics.jsonl").read_text().splitlines()) == 6  # 2 methods x 3 modes


def test_cost_json_and_figures(capsys, tmp_path):
    rc, out, _ = run_cli(capsys, "toy", "cost", "--problem", "cauchy", "--method", "lmo-l2", "--T", "60",
                         "--seeds", "2", "--betas", "0.5,0.9", "--plot", str(tmp_path), "--json")
    data = json.loads(out)
    assert rc == 0 and len(data["eta_sweep"]) == 5 and len(data["beta_sweep"]) == 2
    assert set(data["trends"]) == {"gap_grows_with_eta", "relative_gap_shrinks_with_beta"}
    assert (tmp_path / "toy_gap_vs_eta.png").exists() and (tmp_path / "toy_gap_vs_beta.png").exists()


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["rates", "--problem", "nope", "--method", "lmo-sign"], "unknown problem"),
        (["rates", "--method", "nope"], "unknown method"),
        (["rates", "--method", "lmo-sign", "--problem", "cauchy", "--T", "0,10"], "--T must be >= 1"),
        (["rates", "--method", "lmo-sign", "--seeds", "0"], "--seeds must be >= 1"),
        (["rates", "--method", "lmo-sign", "--seeds", "many"], "invalid int value"),
        (["rates", "--method", "lmo-spectral", "--problem", "cauchy", "--T", "10"], "no known constant"),
        (["rates", "--method", "lmo-sign", "--correction", "ef"], "needs --delay"),
        (["compare", "--methods", "lmo-sign,bogus"], "unknown method"),
        (["compare", "--T", "0"], "--T must be >= 1"),
        (["compare", "--seeds", "0"], "--seeds must be >= 1"),
        (["compare", "--problem", "cauchy", "--methods", "lmo-spectral"], "needs the spectral norm"),
        (["cost", "--method", "adam2"], "unknown method"),
        (["cost", "--beta", "1.0"], "--beta must be in [0, 1)"),
        (["compare", "--problem", "cauchy", "--batch", "4"], "no --batch option"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, needle):
    rc, out, err = run_cli(capsys, "toy", *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and needle in err, err


# -- toy profile --------------------------------------------------------------------------------

PROFILE_FAST = ["--problems", "cauchy", "--delays", "1", "--no-ef", "--lr-scales", "1", "--seeds", "4",
                "--no-stability"]


def test_profile_registry_method_gives_toy_rates_numbers(capsys):
    """`toy profile --optimizer lmo-sign` runs the bound check through rate_check on a per-seed
    optimizer; `toy rates --beta` runs the batched registry method: the same floats."""
    rc, out, _ = run_cli(capsys, "toy", "profile", "--optimizer", "lmo-sign", "--kwargs", '{"lr": 1, "beta": 0.9}',
                         *PROFILE_FAST, "--T", "40,160", "--json")
    assert rc == 0 and out.count("\n") == 1
    prof = json.loads(out)
    checks = {c["mode"]: c for c in prof["bound_check"]}
    for mode, extra in (("sync", []), ("tau=1", ["--delay", "1"])):
        rc, out, _ = run_cli(capsys, "toy", "rates", "--method", "lmo-sign", "--beta", "0.9", "--problem", "cauchy",
                             "--T", "40,160", "--seeds", "4", *extra, "--json")
        rates = json.loads(out)
        assert rc == 0 and rates["points"] == checks[mode]["points"] and rates["holds"] == checks[mode]["holds"]
        assert all(p["beta"] == 0.9 for p in rates["points"])


def test_profile_text_json_files_and_figure(capsys, tmp_path):
    argv = ["toy", "profile", "--optimizer", "torch.optim:SGD", "--kwargs", '{"lr": 0.05, "momentum": 0.9}',
            "--problems", "logdet", "--delays", "1", "--lr-scales", "0.5,1", "--T", "20,40", "--seeds", "2"]
    rc, out, _ = run_cli(capsys, *argv, "--out", str(tmp_path / "o"), "--plot", str(tmp_path))
    assert rc == 0 and "profile: torch.optim:SGD (heavyball, beta=0.9 (inferred))" in out
    assert "largest stable lr on the quadratic" in out and out.count("\nlogdet") == 3  # sync, tau=1, tau=1+EF
    assert (tmp_path / "toy_profile.png").stat().st_size > 10_000
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    # 3 modes x 2 lrs, then 3 stability modes: one metrics line per progress call
    assert len((tmp_path / "o" / "metrics.jsonl").read_text().splitlines()) == 9
    assert summary["stability"]["modes"][1]["predicted_lr"] == pytest.approx(0.1)  # (1 - beta) / lambda
    rc, out, _ = run_cli(capsys, *argv, "--no-stability", "--json")
    assert rc == 0 and out.count("\n") == 1 and "stability" not in json.loads(out)


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--optimizer", "no_such_pkg.mod:make"], "cannot import 'no_such_pkg.mod'"),
        (["--optimizer", "torch.optim:NoSuchThing"], "has no attribute 'NoSuchThing'"),
        (["--optimizer", "torch.optim.AdamW"], "package.module:factory"),
        (["--optimizer", "builtins:len"], "returned int, not a torch.optim.Optimizer"),
        (["--optimizer", "torch.optim:AdamW", "--kwargs", "{lr: 1}"], "--kwargs is not JSON"),
        (["--optimizer", "torch.optim:AdamW", "--kwargs", "[1]"], "must be a JSON object"),
        (["--optimizer", "torch.optim:AdamW", "--kwargs", '{"nope": 1}'], "failed on parameters"),
        (["--optimizer", "torch.optim:AdamW", "--declare", "lmo:0.9"], "needs a norm"),
        (["--optimizer", "torch.optim:AdamW", "--declare", "adam"], "cannot read the declaration"),
        (["--optimizer", "torch.optim:AdamW", "--delays", "0"], "delay >= 1"),
        (["--optimizer", "torch.optim:AdamW", "--problems", "nope"], "unknown problem"),
        (["--optimizer", "torch.optim:AdamW", "--lr-scales", "0,1"], "--lr-scales must be numbers > 0"),
    ],
)
def test_profile_bad_input_is_one_line_exit_2(capsys, argv, needle):
    base = ["--problems", "cauchy", "--seeds", "1", "--T", "2", "--lr-scales", "1", "--no-stability"]
    rc, out, err = run_cli(capsys, "toy", "profile", *base, *argv)  # the case's flags come last and win
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and needle in err, err


def test_load_optimizer():
    f = load_optimizer("torch.optim:AdamW", {"lr": 0.5})
    assert isinstance(f([torch.zeros(2)]), torch.optim.AdamW) and f([torch.zeros(2)]).param_groups[0]["lr"] == 0.5
    assert load_optimizer("lmo-sign", {"lr": 0.1, "beta": 0.5}).__qualname__ == "lmo-sign"
    for spec, match in (("no.such.module:f", "cannot import"), ("torch.optim:Nope", "no attribute"),
                        ("torch.optim", "package.module:factory"), ("math:pi", "not a callable")):
        with pytest.raises(ConfigError, match=match):
            load_optimizer(spec)
