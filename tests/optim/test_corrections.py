"""The correctors' registry: valid lists, one-line errors (library and command line), the help
text it generates, adding a corrector with one registry line, and the acceptance run
``delaylab llm train --preset tiny --delay 1 --correction ef,damp --steps 20`` against a float64
hand recursion."""

import math
import sys
import types

import numpy as np
import pytest
import torch

from delaylab.errors import ConfigError
from delaylab.optim import Delayed, corrections
from delaylab.optim.corrections import CORRECTORS, Entry


@pytest.mark.parametrize("spec,want", [
    ("none", ()), ("", ()), ("ef", ("ef",)), ("damp, ef", ("ef", "damp")), (["damp", "ef"], ("ef", "damp")),
    ("lookahead,ef,damp", ("ef", "lookahead", "damp")), ("dc-asgd-a,damp,ef", ("ef", "dc-asgd-a", "damp")),
])
def test_a_valid_list_comes_back_in_the_order_of_application(spec, want):
    assert corrections.parse(spec) == want
    assert corrections.canonical(spec) == (",".join(want) or "none")


@pytest.mark.parametrize("spec,match", [
    ("predict,lookahead", "predict and lookahead cannot be combined: each corrects the stale gradient"),
    ("dc-asgd,dc-asgd-a", "dc-asgd and dc-asgd-a cannot be combined"),
    ("dc-asgd,predict", "dc-asgd and predict cannot be combined"),
    ("ef,ef", "names one corrector twice"),
    ("none,ef", "unknown correction 'none'"),
    ("ef,magic", "unknown correction 'magic'"),
])
def test_an_invalid_list_is_a_one_line_config_error(spec, match):
    with pytest.raises(ConfigError, match=match) as err:
        Delayed(torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1), 1, spec)
    assert "\n" not in str(err.value)


def test_the_former_keywords_go_through_one_deprecated_adapter_and_configure_each_corrector_once():
    from delaylab.optim.damping import LrDamping
    from delaylab.optim.delayed import with_keywords
    from delaylab.optim.error_feedback import ErrorFeedback

    sgd = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    for old in (dict(correction="ef,damp"), dict(ef_dtype="bfloat16"), dict(damping=0.5)):
        with pytest.raises(TypeError, match="unexpected keyword"):  # the class takes objects alone
            Delayed(sgd, 1, **old)
    with pytest.warns(DeprecationWarning, match="corrector objects"):
        opt = with_keywords(sgd, [2], correction="damp,ef", damping=0.5, ef_dtype="bfloat16", total_steps=9)
    want = Delayed(sgd, [2], [ErrorFeedback(dtype="bfloat16"), LrDamping(0.5)], total_steps=9)
    assert opt.state_dict()["delayed"] == want.state_dict()["delayed"] and opt.correction == "ef,damp"
    with pytest.warns(DeprecationWarning):
        with pytest.raises(ConfigError, match="damp is given both as an object and by keywords"):
            with_keywords(sgd, 1, [LrDamping(0.5)], damping=0.25)
        with pytest.raises(TypeError, match="unexpected keyword argument 'dampng'"):
            with_keywords(sgd, 1, "damp", dampng=0.5)
        with pytest.raises(ConfigError, match="not both"):
            with_keywords(sgd, 1, "ef", correction="damp")


