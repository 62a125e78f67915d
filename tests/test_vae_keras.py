"""The Keras 3 VAE twin against the Flax one (and so, through test_vae_parity, torch).

From the same weights, batch and noise, the loss and every gradient agree to 1e-5, on
Keras's JAX backend (in this process) and its torch backend (a subprocess: Keras picks
its backend once per process, at import).
"""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxport.workloads.vae import config as config_lib
from flaxport.workloads.vae import convert, step

os.environ.setdefault("KERAS_BACKEND", "jax")  # as model_keras does; ~/.keras/keras.json may say tensorflow
pytest.importorskip("keras")
pytestmark = pytest.mark.keras
jax.config.update("jax_default_matmul_precision", "highest")

TOL = dict(rtol=1e-5, atol=1e-5)


def _inputs(config, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.random((config.batch_size, config.image_size ** 2)) < 0.3).astype(np.float32)
    return x, rng.normal(size=(config.batch_size, config.latents)).astype(np.float32)


def _flax_reference(config, variables, x, eps):
    state = step.init_state(config, jax.random.key(0))
    (loss, _), grads = jax.value_and_grad(
        lambda p: step.loss_fn(state.apply_fn, p, jnp.asarray(x), jnp.asarray(eps)), has_aux=True)(
        jax.tree.map(jnp.asarray, variables["params"]))
    flat = {}
    for keras_layer, (part, layer) in convert.KERAS_LAYERS.items():
        for name in ("kernel", "bias"):
            flat[f"{keras_layer}.{name}"] = np.asarray(grads[part][layer][name])
    return float(loss), flat


@pytest.fixture(scope="module")
def config():
    return config_lib.get_config("default")


def test_jax_backend_matches_flax(config):
    from flaxport.workloads.vae import model_keras

    import keras

    if keras.backend.backend() != "jax":
        pytest.skip(f"this process runs Keras on {keras.backend.backend()}")
    net = model_keras.vae(config)
    variables = convert.keras_to_flax(net)  # Keras's own (torch-law) init, carried to Flax
    x, eps = _inputs(config)
    loss, grads = model_keras.loss_and_grads(net, x, eps)
    want_loss, want = _flax_reference(config, variables, x, eps)
    assert loss == pytest.approx(want_loss, rel=1e-6)
    assert sorted(grads) == sorted(want)
    for k in want:
        np.testing.assert_allclose(grads[k], want[k], err_msg=k, **TOL)


def test_round_trip_through_keras(config):
    from flaxport.workloads.vae import model_keras

    net = model_keras.vae(config)
    state = step.init_state(config, jax.random.key(3))
    convert.flax_to_keras(state.variables(), net)
    back = convert.keras_to_flax(net)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(back["params"])):
        np.testing.assert_array_equal(np.asarray(a), b)
    bad = {"params": jax.tree.map(lambda a: a, state.params)}
    bad["params"]["decoder"]["fc2"] = {**bad["params"]["decoder"]["fc2"], "bias": jnp.zeros(10)}
    with pytest.raises(ValueError, match="dec_fc2/bias"):
        convert.flax_to_keras(bad, net)


_TORCH_SCRIPT = r"""
import json, sys
import numpy as np
from flaxport.workloads.vae import config as config_lib, convert, model_keras
import keras
assert keras.backend.backend() == "torch", keras.backend.backend()
d = np.load(sys.argv[1], allow_pickle=False)
config = config_lib.get_config("default")
net = model_keras.vae(config)
params = {"encoder": {}, "decoder": {}}
for k in d.files:
    if k.startswith("p:"):
        _, part, layer, name = k.split(":")
        params[part].setdefault(layer, {})[name] = d[k]
convert.flax_to_keras({"params": params}, net)
loss, grads = model_keras.loss_and_grads(net, d["x"], d["eps"])
np.savez(sys.argv[2], loss=np.float64(loss), **{"g:" + k: v for k, v in grads.items()})
"""


