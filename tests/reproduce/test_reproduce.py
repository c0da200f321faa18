"""`delaylab reproduce --preset ci`: the report's structure, where its numbers come from, resume.

One ci report is made per module (about a minute on 2 cores). Every number checked here is
recomputed from the run folders themselves (summary.json / config.json / metrics.jsonl),
with numpy, not taken from the report; no expected value is written down.
"""

import glob
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from delaylab.reproduce import reproduce
from delaylab.reproduce.markdown import markdown
from delaylab.reproduce.verdicts import STATES, SUMMARIES, aggregate, state

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DELAYLAB_CACHE", str(tmp_path_factory.mktemp("cache")))  # the spawned workers inherit it
        rep = reproduce("ci", out, jobs=2, progress=False)
        yield out, rep


def _load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def _config(folder) -> dict:
    """A run's config.json as flat fields, with its sync/delayed label."""
    from delaylab.llm.config import Config

    cfg = Config.from_dict(_load(Path(folder) / "config.json"))
    return {**cfg.flat(), "mode": cfg.mode}


def _val(out: Path, folder: str):
    return _load(out / folder / "summary.json")["val_loss"]


def _parts(rep: dict) -> dict:
    return {p["key"]: p for p in rep["parts"]}


def _close(a, b, tol=1e-9):
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


def test_report_structure(made):
    out, rep = made
    on_disk = _load(out / "report.json")
    assert on_disk == json.loads(json.dumps(on_disk))  # plain JSON
    assert [p["id"] for p in on_disk["parts"]] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [s["id"] for s in on_disk["summary"]] == [1, 2, 3, 4, 5, 6, 7, 8]
    md = (out / "report.md").read_text()
    assert md == markdown(on_disk)  # the Markdown says exactly what the JSON says
    for part in on_disk["parts"]:
        assert part["rows"] and part["verdicts"] and part["commands"], part["key"]
        for v in part["verdicts"]:
            assert v["state"] in (*STATES, None) and v["line"].strip() and "\n" not in v["line"]
            assert (v["state"] is None) == (v["kind"] == "note")
            assert f"- {v['line']}" in md
        assert part["reproduced"] in SUMMARIES
        assert part["theory_agrees"] in (*SUMMARIES, "qualitative")
        # one aggregation rule for every part
        assert part["reproduced"] == aggregate([v["state"] for v in part["verdicts"] if v["kind"] == "paper"])
        png = out / part["figure"]
        assert png.read_bytes()[:8] == PNG and png.stat().st_size > 5000, png
        assert f"![{part['title']}]({part['figure']})" in md
        assert f"## {part['id']}. {part['title']}" in md
    assert on_disk["session"]["computed"] == on_disk["session"]["runs"] > 0


def test_best_lr_and_gaps_recomputed_from_the_runs(made):
    out, rep = made
    part = _parts(rep)["optimizers"]
    cells = out / "llm" / "main" / "cells"
    for row in part["rows"]:
        opt = row["optimizer"]
        # the best sync lr: the lowest mean final val loss over every sync run of this optimizer in DIR
        by_lr = {}
        for path in glob.glob(str(cells / f"{opt}_sync_*")):
            cfg = _config(Path(path))
            if cfg["momentum"] == row["momentum"] and cfg["seed"] < 2:  # decided on the base seeds (ci: 2)
                by_lr.setdefault(cfg["lr"], []).append(_load(Path(path) / "summary.json")["val_loss"])
        assert sorted(by_lr) == row["lrs"]  # the grid as grown (it starts from the preset's lrs)
        assert set(_load(out / "reproduce.json")["llm"]["lrs"][opt]) <= set(row["lrs"])
        assert row["lr"] == min(by_lr, key=lambda lr: np.mean(by_lr[lr]))
        sync = {_config(out / f)["seed"]: _val(out, f) for f in row["runs"]["sync"]}
        delayed = {_config(out / f)["seed"]: _val(out, f) for f in row["runs"]["delayed"]}
        for f in row["runs"]["delayed"]:
            cfg = _config(out / f)
            assert (cfg["optimizer"], cfg["mode"], cfg["lr"], cfg["correction"]) == (opt, "delayed", row["lr"], "none")
        assert _close(row["sync"]["mean"], np.mean(list(sync.values())))
        assert _close(row["delayed"]["std"], np.std(list(delayed.values()), ddof=1))
        gaps = [delayed[s] - sync[s] for s in sorted(sync)]
        assert _close(row["gap"]["mean"], np.mean(gaps))
        assert _close(row["relative_gap_pct"], 100 * np.mean(gaps) / np.mean(list(sync.values())))
        # ... and the Markdown row prints those numbers
        md_row = next(line for line in (out / "report.md").read_text().splitlines() if line.startswith(f"| {opt} | "))
        assert f"{np.mean(gaps):+.3f} ± {np.std(gaps, ddof=1):.3f}" in md_row


