"""`delaylab llm spectrum`: the file, its figure, and the Hessian-vector product against finite differences."""

from __future__ import annotations

import json

import numpy as np
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
    """The double-backward HVP (math attention) against central differences of the gradient, float64."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from delaylab.llm.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=32, n_layer=1, n_head=2, d_model=16, block_size=8)).double()
    x = torch.randint(0, 32, (2, 8))
    y = torch.randint(0, 32, (2, 8))
    params = list(model.parameters())
    v = [torch.randn_like(p) for p in params]

    def grad():
        with sdpa_kernel(SDPBackend.MATH):
            return torch.autograd.grad(model(x, y)[1], params, create_graph=True)

    g = grad()
    with sdpa_kernel(SDPBackend.MATH):
        hv = torch.autograd.grad(g, params, grad_outputs=v)
    eps = 1e-5
    with torch.no_grad():
        for p, d in zip(params, v):
            p.add_(eps * d)
    gp = [t.detach() for t in grad()]
    with torch.no_grad():
        for p, d in zip(params, v):
            p.sub_(2 * eps * d)
    gm = [t.detach() for t in grad()]
    fd = np.concatenate([((a - b) / (2 * eps)).reshape(-1).numpy() for a, b in zip(gp, gm)])
    exact = np.concatenate([t.reshape(-1).numpy() for t in hv])
    assert np.abs(fd - exact).max() < 1e-6 * max(1.0, np.abs(exact).max())
