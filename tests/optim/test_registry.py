"""build_optimizer: names, the Muon/AdamW split, hyperparameter mapping, errors."""

import builtins
import re

import pytest
import torch

from delaylab.optim import OPTIMIZERS, CombinedOptimizer, LMOMomentum, build_optimizer

from tiny_model import Tiny, tiny_loss


def _value(model):
    with torch.no_grad():
        return tiny_loss(model).item()


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optimizer_builds_and_decreases_atiny_loss(name):
    torch.manual_seed(0)
    model = Tiny()
    opt = build_optimizer(name, model, lr=1e-2 if name not in ("lion",) else 1e-3)
    assert isinstance(opt, torch.optim.Optimizer)
    first = _value(model)
    for _ in range(15):
        tiny_loss(model).backward()
        opt.step()
        opt.zero_grad()
    assert _value(model) < first


def test_muon_split_sends_hidden_matrices_to_muon_only():
    model = Tiny()
    opt = build_optimizer("muon", model, ns_dtype="bfloat16")
    assert isinstance(opt, CombinedOptimizer)
    muon, adamw = opt.optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    muon_ids = {id(p) for g in muon.param_groups for p in g["params"]}
    assert muon_ids == {id(model.hidden.weight)}
    adam_ids = {id(p) for g in adamw.param_groups for p in g["params"]}
    assert {id(model.embed.weight), id(model.head.weight), id(model.norm.weight), id(model.norm.bias), id(model.hidden.bias)} == adam_ids


def test_adamw_decays_only_matrices():
    model = Tiny()
    opt = build_optimizer("adamw", model, weight_decay=0.3)
    by_wd = {g["weight_decay"]: {id(p) for p in g["params"]} for g in opt.param_groups}
    assert id(model.norm.weight) in by_wd[0.0] and id(model.hidden.weight) in by_wd[0.3]


def test_momentum_maps_to_each_optimizers_knob():
    p = [torch.zeros(3, 3, requires_grad=True)]
    assert build_optimizer("adamw", p, momentum=0.8).param_groups[0]["betas"][0] == 0.8
    assert build_optimizer("muon", p, momentum=0.8, ns_dtype="bfloat16").param_groups[0]["momentum"] == 0.8
    assert build_optimizer("muon", p, momentum=0.8, ns_dtype="float32").param_groups[0]["beta"] == 0.8
    assert build_optimizer("sgd", p, momentum=0.8).param_groups[0]["momentum"] == 0.8
    assert build_optimizer("lmo", p, momentum=0.8).param_groups[0]["beta"] == 0.8
    assert build_optimizer("lion", p, momentum=0.8).param_groups[0]["betas"][1] == 0.8


def test_errors_are_one_line_value_errors():
    p = [torch.zeros(2, 2, requires_grad=True)]
    with pytest.raises(ValueError, match="unknown optimizer"):
        build_optimizer("adamw2", p)
    with pytest.raises(ValueError, match="lr must be > 0"):
        build_optimizer("adamw", p, lr=0)
    with pytest.raises(ValueError, match="momentum"):
        build_optimizer("muon", p, momentum=1.5)
    with pytest.raises(ValueError, match="bad hyperparameters"):
        build_optimizer("sgd", p, not_a_knob=3)


