"""optax_from_torch: twelve steps of the translated optax optimizer (and LR scheduler) track torch.optim,
for every torch.optim optimizer but LBFGS and SparseAdam (refused in one line saying why).

A small Linear-Tanh-Linear regression in both frameworks (float64, the same weights,
the same batch), params compared after each step. The JAX side holds torch's tensors
by torch name and layout, so no port is involved: only the optimizer differs.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from flaxport.errors import UserError  # noqa: E402
from flaxport.port import UnsupportedOptimizerError, optax_from_torch, spec_from_torch  # noqa: E402

STEPS = 12


def _problem(dtype):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)).to(dtype)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 3)), rng.normal(size=(6, 2))
    return net, torch.from_numpy(x).to(dtype), torch.from_numpy(y).to(dtype)


SHAPES = {"0.weight": (5, 3), "0.bias": (5,), "2.weight": (2, 5), "2.bias": (2,)}


def _unflatten(flat):
    """One vector -> {torch name: array}. The optax side keeps all parameters in one vector:
    the optimizers are elementwise, and one shape means few op compiles (test time)."""
    out, i = {}, 0
    for k, shape in SHAPES.items():
        n = int(np.prod(shape))
        out[k], i = flat[i:i + n].reshape(shape), i + n
    return out


def _jax_loss(flat, x, y):
    p = _unflatten(flat)
    h = jnp.tanh(x @ p["0.weight"].T + p["0.bias"])
    return jnp.mean((h @ p["2.weight"].T + p["2.bias"] - y) ** 2)


def _make(make_opt, net):
    """(optimizer, scheduler or None) from a case's factory."""
    made = make_opt(net.parameters())
    return made if isinstance(made, tuple) else (made, None)


def _torch_run(net, x, y, opt, sched, steps):
    out = []
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        if sched is not None:
            sched.step()
        out.append({k: v.detach().numpy().copy() for k, v in net.named_parameters()})
    return out


def _torch_steps(make_opt, dtype=torch.float64):
    """(params after each step [{name: array}], the optimizer)."""
    net, x, y = _problem(dtype)
    opt, sched = _make(make_opt, net)
    return _torch_run(net, x, y, opt, sched, STEPS), opt


def _flat(tree):
    return jnp.concatenate([jnp.asarray(tree[k]).ravel() for k in SHAPES])


def _optax_run(tx, params, state, x, y, steps):
    grad = jax.jit(jax.grad(_jax_loss))
    xj, yj = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())
    out = []
    for _ in range(steps):
        updates, state = tx.update(grad(params, xj, yj), state, params)
        params = optax.apply_updates(params, updates)
        out.append(_unflatten(params))
    return out, state


def _optax_steps(tx, dtype=torch.float64):
    """Params after each step of `tx` from the same start: [{torch name: jax array}]."""
    net, x, y = _problem(dtype)
    params = _flat({k: v.detach().numpy() for k, v in net.named_parameters()})
    return _optax_run(tx, params, tx.init(params), x, y, STEPS)[0]


def _run_both(make_opt, dtype=torch.float64):
    """[(torch params, optax params)] after each step; the optax side translated from the torch
    optimizer (and scheduler) as they stand before the first step."""
    net, x, y = _problem(dtype)
    opt, sched = _make(make_opt, net)
    tx = optax_from_torch(opt, sched)
    params = _flat({k: v.detach().numpy() for k, v in net.named_parameters()})
    got, _ = _optax_run(tx, params, tx.init(params), x, y, STEPS)
    return list(zip(_torch_run(net, x, y, opt, sched, STEPS), got))


