"""The runtime's two no-ops that shape XLA:CPU's fusions (docs/cpu.md): exact in every float dtype,
the identity's derivative. fusion_boundary, at a linear layer's input, keeps a pooled head's matrix
products in fusions of their own (XLA:CPU's YNNPACK fusion of a reduction with two products
recomputes the first); computed_once, at a residual block's input, keeps a residual stream from
being computed again in every block after it."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from flaxport.runtime.functions import computed_once, fusion_boundary
from flaxport.runtime.layers import Linear


@pytest.mark.parametrize("no_op", [fusion_boundary, computed_once])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_the_no_ops_return_their_input_bit_for_bit(dtype, no_op):
    with jax.enable_x64(dtype == "float64"):
        finfo = jnp.finfo(dtype)
        special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, float(finfo.tiny) / 4, float(finfo.max)])
        values = np.concatenate([np.random.default_rng(0).standard_normal(57) * 1e3, special])
        x = jnp.asarray(values, dtype)
        out = jax.jit(no_op)(x)
        assert out.dtype == x.dtype
        if no_op is computed_once:  # a division: subnormals flushed, as by any arithmetic of XLA:CPU
            x = jax.jit(lambda v, one: v * one)(x, jnp.ones((), dtype))
        np.testing.assert_array_equal(np.asarray(out).view(np.uint8), np.asarray(x).view(np.uint8))


@pytest.mark.parametrize("no_op", [fusion_boundary, computed_once])
def test_integers_pass_through_untouched(no_op):
    x = jnp.arange(-5, 5, dtype=jnp.int32)
    assert jax.jit(no_op)(x).dtype == jnp.int32
    np.testing.assert_array_equal(jax.jit(no_op)(x), x)


@pytest.mark.parametrize("no_op", [fusion_boundary, computed_once])
def test_their_derivative_is_the_identity_in_both_modes(no_op):
    x = jnp.linspace(-2.0, 2.0, 6)
    f = lambda v: jnp.sum(jnp.sin(no_op(v * 3.0)))  # noqa: E731
    g = lambda v: jnp.sum(jnp.sin(v * 3.0))  # noqa: E731
    np.testing.assert_allclose(jax.grad(f)(x), jax.grad(g)(x), rtol=0, atol=0)
    np.testing.assert_allclose(jax.jacfwd(f)(x), jax.jacfwd(g)(x), rtol=0, atol=0)
    np.testing.assert_allclose(jax.hessian(f)(x), jax.hessian(g)(x), rtol=0, atol=0)


def _ops_per_computation(hlo: str, ops=("dot",)) -> dict:
    """{computation name: its instructions of kinds `ops`} of a compiled module's text."""
    counts, name = {}, None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head:
            name = head.group(1)
            counts[name] = 0
        elif name is not None and re.search(r"= \S+ (%s)\(" % "|".join(ops), line):
            counts[name] += 1
    return counts


def test_a_pooled_head_keeps_its_two_products_apart_on_a_cpu():
    """A global pooling, then Linear -> ReLU -> Linear, as a classifier ends. Without the boundary
    XLA:CPU (jax 0.10) puts the mean and both products in one YNNPACK fusion: 30 ms against 2 ms."""
    rngs = nnx.Rngs(0)
    first, second = Linear(4096, 1024, rngs=rngs), Linear(1024, 1024, rngs=rngs)

    def head(x):
        return second(jax.nn.relu(first(jnp.mean(x, axis=(1, 2)))))

    x = jnp.ones((8, 2, 2, 4096))
    hlo = jax.jit(head).lower(x).compile().as_text()
    products = _ops_per_computation(hlo)
    assert sum(products.values()) == 2, products
    assert max(products.values()) == 1, products
    reference = x.mean(axis=(1, 2)) @ first.weight[...].T + first.bias[...]
    reference = jax.nn.relu(reference) @ second.weight[...].T + second.bias[...]
    np.testing.assert_allclose(jax.jit(head)(x), reference, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("route", ["xla", "native"])
def test_a_classifier_written_as_whole_window_convolutions_keeps_its_products_apart(route, monkeypatch):
    """timm's VGG head at 32x32: a 2x2 max-pool to 1x1, AdaptiveAvgPool to 7x7, a 7x7 convolution
    over the 7x7 map and a 1x1 convolution of the 1x1 map, each one window over its whole input.
    Compiled only (weights as shapes): without the boundary XLA:CPU fuses the pool and both
    products, and timm's VGG-11 forward took 3 s instead of 51 ms."""
    from flaxport.runtime import functions

    if route == "native":
        from flaxport import kernels
        from flaxport.runtime import native

        if not kernels.available():
            pytest.skip("flaxport's CPU kernels are not built here")
        monkeypatch.setattr(functions, "_convolution", native._convolution)

    def head(x, w7, w1):  # x (N, C, 2, 2), torch's layout as the written file keeps it
        pooled = functions.max_pool(x, (2, 2))
        wide = functions.adaptive_avg_pool(pooled, (7, 7))
        h = jax.nn.relu(functions.conv(wide, w7))
        return jax.nn.relu(functions.conv(h, w1))

    shapes = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((2, 512, 2, 2), (4096, 512, 7, 7), (4096, 4096, 1, 1))]
    products = _ops_per_computation(jax.jit(head).lower(*shapes).compile().as_text(), ("dot", "convolution"))
    assert sum(products.values()) == 2, products
    assert max(products.values()) == 1, products