def test_mitigation_shares_recomputed(made):
    out, rep = made
    for row in _parts(rep)["mitigations"]["rows"]:
        means = {}
        for mode, folders in row["runs"].items():
            for f in folders:
                cfg = _config(out / f)
                assert (cfg["optimizer"], cfg["lr"]) == (row["optimizer"], row["lr"])
                if mode == "sync-start":
                    assert cfg["sync_start"] > 0 and cfg["mode"] == "delayed"
                if mode in ("ef", "dc-asgd"):
                    assert cfg["correction"] == mode
            means[mode] = np.mean([_val(out, f) for f in folders])
        gap = means["delayed"] - means["sync"]
        for mode in ("ef", "dc-asgd", "sync-start", "sync-cooldown"):
            assert _close(row[f"{mode}_recovered"]["of_mean_gap"], 100 * (means["delayed"] - means[mode]) / gap, 1e-7)


def test_momentum_lr_and_schedule_rows_recomputed(made):
    out, rep = made
    parts = _parts(rep)
    for key in ("momentum", "learning_rate"):
        for row in parts[key]["rows"]:
            for mode in ("sync", "delayed"):
                vals = [_val(out, f) for f in row["runs"][mode]]
                assert _close(row[mode]["mean"], np.mean(vals))
                for f in row["runs"][mode]:
                    cfg = _config(out / f)
                    assert (cfg["lr"], cfg["momentum"], cfg["mode"]) == (row["lr"], row["momentum"], mode)
    rows = parts["schedules"]["rows"]
    for row in rows:
        (name, folders), = row["runs"].items()
        for f in folders:
            delay = _config(out / f)["delay"]
            assert (delay if isinstance(delay, list) else [delay if name != "sync" else 0]) == row["delays"]
        if "vs_2bw" in row:
            twobw = next(r for r in rows if r["schedule"] == "2bw" and r["optimizer"] == row["optimizer"])
            diff = [_val(out, a) - _val(out, b) for a, b in zip(folders, twobw["runs"]["2bw"])]
            assert _close(row["vs_2bw"]["mean"], np.mean(diff))
            assert _close(row["mean_delay"], np.mean(row["delays"]))


def test_toy_numbers_recomputed(made):
    out, rep = made
    part = _parts(rep)["toy"]
    for row in part["rows"]:
        res = _load(out / row["runs"][0] / "summary.json")
        ts = [p["T"] for p in res["points"]]
        measured = [p["measured"] for p in res["points"]]
        assert _close(row["slope"], np.polyfit(np.log(ts), np.log(measured), 1)[0], 1e-9)
        assert _close(row["max_ratio"], max(p["measured"] / p["bound"] for p in res["points"]), 1e-9)
        assert row["holds"] == (all(p["ci"][1] <= p["bound"] for p in res["points"])
                                and res["slope"] <= res["exponent"] + res["tolerance"])


