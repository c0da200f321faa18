"""The delay correctors against recursions written out by hand, in float64, on a quadratic.

f_c(x) = x^T A x / 2 - b_c^T x with a coupled A and a batch term that changes with the call c.
Call c's gradient is taken at the weights of that call (shifted by
``Delayed.predicted_weights`` where the correction extrapolates); update k uses call k's gradient.
"""

import io

import numpy as np
import pytest
import torch

from delaylab.errors import ConfigError
from delaylab.optim import Delayed, build_optimizer
from delaylab.optim.dc_asgd import EPS
from delaylab.optim.corrections import build
from delaylab.optim.delayed import upgrade_state_dict
from delaylab.optim.error_feedback import ErrorFeedback

D = 4
A = np.array([[2.0, 0.5, 0.0, 0.3], [0.5, 1.5, 0.2, 0.0], [0.0, 0.2, 1.0, 0.4], [0.3, 0.0, 0.4, 0.8]])
B = np.random.default_rng(3).standard_normal((64, D))
X0 = np.array([1.0, -2.0, 0.5, 1.5])
LR, CALLS, TOL = 0.1, 24, 1e-12


def grad(x, c):
    return A @ x - B[c]


def drive(correction, tau, calls=CALLS, **kw):
    """SGD under Delayed on f_c; the iterate after each call."""
    x = torch.tensor(X0, requires_grad=True)
    phases = {k: kw.pop(k) for k in ("sync_start", "sync_cooldown", "total_steps") if k in kw}
    opt = Delayed(torch.optim.SGD([x], lr=LR), tau, build(correction, **kw), **phases)
    out = []
    for c in range(calls):
        before = x.detach().clone()
        with opt.predicted_weights():
            x.grad = torch.tensor(grad(x.detach().numpy(), c))
        assert torch.equal(x.detach(), before)  # the shift is undone bit for bit
        opt.step()
        out.append(x.detach().numpy().copy())
    return np.array(out), opt


def by_hand(tau, calls=CALLS, at=lambda hist, j, k: hist[j], correct=lambda g, k, x, stale: g, lr=LR):
    """x_{k+1} = x_k - lr * correct(grad(at(x_j), k)), j = max(0, k - tau); per call, as drive()."""
    hist = [X0]
    for k in range(calls - tau):
        j = max(0, k - tau)
        g = correct(grad(at(hist, j, k), k), k, hist[k], hist[j])
        hist.append(hist[k] - lr * g)
    return np.array([X0] * tau + hist[1:])


@pytest.mark.parametrize("tau", [1, 2])
def test_dc_asgd_a_is_zheng_et_al_adaptive_lambda(tau):
    lam0, m = 0.7, 0.9
    ms = {"s": np.zeros(D)}

    def correct(g, k, x, stale):
        ms["s"] = m * ms["s"] + (1 - m) * g * g
        return g + lam0 / np.sqrt(ms["s"] + EPS) * g * g * (x - stale)

    xs, opt = drive("dc-asgd-a", tau, dc_lambda0=lam0, dc_ms_decay=m)
    np.testing.assert_allclose(xs, by_hand(tau, correct=correct), rtol=0, atol=TOL)
    assert set(opt.state[opt.param_groups[0]["params"][0]]) == {"queue", "snapshots", "dc_ms"}


def _u_last(hist, j):
    return hist[j - 1] - hist[j] if j >= 1 else np.zeros(D)  # no update yet: no shift


@pytest.mark.parametrize("tau", [1, 2])
def test_weight_prediction_takes_the_gradient_at_x_minus_a_u_last(tau):
    """a = min(k, tau): the updates call k's gradient waits for (fewer while the queue fills)."""
    xs, _ = drive("predict", tau)
    ref = by_hand(tau, at=lambda hist, j, k: hist[j] - min(k, tau) * _u_last(hist, j))
    np.testing.assert_allclose(xs, ref, rtol=0, atol=TOL)


@pytest.mark.parametrize("tau", [1, 2])
def test_lookahead_takes_the_gradient_at_the_nesterov_point(tau):
    gamma = 0.6
    xs, _ = drive("lookahead", tau, lookahead_momentum=gamma)
    ref = by_hand(tau, at=lambda hist, j, k: hist[j] - gamma * _u_last(hist, j))
    np.testing.assert_allclose(xs, ref, rtol=0, atol=TOL)