def test_missing_optional_package_gives_an_install_hint(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "pytorch_optimizer":
            raise ImportError("No module named 'pytorch_optimizer'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(ImportError, match=re.escape("pip install -e '.[optimizers]'")):
        build_optimizer("lion", [torch.zeros(2, 2, requires_grad=True)])


def test_combined_state_dict_round_trip_keeps_groups_shared():
    model = Tiny()
    opt = build_optimizer("muon", model)
    tiny_loss(model).backward()
    opt.step()
    sd = opt.state_dict()
    fresh = build_optimizer("muon", model)
    fresh.load_state_dict(sd)
    assert fresh.param_groups[0] is fresh.optimizers[0].param_groups[0]


def _muon_step(w0, g, make):
    w = w0.clone().requires_grad_()
    opt = make([w])
    w.grad = g.clone()
    opt.step()
    return w.detach(), opt


def test_muon_on_float64_params_computes_in_float64():
    """torch.optim.Muon casts its Newton-Schulz input to bfloat16; on float64 parameters
    "muon" must run the same iteration in float64 (equivalence checks compare to 1e-10)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Dtypes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in (out if isinstance(out, (tuple, list)) else [out]):
                if isinstance(t, torch.Tensor):
                    self.seen.add(t.dtype)
            return out

    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(8, 6, generator=gen, dtype=torch.float64)
    g = torch.randn(8, 6, generator=gen, dtype=torch.float64)
    w = w0.clone().requires_grad_()
    opt = build_optimizer("muon", [w])
    w.grad = g.clone()
    with Dtypes() as mode:
        opt.step()
    assert mode.seen and torch.bfloat16 not in mode.seen
    # By hand, in float64: EMA momentum from 0, Nesterov, 5 quintic Newton-Schulz steps on the
    # wide orientation, Muon's scale sqrt(rows/cols).
    lr, mu, (a, b, c) = 0.02, 0.95, (3.4445, -4.7750, 2.0315)
    buf = (1 - mu) * g
    x = (g + mu * (buf - g)).T
    x = x / x.norm()
    for _ in range(5):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    expected = w0 - lr * (8 / 6) ** 0.5 * x.T
    torch.testing.assert_close(w.detach(), expected, rtol=0, atol=1e-13)
    bf16, _ = _muon_step(w0, g, lambda ps: torch.optim.Muon(ps, lr=lr, momentum=mu, nesterov=True, weight_decay=0.0))
    assert (bf16 - expected).abs().max() > 1e-5  # what the bfloat16 iteration would have given


def test_muon_on_float32_params_is_still_torch_muon():
    gen = torch.Generator().manual_seed(0)
    w0, g = torch.randn(8, 6, generator=gen), torch.randn(8, 6, generator=gen)
    ours, opt = _muon_step(w0, g, lambda ps: build_optimizer("muon", ps, ns_dtype="bfloat16"))
    ref, _ = _muon_step(w0, g, lambda ps: torch.optim.Muon(ps, lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.0))
    assert type(opt) is torch.optim.Muon and torch.equal(ours, ref)


def test_ns_dtype_auto_follows_what_the_cpu_computes_natively(monkeypatch):
    """``auto``: bfloat16 where the CPU has bf16 arithmetic (AVX512-BF16/AMX; torch's Muon), float32
    where it has not (the same method, LMOMomentum); a GPU keeps bfloat16."""
    from delaylab.optim import registry

    p = [torch.zeros(4, 3, requires_grad=True)]
    for native, kind, dtype in ((True, torch.optim.Muon, None), (False, LMOMomentum, torch.float32)):
        monkeypatch.setattr(registry, "cpu_has_native_bf16", lambda native=native: native)
        opt = build_optimizer("muon", p)
        assert type(opt) is kind and (dtype is None or opt.param_groups[0]["ns_dtype"] == dtype)
    assert registry.resolve_ns_dtype("auto", "cuda") == torch.bfloat16  # no CPU question on a GPU
    assert registry.resolve_ns_dtype("auto", "meta") == torch.bfloat16
    with pytest.raises(ValueError, match="ns_dtype must be one of auto, bfloat16, float32"):
        build_optimizer("muon", p, ns_dtype="float16")
    with pytest.raises(ValueError, match="ns_dtype is a Newton-Schulz setting"):
        build_optimizer("adamw", p, ns_dtype="float32")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_float32_newton_schulz_is_the_float64_iteration_to_float32_rounding(seed):
    """The same step as torch's Muon with the iteration in float32, against the float64 iteration
    (an independent computation). From a zero start the step is the update alone: within 4e-6 of
    the step's size (measured 0.7e-6 to 1.4e-6 over seeds 1-7), where bfloat16's is 1e-2 off (1.4e-2
    to 4e-2). From a random start the stored float32 weight adds its own rounding, 2^-24 of its size."""
    gen = torch.Generator().manual_seed(seed)
    start, g = torch.randn(16, 12, generator=gen), torch.randn(16, 12, generator=gen)
    for w0 in (torch.zeros_like(start), start):
        exact, _ = _muon_step(w0.double(), g.double(), lambda ps: build_optimizer("muon", ps))
        f32, opt = _muon_step(w0, g, lambda ps: build_optimizer("muon", ps, ns_dtype="float32"))
        bf16, _ = _muon_step(w0, g, lambda ps: build_optimizer("muon", ps, ns_dtype="bfloat16"))
        assert type(opt) is LMOMomentum
        step = (exact - w0.double()).abs().max().item()
        storage = 2.0 ** -24 * exact.abs().max().item()  # half an ulp of the largest stored weight
        err32, err16 = ((f32.double() - exact).abs().max().item(), (bf16.double() - exact).abs().max().item())
        assert err32 <= 4e-6 * step + storage, (err32 / step, storage / step)
        assert err16 > 1e-2 * step, err16 / step


def test_muon_float64_split_keeps_adamw_for_the_rest():
    model = Tiny().double()
    opt = build_optimizer("muon", model)
    lmo_part, adamw = opt.optimizers
    assert isinstance(lmo_part, LMOMomentum) and lmo_part.param_groups[0]["ns_dtype"] is None
    assert isinstance(adamw, torch.optim.AdamW)
    with pytest.raises(ValueError, match="float64"):
        build_optimizer("muon", model, adjust_lr_fn="match_rms_adamw")


def test_fused_kernels_on_cuda_parameters_only(monkeypatch):
    """On CUDA parameters AdamW (muon's AdamW part too) and SGD get torch's fused step; on the CPU
    torch's default stays (the single-tensor step every bitwise test pins), and a kernel the
    caller names wins. The device check is faked: this machine has no GPU."""
    from delaylab.optim import registry

    def fused_flags(opt):
        parts = opt.optimizers if isinstance(opt, CombinedOptimizer) else [opt]
        return [p.defaults.get("fused") for p in parts]

    assert not registry._on_cuda(list(Tiny().parameters())) and not registry._on_cuda([])
    assert fused_flags(build_optimizer("adamw", Tiny())) == [None]
    assert fused_flags(build_optimizer("sgd", Tiny())) == [None]
    monkeypatch.setattr(registry, "_on_cuda", lambda params: True)
    assert fused_flags(build_optimizer("adamw", Tiny())) == [True]
    assert fused_flags(build_optimizer("sgd", Tiny())) == [True]
    assert fused_flags(build_optimizer("muon", Tiny())) == [None, True]  # torch.optim.Muon has no fused kernel
    assert fused_flags(build_optimizer("adamw", Tiny(), foreach=True)) == [None]
