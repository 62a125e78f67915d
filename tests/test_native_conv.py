"""flaxport.kernels: the FFI convolution against lax.conv, its fallbacks, its build errors."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from flaxport import kernels
from flaxport.kernels.conv import native_conv2d, supported
from flaxport.nn.conv import conv2d

pytestmark = pytest.mark.skipif(not kernels.available(), reason=f"no native kernels: {kernels.unavailable_reason()}")


def _lax_conv(x, kernel, padding):
    return lax.conv_general_dilated(x, kernel, (1, 1), ((padding, padding), (padding, padding)),
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    precision=lax.Precision.HIGHEST)


def _value_and_grads(conv, x, kernel, padding, cotangent):
    y, vjp = jax.vjp(lambda a, b: conv(a, b, padding), x, kernel)
    return (y, *vjp(cotangent))


# (batch, height, width, cin, cout, k, padding): register-tile tails (widths 13, 7),
# channel blocks of 1-4 vectors (16..80), an RGB input (its input gradient goes to XLA),
# a 1x1 shortcut, a 1x1 with a 1 MB weight (its gradients are XLA's dots), a 5x5 kernel and
# an unpadded ("valid") conv.
SHAPES = [(2, 7, 9, 16, 16, 3, 1), (1, 5, 5, 3, 32, 3, 1), (2, 6, 6, 35, 48, 1, 0), (2, 3, 4, 512, 512, 1, 0),
          (3, 8, 8, 32, 80, 3, 1), (1, 4, 13, 16, 64, 5, 2), (2, 5, 7, 16, 32, 3, 0)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_values_and_both_gradients_match_lax_conv(shape):
    n, h, w, cin, cout, k, p = shape
    rng = np.random.default_rng(sum(shape))
    x = jnp.asarray(rng.standard_normal((n, h, w, cin)), jnp.float32)
    kernel = jnp.asarray(rng.standard_normal((k, k, cin, cout)) / np.sqrt(k * k * cin), jnp.float32)
    ho, wo = h + 2 * p - k + 1, w + 2 * p - k + 1
    cotangent = jnp.asarray(rng.standard_normal((n, ho, wo, cout)), jnp.float32)
    assert supported(x.shape, kernel.shape, 1, p, x.dtype, kernel.dtype)
    got = jax.jit(lambda x, k, c: _value_and_grads(native_conv2d, x, k, p, c))(x, kernel, cotangent)
    want = _value_and_grads(_lax_conv, x, kernel, p, cotangent)
    for name, g, r in zip(("y", "dx", "dw"), got, want):
        assert g.shape == r.shape, name
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(r))), err_msg=name)


def _lowered(x, kshape, stride, **kw):
    return jax.jit(lambda x, k: conv2d(x, k, 1, stride, **kw)).lower(x, jnp.ones(kshape, jnp.float32)).as_text()


def test_conv2d_runs_every_float32_conv_on_the_kernels_and_falls_back_for_float64():
    x = jnp.ones((1, 6, 6, 16), jnp.float32)
    # stride 2 and 10 output channels run on the kernels too, with im2col's numbers
    for stride, kshape in ((1, (3, 3, 16, 32)), (2, (3, 3, 16, 32)), (1, (3, 3, 16, 10))):
        assert "flaxport_conv_fwd" in _lowered(x, kshape, stride, impl="native")
        k = jnp.asarray(np.random.default_rng(0).standard_normal(kshape), jnp.float32)
        np.testing.assert_allclose(conv2d(x, k, 1, stride, "native"), conv2d(x, k, 1, stride, "im2col"), rtol=1e-5,
                                   atol=1e-5)
    assert not supported((1, 6, 6, 16), (3, 3, 16, 32), 1, 1, jnp.float32, jnp.float64)


def test_inside_scan_equals_outside():
    rng = np.random.default_rng(3)
    xs = jnp.asarray(rng.standard_normal((3, 2, 8, 8, 16)), jnp.float32)
    kernel = jnp.asarray(rng.standard_normal((3, 3, 16, 16)) * 0.1, jnp.float32)
    loss = lambda k, x: jnp.sum(native_conv2d(x, k, 1) ** 2)  # noqa: E731

    def body(k, x):
        g = jax.grad(loss)(k, x)
        return k - 0.01 * g, g

    _, scanned = jax.jit(lambda k: lax.scan(body, k, xs))(kernel)
    k, unrolled = kernel, []
    for x in xs:
        k, g = jax.jit(body)(k, x)
        unrolled.append(g)
    np.testing.assert_array_equal(scanned, jnp.stack(unrolled))


def _conv_problem():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((8, 16, 16, 32)), jnp.float32)
    kernel = jnp.asarray(rng.standard_normal((3, 3, 32, 64)) * 0.05, jnp.float32)
    return x, kernel


def _native_grads(x, kernel):
    """(y, dx, dw) for the cotangent cos(y): only the kernels sum (no XLA reduction)."""
    def f(x, k):
        y, vjp = jax.vjp(lambda a, b: native_conv2d(a, b, 1), x, k)
        return (y, *vjp(jnp.cos(y)))
    return jax.jit(f)(x, kernel)


_THREADED = textwrap.dedent("""
    import sys, numpy as np, jax
    sys.path.insert(0, sys.argv[2])
    from test_native_conv import _conv_problem, _native_grads
    assert jax.devices()[0].platform == "cpu"
    runs = [jax.tree.leaves(_native_grads(*_conv_problem())) for _ in range(4)]
    np.savez(sys.argv[1], *runs[0], same=all(
        all(np.array_equal(a, b) for a, b in zip(run, runs[0])) for run in runs))
