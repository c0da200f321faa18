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
    assert rc == 0 and "rates: logdet, lmo-spectral" in out and "\nverdict: " in out


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


def test_suite_at_longer_delays(capsys, tmp_path):
    md = tmp_path / "results.md"
    rc, out, _ = run_cli(capsys, "toy", "rates", "--suite", "--problem", "cauchy", "--method", "lmo-l2", "--T", "30,60",
                         "--seeds", "2", "--suite-delays", "4,8", "--markdown", str(md), "--json")
    data = json.loads(out)
    assert rc == 0 and [(r["delay"], r["correction"]) for r in data["results"]] == [
        (0, "none"), (4, "none"), (4, "ef"), (8, "none"), (8, "ef")]
    table = md.read_text()
    assert "| cauchy | lmo-l2 | tau=8+EF |" in table and "--suite-delays 4,8" in table


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


BAD_INPUT = [
    (["rates", "--problem", "nope", "--method", "lmo-sign"], "unknown problem"),
    (["rates", "--method", "nope"], "unknown method"),
    (["rates"], "--method is required"),
    (["rates", "--method", "lmo-sign,lmo-l2"], "takes one method (use --suite"),
    (["rates", "--method", "lmo-sign", "--problem", "cauchy", "--T", "0,10"], "--T must be >= 1"),
    (["rates", "--method", "lmo-sign", "--T", "10,x"], "comma-separated list of integers"),
    (["rates", "--method", "lmo-sign", "--T", ","], "--T must not be empty"),
    (["rates", "--method", "lmo-sign", "--seeds", "0"], "--seeds must be >= 1"),
    (["rates", "--method", "lmo-sign", "--seeds", "many"], "invalid int value"),
    (["rates", "--method", "lmo-sign", "--tolerance", "-0.1"], "--tolerance must be >= 0"),
    (["rates", "--method", "lmo-sign", "--beta", "7"], "--beta must be in [0, 1), got 7.0"),
    (["rates", "--beta", "7"], "--beta must be in [0, 1), got 7.0"),
    (["rates", "--method", "lmo-spectral", "--problem", "cauchy", "--T", "10"], "no known constant"),
    (["rates", "--method", "lmo-sign", "--correction", "ef"], "needs --delay"),
    (["rates", "--method", "lmo-sign", "--delay", "-1"], "--delay must be >= 0"),
    (["rates", "--method", "lmo-sign", "--delay", "1", "--block-delays", "1,2"], "either --delay or --block-delays"),
    (["rates", "--method", "lmo-sign", "--block-delays", "1,-2"], "--block-delays must be >= 0"),
    (["rates", "--method", "lmo-sign", "--problem", "cauchy", "--sigma", "-1"], "--sigma must be >= 0"),
    (["rates", "--method", "lmo-sign", "--problem", "cauchy-regression", "--batch", "0"], "--batch must be >= 1"),
    (["rates", "--method", "lmo-sign", "--markdown", "t.md"], "needs --suite"),
    (["rates", "--suite", "--problem", "nope"], "unknown problem"),
    (["rates", "--suite", "--method", "sgdm"], "LMO methods only"),
    (["rates", "--suite", "--delay", "1"], "drop --delay"),
    (["rates", "--suite", "--suite-delays", "4,0"], "--suite-delays must be >= 1"),
    (["rates", "--method", "lmo-sign", "--suite-delays", "4"], "needs --suite"),
    (["rates", "--suite", "--beta", "0.5"], "drop --beta"),
    (["rates", "--suite", "--problem", "cauchy", "--sigma", "0.1"], "default instances"),
    (["compare", "--methods", "lmo-sign,bogus"], "unknown method"),
    (["compare", "--T", "0"], "--T must be >= 1"),
    (["compare", "--seeds", "0"], "--seeds must be >= 1"),
    (["compare", "--delay", "0"], "--delay must be >= 1"),
    (["compare", "--beta", "1"], "--beta must be in [0, 1)"),
    (["compare", "--eta-scale", "0"], "--eta-scale must be > 0"),
    (["compare", "--eta-scale", "nan"], "--eta-scale must be > 0"),
    (["compare", "--modes", "delayed,ef"], "--modes must start with sync"),
    (["compare", "--modes", "sync,late"], "--modes must start with sync"),
    (["compare", "--norm", "frobenius"], "no known constant"),
    (["compare", "--problem", "cauchy", "--methods", "lmo-spectral"], "no known constant for norm 'spectral'"),
    (["compare", "--problem", "cauchy", "--batch", "4"], "no --batch option"),
    (["cost", "--method", "adam2"], "unknown method"),
    (["cost", "--method", "lmo-sign,lmo-l2"], "takes one method"),
    (["cost", "--beta", "1.0"], "--beta must be in [0, 1)"),
    (["cost", "--betas", "0.5,x"], "comma-separated list of numbers"),
    (["cost", "--betas", "0.5,1.5"], "--betas must be in [0, 1), got 1.5"),
    (["cost", "--delay", "0"], "--delay must be >= 1"),
    (["cost", "--problem", "cauchy", "--method", "lmo-spectral"], "no known constant"),
]


