"""check_step: the same train steps in torch and JAX, compared tensor by tensor; float32 noise told
from real divergences (check_parity and check_step); what cannot be carried across, in one line.

Models: the zoo's tiny ResNet (6 residual blocks down to 1x1 maps: at batch 4 the BatchNorms
normalise over 4 values per channel), a Linen MLP with dropout, and a hand-made stand-in for a
flaxport.translate translation (fake_translation.py). The LSTM classifier is in test_recurrent.py.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
jax.config.update("jax_default_matmul_precision", "highest")

import fake_translation  # noqa: E402  (imports torch)
import port_zoo  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from flaxport import nn as fpnn  # noqa: E402
from flaxport.errors import UserError  # noqa: E402
from flaxport.port import (UnsupportedLossError, UnsupportedOptimizerError, UnsupportedSchedulerError,  # noqa: E402
                           build_key_map, check_parity, check_step)
from flaxport.port.dropout import DropoutMismatchError  # noqa: E402
from flaxport.port.losses import table_loss  # noqa: E402


def _snapshot(module, opt=None, sched=None):
    state = {k: v.clone() for k, v in module.state_dict().items()}
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in module.named_parameters()}
    opt_state = ({id(p): {k: v.clone() if hasattr(v, "clone") else v for k, v in s.items()}
                  for p, s in opt.state.items()} if opt is not None else None)
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] if opt is not None else None
    return state, grads, opt_state, groups, (sched.state_dict() if sched is not None else None), module.training


def _assert_same(a, b):
    (s1, g1, o1, gr1, sc1, t1), (s2, g2, o2, gr2, sc2, t2) = a, b
    assert s1.keys() == s2.keys() and all(torch.equal(s1[k], s2[k]) for k in s1)
    assert all((g1[k] is None and g2[k] is None) or torch.equal(g1[k], g2[k]) for k in g1)
    if o1 is not None:
        assert o1.keys() == o2.keys()
        for p in o1:
            assert all(torch.equal(o1[p][k], o2[p][k]) if hasattr(o1[p][k], "clone") else o1[p][k] == o2[p][k]
                       for k in o1[p])
    assert gr1 == gr2 and sc1 == sc2 and t1 == t2


# --------------------------------------------------------------------------- the tiny ResNet (1x1 maps)
@pytest.fixture(scope="module")
def tiny_resnet():
    torch.manual_seed(0)
    tm = port_zoo.randomize_norms(port_zoo.TorchTinyResNet(), 0)
    fm = port_zoo.FlaxTinyResNet()
    x = port_zoo.image((4, 3, 8, 8))
    return tm, fm, x, build_key_map(tm, fm, x)


@pytest.mark.slow
def test_parity_float32_rounding_is_told_from_a_real_divergence(tiny_resnet):
    """BatchNorm over 1x1 maps at batch 4: a correct port fails dozens of float32 rows (train mode,
    1e-5), each of which passes in float64; the report is OK and says why. With a real bug (one
    BatchNorm's running variance ported wrong) the first float32 failure is still a noisy row, and
    the first divergence the report names is the real one further down."""
    tm, fm, x, km = tiny_resnet
    variables = km.to_flax(tm.state_dict())
    report = check_parity(tm, fm, variables, x, train=True, key_map=km)
    failing = [r for r in report.rows if not r.ok]
    assert len(failing) >= 20 and all(r.rounding for r in failing), str(report)
    assert report.ok and not report.strict_ok and report.first_divergence is None
    assert all("float32 rounding (passes in float64 at" in r.cause for r in failing)
    assert report.float64_report.strict_ok
    assert any("normalises over 4 values per channel" in w and "entry 28" in w for w in report.why)
    text = str(report)
    assert "OK (" in text.splitlines()[0] and "float64 recheck:" in text and "why float32 differs here" in text

    variables["batch_stats"]["blocks_5"]["bn2"]["var"] = variables["batch_stats"]["blocks_5"]["bn2"]["var"] * 1.5
    report = check_parity(tm, fm, variables, x, train=True, key_map=km)
    first32 = next(r for r in report.rows if not r.ok)
    assert first32.rounding  # float32's first failure is noise ...
    first = report.first_divergence  # ... the report names the real one
    assert (first.phase, first.torch_name) == ("running_stats", "blocks.5.bn2.running_var"), str(report)
    assert first.cause.startswith("real divergence (fails in float64 too") and not report.ok
    assert "FIRST DIVERGENCE at torch 'blocks.5.bn2.running_var'" in str(report).splitlines()[0]


@pytest.mark.slow
def test_resnet_three_adam_steps_float32_rows_classified_float64_exact(tiny_resnet):
    """check_step with the hand-written Linen twin, 3 Adam steps: float32 rows off are each float32
    rounding, and in float64 every loss, gradient, statistic, parameter and moment agrees to 1e-8."""
    tm, fm, x, km = tiny_resnet
    before = _snapshot(tm)
    opt = torch.optim.Adam(tm.parameters(), lr=1e-3)
    report = check_step(tm, opt, F.cross_entropy, fm, (x, torch.tensor([0, 1, 2, 3])), steps=3, key_map=km)
    assert report.ok, str(report)
    assert all(r.rounding for r in report.rows if not r.ok)
    f64 = report.float64_report
    assert f64 is not None and f64.dtype == "float64" and f64.strict_ok
    assert max(r.max_abs for r in f64.rows) < 1e-8
    phases = {r.phase for r in f64.rows}
    assert phases == {"loss", "grad", "running_stats", "param", "moment"}
    assert {r.torch_name for r in f64.rows if r.phase == "moment"} >= {"exp_avg[fc.weight]", "exp_avg_sq[fc.bias]"}
    assert report.loss == "F.cross_entropy from flaxport's loss table"
    _assert_same(before, _snapshot(tm))


# --------------------------------------------------------------------------- a Linen MLP with dropout
class TorchDropMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(5, 12)
        self.drop = torch.nn.Dropout(0.4)
        self.fc2 = torch.nn.Linear(12, 3)

    def forward(self, x):
        return self.fc2(F.dropout(torch.tanh(self.drop(self.fc1(x))), 0.2, self.training))


class FlaxDropMLP(nn.Module):
    drops: int = 2

    @nn.compact
    def __call__(self, x, train: bool):
        h = nn.Dropout(0.4, deterministic=not train)(fpnn.Dense(12, name="fc1")(x))
        h = jnp.tanh(h)
        if self.drops == 2:
            h = nn.Dropout(0.2, deterministic=not train)(h)
        return fpnn.Dense(3, name="fc2")(h)


def _mlp(dtype=torch.float64):
    torch.manual_seed(0)
    tm = TorchDropMLP().to(dtype)
    x = torch.randn(6, 5, dtype=dtype)
    return tm, x, torch.randint(0, 3, (6,))


def test_state_carried_scheduler_and_dropout_masks_float64():
    """An optimizer that has stepped (SGD nesterov momentum under OneCycleLR, its momentum cycled):
    its buffers and the scheduler's count are carried, dropout (nn.Dropout and F.dropout) draws
    the same masks on both sides; the torch module, optimizer and scheduler come back unchanged."""
    tm, x, y = _mlp()
    opt = torch.optim.SGD(tm.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.3, total_steps=10)
    for _ in range(2):
        opt.zero_grad()
        F.cross_entropy(tm(x), y).backward()
        opt.step()
        sched.step()
    before = _snapshot(tm, opt, sched)
    with jax.enable_x64(True):
        report = check_step(tm, opt, torch.nn.CrossEntropyLoss(label_smoothing=0.1), FlaxDropMLP(), (x, y),
                            steps=3, scheduler=sched, atol=1e-12, rtol=1e-12)
    assert report.strict_ok, str(report)
    assert "masks made equal" in report.dropout and "2 calls a forward" in report.dropout
    assert "OneCycleLR" in report.optimizer
    assert report.loss.startswith("nn.CrossEntropyLoss from flaxport's loss table")
    assert {r.torch_name for r in report.rows if r.phase == "moment"} == {
        f"momentum_buffer[{n}]" for n, _ in tm.named_parameters()}
    _assert_same(before, _snapshot(tm, opt, sched))


def test_dropout_off_and_mismatch():
    tm, x, y = _mlp()
    with jax.enable_x64(True):
        report = check_step(tm, torch.optim.Adam(tm.parameters()), F.cross_entropy, FlaxDropMLP(), (x, y), steps=1,
                            dropout="off", atol=1e-12, rtol=1e-12)
        assert report.strict_ok and report.dropout.startswith("off on both sides"), str(report)
        with pytest.raises(DropoutMismatchError, match="torch applies dropout 2 times in one forward, the Flax "
                                                       "model 1") as e:
            check_step(tm, torch.optim.Adam(tm.parameters()), F.cross_entropy, FlaxDropMLP(drops=1), (x, y), steps=1)
    assert "\n" not in str(e.value)


def test_flax_kwargs_rngs_in_train_mode():
    """flax_kwargs={'rngs': ...} is taken (it used to raise a TypeError), and dropout is still matched."""
    tm, x, _ = _mlp(torch.float32)
    fm = FlaxDropMLP()
    km = build_key_map(tm, fm, x, flax_kwargs={"rngs": {"dropout": jax.random.key(1)}})
    for rngs in ({"dropout": jax.random.key(1)}, jax.random.key(2), 3):
        report = check_parity(tm, fm, km.to_flax(tm.state_dict()), x, train=True, key_map=km,
                              flax_kwargs={"rngs": rngs})
        assert report.strict_ok and "masks made equal" in report.dropout, str(report)
    off = check_parity(tm, fm, km.to_flax(tm.state_dict()), x, train=True, key_map=km, dropout="off")
    assert off.strict_ok and "dropout: off on both sides" in str(off)


# --------------------------------------------------------------------------- a translation
def test_translation_adamw_steplr_float32_and_float64():
    """A translation (the fake one: nnx model, load_state_dict, state_dict(tree)): BatchNorm
    statistics with num_batches_tracked, AdamW under StepLR, dropout masks made equal; float32 rows
    classified and float64 exact. The translation's model keeps its weights and its mode."""
    from flax import nnx

    torch.manual_seed(0)
    tm = fake_translation.TorchNet()
    t = fake_translation.FakeTranslation(tm.eval())
    tm.train()
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    def values(model):
        return [np.asarray(jax.random.key_data(a) if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key) else a)
                for a in jax.tree.leaves(nnx.state(model))]

    before = values(t.model)
    opt = torch.optim.AdamW(tm.parameters(), lr=1e-2)
    report = check_step(tm, opt, F.cross_entropy, t, (x, y), steps=3,
                        scheduler=torch.optim.lr_scheduler.StepLR(opt, 2, 0.5))
    assert report.ok, str(report)
    assert {"bn.num_batches_tracked", "bn.running_var"} <= {r.torch_name for r in report.rows
                                                            if r.phase == "running_stats"}
    assert "masks made equal" in report.dropout
    assert {r.flax_name for r in report.rows if r.phase == "param"} >= {"fc1/kernel", "bn/weight"}
    assert all(np.array_equal(a, b) for a, b in zip(before, values(t.model)))
    assert t.model.bn.use_running_average and t.model.drop.deterministic  # still in eval mode
    # float32's rows off (BatchNorm over 8 values, AdamW on the zero-gradient fc1.bias) were rechecked
    # in float64, where the translation's weights are float64 too: every row within 1e-10
    assert not report.strict_ok and report.float64_report is not None, str(report)
    assert max(r.max_abs for r in report.float64_report.rows) < 1e-10


