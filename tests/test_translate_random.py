"""Forwards that draw random numbers: translated to jax.random on a `noise` stream, proved with torch's draws."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import translate_zoo as zoo  # noqa: E402


@pytest.mark.parametrize("name", zoo.SAMPLING)
def test_sampling_forward_passes_the_proof_on_torchs_draws(name):
    """Eval mode in float64 (torch's draws replayed into jax.random), then one train-mode forward
    (NoisyNet's stochastic depth draws only in training)."""
    from flaxport.translate.proof import check_train

    module, inputs, t = zoo.translated(name)
    assert t.report.ok and t.report.precision == "float64", str(t.report)
    assert t.report.max_abs < 1e-12, str(t.report)
    assert "self.noise = rngs.noise.fork()" in t.source
    train = check_train(t, module)
    assert train.ok, str(train)


def test_values_a_helper_method_returns_take_the_callers_names():
    """`mu, logvar = self.encode(x)` calls three modules in one statement: not a loop's runs."""
    module, inputs, t = zoo.translated("sampling_vae")
    assert "mu = self.fc21(" in t.source and "logvar = self.fc22(" in t.source, t.source
    assert "z = mu + jax.random.normal(self.noise(), exp.shape, dtype=exp.dtype) * exp" in t.source


def test_timms_drop_path_becomes_one_class_with_its_probability():
    """x.new_empty(shape).bernoulli_(keep_prob) then div_: a bernoulli draw of the batch's shape;
    the two DropPath instances (keep 0.9, 0.8) share a class taking `p`."""
    module, inputs, t = zoo.translated("convnext")
    src = t.source[t.source.index("class DropPath"):t.source.index("\ndef load(")]
    assert "def __init__(self, p, *, rngs: nnx.Rngs):" in src
    assert "jax.random.bernoulli(self.noise(), self.p, (x.shape[0], 1, 1, 1)).astype(x.dtype) / self.p" in src
    assert "DropPath(0.9, rngs=rngs)" in t.source and "DropPath(0.8, rngs=rngs)" in t.source


def test_the_proof_catches_a_draw_used_wrongly(monkeypatch):
    """A translation that scales torch's noise by 1.01 fails at the first module reading it."""
    from flaxport.translate import ops, translate
    from flaxport.translate.ops import Expr

    right = ops.OPS["aten.randn_like.default"]
    monkeypatch.setitem(ops.OPS, "aten.randn_like.default", lambda c, node: Expr(f"{right(c, node).text} * 1.01"))
    module, inputs = zoo.make("sampling_vae")
    report = translate(module, *inputs).report
    assert not report.ok and report.first_divergence.torch_name == "fc3", str(report)


def test_a_translation_drawing_more_than_torch_fails_the_proof_and_says_so(monkeypatch):
    from flaxport.translate import ops, translate
    from flaxport.translate.ops import Expr

    right = ops.OPS["aten.randn_like.default"]
    monkeypatch.setitem(ops.OPS, "aten.randn_like.default",
                        lambda c, node: Expr(f"({right(c, node).text} + {right(c, node).text}) / 2"))
    module, inputs = zoo.make("sampling_vae")
    report = translate(module, *inputs).report
    assert not report.ok, str(report)
    assert "random draws: the JAX side draws more random numbers than torch" in report.first_divergence.note


def test_the_translation_draws_afresh_each_call_and_as_seeded(tmp_path):
    """t.model's stream advances per call; the saved file (no flaxport, no torch) draws the same
    numbers for the same seed, other numbers for another, at another batch size too."""
    import jax.numpy as jnp

    module, (x,), t = zoo.translated("sampling_vae")
    first, second = (np.asarray(t.model(jnp.asarray(x.numpy()))[0]) for _ in range(2))
    assert first.shape == (2, 64) and not np.allclose(first, second)
    t.save(tmp_path)
    np.save(tmp_path / "x.npy", np.random.default_rng(0).random((5, 1, 8, 8), dtype=np.float32))
    zoo.run_without_flaxport_or_torch(f"""
        import json, sys
        import numpy as np
        sys.path.insert(0, {str(tmp_path)!r})
        import model as model_py
        x = np.load({str(tmp_path / "x.npy")!r})
        runs = [model_py.load({str(tmp_path)!r}, seed=s)(x)[0] for s in (1, 1, 2)]
        with open({str(tmp_path / "out.json")!r}, "w") as f:
            json.dump({{"shape": list(runs[0].shape), "same": bool(np.array_equal(runs[0], runs[1])),
                       "other": bool(not np.allclose(runs[0], runs[2]))}}, f)
    """)
    out = json.loads((tmp_path / "out.json").read_text())
    assert out == {"shape": [5, 64], "same": True, "other": True}


@pytest.mark.slow
def test_a_sampling_vae_trains_like_torch_on_torchs_draws():
    """train_step.py for Adam and the MSE of the reconstruction: check_step's 3 steps and the file's
    own step in float64, each step given the draws torch made in it."""
    from flaxport.translate.train_step import write_train_step

    module, inputs, t = zoo.translated("sampling_vae")
    step = write_train_step(t, module, "torch.optim.Adam(lr=1e-2)", "torch.nn.functional.mse_loss",
                            batch=(inputs, inputs[0].view(2, 64)))
    assert step.ok, step.markdown()
    assert {r.phase for r in step.report.rows} >= {"loss", "grad", "param", "moment"}


def test_sampling_without_a_translation_is_refused_in_one_line(tmp_path):
    """torch.multinomial in forward: exit 2 and a line naming the op, its module and source line."""
    import subprocess
    import sys

    (tmp_path / "sampler.py").write_text(
        "import torch\n"
        "class Sampler(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.logits = torch.nn.Linear(4, 6)\n"
        "    def forward(self, x):\n"
        "        return torch.multinomial(self.logits(x).softmax(-1), 2)\n")
    run = subprocess.run([sys.executable, "-m", "flaxport", "translate", "sampler.py:Sampler", "--input", "3,4",
                          "--out", str(tmp_path / "out")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert "aten.multinomial.default: random numbers (multinomial): draw the samples outside forward" in run.stderr
    assert "sampler.py:7" in run.stderr


class HalfDrop(torch.nn.Module):
    """`bernoulli_(0.5)`: p is bernoulli_'s default, so the graph leaves it out."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        x = self.proj(x)
        return x * x.new_empty((x.shape[0], 1)).bernoulli_(0.5) / 0.5


def test_an_argument_left_at_its_in_place_default_is_written():
    from flaxport.translate import translate

    t = translate(HalfDrop().train(), torch.randn(3, 4))
    assert t.report.ok, t.report.first_divergence
    assert "jax.random.bernoulli(self.noise(), 0.5," in t.source
