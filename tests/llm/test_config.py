"""The one config: flags generated from its fields, defaults in one place, resolution, legacy files."""

import json

import pytest

from delaylab.cli import build_parser
from delaylab.commands._config_flags import config_from_args
from delaylab.errors import ConfigError
from delaylab.llm.config import Config, leaf_fields

# A value other than the default for every field, as typed on the command line and as parsed.
SAMPLES = {
    "preset": ("small", "small"), "n_layer": ("3", 3), "mlp": ("swiglu", "swiglu"),
    "tie_embeddings": ("true", True), "dropout": ("0.1", 0.1), "block_size": ("16", 16),
    "dtype": ("float64", "float64"), "mlp_hidden": ("96", 96), "moe_experts": ("4", 4), "moe_top_k": ("1", 1),
    "moe_capacity_factor": ("2", 2.0), "moe_aux_loss_coef": ("0.1", 0.1),
    "data": ("a.txt", "a.txt"), "tokenizer": ("bpe", "bpe"),
    "vocab_size": ("512", 512), "text_field": ("body", "body"), "val_fraction": ("0.2", 0.2),
    "batch_size": ("8", 8), "grad_accum": ("3", 3), "optimizer": ("muon", "muon"), "lr": ("0.02", 0.02),
    "momentum": ("0.9", 0.9), "weight_decay": ("0.01", 0.01),
    "muon_ns_dtype": ("float32", "float32"), "lr_schedule": ("wsd", "wsd"),
    "warmup": ("4", 4), "min_lr_ratio": ("0.2", 0.2), "wsd_decay": ("0.3", 0.3), "delay": ("3,2,1", [3, 2, 1]),
    "delay_dist": ("uniform:4", "uniform:4"), "correction": ("ef", "ef"), "dc_lambda": ("0.5", 0.5), "dc_lambda0": ("1.5", 1.5), "dc_ms_decay": ("0.9", 0.9),
    "lookahead_momentum": ("0.5", 0.5), "damping": ("2", 2.0), "ef_dtype": ("bfloat16", "bfloat16"),
    "sync_start": ("2", 2), "sync_cooldown": ("1", 1),
    "schedule": ("pipedream", "pipedream"), "stages": ("3", 3), "timeout": ("9", 9.0), "steps": ("50", 50),
    "seed": ("7", 7), "eval_every": ("5", 5), "eval_batches": ("2", 2), "log_every": ("3", 3),
    "ckpt_every": ("0", 0), "ckpt_final": ("true", True), "compile": ("true", True),
    "deterministic": ("true", True), "peak_tflops": ("989.5", 989.5), "device": ("cpu", "cpu"),
    "threads": ("2", 2), "progress": ("false", False),
    "log": ("tensorboard", "tensorboard"), "dp": ("2", 2), "dp_shard": ("true", True),
}


def test_every_field_has_a_flag_that_sets_it():
    assert set(SAMPLES) == set(leaf_fields())  # a new field needs a sample here
    argv = ["llm", "train"]
    for name, (text, _) in SAMPLES.items():
        argv += ["--" + name.replace("_", "-"), text]
    args = build_parser().parse_args(argv)
    flat = config_from_args(args).flat()
    for name, (_, value) in SAMPLES.items():
        assert flat[name] == value, name
    for name, (_, value) in SAMPLES.items():  # and each flag alone sets only its field
        alone = config_from_args(build_parser().parse_args(
            ["llm", "train", "--" + name.replace("_", "-"), SAMPLES[name][0]])).flat()
        default = Config().flat()
        assert {k for k in alone if alone[k] != default[k]} == {name}, name