# --------------------------------------------------------------------------- what cannot be carried across
def test_what_cannot_be_carried_across_is_one_line():
    tm, x, y = _mlp(torch.float32)
    fm = FlaxDropMLP()
    adam = torch.optim.Adam(tm.parameters())
    cases = [
        (UnsupportedLossError, r"the loss .*<lambda> is not one of the torch losses check_step carries .*"
                               r"pass flax_loss_fn=.*translate_function",
         dict(loss_fn=lambda out, t: F.cross_entropy(out, t) if out.sum() > 0 else out.abs().mean(), opt=adam)),
        (UnsupportedOptimizerError, r"LBFGS is not translated: LBFGS re-evaluates the loss .*optax.lbfgs",
         dict(loss_fn=F.cross_entropy, opt=torch.optim.LBFGS(tm.parameters()))),
        (UnsupportedSchedulerError, r"ReduceLROnPlateau is not translated: it lowers the rate when a metric",
         dict(loss_fn=F.cross_entropy, opt=adam, scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(adam))),
    ]
    for error, message, kw in cases:
        with pytest.raises(error, match=message) as e:
            check_step(tm, kw["opt"], kw["loss_fn"], fm, (x, y), steps=1, scheduler=kw.get("scheduler"))
        assert isinstance(e.value, UserError) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="jax x64 is off"):
        check_step(tm.double(), torch.optim.SGD(tm.parameters(), lr=0.1), F.cross_entropy, fm, (x.double(), y))