def test_resume_reruns_only_what_is_missing_and_gives_the_same_report(made, tmp_path):
    from delaylab.llm.sweep import run_cell
    from delaylab.llm.config import Config
    from delaylab.llm.run.trainer import train
    from delaylab.reproduce import plan as P
    from delaylab.reproduce.ledger import Folders
    from delaylab.reproduce.presets import get_preset

    out, rep = made
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    p = get_preset("ci")
    grid = P.grid(p, Folders(out))
    gone, stopped = grid[0], grid[-1]
    shutil.rmtree(copy / gone.folder)                      # never run
    shutil.rmtree(copy / stopped.folder)                   # killed half way: a checkpoint, no summary
    cfg = stopped.cell.config(Config.from_dict(stopped.base))
    train(cfg, copy / stopped.folder, stop_at=cfg.steps // 2)
    assert not (copy / stopped.folder / "summary.json").exists()
    toy_run = P.toy(p)["cost"][0]
    shutil.rmtree(copy / toy_run.folder)
    again = reproduce("ci", copy, jobs=1, progress=False)
    assert again["session"]["computed"] == 3
    assert again["session"]["read"] == again["session"]["runs"] - 3
    assert [s["status"] for s in again["sessions"]] == ["finished", "finished"]  # both sessions are kept
    assert _numbers(again, copy) == _numbers(rep, out)
    assert run_cell(stopped.base, stopped.cell, str(copy / stopped.folder))["val_loss"] == _val(out, stopped.folder)


def _numbers(rep: dict, out: Path) -> dict:
    """A report without what differs between two folders and sessions (its folder, its sessions)."""
    r = json.loads(json.dumps(rep))
    r.pop("session"), r.pop("sessions"), r.pop("out"), r.pop("command")
    for part in r["parts"]:
        part["commands"] = [c.replace(str(out), "DIR") for c in part["commands"]]
    return r


def _children(pid: int) -> set[int]:
    return {int(c) for t in Path(f"/proc/{pid}/task").glob("*") for c in (t / "children").read_text().split()}


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the workers from /proc (Linux)")
@pytest.mark.parametrize("sig", ["SIGTERM", pytest.param("SIGUSR1", marks=pytest.mark.slow)])  # one handler for both
def test_a_cluster_signal_stops_the_pool_records_the_session_exits_75_and_the_resume_is_exact(made, tmp_path, sig):
    """What a scheduler sends before it kills a job: the workers stop at a checkpoint and leave, the
    session is recorded as stopped, the exit code says "run again" (75), and running the same command
    again gives the report of the uninterrupted run."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    from delaylab.errors import Preempted
    from delaylab.reproduce import plan as P
    from delaylab.reproduce.ledger import Folders
    from delaylab.reproduce.presets import get_preset

    out, rep = made
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    gone = [r.folder for r in P.grid(get_preset("ci"), Folders(out))[-8:]]
    for folder in gone:
        shutil.rmtree(copy / folder)
    log = tmp_path / "stderr"  # a file, not a pipe: a worker left running would hold a pipe open
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "delaylab", "reproduce", "--preset", "ci", "--jobs", "2",
                                 "--out", str(copy)], stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.time() + 120
        # a worker has started one of the removed runs: the driver is past its start-up, in the pool
        while not any((copy / f / "config.json").is_file() for f in gone):
            assert proc.poll() is None and time.time() < deadline, log.read_text()
            time.sleep(0.05)
        workers = _children(proc.pid)
        os.kill(proc.pid, getattr(signal, sig))
        code = proc.wait(timeout=120)
        # none left running without a driver (the resource tracker leaves once its pipe closes)
        deadline = time.time() + 10
        while [w for w in workers if _alive(w)] and time.time() < deadline:
            time.sleep(0.1)
        left = [w for w in workers if _alive(w)]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the run under test left behind
    err = log.read_text().strip().splitlines()
    assert code == Preempted.exit_code, err
    assert err[-1].startswith(f"delaylab: preempted: {sig}: stopped;") and "Traceback" not in "\n".join(err), err
    assert workers and not left, left
    session = json.loads((copy / "sessions.jsonl").read_text().splitlines()[-1])
    assert session["status"] == "interrupted" and session["stopped_by"] == sig
    assert session["computed"] < len(gone) and session["seconds"] > 0
    assert not list(copy.glob("llm/**/*.pending"))  # every checkpoint written whole, or not begun
    again = reproduce("ci", copy, jobs=2, progress=False)
    assert [s["status"] for s in again["sessions"][-2:]] == ["interrupted", "finished"]
    assert again["session"]["computed"] == len(gone) - session["computed"]
    assert _numbers(again, copy) == _numbers(rep, out)


def test_cli_json_reads_a_finished_report(made, capsys):
    from delaylab.cli import main

    out, rep = made
    assert main(["reproduce", "--preset", "ci", "--out", str(out), "--json"]) == 0
    printed = capsys.readouterr().out
    result = json.loads(printed)
    assert printed.count("\n") == 1
    assert result["session"]["computed"] == 0 and result["session"]["read"] == rep["session"]["runs"]
    assert result["summary"] == rep["summary"]


def test_cli_errors_are_one_line(tmp_path, capsys):
    from delaylab.cli import main

    assert main(["reproduce", "--preset", "nope", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown preset 'nope'" in err
    with pytest.raises(SystemExit) as exc:
        main(["reproduce", "--preset", "ci", "--out", str(tmp_path / "x"), "--jobs", "0"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "reproduce.json").write_text(json.dumps({"name": "cpu-small"}))
    assert main(["reproduce", "--preset", "ci", "--out", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another grid" in err
    assert not (folder / "llm").exists()


def test_config_flags_reach_every_gpt_run_of_the_report(monkeypatch, tmp_path, capsys):
    """`reproduce --tokenizer bpe --device cpu` changes the base of every GPT run, nothing else."""
    import delaylab.reproduce as R
    from delaylab.cli import main
    from delaylab.reproduce import get_preset

    seen = {}

    def fake(preset, out, jobs):
        seen["preset"] = preset
        return {"preset": "ci", "out": str(out), "summary": [], "session": {}}

    monkeypatch.setattr(R, "reproduce", fake)
    assert main(["reproduce", "--preset", "ci", "--out", str(tmp_path), "--tokenizer", "bpe", "--device", "cpu",
                 "--json"]) == 0
    ci = get_preset("ci")
    assert seen["preset"].llm.base == {**ci.llm.base, "tokenizer": "bpe", "device": "cpu"}
    assert seen["preset"].llm.lrs == ci.llm.lrs and seen["preset"].schedules == ci.schedules


# -- protocol v2 ----------------------------------------------------------------------------------------


def _seed_vals(out: Path, folders: list[str]) -> dict:
    return {_config(out / f)["seed"]: _val(out, f) for f in folders}


def test_tuned_gap_and_neighbourhood_recomputed(made):
    out, rep = made
    cells = out / "llm" / "main" / "cells"
    for row in _parts(rep)["optimizers"]["rows"]:
        opt = row["optimizer"]
        runs = {}
        for path in glob.glob(str(cells / f"{opt}_*")):
            cfg = _config(Path(path))
            if cfg["correction"] == "none" and cfg["momentum"] == row["momentum"] and not cfg["sync_start"] \
                    and not cfg["sync_cooldown"]:
                runs.setdefault((cfg["mode"], cfg["lr"]), {})[cfg["seed"]] = _load(Path(path) / "summary.json")["val_loss"]
        base = {k: {s: v for s, v in vals.items() if s < 2} for k, vals in runs.items()}  # the base seeds decide
        best = {m: min((lr for mode, lr in base if mode == m), key=lambda lr: np.mean(list(base[(m, lr)].values())))
                for m in ("sync", "delayed")}
        assert (row["tuned"]["sync_lr"], row["tuned"]["lr"]) == (best["sync"], best["delayed"])
        sync, delayed = runs[("sync", best["sync"])], runs[("delayed", best["delayed"])]
        assert _close(row["tuned"]["gap"]["mean"], np.mean([delayed[s] - sync[s] for s in sorted(set(sync) & set(delayed))]))
        from delaylab.reproduce.plan import neighbours

        lrs = sorted(lr for mode, lr in runs if mode == "sync")
        assert [x["lr"] for x in row["neighbourhood"]] == neighbours(lrs, row["lr"])
        for x in row["neighbourhood"]:
            s, d = runs[("sync", x["lr"])], runs[("delayed", x["lr"])]
            assert _close(x["gap"]["mean"], np.mean([d[k] - s[k] for k in sorted(s) if k < 2]))


def test_momentum_is_retuned_at_each_momentum(made):
    out, rep = made
    part = _parts(rep)["momentum"]
    for row in part["rows"]:
        sync = {}
        for path in glob.glob(str(out / "llm" / "main" / "cells" / f"{row['optimizer']}_sync_*")):
            cfg = _config(Path(path))
            if cfg["momentum"] == row["momentum"] and cfg["seed"] < 2:  # the base seeds decide
                sync.setdefault(cfg["lr"], []).append(_load(Path(path) / "summary.json")["val_loss"])
        assert len(sync) >= 2  # the lr is searched at this momentum, not fixed
        assert sorted(sync) == row["lrs"]
        assert row["lr"] == min(sync, key=lambda lr: np.mean(sync[lr]))
        assert bool(row["censored"].get("sync")) == (row["lr"] in (min(sync), max(sync)))


def test_ablation_numbers_recomputed(made):
    out, rep = made
    part = _parts(rep)["ablations"]
    rows = part["rows"]
    assert rows["warmup"] and rows["length"] and rows["dc"]
    for r in rows["warmup"] + rows["length"]:
        (n0, a), (n1, b) = r["settings"].items()
        for name, st in ((n0, a), (n1, b)):
            sync, delayed = _seed_vals(out, st["runs"]["sync"]), _seed_vals(out, st["runs"]["delayed"])
            ef = _seed_vals(out, st["runs"]["ef"])
            assert _close(st["gap"]["mean"], np.mean([delayed[k] - sync[k] for k in sorted(sync)]))
            s, d, e = (np.mean(list(v.values())) for v in (sync, delayed, ef))
            assert _close(st["recovered"]["ratio_of_means"], 100 * (d - e) / (d - s), 1e-7)
            for f in st["runs"]["delayed"]:
                cfg = _config(out / f)
                if name.startswith("warmup-") and name != n0:
                    assert cfg["warmup"] == round(int(name[len("warmup-"):-1]) / 100 * cfg["steps"])
                if name.startswith("length-") and name != n0:
                    assert cfg["steps"] == int(name[len("length-"):-1]) * _load(out / "reproduce.json")["llm"]["base"]["steps"]
        assert _close(r["gap_change"]["mean"], b["gap"]["mean"] - a["gap"]["mean"])
    for r in rows["dc"]:
        for f in r["runs"][r["variant"]]:
            cfg = _config(out / f)
            assert cfg["correction"] == ("dc-asgd-a" if r["lambda"] is None else "dc-asgd")
            if r["lambda"] is not None:
                assert cfg["dc_lambda"] == r["lambda"]


def test_longer_run_overhead_against_the_1x_sync_run(made):
    """The 2x delayed run's tokens to reach the 1x sync run's final val loss, by hand."""
    out, rep = made
    for r in _parts(rep)["ablations"]["rows"]["length"]:
        (n0, a), (n1, b) = r["settings"].items()
        per = []
        for fs, fd in zip(sorted(a["runs"]["sync"]), sorted(b["runs"]["delayed"])):
            lines = lambda f: [json.loads(x) for x in (out / f / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
            sync = [(x["tokens"], x["val_loss"]) for x in lines(fs) if "val_loss" in x]
            dl = [(x["tokens"], x["val_loss"]) for x in lines(fd) if "val_loss" in x]
            target, t_sync = sync[-1][1], sync[-1][0]
            i = next((k for k, (_, v) in enumerate(dl) if v <= target), None)
            if i is None or i == 0:
                per.append(None)
                continue
            (t0, v0), (t1, v1) = dl[i - 1], dl[i]
            per.append((t0 + (v0 - target) / (v0 - v1) * (t1 - t0)) / t_sync)
        got = r["overhead_vs_1x_sync"]["delayed"]
        for mine, theirs, reached in zip(per, got["values"], got["reached"]):
            if mine is not None:
                assert reached and _close(mine, theirs, 1e-9)


def test_axis_recomputed(made):
    """Each axis point: its updates give the stated tokens per parameter, its lr is the scan's best
    (grown at an edge), its gap and EF recovery are the runs' own."""
    out, rep = made
    part = _parts(rep)["scale"]
    spec = _load(out / "reproduce.json")["scale"]
    assert [(e["size"], e["tokens_per_param"]) for e in part["rows"]] == [
        (size, r) for size in spec["sizes"] for r in spec["ratios"] if r <= spec["max_ratio"].get(size, r)]
    for e in part["rows"]:
        batch = spec["batch_size"][e["size"]]
        assert e["steps"] == round(e["tokens_per_param"] * e["params"] / (batch * spec["block_size"]))
        for opt, st in e["optimizers"].items():
            cfgs = [_config(out / f) for f in st["runs"]["sync"]]
            assert all((c["preset"], c["steps"], c["batch_size"]) == (e["size"], e["steps"], batch) for c in cfgs)
            scan = {}
            for lr in st["lr_scan"]["lrs"]:
                folder = out / "llm" / f"axis-{e['size']}-{e['tokens_per_param']:g}tpp" / "cells" / \
                    f"{opt}_sync_lr{lr:g}_m{spec['momentum'][opt]:g}_s0"
                scan[lr] = _load(folder / "summary.json")["val_loss"]
            assert st["lr"] == min(scan, key=scan.get)
            sync, delayed = _seed_vals(out, st["runs"]["sync"]), _seed_vals(out, st["runs"]["delayed"])
            ef = _seed_vals(out, st["runs"]["ef"])
            assert _close(st["gap"]["mean"], np.mean([delayed[k] - sync[k] for k in sorted(sync)]))
            s, d, f = (np.mean(list(v.values())) for v in (sync, delayed, ef))
            assert _close(st["recovered"]["ratio_of_means"], 100 * (d - f) / (d - s), 1e-7)
    for t in part["trends"].values():
        assert t["direction"] in ("n/a", "no resolved change") or t["change"]["sign"] != 0


def test_theory_column_and_verdicts_follow_the_one_rule(made):
    out, rep = made
    col = rep["theory_column"]
    assert {n["id"] for n in col} == set(range(1, 9))
    md = (out / "report.md").read_text()
    assert "## Theory column" in md
    for n in col:
        if n["note"] in ("qualitative", "sketch"):
            assert n["state"] is None and n["score"] is None
        elif n["score"] is not None:
            sc = n["score"]
            assert n["state"] == state(sc["interval"], sc["predicted"], sc["null"], censored=sc["censored"],
                                       issues=sc["issues"])
    for part in rep["parts"]:
        for v in part["verdicts"]:
            if v["score"] is not None:
                sc = v["score"]
                assert v["state"] == state(sc["interval"], sc["predicted"], sc["null"], censored=sc["censored"],
                                           issues=sc["issues"])
                if part["id"] in (1, 2, 3, 4, 5):  # ci's GPT runs are too short for the protocol
                    assert sc["issues"] and v["state"] == "undetermined"
    # the numbers come from the theory modules, not from the report
    from delaylab.reproduce import predict

    lr = next(n for n in col if n["quantity"] == "adamw: best delayed lr / best sync lr")
    assert _close(lr["predicted"], predict.adam_stable_range(0.9, 1) / predict.adam_stable_range(0.9, 0))
    sched = [n for n in col if n["id"] == 5]
    assert sched and all(_close(n["predicted"], 0.5) and n["note"] == "sketch" for n in sched)  # ci: depth 2


def test_runs_jsonl_alone_recomputes_the_headline_numbers(made):
    """runs.jsonl lists every GPT run with the fields the issue names; tests/reproduce/recompute.py
    (plain Python, no delaylab) recomputes the report's gaps, recoveries and axis gaps from it."""
    import recompute as R

    out, rep = made
    runs = R.load(out / "runs.jsonl")
    fields = {"optimizer", "mode", "correction", "delay", "lr", "momentum", "seed", "preset", "params", "steps",
              "tokens", "tokens_per_param", "val_loss", "val_curve"}
    gpt = [r for r in runs if r["kind"] == "gpt"]
    assert all(fields <= set(r) for r in gpt)
    folders = {r["folder"] for r in gpt}
    assert len(folders) == len(gpt) == len(list(out.glob("llm/*/cells/*/summary.json")))  # every GPT run, once
    for r in gpt[:5]:
        assert r["val_loss"] == _val(out, r["folder"]) and r["val_curve"][-1][1] == r["val_loss"]
    parts = _parts(rep)
    for row in parts["optimizers"]["rows"]:
        m, ci = R.gap_at_best_sync_lr(runs, row["optimizer"], row["momentum"])
        assert _close(m, row["gap"]["mean"]) and np.allclose(ci, row["gap"]["ci"], rtol=1e-9)
    for row in parts["mitigations"]["rows"]:
        value, ci = R.ef_recovery(runs, row["optimizer"], row["momentum"])
        rec = row["ef_recovered"]
        assert _close(value, rec["ratio_of_means"], 1e-9)
        assert (ci is None and rec["ci"] is None) or np.allclose(ci, rec["ci"], rtol=1e-9)
    for t in parts["mitigations"]["ef_tuned"]:
        value, ci = R.ef_recovery(runs, t["optimizer"], 0.9 if t["optimizer"] == "adamw" else 0.95, tuned=True)
        assert _close(value, t["recovered"], 1e-9)
        assert (ci is None and t["ci"] is None) or np.allclose(ci, t["ci"], rtol=1e-9)
    for e in parts["scale"]["rows"]:
        for opt, st in e["optimizers"].items():
            m, ci = R.axis_gap(runs, opt, e["size"], e["tokens_per_param"], 0.9 if opt == "adamw" else 0.95)
            assert _close(m, st["gap"]["mean"]) and np.allclose(ci, st["gap"]["ci"], rtol=1e-9)
    held, n = R.toy_holds(runs)
    assert parts["toy"]["headline"].startswith(f"{held}/{n} settings")


def test_after_settle_no_run_folder_is_opened(made):
    """The Ledger settled from the run folders builds the report on disk with the folders gone, and
    the Ledger read back from runs.jsonl (and report.json, sessions.jsonl) renders the same report."""
    from delaylab._io import dumps
    from delaylab.reproduce import ledger, report
    from delaylab.reproduce.presets import get_preset

    out, rep = made
    on_disk = _load(out / "report.json")
    sessions = [json.loads(x) for x in (out / "sessions.jsonl").read_text().splitlines()]
    book = ledger.settle(get_preset("ci"), out, sessions)
    away = out.with_name(out.name + "-away")
    out.rename(away)
    try:
        built = json.loads(dumps(report.build(book)))
        assert not out.exists()
    finally:
        away.rename(out)
    assert built == on_disk
    assert (out / "report.md").read_text() == markdown(built)
    again = ledger.read(out)
    assert again.carried == {}  # a runs.jsonl the Ledger wrote holds everything: nothing taken from report.json
    assert json.loads(dumps(report.build(again))) == on_disk
    assert again.decisions() == book.decisions() and book.decisions()["best_sync"]


def test_rescore_of_a_committed_report_is_a_fixed_point_and_a_missing_report_exits_2(tmp_path, capsys):
    """The committed report.md is what this version's rule renders from its report.json: re-scoring a
    copy changes no verdict and no byte of either file."""
    import shutil

    from delaylab.cli import main

    src = Path(__file__).resolve().parents[2] / "docs" / "reproduce" / "cpu-delays"
    shutil.copytree(src, tmp_path / "r")
    assert main(["reproduce", "--rescore", "--out", str(tmp_path / "r"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changes"] == []
    for name in ("report.json", "report.md"):
        assert (tmp_path / "r" / name).read_text() == (src / name).read_text(), name
    assert main(["reproduce", "--rescore", "--out", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "report.json not found" in err