def test_help_shows_each_default_from_the_dataclass(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["llm", "pipeline", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name, (_, f) in leaf_fields().items():
        assert "--" + name.replace("_", "-") in text, name
        if f.default is not None and not isinstance(f.default, bool):
            assert f"(default {f.default})" in text, name


@pytest.mark.parametrize("flat,engine,want", [
    (dict(), "simulator", dict(delay=0, grad_accum=1, schedule=None, stages=None)),
    (dict(delay=3), "simulator", dict(delay=3, grad_accum=1, schedule=None)),
    (dict(delay=[1, 0]), "simulator", dict(stages=2, grad_accum=1)),
    (dict(schedule="2bw", stages=3, preset="small"), "simulator", dict(delay=1, grad_accum=4, stages=3)),
    (dict(), "pipeline", dict(schedule="2bw", delay=1, stages=2, grad_accum=4)),
    (dict(delay=0), "pipeline", dict(schedule="1f1b", stages=2, grad_accum=4)),
    (dict(delay=[2, 1, 0], preset="small"), "pipeline", dict(schedule="pipedream", stages=3, grad_accum=1)),
    (dict(schedule="2bw", stages=4, preset="small"), "pipeline", dict(delay=1, grad_accum=4)),
    (dict(schedule="2bw", stages=4, preset="small", n_layer=8), "pipeline", dict(grad_accum=4)),
])
def test_resolution_fills_what_the_engine_leaves_open(flat, engine, want):
    cfg = Config.from_dict(flat).resolved(engine)
    assert {k: cfg.flat()[k] for k in want} == want
    assert cfg.resolved(engine) is cfg  # validated once


@pytest.mark.parametrize("flat,engine,match", [
    (dict(delay=2), "pipeline", "no pipeline schedule gives delay 2"),
    (dict(delay=1, schedule="gpipe"), "simulator", "contradicts schedule gpipe"),
    (dict(delay=[1, 0], stages=3), "simulator", "2 stage delays but stages=3"),
    (dict(correction="dc-asgd", delay=1), "pipeline", "supports correction none or ef"),
    (dict(sync_start=2, delay=1), "pipeline", "not supported by the pipeline"),
    (dict(correction="ef", ef_dtype="bfloat16", delay=1), "pipeline", "simulator only"),
    (dict(correction="dc-asgd-a", dc_ms_decay=1.0, delay=1), "simulator", "dc_ms_decay"),
    (dict(correction="damp", damping=-1.0, delay=1), "simulator", "damping must be >= 0"),
    (dict(delay=[1, 0], tie_embeddings=True), "simulator", "per-stage delays need untied"),
])
def test_combinations_that_cannot_run_are_one_line_errors(flat, engine, match):
    with pytest.raises(ConfigError, match=match):
        Config.from_dict(flat).resolved(engine)


def test_a_config_round_trips_through_json_nested_and_flat():
    cfg = Config.from_dict(optimizer="muon", delay=[1, 0], lr=0.01).resolved()
    again = Config.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again.flat() == cfg.flat() and not cfg.differences(cfg.to_dict())
    assert Config.from_dict(cfg.flat()).flat() == cfg.flat()
    with pytest.raises(ConfigError, match="unknown config fields: mode2"):
        Config.from_dict(mode2=1)


@pytest.mark.parametrize("legacy,delay", [
    (dict(mode="sync", delay=1), 0), (dict(mode="delayed", delay=1), 1), (dict(mode="delayed", delay=[2, 0]), [2, 0]),
])
def test_configs_of_earlier_versions_still_read(legacy, delay):
    """Flat configs with the ``mode`` switch (run folders made before the nested config)."""
    cfg = Config.from_dict({**legacy, "schedule": "wsd", "microbatches": 3})
    assert (cfg.delay.delay, cfg.lr_schedule.lr_schedule, cfg.data.grad_accum) == (delay, "wsd", 3)


def test_the_simulator_offers_every_correction_of_the_wrapper():
    from delaylab.llm.config import CORRECTIONS_BY_ENGINE
    from delaylab.optim import CORRECTIONS

    assert CORRECTIONS_BY_ENGINE["simulator"] == CORRECTIONS


def test_every_numeric_field_declares_its_range_and_resolving_refuses_values_outside_it():
    """One place: each int/float field has a ``range`` in its metadata, and ``Config.resolved`` refuses,
    in one line naming the field, a value just outside each finite bound, an excluded bound itself,
    NaN and the infinities (a float field), whatever the engine."""
    import math

    from delaylab.llm.config import parse_range, range_error

    numeric = {name for name, (_, f) in leaf_fields().items()
               if {"int", "float"} & set(f.type.replace(" ", "").replace("list[int]", "int").split("|"))}
    ranged = {name for name, (_, f) in leaf_fields().items() if "range" in f.metadata}
    assert numeric == ranged and len(numeric) >= 30, numeric ^ ranged
    for name in sorted(numeric):
        _, f = leaf_fields()[name]
        text = f.metadata["range"]
        lo, lo_in, hi, hi_in = parse_range(text)
        is_int = "float" not in f.type
        step = (lambda x, d: x + d) if is_int else (lambda x, d: math.nextafter(x, d * math.inf))
        bad = []
        if math.isfinite(lo):
            bad.append(step(lo, -1) if lo_in else lo)
        if math.isfinite(hi):
            bad.append(step(hi, +1) if hi_in else hi)
        if not is_int:
            bad += [math.nan, math.inf, -math.inf]
        good = [v for v in (lo if lo_in else step(lo, +1), 1) if range_error(name, text, v) is None]
        assert good, name  # the range is not empty
        for value in bad:
            with pytest.raises(ConfigError, match=rf"^{name} must be"):
                Config.from_dict(**{name: int(value) if is_int and math.isfinite(value) else value}).resolved()
            assert range_error(name, text, value) is not None, (name, value)


def test_lookahead_momentum_and_the_other_momenta_are_in_0_1():
    for name in ("momentum", "dc_ms_decay", "lookahead_momentum"):
        with pytest.raises(ConfigError, match=rf"{name} must be in \[0, 1\), got 1.5"):
            Config.from_dict(**{name: 1.5}).resolved()


def test_resolving_reads_nothing_from_the_host_and_setup_checks_the_host_and_the_engines(monkeypatch):
    """The world size is an argument (WORLD_SIZE does not reach Config.resolved); the checks of the
    GPUs, a schedule's microbatches and FSDP2 are setup's, with the GPU count passed in."""
    from delaylab.llm.run.setup import check_engine, resolve

    monkeypatch.setenv("WORLD_SIZE", "4")
    assert Config.from_dict(batch_size=4).resolved("simulator").parallel.dp == 1
    assert Config.from_dict(batch_size=4).resolved("simulator", world_size=4).parallel.dp == 4
    assert resolve(Config.from_dict(batch_size=4, stages=2, device="cpu"), "pipeline").parallel.dp == 2
    monkeypatch.delenv("WORLD_SIZE")
    cases = [(dict(dtype="float64", device="cuda"), "simulator", 0, "CUDA"),
             (dict(dtype="float64"), "simulator", 1, "float64 is for equivalence checks on the CPU"),
             (dict(device="cuda:1"), "simulator", 1, "2 GPUs needed"),
             (dict(stages=4, preset="small", grad_accum=2), "pipeline", 0, "needs microbatches >= stages - 1"),
             (dict(dp=2, dp_shard=True, optimizer="muon", batch_size=4), "simulator", 0, "whole matrices")]
    for flat, engine, gpus, match in cases:
        cfg = Config.from_dict(flat).resolved(engine)  # the config alone accepts it
        with pytest.raises(ConfigError, match=match):
            check_engine(cfg, engine, gpus)
    check_engine(Config.from_dict(device="cuda").resolved(), "simulator", gpus=1)


def test_the_config_makes_its_correctors_once_as_objects():
    """``Config.correctors()``: the named correctors, in the registry's order, each configured from
    the delay section's fields it declares; the others' fields do not reach it."""
    cfg = Config.from_dict(delay=1, correction="damp,ef", damping=0.5, ef_dtype="bfloat16",
                           dc_lambda=0.3).resolved()
    made = cfg.correctors()
    assert [(c.name, c.hyper()) for c in made] == [("ef", {"dtype": "bfloat16", "lags": []}), ("damp", {"c": 0.5})]
    assert Config.from_dict().resolved().correctors() == []