CASES = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum_wd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.05),
    "sgd_nesterov": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.8, nesterov=True, weight_decay=0.01),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adam_l2": lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    "adamw_default_wd": lambda p: torch.optim.AdamW(p, lr=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.3),
    "adam_decoupled": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.3, decoupled_weight_decay=True),
    "rmsprop": lambda p: torch.optim.RMSprop(p, lr=0.01),
    "rmsprop_centered_momentum_wd": lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.9, eps=1e-3, centered=True,
                                                                  momentum=0.5, weight_decay=0.1),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1),
    "adagrad_decay_wd_acc": lambda p: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.05, weight_decay=0.1,
                                                          initial_accumulator_value=0.2, eps=1e-6),
    "sgd_dampening_maximize": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.3, maximize=True),
    "adam_amsgrad": lambda p: torch.optim.Adam(p, lr=0.01, amsgrad=True, weight_decay=0.1),
    "adamw_amsgrad": lambda p: torch.optim.AdamW(p, lr=0.01, amsgrad=True),
    "adadelta_wd": lambda p: torch.optim.Adadelta(p, lr=0.5, rho=0.8, weight_decay=0.1),
    "adamax_wd": lambda p: torch.optim.Adamax(p, lr=0.01, weight_decay=0.1),
    "nadam_l2": lambda p: torch.optim.NAdam(p, lr=0.01, weight_decay=0.1, momentum_decay=0.01),
    "nadam_decoupled": lambda p: torch.optim.NAdam(p, lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
    "radam_l2": lambda p: torch.optim.RAdam(p, lr=0.01, weight_decay=0.1),  # rho_t > 5 from step 6: both branches
    "radam_decoupled": lambda p: torch.optim.RAdam(p, lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
    "asgd_averaging": lambda p: torch.optim.ASGD(p, lr=0.05, lambd=0.01, t0=4, weight_decay=0.01),
    "rprop": lambda p: torch.optim.Rprop(p, lr=0.01, etas=(0.4, 1.3), step_sizes=(1e-4, 0.02)),
}


def _with(sched, opt):
    return opt, sched(opt)


lrs = torch.optim.lr_scheduler
# Each scheduler over 12 steps, so every phase is crossed: StepLR's boundaries, the cosine's
# minimum at T_max = 8 and its way back up, OneCycle's peak and both anneals (momentum too).
SCHEDULED = {
    "steplr_sgd_momentum": lambda p: _with(lambda o: lrs.StepLR(o, step_size=3, gamma=0.5),
                                           torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01)),
    "exponentiallr_rmsprop_momentum": lambda p: _with(lambda o: lrs.ExponentialLR(o, gamma=0.8),
                                                      torch.optim.RMSprop(p, lr=0.01, momentum=0.5)),
    "cosine_adamw": lambda p: _with(lambda o: lrs.CosineAnnealingLR(o, T_max=8, eta_min=1e-3),
                                    torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)),
    "linear_warmup_adam": lambda p: _with(lambda o: lrs.LinearLR(o, start_factor=0.1, total_iters=5),
                                          torch.optim.Adam(p, lr=0.01, weight_decay=0.05)),
    "onecycle_adam_beta1": lambda p: _with(lambda o: lrs.OneCycleLR(o, max_lr=0.05, total_steps=STEPS),
                                           torch.optim.Adam(p, lr=0.01)),
    "onecycle_sgd_nesterov_linear": lambda p: _with(
        lambda o: lrs.OneCycleLR(o, max_lr=0.2, total_steps=STEPS + 2, pct_start=0.25, anneal_strategy="linear"),
        torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True)),
    "onecycle_three_phase_no_momentum_adagrad": lambda p: _with(
        lambda o: lrs.OneCycleLR(o, max_lr=0.3, total_steps=STEPS, three_phase=True, cycle_momentum=False),
        torch.optim.Adagrad(p, lr=0.1)),
    "linear_warmup_rmsprop_centered": lambda p: _with(lambda o: lrs.LinearLR(o, start_factor=0.25, end_factor=0.5,
                                                                             total_iters=6),
                                                      torch.optim.RMSprop(p, lr=0.01, centered=True)),
}