def test_torch_backend_matches_flax(config, tmp_path):
    pytest.importorskip("torch")
    state = step.init_state(config, jax.random.key(1))
    x, eps = _inputs(config, 1)
    arrays = {"x": x, "eps": eps}
    for part, layers in state.params.items():
        for layer, leaves in layers.items():
            for name, v in leaves.items():
                arrays[f"p:{part}:{layer}:{name}"] = np.asarray(v)
    np.savez(tmp_path / "in.npz", **arrays)
    proc = subprocess.run([sys.executable, "-c", _TORCH_SCRIPT, tmp_path / "in.npz", tmp_path / "out.npz"],
                          capture_output=True, text=True, env={**os.environ, "KERAS_BACKEND": "torch"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = np.load(tmp_path / "out.npz")
    want_loss, want = _flax_reference(config, state.variables(), x, eps)
    assert float(out["loss"]) == pytest.approx(want_loss, rel=1e-6)
    for k in want:
        np.testing.assert_allclose(out["g:" + k], want[k], err_msg=k, **TOL)


# -- Keras's own training path: `fit` -------------------------------------------------------

def test_one_fit_step_is_one_adam_step_on_the_flax_gradient(config):
    """`fit` draws its noise from the model's SeedGenerator and steps Keras's Adam. From the
    same weights, the same noise (redrawn outside from the same seed) gives the Flax loss,
    and the update equals optax's Adam with eps / sqrt(1 - b2): Keras adds eps before the
    bias correction of v (torch and optax after it), which at step 1 scales it by that."""
    import dataclasses

    import keras
    import optax

    from flaxport.workloads.vae import step_keras

    if keras.backend.backend() != "jax":
        pytest.skip(f"this process runs Keras on {keras.backend.backend()}")
    # A large eps: Adam divides by |g| + eps, and with 1e-8 the near-zero gradients, whose
    # float32 rounding differs between the two graphs, would be scaled up to a full lr step.
    # At 1e-3 the check stays sharp: the unscaled eps would be 30x off.
    config = dataclasses.replace(config, batch_size=64, adam_eps=1e-3)
    ks = step_keras.init_state(config, seed=2)
    before = convert.keras_to_flax(ks.model)
    x, _ = _inputs(config, 2)
    metrics = step_keras.train_epoch(config, ks, {"image": x.reshape(-1, 28, 28, 1).astype(np.uint8)}, 7)
    eps = np.asarray(keras.random.normal((config.batch_size, config.latents), seed=keras.random.SeedGenerator(7)))
    state = step.init_state(config, jax.random.key(0))
    params = jax.tree.map(jnp.asarray, before["params"])
    (loss, _), grads = jax.value_and_grad(
        lambda p: step.loss_fn(state.apply_fn, p, jnp.asarray(x), jnp.asarray(eps)), has_aux=True)(params)
    assert metrics["loss"].shape == (1,)
    assert metrics["loss"][0] == pytest.approx(float(loss), rel=1e-6)
    tx = optax.adam(config.lr, b1=config.b1, b2=config.b2, eps=config.adam_eps / np.sqrt(1 - config.b2))
    updates, _ = tx.update(grads, tx.init(params), params)
    want = optax.apply_updates(params, updates)
    got = convert.keras_to_flax(ks.model)["params"]
    for (path, w), g in zip(jax.tree_util.tree_leaves_with_path(want), jax.tree.leaves(got)):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-7, err_msg=jax.tree_util.keystr(path))


def test_keras_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    import keras

    import runs
    from flaxport.harness import keras_loop
    from flaxport.workloads import registry

    if keras.backend.backend() != "jax":
        pytest.skip(f"this process runs Keras on {keras.backend.backend()}")
    wl = registry.get("vae")
    config = wl.get_config("smoke")
    kw = dict(data=wl.load_data(config), progress=False, quiet=True)
    full = keras_loop.train(wl, config, workdir=tmp_path / "full", epochs=2, **kw)
    keras_loop.train(wl, config, workdir=tmp_path / "cut", epochs=1, **kw)
    resumed = keras_loop.train(wl, config, workdir=tmp_path / "cut", epochs=2, resume=True, **kw)
    assert [h["epoch"] for h in resumed.history] == [2]
    assert runs.strip(runs.records(tmp_path / "full")) == runs.strip(runs.records(tmp_path / "cut"))
    assert full.quality == resumed.quality
    a, b = (np.load(tmp_path / d / "checkpoints" / "epoch_2.npz") for d in ("full", "cut"))
    assert len(a.files) == 1 + 1 + 10 + 22  # meta, noise state, weights, Adam (iteration, lr, m, v)
    runs.assert_same_state({k: a[k] for k in a.files}, {k: b[k] for k in b.files})