""")


def test_same_bits_with_a_pool_of_two_threads_as_with_one(tmp_path):
    """The test process runs XLA on one thread (conftest); a fresh process gets the full
    pool, so the kernels split their work. The weight gradient sums per-thread parts: in a
    fixed order, so every call, and every thread count, gives the same bits."""
    out = tmp_path / "threaded.npz"
    proc = subprocess.run([sys.executable, "-c", _THREADED, str(out), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    threaded = np.load(out)
    assert bool(threaded["same"]), "two-thread calls differ from each other"
    here = jax.tree.leaves(_native_grads(*_conv_problem()))
    for i, a in enumerate(here):
        np.testing.assert_array_equal(threaded[f"arr_{i}"], a)
    x, kernel = _conv_problem()  # and the numbers are right
    y = _lax_conv(x, kernel, 1)
    want = _value_and_grads(_lax_conv, x, kernel, 1, jnp.cos(y))
    for g, r in zip(here, want):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-5 * float(jnp.max(jnp.abs(r))))


_BROKEN_BUILD = textwrap.dedent("""
    import jax.numpy as jnp, numpy as np
    from flaxport import kernels
    from flaxport.nn.conv import conv2d
    x = jnp.ones((1, 5, 5, 16)); k = jnp.asarray(np.random.default_rng(0).standard_normal((3, 3, 16, 16)), jnp.float32)
    np.testing.assert_allclose(conv2d(x, k, 1, 1, "native"), conv2d(x, k, 1, 1, "im2col"), rtol=1e-6)
    print("reason:", kernels.unavailable_reason())
""")


@pytest.mark.parametrize("env,reason", [({"CXX": "/bin/false"}, "building conv_cpu.cc, pack_cpu.cc, depthwise_cpu.cc failed"),
                                        ({"FLAXPORT_NATIVE": "0"}, "FLAXPORT_NATIVE=0")])
def test_no_kernels_means_pure_jax_and_one_line_saying_why(tmp_path, env, reason):
    full_env = {**os.environ, "FLAXPORT_CACHE": str(tmp_path), **env}
    proc = subprocess.run([sys.executable, "-c", _BROKEN_BUILD], capture_output=True, text=True, timeout=300,
                          env=full_env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert reason in proc.stdout
    if env.get("CXX"):
        lines = [line for line in proc.stderr.splitlines() if "flaxport" in line]
        assert lines == [f"flaxport: native CPU conv kernels unavailable ({kernels_reason(proc.stdout)}); "
                         "using pure JAX"]
        assert not list(tmp_path.glob("kernels/*.so")) and not list(tmp_path.glob("kernels/*.tmp*"))


def kernels_reason(stdout: str) -> str:
    return stdout.split("reason: ", 1)[1].strip()


def test_an_empty_batch_gives_empty_outputs_and_zero_weight_gradient():
    x = jnp.zeros((0, 6, 6, 16), jnp.float32)
    kernel = jnp.ones((3, 3, 16, 16), jnp.float32)
    y, vjp = jax.vjp(lambda a, b: native_conv2d(a, b, 1), x, kernel)
    dx, dw = vjp(jnp.zeros_like(y))
    assert y.shape == (0, 6, 6, 16) and dx.shape == x.shape
    np.testing.assert_array_equal(dw, np.zeros((3, 3, 16, 16), np.float32))