@pytest.mark.parametrize("tau", [1, 2])
def test_damping_divides_the_lr_by_one_plus_c_tau(tau):
    c = 0.5
    xs, opt = drive("damp", tau, damping=c)
    np.testing.assert_allclose(xs, by_hand(tau, lr=LR / (1 + c * tau)), rtol=0, atol=TOL)
    assert opt.param_groups[0]["lr"] == LR  # the schedule's lr is restored after each update


@pytest.mark.parametrize("correction,kw", [("dc-asgd-a", {}), ("predict", {}), ("lookahead", {}),
                                           ("damp", {}), ("ef", {"ef_dtype": "bfloat16"})])
def test_each_corrector_changes_the_delayed_trajectory(correction, kw):
    plain, _ = drive("none", 1)
    xs, _ = drive(correction, 1, **kw)
    assert np.abs(xs - plain).max() > 1e-3
    assert np.array_equal(xs[0], plain[0])  # the fill call makes no update either way


def test_prediction_uses_the_update_after_the_optimizer_transform():
    """u_last is x_before - x_after of the last update: for Muon, after orthogonalization."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    opt = Delayed(build_optimizer("muon", model, lr=0.02), 1, "predict")
    for c in range(4):
        before = [p.detach().clone() for p in model.parameters()]
        (model(torch.randn(5, 6)).sin() ** 2).sum().backward()
        opt.step()
        opt.zero_grad()
    for p, b in zip(model.parameters(), before):
        assert torch.equal(opt.state[p]["u_last"], b - p.detach())


def test_lookahead_and_prediction_do_not_shift_outside_a_delayed_phase():
    xs, _ = drive("lookahead", 1, sync_start=5, total_steps=CALLS - 1)
    sync, _ = drive("none", 1, sync_start=5, total_steps=CALLS - 1)
    np.testing.assert_array_equal(xs[:6], sync[:6])  # 5 sync updates, then the fill call
    assert np.abs(xs - sync).max() > 1e-3


def test_ef_bfloat16_buffer_is_the_float32_update_with_u_rounded():
    """x_{k+1} = x_k - 2 u_k + bf16(u_{k-1}): only the kept buffer is rounded."""
    xs, opt = drive("ef", 1, ef_dtype="bfloat16")
    hist, prev = [X0], np.zeros(D)
    for k in range(CALLS - 1):
        u = LR * grad(hist[max(0, k - 1)], k)
        hist.append(hist[k] - 2 * u + prev)
        prev = torch.tensor(u).to(torch.bfloat16).double().numpy()
    np.testing.assert_allclose(xs, np.array([X0] + hist[1:]), rtol=0, atol=TOL)
    buf = opt.state[opt.param_groups[0]["params"][0]]["ef_buffer"]
    assert buf.dtype == torch.bfloat16
    full, _ = drive("ef", 1)
    assert 0 < np.abs(xs - full).max() < 1e-2  # rounding, not a different method


def test_ef_bfloat16_per_parameter_path_equals_the_whole_model_path():
    def run(whole):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        opt = Delayed(torch.optim.AdamW(model.parameters(), lr=0.01), 1, [ErrorFeedback(dtype="bfloat16")])
        if whole:
            opt._steps_per_param = lambda ef_lags: False
        gen = torch.Generator().manual_seed(1)
        for _ in range(6):
            (model(torch.randn(5, 6, generator=gen)).sin() ** 2).sum().backward()
            opt.step()
            opt.zero_grad()
        return [p.detach().clone() for p in model.parameters()]

    for a, b in zip(run(False), run(True)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
@pytest.mark.parametrize("lag", [1, 2])
def test_ef_group_hooks_equal_the_per_parameter_hooks_bit_for_bit(dtype, lag):
    """EF's group form (torch._foreach_*, the whole-model step on an accelerator) against its
    per-parameter form on the same parameters and inner steps: the same bits in the weights and
    in the buffers, from the first step (no buffer yet) on, with buffers of the params' dtype or
    of bfloat16; float64 and float32 parameters mixed."""
    from delaylab.optim.corrector import Spare, Update
    from delaylab.optim.error_feedback import ErrorFeedback

    gen = torch.Generator().manual_seed(0)
    shapes = [((5, 3), torch.float32), ((7,), torch.float32), ((4, 4), torch.float64), ((2, 3, 2), torch.float32)]
    start = [torch.randn(s, generator=gen, dtype=t) for s, t in shapes]
    per_p, grouped = [x.clone() for x in start], [x.clone() for x in start]
    ef_a, ef_b = ErrorFeedback(dtype=dtype), ErrorFeedback(dtype=dtype)
    for ef in (ef_a, ef_b):
        ef.bind([lag])
    st_a, st_b = [{} for _ in shapes], [{} for _ in shapes]
    update = Update(0, lag, True)
    for _ in range(4):
        steps = [torch.randn(s, generator=gen, dtype=t) * 1e-2 for s, t in shapes]  # the inner's updates
        toks = [ef_a.before(p, st, update, Spare()) for p, st in zip(per_p, st_a)]
        for p, d in zip(per_p, steps):
            p.sub_(d)
        for p, st, tok in zip(per_p, st_a, toks):
            ef_a.after(p, st, update, tok, Spare())
        snaps = ef_b.before_all(grouped, st_b, update, Spare(keep=False))
        for p, d in zip(grouped, steps):
            p.sub_(d)
        ef_b.after_all(grouped, st_b, update, snaps, Spare(keep=False))
        for a, b, sa, sb in zip(per_p, grouped, st_a, st_b):
            assert torch.equal(a, b)
            assert sa["ef_buffer"].dtype == sb["ef_buffer"].dtype and torch.equal(sa["ef_buffer"], sb["ef_buffer"])
    assert not torch.equal(per_p[0], start[0] - 0)  # the steps moved the weights
    assert {st["ef_buffer"].dtype for st in st_b} == ({torch.bfloat16} if dtype else {torch.float32, torch.float64})


# Bytes held across steps by a 10x10 float32 weight (400 bytes) at tau = 2: the docs' table.
MEMORY = {"none": 0, "ef": 400, "dc-asgd": 2 * 400, "dc-asgd-a": 3 * 400, "predict": 400,
          "lookahead": 400, "damp": 0}


@pytest.mark.parametrize("correction", MEMORY)
def test_corrector_bytes(correction):
    w = torch.randn(10, 10, requires_grad=True)
    opt = Delayed(torch.optim.AdamW([w], lr=0.01), 2, correction)
    for _ in range(5):
        w.grad = torch.randn(10, 10)
        opt.step()
    assert opt.corrector_bytes() == MEMORY[correction]


def test_ef_bfloat16_halves_the_ef_bytes():
    w = torch.randn(10, 10, requires_grad=True)
    opt = Delayed(torch.optim.AdamW([w], lr=0.01), 1, [ErrorFeedback(dtype="bfloat16")])
    for _ in range(3):
        w.grad = torch.randn(10, 10)
        opt.step()
    assert opt.corrector_bytes() == 200


@pytest.mark.parametrize("correction", ["dc-asgd-a", "predict", "lookahead", "damp"])
def test_resume_in_mid_run_is_bit_exact(correction):
    def make(x):
        return Delayed(torch.optim.AdamW([x], lr=0.05), 2, correction)

    def run(opt, x, calls, start=0):
        for c in range(start, start + calls):
            with opt.predicted_weights():
                x.grad = torch.tensor(grad(x.detach().numpy(), c))
            opt.step()

    x = torch.tensor(X0, requires_grad=True)
    opt = make(x)
    run(opt, x, 5)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    y = x.detach().clone().requires_grad_()
    fresh = make(y)
    fresh.load_state_dict(torch.load(buf, weights_only=False))
    run(opt, x, 6, start=5)
    run(fresh, y, 6, start=5)
    assert torch.equal(x, y)


@pytest.mark.parametrize("kw,msg", [(dict(dc_ms_decay=1.0), "dc_ms_decay"), (dict(damping=-1.0), "damping"),
                                    (dict(lookahead_momentum=-0.1), "lookahead_momentum"),
                                    (dict(ef_dtype="float8"), "ef_dtype")])
def test_bad_corrector_arguments_raise_config_errors(kw, msg):
    from delaylab.errors import ConfigError

    with pytest.raises(ConfigError, match=msg):
        Delayed(torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1), 1, build("none", **kw))


# -- combinations -------------------------------------------------------------------------------
def feed(opt, x, calls, start=0):
    """Calls ``start ..`` of f_c, each gradient taken inside ``predicted_weights``."""
    for c in range(start, start + calls):
        with opt.predicted_weights():
            x.grad = torch.tensor(grad(x.detach().numpy(), c))
        opt.step()


def saved_copy(opt) -> dict:
    """``opt.state_dict()`` through a file's bytes: a copy, as a checkpoint is."""
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def resumes_bit_for_bit(make, sd_of=saved_copy) -> dict:
    """Run ``make(x)`` 5 calls, load ``sd_of(opt)`` into a fresh ``make(y)``, run both 6 more:
    they must agree to the bit. Returns the state_dict that was loaded."""
    x = torch.tensor(X0, requires_grad=True)
    opt = make(x)
    feed(opt, x, 5)
    sd = sd_of(opt)
    y = x.detach().clone().requires_grad_()
    fresh = make(y)
    fresh.load_state_dict(sd)
    feed(opt, x, 6, start=5)
    feed(fresh, y, 6, start=5)
    assert torch.equal(x, y)
    return sd


