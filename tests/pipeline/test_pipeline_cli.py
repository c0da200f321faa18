"""`delaylab llm pipeline`: bad configurations end in one line and exit 2, before any process starts."""

import json

import pytest

from delaylab.cli import main


def run_cli(argv) -> int:
    try:
        return main(["llm", "pipeline", *argv])
    except SystemExit as exit_:  # argparse's own errors
        return exit_.code


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--stages", "5", "--preset", "small"], "5 stages but the model has only 4 layers"),
        (["--stages", "4", "--preset", "small", "--microbatches", "2"], "needs microbatches >= stages - 1 = 3"),
        (["--schedule", "zb"], "unknown schedule 'zb'"),
        (["--schedule", "pipedream", "--microbatches", "4"], "use microbatches=1"),
        (["--schedule", "1f1b", "--correction", "ef"], "needs a delay"),
        (["--correction", "dc-asgd"], "supports correction none or ef"),
        (["--optimizer", "rmsprop"], "unknown optimizer 'rmsprop'"),
        (["--stages", "0"], "must be >= 1"),
        (["--device", "cuda:1"], "places rank r on cuda:r"),
        (["--resume", "nowhere"], "no run to resume in nowhere"),
    ],
)
def test_bad_configuration_exits_2_with_one_line_before_any_process(argv, message, tmp_path, capsys):
    out = tmp_path / "run"
    assert run_cli([*argv, "--out", str(out)] if "--resume" not in argv else argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_show_schedule_prints_the_actions_and_the_bubble_model(capsys):
    assert run_cli(["--stages", "3", "--schedule", "1f1b", "--microbatches", "4", "--preset", "small",
                    "--steps", "2", "--show-schedule"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "1f1b: P=3 M=4 steps=2 delays=[0, 0, 0]"
    # Stage 0: P-1 = 2 warm-up forwards, then forward/backward pairs, then the cool-down.
    assert lines[1].startswith("stage 0: F0@v0 F1@v0 F2@v0 B0@v0 F3@v0 B1@v0 B2@v0 B3@v0 U0>v1 F4@v1")
    # (M + P - 1)(f + b) = 6 * 3 per batch; bubble (P - 1) / (M + P - 1) = 1/3.
    assert lines[-1].endswith("18 per batch, bubble 33.3%")


def test_microbatches_default_fits_the_schedule(tmp_path, capsys):
    assert run_cli(["--stages", "4", "--preset", "small", "--steps", "1", "--show-schedule"]) == 0
    assert "2bw: P=4 M=4" in capsys.readouterr().out
    assert run_cli(["--stages", "2", "--schedule", "pipedream", "--steps", "3", "--show-schedule"]) == 0
    assert "pipedream: P=2 M=1 steps=3 delays=[1, 0]" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(200)
def test_diverging_run_names_the_last_stage_and_exits_1(tmp_path, capsys):
    argv = ["--stages", "2", "--preset", "tiny", "--optimizer", "sgd", "--lr", "1e6", "--steps", "20",
            "--batch-size", "2", "--block-size", "16", "--out", str(tmp_path / "run"), "--json"]
    assert run_cli(argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "pipeline stopped: rank 1 failed (Diverged: loss is nan at update" in captured.err
    assert not (tmp_path / "run" / "summary.json").exists()
    assert json.loads((tmp_path / "run" / "config.json").read_text())["parallel"]["schedule"] == "2bw"