@pytest.fixture
def torch_float64():
    """torch keeps optimizer scalars (NAdam's mu_product, ASGD's eta) in its default dtype."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(saved)


@pytest.mark.parametrize("case", sorted(CASES) + sorted(SCHEDULED))
def test_twelve_steps_float64(case, torch_float64):
    with jax.enable_x64(True):
        for step, (want, got) in enumerate(_run_both({**CASES, **SCHEDULED}[case]), start=1):
            for k in want:
                assert got[k].dtype == jnp.float64
                np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-9, atol=1e-12,
                                           err_msg=f"{case} step {step} {k}")


def test_matrices_adafactor_factored_and_muon_float64(torch_float64):
    """Adafactor factors each matrix's second moment over its last two axes (a vector's is
    whole) and Muon orthogonalises each matrix in bfloat16 (as torch computes it): 8 steps on
    an MLP (bias-free for Muon, which takes matrices only), equal to torch's in float64. The
    parameters are kept per tensor here: both optimizers read each one's shape."""
    def loss(p, x, y):
        h = jnp.tanh(x @ p["0.weight"].T + p.get("0.bias", 0.0))
        return jnp.mean((h @ p["2.weight"].T + p.get("2.bias", 0.0) - y) ** 2)

    cases = {"adafactor": lambda p: torch.optim.Adafactor(p, lr=0.05, weight_decay=0.1, beta2_decay=-0.5),
             "muon": lambda p: torch.optim.Muon(p, lr=0.02, adjust_lr_fn="match_rms_adamw")}
    with jax.enable_x64(True):
        for case, make in cases.items():
            torch.manual_seed(0)
            bias = case != "muon"
            net = torch.nn.Sequential(torch.nn.Linear(3, 5, bias=bias), torch.nn.Tanh(),
                                      torch.nn.Linear(5, 2, bias=bias)).double()
            x, y = torch.randn(6, 3, dtype=torch.float64), torch.randn(6, 2, dtype=torch.float64)
            opt = make(net.parameters())
            tx = optax_from_torch(opt)
            params = {k: jnp.asarray(v.detach().numpy()) for k, v in net.named_parameters()}
            state, grad = tx.init(params), jax.jit(jax.grad(loss))
            for step in range(8):
                opt.zero_grad()
                torch.nn.functional.mse_loss(net(x), y).backward()
                opt.step()
                updates, state = tx.update(grad(params, x.numpy(), y.numpy()), state, params)
                params = optax.apply_updates(params, updates)
                for k, v in net.named_parameters():
                    np.testing.assert_allclose(np.asarray(params[k]), v.detach().numpy(), rtol=1e-9, atol=1e-12,
                                               err_msg=f"{case} step {step + 1} {k}")


def test_pitfalls_are_real():
    """What the translation avoids takes other steps: optax.adamw's default weight decay
    (1e-4; torch's is 1e-2) and optax.rmsprop's defaults (eps inside the square root)."""
    with jax.enable_x64(True):
        for case, naive in (("adamw_default_wd", optax.adamw(0.01)), ("rmsprop", optax.rmsprop(0.01, decay=0.99))):
            want = _torch_steps(CASES[case])[0][-1]
            got = _optax_steps(naive)[-1]
            assert max(np.abs(np.asarray(got[k]) - want[k]).max() for k in want) > 1e-5, case


def test_spec_and_errors():
    net, _, _ = _problem(torch.float64)
    assert spec_from_torch(torch.optim.AdamW(net.parameters()))["weight_decay"] == 0.01
    # a spec gets torch's defaults: AdamW's weight decay is 0.01
    assert isinstance(optax_from_torch({"name": "AdamW", "lr": 1e-3}), optax.GradientTransformation)
    assert issubclass(UnsupportedOptimizerError, UserError)
    bad = {
        r"LBFGS is not translated: LBFGS re-evaluates the loss through a closure": torch.optim.LBFGS(net.parameters()),
        r"SparseAdam is not translated: SparseAdam steps only on sparse gradients": torch.optim.SparseAdam(
            net.parameters()),
        r"param group 1 differs from group 0 in \['lr'\]": torch.optim.SGD(
            [{"params": net[0].parameters()}, {"params": net[2].parameters(), "lr": 0.5}], lr=0.1),
        r"adam option 'foo' is not translated": {"name": "adam", "foo": 1},
    }
    for message, opt in bad.items():
        with pytest.raises(UnsupportedOptimizerError, match=message):
            optax_from_torch(opt)


CARRY = {  # optimizer (+ scheduler) cases whose state is carried mid-run
    "adam_l2": CASES["adam_l2"], "adamw": CASES["adamw"], "sgd_nesterov": CASES["sgd_nesterov"],
    "rmsprop_centered_momentum_wd": CASES["rmsprop_centered_momentum_wd"],
    "adagrad_decay_wd_acc": CASES["adagrad_decay_wd_acc"], "onecycle_adam_beta1": SCHEDULED["onecycle_adam_beta1"],
    "steplr_sgd_momentum": SCHEDULED["steplr_sgd_momentum"], "nadam_l2": CASES["nadam_l2"],
    "asgd_averaging": CASES["asgd_averaging"], "sgd_dampening_maximize": CASES["sgd_dampening_maximize"],
    "adam_amsgrad": CASES["adam_amsgrad"], "rprop": CASES["rprop"], "adadelta_wd": CASES["adadelta_wd"],
}