@pytest.mark.parametrize("argv,match", [
    (["llm", "train", "--delay", "1", "--correction", "predict,lookahead"], "corrections predict and lookahead cannot"),
    (["llm", "train", "--delay", "1", "--correction", "ef,magic"], "unknown correction 'magic'"),
    (["llm", "pipeline", "--correction", "ef,damp"], "the pipeline supports correction none or ef, got 'ef,damp'"),
])
def test_the_command_line_rejects_an_invalid_list_in_one_line(tmp_path, capsys, argv, match):
    from delaylab.cli import main

    out = tmp_path / "run"
    assert main([*argv, "--preset", "tiny", "--steps", "2", "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and match in err
    assert not out.exists()


def test_the_config_keeps_the_list_in_the_order_of_application():
    from delaylab.llm.config import CORRECTIONS_BY_ENGINE, Config

    assert Config.from_dict(correction="damp, ef", delay=1).resolved().delay.correction == "ef,damp"
    assert CORRECTIONS_BY_ENGINE == {"simulator": ("none", *CORRECTORS),
                                     "pipeline": ("none", *(n for n, e in CORRECTORS.items() if e.lagged))}


def test_the_help_text_is_the_registry(monkeypatch):
    from delaylab.llm.config import leaf_fields

    text = corrections.help_text()
    assert leaf_fields()["correction"][1].metadata["help"] == text
    for name, entry in CORRECTORS.items():
        assert f"{name} ({entry.summary})" in text
    assert "at most one of dc-asgd, dc-asgd-a, predict, lookahead" in text
    assert "The pipeline engine runs none and ef" in text
    monkeypatch.setitem(CORRECTORS, "clip", Entry("x.Clip", "lr", "clip the lr"))
    assert "clip (clip the lr)" in corrections.help_text()
    assert "at most one of damp, clip" in corrections.help_text()


SIGN = '''
import torch
from delaylab.optim.corrector import Corrector


class SignOfStaleGradient(Corrector):
    """A made-up corrector: the inner is given the sign of the stale gradient."""

    name = "sign"

    def on_pop(self, p, st, g):
        return None if g is None else torch.sign(g)
'''


def test_a_new_corrector_is_one_file_and_one_registry_line(monkeypatch):
    module = types.ModuleType("delaylab.optim.sign")
    exec(SIGN, module.__dict__)  # the new file
    monkeypatch.setitem(sys.modules, "delaylab.optim.sign", module)
    monkeypatch.setitem(CORRECTORS, "sign", Entry("sign.SignOfStaleGradient", "gradient", "sign(g)"))  # its line

    x0, lr, b = np.array([1.0, -2.0, 0.5]), 0.1, np.random.default_rng(5).standard_normal((12, 3))
    x = torch.tensor(x0, requires_grad=True)
    opt = Delayed(torch.optim.SGD([x], lr=lr), 1, "sign,ef")
    for c in range(12):
        x.grad = torch.tensor(2 * x.detach().numpy() - b[c])
        opt.step()
    hist, u_prev = [x0], np.zeros(3)  # EF of the sign step: x_{k+1} = x_k - 2 u_k + u_{k-1}
    for k in range(11):
        u = lr * np.sign(2 * hist[max(0, k - 1)] - b[k])
        hist.append(hist[k] - 2 * u + u_prev)
        u_prev = u
    np.testing.assert_allclose(x.detach().numpy(), hist[-1], rtol=0, atol=1e-12)
    with pytest.raises(ConfigError, match="predict and sign cannot be combined"):
        corrections.parse("predict,sign")


# -- the acceptance run, in float64, against AdamW + damping + EF written out by hand -----------
ACCEPTANCE = dict(preset="tiny", delay=1, correction="ef,damp", steps=20)


def command_line_weights(out, **flags) -> dict:
    """The final weights (the last checkpoint) of ``delaylab llm train`` with ``flags``."""
    from delaylab.cli import main
    from delaylab.llm import checkpoint

    argv = ["llm", "train", *[a for k, v in flags.items() for a in ("--" + k, str(v))], "--out", str(out)]
    assert main(argv) == 0
    return checkpoint.read(out)["model"]


def ef_damp_adamw_by_hand(**flags) -> tuple[dict, dict]:
    """The weights after ``steps`` updates of

        u_k = x_k - AdamW_k(x_k; g_k, lr_k / (1 + c tau)),  x_{k+1} = x_k - 2 u_k + u_{k-1},  u_{-1} = 0,

    g_k the gradient of batch k at x_{max(0, k-1)} (autograd on the model), AdamW written out
    (torch's decoupled weight decay and bias corrections), lr_k the config's schedule, c its
    damping; the initial weights, batches and group hyperparameters are the trainer's. Returns
    the initial and the final weights."""
    from delaylab.llm.config import Config, lr_factor
    from delaylab.llm.run.trainer import Trainer

    cfg = Config.from_dict(**flags).resolved()
    trainer = Trainer(cfg)
    model = trainer.model
    params = dict(model.named_parameters())
    groups = [(set(map(id, g["params"])), g) for g in trainer.opt.param_groups]
    hyper = {n: next(g for ids, g in groups if id(p) in ids) for n, p in params.items()}
    c, tau, steps = cfg.delay.damping, 1, cfg.run.steps

    def gradient(x: dict, k: int) -> dict:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(x[n])
        model.zero_grad(set_to_none=True)
        xb, yb = trainer.setup.rows(*trainer.data.batch(k, cfg.data.batch_size, trainer.block, cfg.run.seed))
        model(xb, yb)[1].backward()
        return {n: p.grad.detach().clone() for n, p in params.items()}

    x = [{n: p.detach().clone() for n, p in params.items()}]
    zeros = lambda: {n: torch.zeros_like(t) for n, t in x[0].items()}  # noqa: E731
    m, v, u_prev = zeros(), zeros(), zeros()
    for k in range(steps):
        g = gradient(x[max(0, k - tau)], k)
        nxt = {}
        for n in params:
            h = hyper[n]
            (b1, b2), eps, wd = h["betas"], h["eps"], h["weight_decay"]
            lr = h["initial_lr"] * lr_factor(k, cfg) / (1 + c * tau)
            m[n] = b1 * m[n] + (1 - b1) * g[n]
            v[n] = b2 * v[n] + (1 - b2) * g[n] ** 2
            bc1, bc2 = 1 - b1 ** (k + 1), 1 - b2 ** (k + 1)
            after = x[k][n] * (1 - lr * wd) - lr / bc1 * m[n] / (v[n].sqrt() / math.sqrt(bc2) + eps)
            u = x[k][n] - after
            nxt[n] = x[k][n] - 2 * u + u_prev[n]
            u_prev[n] = u
        x.append(nxt)
    return x[0], x[steps]


def test_the_ef_damp_run_of_the_command_line_is_the_hand_recursion(tmp_path):
    """The acceptance command with ``--dtype float64 --device cpu``: weights to 1e-12."""
    flags = dict(ACCEPTANCE, dtype="float64", device="cpu")
    got = command_line_weights(tmp_path / "run", **flags)
    start, want = ef_damp_adamw_by_hand(**flags)
    diff = max(float((got[n] - w).abs().max()) for n, w in want.items())
    moved = min(float((w - start[n]).abs().max()) for n, w in want.items())
    assert diff < 1e-12 and moved > 1e-4, (diff, moved)
