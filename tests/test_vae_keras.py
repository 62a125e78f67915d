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