@pytest.mark.parametrize("case", sorted(CARRY))
def test_state_carried_mid_run_float64(case, torch_float64):
    """torch takes 5 steps; the optax state built from the torch optimizer (moments, step, the
    scheduler's count) then takes 7 more beside torch: the same params and moments each step."""
    from flaxport.port.optim import optax_state_from_torch, optimizer_name, torch_moments

    with jax.enable_x64(True):
        net, x, y = _problem(torch.float64)
        opt, sched = _make(CARRY[case], net)
        _torch_run(net, x, y, opt, sched, 5)
        tx = optax_from_torch(opt, sched)
        params = _flat({k: v.detach().numpy() for k, v in net.named_parameters()})
        state = optax_state_from_torch(tx, opt, net, params, _flat, sched)
        want = _torch_run(net, x, y, opt, sched, 7)
        got, state = _optax_run(tx, params, state, x, y, 7)
        for k in want[-1]:
            np.testing.assert_allclose(np.asarray(got[-1][k]), want[-1][k], rtol=1e-9, atol=1e-12, err_msg=k)
        moments = torch_moments(optimizer_name(opt), state)
        names = dict(net.named_parameters())
        assert moments and set(moments) <= {k for s in opt.state.values() for k in s}
        for moment, tree in moments.items():
            for k, value in _unflatten(tree).items():
                np.testing.assert_allclose(np.asarray(value), opt.state[names[k]][moment].numpy(), rtol=1e-9,
                                           atol=1e-12, err_msg=f"{moment} {k}")


def test_optax_builtin_schedules_are_not_torchs():
    """Why CosineAnnealingLR and OneCycleLR are written out: optax.cosine_decay_schedule stays at
    eta_min after T_max where torch's cosine comes back up, and optax.cosine_onecycle_schedule peaks
    one step later than torch's OneCycleLR."""
    from flaxport.port.optimizers.schedule_links import schedules_from_torch

    def torch_lrs(make_sched, steps):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        sched, out = make_sched(opt), []
        for _ in range(steps):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return np.array(out), sched

    with jax.enable_x64(True):
        want, sched = torch_lrs(lambda o: lrs.CosineAnnealingLR(o, T_max=4), 8)
        ours = np.array([schedules_from_torch(sched)[0](k) for k in range(8)])
        np.testing.assert_allclose(ours, want, rtol=1e-12, atol=1e-15)
        assert want[6] > 0.04 and optax.cosine_decay_schedule(0.1, 4)(6) == 0  # back up vs. stays down
        want, sched = torch_lrs(lambda o: lrs.OneCycleLR(o, max_lr=1.0, total_steps=10, cycle_momentum=False), 10)
        ours = np.array([schedules_from_torch(sched)[0](k) for k in range(10)])
        np.testing.assert_allclose(ours, want, rtol=1e-12, atol=1e-15)
        builtin = np.array([optax.cosine_onecycle_schedule(10, 1.0)(k) for k in range(10)])
        assert int(np.argmax(want)) == 2 and int(np.argmax(builtin)) == 3


def test_untranslated_schedulers_are_one_line_saying_why():
    from flaxport.port.schedules import UnsupportedSchedulerError

    net, _, _ = _problem(torch.float64)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with pytest.raises(UnsupportedSchedulerError, match=r"ReduceLROnPlateau is not translated: it lowers the rate "
                                                        r"when a metric .*optax.contrib.reduce_on_plateau"):
        optax_from_torch(opt, lrs.ReduceLROnPlateau(opt))
    with pytest.raises(UnsupportedSchedulerError, match=r"MultiplicativeLR is not translated: .*LambdaLR"):
        optax_from_torch(opt, lrs.MultiplicativeLR(opt, lambda k: 0.9))
    with pytest.raises(UnsupportedSchedulerError, match=r"lr_lambda is not translated: it calls `print`"):
        optax_from_torch(opt, lrs.LambdaLR(opt, lambda k: print(k) or 1.0))
    assert issubclass(UnsupportedSchedulerError, UserError)