# Documented composition (docs/correctors.md): the gradient is taken at the gradient point, the
# inner makes its update at the damped lr, EF rewrites that update, and u_last is the
# displacement actually applied (EF's included).


def ef_by_hand(tau, damping=None, shift=None, gamma=0.6, calls=CALLS):
    """x_{k+1} = x_k - (tau+1) u_k + tau u_{k-1}, u_{-1} = 0, u_k = eta * grad(z_k, k) with
    eta = LR / (1 + damping tau) and z_k = x_j - a d_j, j = max(0, k - tau), d_j = x_{j-1} - x_j
    (the applied displacement; 0 for j = 0), a = min(k, tau) (predict) or gamma (lookahead)."""
    eta = LR if damping is None else LR / (1 + damping * tau)
    hist, u_prev = [X0], np.zeros(D)
    for k in range(calls - tau):
        j = max(0, k - tau)
        z = hist[j]
        if shift is not None and j >= 1:
            z = z - (min(k, tau) if shift == "predict" else gamma) * (hist[j - 1] - hist[j])
        u = eta * grad(z, k)
        hist.append(hist[k] - (tau + 1) * u + tau * u_prev)
        u_prev = u
    return np.array([X0] * tau + hist[1:])


COMBINATIONS = {
    "ef,damp": dict(damping=0.5),
    "ef,predict": dict(shift="predict"),
    "ef,lookahead": dict(shift="lookahead"),
    "ef,predict,damp": dict(damping=0.5, shift="predict"),
}