@pytest.mark.parametrize("argv,needle", BAD_INPUT)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(capsys, tmp_path, argv, needle):
    out = tmp_path / "run"
    rc, stdout, err = run_cli(capsys, "toy", *argv, "--out", str(out))
    assert rc == 2 and stdout == ""
    assert err.count("\n") == 1 and needle in err, err
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nor a --markdown file


def test_a_folder_that_holds_a_run_is_refused(capsys, tmp_path):
    out = tmp_path / "run"
    out.mkdir()  # an empty folder is fine
    argv = ["toy", "rates", "--problem", "cauchy", "--method", "lmo-sign", "--T", "20", "--seeds", "2",
            "--out", str(out)]
    assert run_cli(capsys, *argv)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {"config.json", "metrics.jsonl", "summary.json"}
    rc, stdout, err = run_cli(capsys, *argv[:-4], "--seeds", "3", "--out", str(out))
    assert rc == 2 and stdout == "" and err.count("\n") == 1 and "already holds a run" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


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


def test_profile_bound_check_says_which_part_failed(capsys):
    """The docs' `toy profile --optimizer lmo-spectral` example (reduced grid): each bound-check line
    ends with the verdict of its two parts, "bound holds, slope check fails" where only the slope
    fails, never a bare "NO"."""
    from delaylab.toy.report import verdict

    argv = ["toy", "profile", "--optimizer", "lmo-spectral", "--kwargs", '{"lr": 1, "beta": 0.9}', *PROFILE_FAST[2:],
            "--problems", "logdet", "--T", "25,100"]
    rc, out, _ = run_cli(capsys, *argv, "--json")
    checks = json.loads(out)["bound_check"]
    rc2, text, _ = run_cli(capsys, *argv)
    assert rc == rc2 == 0 and len(checks) == 2
    lines = [line for line in text.splitlines() if line.startswith("bound check ")]
    assert len(lines) == 2 and "NO" not in text
    for c, line in zip(checks, lines):
        assert line.endswith(": " + verdict(c)) and c["bound_holds"] is True
    # Measured on this grid: the bound holds at every T and the fitted slope is above -1/4 + 0.1.
    assert checks[0]["slope_holds"] is False and lines[0].endswith("bound holds, slope check fails")
    assert [verdict({"bound_holds": b, "slope_holds": s}) for b, s in ((True, True), (False, True), (False, False))] \
        == ["holds", "bound fails, slope check holds", "bound and slope check fail"]
    assert verdict({"bound_holds": None, "slope_holds": True}) == "no bound"


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
        (["--optimizer", "torch.optim:AdamW", "--lr-scales", "1,x"], "comma-separated list of numbers"),
        (["--optimizer", "torch.optim:AdamW", "--lr-scales", "inf"], "finite numbers > 0"),
        (["--optimizer", "torch.optim:AdamW", "--T", "0"], "--T must be >= 1"),
        (["--optimizer", "torch.optim:AdamW", "--bound-T", "0,5"], "--bound-T must be >= 1"),
        (["--optimizer", "torch.optim:AdamW", "--seeds", "0"], "--seeds must be >= 1"),
        (["--optimizer", "torch.optim:AdamW", "--delays", "1,-1"], "--delays must be >= 0"),
        (["--optimizer", "torch.optim:Muon"], "ran on no problem"),
        (["--optimizer", "lmo-sign", "--kwargs", '{"lr": "x"}'], "lr and beta must be numbers"),
        (["--optimizer", "lmo-sign", "--kwargs", '{"momentum": 0.9}'], "takes lr and beta"),
    ],
)
def test_profile_bad_input_is_one_line_exit_2_and_writes_nothing(capsys, tmp_path, argv, needle):
    base = ["--problems", "cauchy", "--seeds", "1", "--T", "2", "--lr-scales", "1", "--no-stability",
            "--out", str(tmp_path / "run")]
    rc, out, err = run_cli(capsys, "toy", "profile", *base, *argv)  # the case's flags come last and win
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "run").exists()


def test_load_optimizer():
    f = load_optimizer("torch.optim:AdamW", {"lr": 0.5})
    assert isinstance(f([torch.zeros(2)]), torch.optim.AdamW) and f([torch.zeros(2)]).param_groups[0]["lr"] == 0.5
    assert load_optimizer("lmo-sign", {"lr": 0.1, "beta": 0.5}).__qualname__ == "lmo-sign"
    for spec, match in (("no.such.module:f", "cannot import"), ("torch.optim:Nope", "no attribute"),
                        ("torch.optim", "package.module:factory"), ("math:pi", "not a callable")):
        with pytest.raises(ConfigError, match=match):
            load_optimizer(spec)


