"""`delaylab llm spectrum`: the file, its figure, and the Hessian-vector product against finite differences."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from delaylab.cli import main
from delaylab.theory.nqm import read_spectrum as read

TINY = ["--preset", "tiny", "--batch-size", "4", "--block-size", "32", "--steps", "4", "--ckpt-every", "2",
        "--eval-every", "4", "--eval-batches", "2", "--log-every", "2", "--device", "cpu", "--threads", "1",
        "--progress", "false", "--optimizer", "adamw", "--lr", "0.003"]


def test_spectrum_file_and_figure(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["llm", "train", *TINY, "--out", str(run)]) == 0
    capsys.readouterr()
    png = tmp_path / "s.png"
    assert main(["llm", "spectrum", str(run), "--probes", "1", "--lanczos-steps", "4", "--batches", "1",
                 "--noise-sequences", "4", "--figure", str(png), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["checkpoints"] == [2, 4] and png.stat().st_size > 1000
    spec = read(run / "spectrum.json")
    n = spec["checkpoints"][0]["n_params"]
    for c in spec["checkpoints"]:
        for kind in ("hessian", "precond"):  # AdamW: both densities, multiplicities summing to n
            assert abs(sum(c[kind]["weights"]) - n) < 1e-6 * n
        assert c["noise_trace"] > 0 and c["noise_trace_precond"] > 0
    assert spec["init_val_loss"] > spec["checkpoints"][-1]["val_loss"]
    # bad input: one line, exit 2
    assert main(["llm", "spectrum", str(tmp_path / "nothing")]) == 2
    assert main(["llm", "spectrum", str(run), "--probes", "0"]) == 2
    assert capsys.readouterr().err.count("\n") == 2


def test_hessian_vector_product_against_finite_differences():
    """``llm.spectrum.hessian``'s product (double backward through math attention, float64), the one
    ``measure`` hands to Lanczos, against central differences of the gradient taken here by one
    backward at w +- eps v on a copy of the model; and symmetric and linear."""
    from delaylab.llm.model import GPT, GPTConfig
    from delaylab.llm.spectrum import hessian

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, n_layer=1, n_head=2, d_model=16, block_size=8)).double()
    batches = [(torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))) for _ in range(2)]
    obj, point, hvp = hessian(model, batches)
    n = sum(b.size for b in point)
    rng = np.random.default_rng(0)
    v, u = rng.standard_normal(n), rng.standard_normal(n)
    exact, hu, mixed = hvp(v), hvp(u), hvp(2 * v + u)
    twin = copy.deepcopy(model)
    params = list(twin.parameters())
    assert n == sum(p.numel() for p in params)
    with torch.no_grad():
        mean = sum(float(twin(x, y)[1]) for x, y in batches) / len(batches)
    assert obj.loss(point) == pytest.approx(mean, rel=1e-12)

    def grad_at(shift: np.ndarray) -> np.ndarray:
        """The gradient of the mean loss at w + shift, by one backward."""
        with torch.no_grad():
            for p, d in zip(params, np.split(shift, np.cumsum([p.numel() for p in params])[:-1])):
                p.add_(torch.from_numpy(d).view_as(p))
        loss = sum(twin(x, y)[1] for x, y in batches) / len(batches)
        g = np.concatenate([t.reshape(-1).numpy() for t in torch.autograd.grad(loss, params)])
        with torch.no_grad():
            for p, d in zip(params, np.split(shift, np.cumsum([p.numel() for p in params])[:-1])):
                p.sub_(torch.from_numpy(d).view_as(p))
        return g

    eps = 1e-5
    fd = (grad_at(eps * v) - grad_at(-eps * v)) / (2 * eps)
    scale = np.abs(exact).max()
    assert scale > 1e-3  # a product of zeros would pass the comparison
    assert np.abs(fd - exact).max() < 1e-6 * scale
    assert u @ exact == pytest.approx(v @ hu, rel=1e-10)  # H is symmetric
    assert np.allclose(mixed, 2 * exact + hu, rtol=1e-10, atol=1e-12 * scale)