@pytest.mark.parametrize("tau", [1, 2])
@pytest.mark.parametrize("spec", COMBINATIONS)
def test_combination_is_its_hand_recursion(spec, tau):
    kw = COMBINATIONS[spec]
    xs, opt = drive(spec, tau, damping=kw.get("damping"), lookahead_momentum=0.6)
    np.testing.assert_allclose(xs, ef_by_hand(tau, **kw), rtol=0, atol=TOL)
    assert opt.correction == spec and opt.param_groups[0]["lr"] == LR


@pytest.mark.parametrize("tau", [1, 2])
def test_prediction_under_ef_extrapolates_the_applied_displacement_not_the_inner_update(tau):
    """The alternative (u_last = the inner's u_{j-1}) is a different trajectory: the test above
    tells the two apart."""
    hist, us = [X0], [np.zeros(D)]
    for k in range(CALLS - tau):
        j = max(0, k - tau)
        u = LR * grad(hist[j] - min(k, tau) * us[j], k)
        hist.append(hist[k] - (tau + 1) * u + tau * us[-1])
        us.append(u)
    xs, _ = drive("ef,predict", tau)
    assert np.abs(xs - np.array([X0] * tau + hist[1:])).max() > 1e-4


def test_the_list_order_and_the_form_do_not_change_the_result():
    from delaylab.optim.damping import LrDamping
    from delaylab.optim.error_feedback import ErrorFeedback

    ref, _ = drive("ef,damp", 2, damping=0.5, ef_dtype="bfloat16")
    for spec in ("damp,ef", ["damp", "ef"], [LrDamping(0.5), ErrorFeedback(dtype="bfloat16")]):
        kw = {} if not isinstance(spec[0], str) else dict(damping=0.5, ef_dtype="bfloat16")
        xs, opt = drive(spec, 2, **kw)
        np.testing.assert_array_equal(xs, ref)
        assert opt.correction == "ef,damp"