@pytest.mark.torch
def test_a_translated_functional_linear_after_a_pooling_keeps_its_products_apart():
    """F.linear in the user's forward (aten.linear, not an nn.Linear) is written through the boundary too."""
    torch = pytest.importorskip("torch")
    from torch.nn import functional as F

    from flaxport.translate import translate

    class PooledHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden = torch.nn.Parameter(torch.randn(1024, 4096) * 0.01)
            self.out = torch.nn.Parameter(torch.randn(1024, 1024) * 0.01)

        def forward(self, x):
            return F.linear(F.relu(F.linear(x.mean(dim=(2, 3)), self.hidden)), self.out)

    t = translate(PooledHead(), torch.randn(8, 4096, 2, 2), check=False)
    assert "fusion_boundary(" in t.source
    graphdef, state = nnx.split(t.new_model())
    forward = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    products = _ops_per_computation(forward.lower(state, jnp.ones((8, 4096, 2, 2))).compile().as_text())
    assert sum(products.values()) == 2, products
    assert max(products.values()) == 1, products


def test_a_residual_stream_is_computed_once_per_block():
    """Twelve blocks x = relu(0.5 * conv(x) + 0.1 + x). XLA:CPU (jax 0.10) fuses each block's sum
    into the next block's, though the convolution has it written out: the last fusion holds all
    twelve blocks' ReLUs, 78 in all. Through computed_once, one ReLU a block."""

    def stream(x, w):
        for _ in range(12):
            x = computed_once(x)
            h = jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "OIHW", "NHWC"))
            x = jax.nn.relu(h * 0.5 + 0.1 + x)
        return x

    shapes = [jax.ShapeDtypeStruct((2, 8, 8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 16, 1, 1), jnp.float32)]
    relus = _ops_per_computation(jax.jit(stream).lower(*shapes).compile().as_text(), ("maximum",))
    assert sum(relus.values()) == 12, relus
    assert max(relus.values()) == 1, relus


@pytest.mark.torch
def test_a_translated_residual_block_computes_its_input_once():
    """Written at the top of a block whose input a sum and a convolution read; not in a block whose
    input only convolutions read (a projection shortcut), nor in x * sigmoid(x) (all element-wise),
    nor in a squeeze-and-excitation gate (a mean and a product: XLA fuses both)."""
    torch = pytest.importorskip("torch")

    class Residual(torch.nn.Module):
        def __init__(self, project=False):
            super().__init__()
            self.conv = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
            self.bn = torch.nn.BatchNorm2d(8)
            self.shortcut = torch.nn.Conv2d(8, 8, 1) if project else None

        def forward(self, x):
            shortcut = x if self.shortcut is None else self.shortcut(x)
            return torch.relu(self.bn(self.conv(x)) + shortcut)

    class Swish(torch.nn.Module):
        def forward(self, x):
            return x * torch.sigmoid(x)

    class Excitation(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Conv2d(8, 8, 1)

        def forward(self, x):
            return x * torch.sigmoid(self.fc(x.mean((2, 3), keepdim=True)))

    from flaxport.translate import translate

    net = torch.nn.Sequential(Residual(project=True), Swish(), Excitation(), *[Residual() for _ in range(6)]).eval()
    t = translate(net, torch.randn(2, 8, 6, 6))
    classes = {block.split("(")[0]: block for block in t.source.split("\nclass ")[1:]}
    once = {name for name, text in classes.items() if "computed_once, x)" in text}
    assert once == {"ResidualWithoutShortcut"}, sorted(classes)
    graphdef, state = nnx.split(t.new_model())
    forward = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
    relus = _ops_per_computation(forward.lower(state, jnp.ones((2, 8, 6, 6))).compile().as_text(), ("maximum",))
    assert max(relus.values()) == 1, relus