LOSSES = {
    "cross_entropy": (F.cross_entropy, "class"),
    "cross_entropy_module": (torch.nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 0.5]).double(),
                                                       ignore_index=1, reduction="mean"), "class"),
    "cross_entropy_smoothing_sum": (torch.nn.CrossEntropyLoss(label_smoothing=0.2, reduction="sum"), "class"),
    "cross_entropy_3d": (torch.nn.CrossEntropyLoss(label_smoothing=0.1), "class3d"),
    "nll": (torch.nn.NLLLoss(weight=torch.tensor([0.3, 1.0, 2.0]).double()), "class"),
    "mse": (F.mse_loss, "same"), "l1_sum": (torch.nn.L1Loss(reduction="sum"), "same"),
    "bce_logits": (torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor([1.5, 0.5, 2.0]).double()), "binary"),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_table_matches_torch_float64(name):
    """The losses check_step carries without flaxport.translate, with their options, in float64."""
    loss_fn, kind = LOSSES[name]
    g = torch.Generator().manual_seed(0)
    out = torch.randn((7, 3, 4) if kind == "class3d" else (7, 3), generator=g, dtype=torch.float64)
    target = {"class": torch.randint(0, 3, (7,), generator=g), "class3d": torch.randint(0, 3, (7, 4), generator=g),
              "same": torch.randn(7, 3, generator=g, dtype=torch.float64),
              "binary": torch.randint(0, 2, (7, 3), generator=g).double()}[kind]
    fn, _ = table_loss(loss_fn)
    want = loss_fn(out, target).item()
    with jax.enable_x64(True):
        got = float(fn(jnp.asarray(out.numpy()), jnp.asarray(target.numpy())))
    assert got == pytest.approx(want, rel=1e-12, abs=1e-14)


def test_recheck_says_when_the_flax_side_cannot_compute_in_float64():
    """A Flax twin with a dtype fixed to float32 stays float32 under float64 weights: the recheck
    cannot tell rounding from bugs, says so, and the float32 verdict stands."""
    class Fixed(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = jnp.tanh(nn.Dense(8, dtype=jnp.float32, name="fc1")(x))
            return nn.Dense(3, dtype=jnp.float32, name="fc2")(h) + 1e-3  # and a bug
    class Torch(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(5, 8), torch.nn.Linear(8, 3)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)))

    tm, x = Torch(), torch.randn(4, 5)
    report = check_parity(tm, Fixed(), build_key_map(tm, Fixed(), x).to_flax(tm.state_dict()), x)
    assert not report.ok and report.recheck.startswith("not possible: with float64 weights and inputs the Flax "
                                                       "side still computes in float32"), str(report)