def test_a_corrector_object_is_copied_into_each_wrapper():
    from delaylab.optim.error_feedback import ErrorFeedback

    ef = ErrorFeedback()
    a = Delayed(torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1), 1, [ef])
    b = Delayed(torch.optim.SGD([{"params": [torch.zeros(2, requires_grad=True)]},
                                 {"params": [torch.zeros(1, requires_grad=True)]}], lr=0.1), [2, 0], [ef])
    assert (a.ef_lags, b.ef_lags, ef.lags) == ([1], [2, 0], [])


@pytest.mark.parametrize("spec", ["ef,damp", "dc-asgd-a,ef", "ef,predict,damp"])
def test_two_or_three_correctors_resume_in_mid_queue_bit_for_bit(spec):
    saved = resumes_bit_for_bit(lambda x: Delayed(torch.optim.AdamW([x], lr=0.05), 2, build(spec, damping=0.5)))
    assert len(saved["delayed"]["buffers"][0]["queue"]) == 2  # mid-queue: two gradients waiting
    held = saved["delayed"]["corrections"]  # each corrector's configuration, in the order they apply
    assert list(held) == [n for n in ("ef", "dc-asgd-a", "predict", "damp") if n in spec.split(",")]
    assert held["ef"] == {"dtype": "float32", "lags": [2]} and held.get("damp", {"c": 0.5}) == {"c": 0.5}
    other = Delayed(torch.optim.AdamW([torch.zeros(D, dtype=torch.float64, requires_grad=True)], lr=0.05), 2,
                    build(spec, damping=0.5, ef_dtype="bfloat16"))
    with pytest.raises(ValueError, match="saved with"):  # another configuration: not this run's state
        other.load_state_dict(saved)


def _old_format(opt, correction, *, hyper=True, **old):
    """``opt.state_dict()`` rewritten in the format of main 514494e (one ``correction`` name and
    the Delayed keywords as fields); ``hyper=False``: the format before ddb4321 (no ``ef_dtype``,
    no ``hyper``)."""
    sd = saved_copy(opt)
    ours = sd["delayed"]
    fields = {"delays": ours["delays"], "correction": correction, "ef_lags": old.pop("ef_lags", ours["delays"]),
              "sync_start": ours["sync_start"], "sync_cooldown": ours["sync_cooldown"],
              "total_steps": ours["total_steps"], "dc_lambda": old.pop("dc_lambda", 0.04)}
    if hyper:
        fields["ef_dtype"] = old.pop("ef_dtype", "float32")
        fields["hyper"] = {"dc_lambda0": 2.0, "dc_ms_decay": 0.95, "damping": 1.0, "lookahead_momentum": 0.99, **old}
    fields.update({k: ours[k] for k in ("updates", "queued", "updated", "buffers")})
    return {"inner": sd["inner"], "delayed": fields}


@pytest.mark.parametrize("correction,kw,hyper", [
    ("none", {}, True), ("ef", {"ef_dtype": "bfloat16"}, True), ("dc-asgd-a", {"dc_ms_decay": 0.9}, True),
    ("damp", {"damping": 0.5}, True), ("lookahead", {"lookahead_momentum": 0.6}, True),
    ("ef", {}, False), ("dc-asgd", {"dc_lambda": 0.5}, False),
])
def test_a_state_dict_of_the_one_correction_format_loads_through_the_adapter(correction, kw, hyper):
    """The class refuses the old format in one line; ``upgrade_state_dict`` (deprecated, outside the
    class) converts it, and the run resumes bit for bit."""
    def make(x):
        return Delayed(torch.optim.AdamW([x], lr=0.05), 2, build(correction, **kw))

    old = {}

    def upgraded(opt):
        old.update(_old_format(opt, correction, hyper=hyper, **kw))
        with pytest.raises(ConfigError, match="upgrade_state_dict"):
            make(torch.zeros(D, dtype=torch.float64, requires_grad=True)).load_state_dict(old)
        with pytest.warns(DeprecationWarning, match="one-correction format"):
            return upgrade_state_dict(old)

    new = resumes_bit_for_bit(make, upgraded)
    assert "corrections" not in old["delayed"] and upgrade_state_dict(new) is new
    # Another corrector, or this one at its default hyperparameters: not the saved run.
    other = correction if kw else "none" if correction != "none" else "ef"
    with pytest.raises(ValueError, match="saved with"):
        Delayed(torch.optim.AdamW([torch.zeros(D, dtype=torch.float64, requires_grad=True)], lr=0.05), 2,
                other).load_state_dict(new)
