"""translate in train mode: both modes captured, NNX's train()/eval() switch them.

Train-mode BatchNorm updates running statistics and num_batches_tracked as torch does
(momentum, unbiased variance, momentum=None's cumulative average), Python branches on
`self.training` become `if self.training:` in the generated class, dropout draws from
the model's `dropout` rng stream, and t.model starts in the torch module's mode.
One train-mode forward of the zoo models against torch: test_translate.py (it shares their
translations).
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch import nn  # noqa: E402

import translate_zoo as zoo  # noqa: E402


class Branchy(nn.Module):
    """A forward whose Python code differs between modes, plus BatchNorm with momentum=None."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8, momentum=None)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        h = self.bn(self.fc(x))
        if self.training:
            h = torch.relu(h) * 2.0 + 1.0
        else:
            h = torch.tanh(h)
        h = self.drop(h)
        return self.head(h)


@pytest.fixture(scope="module")
def branchy():
    from flaxport.translate import translate

    torch.manual_seed(0)
    module = zoo.randomize_batchnorm(Branchy()).eval()
    x = torch.randn(5, 6)
    return module, x, translate(module, x)


def test_python_branches_on_self_training_become_if_self_training(branchy):
    from flaxport.translate.proof import check_train

    module, x, t = branchy
    assert t.report.ok, str(t.report)
    assert "if self.training:" in t.source and "class Branchy(TorchModule):" in t.source
    report = check_train(t, module)  # train branch, and BatchNorm's cumulative average (momentum=None)
    assert report.ok, str(report)
    assert {r.torch_name for r in report.rows} >= {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}


def test_train_and_eval_switch_batchnorm_and_dropout(branchy):
    import jax.numpy as jnp

    module, x, t = branchy
    model = t.new_model()
    xj = jnp.asarray(x.numpy())
    model.eval()
    a, b = model(xj), model(xj)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # eval: deterministic
    with torch.no_grad():
        np.testing.assert_allclose(np.asarray(a), module.eval()(x).numpy(), rtol=1e-5, atol=1e-6)
    model.train()
    c, d = model(xj), model(xj)
    assert not np.allclose(np.asarray(c), np.asarray(d))  # dropout: a new mask from the `dropout` stream each call
    assert int(model.bn.num_batches_tracked[...]) == 7 + 2  # randomize_batchnorm set 7; two train calls
    model.eval()
    e = model(xj)
    assert not np.allclose(np.asarray(a), np.asarray(e))  # the running statistics moved


def test_model_starts_in_the_torch_modules_mode():
    from flaxport.translate import translate

    module, inputs = zoo.make("gan_g")
    t_eval = translate(module.eval(), *inputs, check=False)
    t_train = translate(module.train(), *inputs, check=False)
    assert t_eval.model.net.layers[1].use_running_average is True
    assert t_train.model.net.layers[1].use_running_average is False
    assert t_train.mode == "train" and t_eval.mode == "eval"


def test_dropout_streams_are_seeded_and_reproducible(branchy):
    import jax.numpy as jnp

    module, x, t = branchy
    xj = jnp.asarray(x.numpy())
    runs = []
    for seed in (0, 0, 1):
        model = t.new_model(seed=seed)
        model.train()
        runs.append(np.asarray(model(xj)))
    np.testing.assert_array_equal(runs[0], runs[1])
    assert not np.allclose(runs[0], runs[2])