def test_console_script_imports_a_factory_from_the_working_directory(tmp_path):
    """`delaylab toy profile --optimizer mymod:make` run from the folder holding mymod.py, with the
    console script (whose sys.path starts at its bin folder, not the working directory), imports
    mymod as `python -m delaylab` does; no PYTHONPATH needed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    work, bindir = tmp_path / "project", tmp_path / "bin"
    work.mkdir()
    bindir.mkdir()
    (work / "mymod.py").write_text("import torch\n\ndef make(params):\n"
                                   "    return torch.optim.SGD(params, lr=0.05, momentum=0.9)\n")
    # What pip writes for [project.scripts] delaylab = "delaylab.cli:main", in a folder of its own.
    script = bindir / "delaylab"
    script.write_text("import sys\nfrom delaylab.cli import main\nsys.exit(main())\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    import delaylab

    env["PYTHONPATH"] = str(Path(delaylab.__file__).parents[1])  # this checkout's delaylab, nothing else
    argv = ["toy", "profile", "--optimizer", "mymod:make", "--problems", "logdet", "--delays", "1", "--no-ef",
            "--lr-scales", "1", "--T", "20", "--seeds", "2", "--no-stability", "--json"]
    run = subprocess.run([sys.executable, str(script), *argv], cwd=work, env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["optimizer"] == "mymod:make"


# -- the progress total ---------------------------------------------------------------------------

RUN_COUNTS = [
    # (argv, the runs made, counted by hand from the arguments)
    (["rates", "--problem", "cauchy", "--method", "lmo-sign", "--T", "10,20,10", "--seeds", "2"], 2),  # T once each
    (["rates", "--suite", "--problem", "cauchy", "--method", "lmo-sign,lmo-l2", "--T", "10,20", "--seeds", "2"],
     2 * 3 * 2),  # methods x {sync, tau=1, tau=1+EF} x T
    (["compare", "--problem", "cauchy", "--methods", "lmo-sign,adam", "--modes", "sync,ef", "--T", "10",
      "--seeds", "2"], 2 * 2),
    (["cost", "--problem", "cauchy", "--method", "lmo-l2", "--T", "10", "--seeds", "2", "--betas", "0.5,0.9"],
     5 + 2),  # 5 etas, 2 betas
    # 2 problems x {sync, tau=1, tau=1+EF} x 1 lr, 3 stability modes, then the bound check of the
    # declared LMO method: 2 problems x 3 modes (main before this change counted 9: no bound check)
    (["profile", "--optimizer", "lmo-sign", "--kwargs", '{"lr": 1, "beta": 0.9}', "--problems", "cauchy,logdet",
      "--delays", "1", "--lr-scales", "1", "--T", "5,10", "--seeds", "2"], 2 * 3 * 1 + 3 + 2 * 3),
    # {sync, tau=1} x one lr (1,1 is one lr); before: 2 x 2
    (["profile", "--optimizer", "torch.optim:SGD", "--kwargs", '{"lr": 0.05}', "--problems", "cauchy",
      "--delays", "1", "--no-ef", "--lr-scales", "1,1", "--T", "5", "--seeds", "2", "--no-stability"], 2),
    # Muon skips the vector problem: logdet x 3 modes x 1 lr + 3 stability modes; before: 2 x 3 + 3
    (["profile", "--optimizer", "torch.optim:Muon", "--kwargs", '{"lr": 0.02}', "--problems", "cauchy,logdet",
      "--delays", "1", "--lr-scales", "1", "--T", "5", "--seeds", "2"], 3 + 3),
]


@pytest.mark.parametrize("argv,runs", RUN_COUNTS, ids=lambda x: x[0] if isinstance(x, list) else str(x))
def test_the_progress_total_is_the_number_of_runs(capsys, tmp_path, monkeypatch, argv, runs):
    from delaylab.run_folder import RunFolder

    seen = {"total": [], "advanced": 0}
    open_, advance = RunFolder.open, RunFolder.advance

    def spy_open(self, *a, **kw):
        seen["total"].append(kw["total"])
        return open_(self, *a, **kw)

    def spy_advance(self, n=1):
        seen["advanced"] += n
        return advance(self, n)

    monkeypatch.setattr(RunFolder, "open", spy_open)
    monkeypatch.setattr(RunFolder, "advance", spy_advance)
    rc, _, _ = run_cli(capsys, "toy", *argv, "--out", str(tmp_path / "run"))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert rc == 0 and seen == {"total": [runs], "advanced": runs} and len(lines) == runs
