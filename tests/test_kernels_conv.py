"""flaxport.kernels.conv against torch: every kind of convolution a CNN holds, values and both gradients.

The kernels run float32; torch computes the reference in float64 (the sums the kernels must
reproduce), so a row fails on anything but float32 rounding.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flaxport import kernels

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(not kernels.available(), reason=f"no native kernels: {kernels.unavailable_reason()}")]

from flaxport.kernels.conv import convolution, runs  # noqa: E402

# (name, batch, spatial size, in channels, out channels, kernel, stride, padding, dilation, groups)
CASES = [
    ("3x3", 2, (7, 9), 16, 16, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    ("stem 7x7/2 rgb", 2, (11, 11), 3, 24, (7, 7), (2, 2), (3, 3), (1, 1), 1),
    ("3x3/2, 10 out", 2, (9, 8), 8, 10, (3, 3), (2, 2), (1, 1), (1, 1), 1),
    ("1x1/2 projection", 2, (8, 8), 20, 36, (1, 1), (2, 2), (0, 0), (1, 1), 1),
    ("1x1, 40 out", 3, (5, 6), 24, 40, (1, 1), (1, 1), (0, 0), (1, 1), 1),
    ("1x7", 1, (10, 9), 8, 12, (1, 7), (1, 1), (0, 3), (1, 1), 1),
    ("7x1", 1, (10, 9), 8, 12, (7, 1), (1, 1), (3, 0), (1, 1), 1),
    ("dilated 2", 2, (9, 9), 16, 16, (3, 3), (1, 1), (2, 2), (2, 2), 1),
    ("stride 3x2, dilation 2x3", 2, (11, 10), 16, 16, (3, 3), (3, 2), (1, 2), (2, 3), 1),
    ("4x4/2, wider than the image", 2, (3, 3), 4, 8, (5, 5), (2, 2), (2, 2), (1, 1), 1),
    ("64 out, 4 vectors", 2, (6, 6), 16, 64, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    ("96 out, 3+3 vectors", 1, (5, 5), 8, 96, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    ("80 out, 5 vectors", 1, (5, 5), 8, 80, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    ("grouped 2", 2, (8, 8), 48, 96, (3, 3), (2, 2), (1, 1), (1, 1), 2),
    ("grouped 8, 4 a group", 2, (8, 8), 32, 32, (3, 3), (1, 1), (1, 1), (1, 1), 8),
    ("grouped 3, 8 a group", 2, (8, 8), 24, 24, (3, 3), (1, 1), (1, 1), (1, 1), 3),
    ("depthwise 3x3, 18", 2, (8, 8), 18, 18, (3, 3), (1, 1), (1, 1), (1, 1), 18),
    ("depthwise 5x5/2, 40", 2, (9, 9), 40, 40, (5, 5), (2, 2), (2, 2), (1, 1), 40),
    ("depthwise 7x7, 35", 2, (12, 12), 35, 35, (7, 7), (1, 1), (3, 3), (1, 1), 35),
    ("depthwise 3x3/2x1 dilated", 2, (9, 9), 17, 17, (3, 3), (2, 1), (2, 1), (2, 1), 17),
    ("depthwise multiplier 2", 2, (6, 6), 8, 16, (3, 3), (1, 1), (1, 1), (1, 1), 8),
    ("3x3, 24 out, two partial sums", 4, (24, 24), 8, 24, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    ("window the whole input (VGG's head)", 2, (7, 7), 32, 40, (7, 7), (1, 1), (0, 0), (1, 1), 1),
    ("1x1 on a 1x1 map", 3, (1, 1), 24, 40, (1, 1), (1, 1), (0, 0), (1, 1), 1),
    # a 1x1 weight of 1 MB or more: the gradients are XLA's dots (every s-th cell for a stride)
    ("1x1, a 1 MB weight", 2, (4, 5), 512, 512, (1, 1), (1, 1), (0, 0), (1, 1), 1),
    ("1x1/2 projection, a 2 MB weight", 2, (7, 6), 512, 1024, (1, 1), (2, 2), (0, 0), (1, 1), 1),
    ("whole 5x3 window, stride 2", 2, (5, 3), 8, 12, (5, 3), (2, 2), (0, 0), (1, 1), 1),
    # outputs of 4 MB and more are written past the caches (non-temporal stores)
    ("1x1 to 256 channels, output streamed", 2, (64, 64), 16, 256, (1, 1), (1, 1), (0, 0), (1, 1), 1),
    ("3x3 from 256 channels, input gradient streamed", 2, (48, 48), 256, 16, (3, 3), (1, 1), (1, 1), (1, 1), 1),
]


def _torch_conv(x, w, case):
    _, _, _, _, _, _, stride, padding, dilation, groups = case
    if w.ndim == 3:
        return torch.nn.functional.conv1d(x, w, None, stride[1], padding[1], dilation[1], groups)
    return torch.nn.functional.conv2d(x, w, None, stride, padding, dilation, groups)


def _check(case, one_d=False):
    name, n, (h, w), cin, cout, (kh, kw), stride, padding, dilation, groups = case
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    x = rng.standard_normal((n, cin, w) if one_d else (n, cin, h, w))
    weight = rng.standard_normal((cout, cin // groups, kw) if one_d else (cout, cin // groups, kh, kw))
    weight /= np.sqrt(cin // groups * kh * kw)
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(weight, requires_grad=True)
    y = _torch_conv(xt, wt, case)
    cotangent = rng.standard_normal(y.shape)
    dx, dw = torch.autograd.grad(y, (xt, wt), torch.tensor(cotangent))
    want = [y.detach().numpy(), dx.numpy(), dw.numpy()]

    axes = 1 if one_d else 2
    pads = [(p, p) for p in padding][-axes:]
    args = (stride[-axes:], pads, dilation[-axes:], groups)

    def channels_last(a):
        return jnp.asarray(np.moveaxis(a, 1, -1), jnp.float32)

    x32, w32 = channels_last(x), jnp.asarray(weight, jnp.float32)
    assert runs(x32, w32, *args)

    def f(x, w, c):
        y, vjp = jax.vjp(lambda a, b: convolution(a, b, args[0], args[1], args[2], args[3]), x, w)
        return (y, *vjp(c))

    got = jax.jit(f)(x32, w32, channels_last(cotangent))
    got = [np.moveaxis(np.asarray(got[0]), -1, 1), np.moveaxis(np.asarray(got[1]), -1, 1), np.asarray(got[2])]
    for part, g, r in zip(("y", "dx", "dw"), got, want):
        assert g.shape == r.shape, (name, part)
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=2e-5 * np.max(np.abs(r)), err_msg=f"{name}: {part}")


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_values_and_both_gradients_match_torch(case):
    _check(case)


@pytest.mark.parametrize("case", [c for c in CASES if c[5][0] == 1 or c[0].startswith("depthwise 7")],
                         ids=lambda c: c[0])
def test_one_dimensional_convolutions_match_torch(case):
    _check(case, one_d=True)


def test_a_window_over_the_whole_input_is_a_matrix_product_and_others_stay_on_the_kernels():
    """The whole-window case is XLA's dot on the weights as they lie (no pack, no FFI call);
    padding, groups or a smaller window keep the kernels."""
    x, w = jnp.ones((2, 7, 7, 8), jnp.float32), jnp.ones((4, 8, 7, 7), jnp.float32)

    def calls(x, w, padding=((0, 0), (0, 0)), groups=1):
        def loss(x, w):
            return convolution(x, w, (1, 1), padding, (1, 1), groups).sum()
        return str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, w))

    assert "ffi_call" not in calls(x, w) and "dot_general" in calls(x, w)
    assert "ffi_call" in calls(x, w, padding=((1, 1), (1, 1)))
    assert "ffi_call" in calls(x, jnp.ones((4, 4, 7, 7), jnp.float32), groups=2)
    assert "ffi_call" in calls(jnp.ones((2, 9, 9, 8), jnp.float32), w)


def test_a_large_1x1_weight_s_gradients_are_matrix_products_and_a_small_one_s_stay_on_the_kernels():
    """From a 1 MB weight on, packing it (swapped, for dx) and the kernels' weight gradient cost
    more than XLA's dots on the weight as it lies (ResNeXt-101 32x8d's train step at 64x64:
    764 -> 542 ms); the forward stays on the kernel, a padded 1x1 on the kernels too."""
    def backward(x, w, padding=((0, 0), (0, 0))):
        def loss(x, w):
            return convolution(x, w, (1, 1), padding, (1, 1), 1).sum()
        text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, w))
        return text.count("flaxport_conv_fwd"), text.count("flaxport_conv_dw"), "dot_general" in text

    x = jnp.ones((2, 4, 4, 512), jnp.float32)
    assert backward(x, jnp.ones((512, 512, 1, 1), jnp.float32)) == (1, 0, True)
    assert backward(x, jnp.ones((511, 512, 1, 1), jnp.float32)) == (2, 1, False)
    assert backward(x, jnp.ones((512, 512, 1, 1), jnp.float32), ((1, 1), (1, 1))) == (2, 1, False)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in ("3x3/2, 10 out", "grouped 2", "depthwise 5x5/2, 40",
                                                                "1x1, a 1 MB weight")], ids=lambda c: c[0])
def test_bfloat16_runs_on_the_kernels_with_float32_sums_rounded_once(case):
    """bfloat16 products are exact in float32: the value and both gradients are the exact sums
    of the bfloat16 operands (torch in float64) rounded to bfloat16, off by at most one of its
    steps where a sum lies near the midpoint of two."""
    name, n, (h, w), cin, cout, (kh, kw), stride, padding, dilation, groups = case
    rng = np.random.default_rng(1)
    rounded = [np.asarray(jnp.asarray(a, jnp.bfloat16), np.float64) for a in (
        rng.standard_normal((n, cin, h, w)), rng.standard_normal((cout, cin // groups, kh, kw)) / np.sqrt(kh * kw))]
    xt, wt = (torch.tensor(a, requires_grad=True) for a in rounded)
    y = _torch_conv(xt, wt, case)
    cotangent = np.asarray(jnp.asarray(rng.standard_normal(y.shape), jnp.bfloat16), np.float64)
    want = [y.detach().numpy(), *(g.numpy() for g in torch.autograd.grad(y, (xt, wt), torch.tensor(cotangent)))]

    def bf16_last(a):
        return jnp.asarray(np.moveaxis(a, 1, -1), jnp.bfloat16)

    args = (stride, [(p, p) for p in padding], dilation, groups)
    x16, w16 = bf16_last(rounded[0]), jnp.asarray(rounded[1], jnp.bfloat16)
    assert runs(x16, w16, *args)

    def f(x, w, c):
        y, vjp = jax.vjp(lambda a, b: convolution(a, b, *args), x, w)
        return (y, *vjp(c))

    assert "ffi_call" in str(jax.make_jaxpr(f)(x16, w16, bf16_last(cotangent)))
    got = jax.jit(f)(x16, w16, bf16_last(cotangent))
    assert all(g.dtype == jnp.bfloat16 for g in got)
    got = [np.moveaxis(np.asarray(got[0], np.float64), -1, 1), np.moveaxis(np.asarray(got[1], np.float64), -1, 1),
           np.asarray(got[2], np.float64)]
    for part, g, r in zip(("y", "dx", "dw"), got, want):
        step = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(r), 1e-30))) - 7)  # bfloat16's spacing at r
        assert np.all(np.abs(g - r) <= step + 1e-6 * np.max(np.abs(r))), f"{name}: {part}"


def test_an_empty_batch_gives_empty_outputs_and_zero_weight_gradients():
    for groups, cin, cout, k in ((1, 16, 16, 3), (16, 16, 16, 3), (1, 512, 512, 1)):
        x = jnp.zeros((0, 6, 6, cin), jnp.float32)
        w = jnp.ones((cout, cin // groups, k, k), jnp.float32)
        pads = [(k // 2, k // 2)] * 2
        y, vjp = jax.vjp(lambda a, b: convolution(a, b, (2, 2), pads, (1, 1), groups), x, w)
        dx, dw = vjp(jnp.zeros_like(y))
        assert y.shape == (0, 3, 3, cout) and dx.shape == x.shape
        np.testing.assert_array_equal(dw, np.zeros(w.shape, np.float32))


def _temp_bytes(layers: int, gradient: bool) -> int:
    """XLA's temporary buffer for a chain of `layers` 3x3 convolutions, 64 to 64 channels (a
    packed weight is 147 kB), run forward or with both gradients."""
    x = jnp.ones((2, 8, 8, 64), jnp.float32)
    weights = [jnp.ones((64, 64, 3, 3), jnp.float32) for _ in range(layers)]

    def chain(x, weights):
        for w in weights:
            x = convolution(x, w, (1, 1), [(1, 1), (1, 1)], (1, 1), 1)
        return x.sum()

    f = jax.grad(chain, argnums=(0, 1)) if gradient else chain
    return jax.jit(f).lower(x, weights).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("gradient", [False, True], ids=["forward", "gradients"])
def test_a_layer_s_weights_are_packed_where_they_are_used_not_all_at_once(gradient):
    """A pack waits for the layer's input, so one layer's packed weights are live at a time: the
    temporary buffer does not grow by a packed weight per layer (all packs first made ResNet-18's
    a 45 MB buffer, which glibc maps afresh on each call)."""
    packed = 64 * 64 * 9 * 4
    assert _temp_bytes(8, gradient) - _temp_bytes(2, gradient) < packed


def test_other_dtypes_3d_and_negative_padding_are_left_to_xla():
    x = jnp.ones((1, 6, 6, 16), jnp.float32)
    w = jnp.ones((16, 16, 3, 3), jnp.float32)
    same = ((1, 1), [(1, 1), (1, 1)], (1, 1), 1)
    assert runs(x, w, *same)
    assert not runs(x.astype(jnp.float16), w.astype(jnp.float16), *same)
    assert not runs(x.astype(jnp.bfloat16), w, *same)
    assert not runs(x, w, (1, 1), [(-1, 1), (1, 1)], (1, 1), 1)
    assert not runs(x[:, None], w[..., None], (1, 1, 1), [(1, 1)] * 3, (1, 1, 1), 1)


def problem():
    """A strided grouped conv and a strided depthwise one, their values and both gradients."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((6, 17, 17, 48)), jnp.float32)
    dense_w = jnp.asarray(rng.standard_normal((96, 24, 3, 3)) * 0.1, jnp.float32)
    depth_w = jnp.asarray(rng.standard_normal((48, 1, 5, 5)) * 0.1, jnp.float32)
    wide_w = jnp.asarray(rng.standard_normal((2816, 96, 1, 1)) * 0.1, jnp.float32)  # gradients as dots

    def f(x, dense_w, depth_w, wide_w):
        def net(x, a, b, c):
            h = convolution(x, b, (2, 2), [(2, 2), (2, 2)], (1, 1), 48)
            h = convolution(h, a, (2, 2), [(1, 1), (1, 1)], (1, 1), 2)
            return convolution(h, c, (1, 1), [(0, 0), (0, 0)], (1, 1), 1)

        y, vjp = jax.vjp(net, x, dense_w, depth_w, wide_w)
        return (y, *vjp(jnp.cos(y)))

    return [np.asarray(a) for a in jax.jit(f)(x, dense_w, depth_w, wide_w)]


_THREADED = textwrap.dedent("""
    import sys, numpy as np, jax
    sys.path.insert(0, sys.argv[2])
    from test_kernels_conv import problem
    runs = [problem() for _ in range(3)]
    np.savez(sys.argv[1], *runs[0], same=all(all(np.array_equal(a, b) for a, b in zip(r, runs[0])) for r in runs))
""")


def test_same_bits_with_a_pool_of_two_threads_as_with_one(tmp_path):
    """The test process runs XLA on one thread (conftest); a fresh process gets the full pool,
    over which the kernels split their sums in a fixed way: every thread count, the same bits."""
    out = tmp_path / "threaded.npz"
    proc = subprocess.run([sys.executable, "-c", _THREADED, str(out), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=300, env={**os.environ})
    assert proc.returncode == 0, proc.stderr[-2000:]
    threaded = np.load(out)
    assert bool(threaded["same"]), "calls with two threads differ from each other"
    for i, a in enumerate(problem()):
        np.testing.assert_array_equal(threaded[f"arr_{i}"], a)
