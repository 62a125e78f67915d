"""docs/porting.md cannot drift from the code: every test it names exists (found with ast, no
pytest run), and every pitfall names one. Below that, the pitfalls no other test shows,
each pinning the number the guide quotes.
"""
import ast
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "porting.md"
REF = re.compile(r"tests/(test_\w+\.py)::(\w+(?:::\w+)?)")


def _test_names(path: Path) -> set:
    """Module-level test functions, and Class::method of test classes."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names |= {f"{node.name}::{f.name}" for f in node.body
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name.startswith("test")}
    return names


def test_every_test_the_guide_names_exists():
    refs = REF.findall(GUIDE.read_text())
    assert len(refs) >= 25, "the guide names too few tests: did the reference format change?"
    known: dict = {}
    missing = []
    for file, name in refs:
        path = ROOT / "tests" / file
        if file not in known:
            known[file] = _test_names(path) if path.exists() else set()
        if name not in known[file]:
            missing.append(f"tests/{file}::{name}")
    assert not missing, f"docs/porting.md names tests that do not exist: {sorted(set(missing))}"


def test_every_pitfall_has_symptom_size_fix_and_test():
    sections = re.split(r"^### ", GUIDE.read_text(), flags=re.M)[1:]
    assert len(sections) >= 20
    for s in sections:
        title = s.splitlines()[0]
        for field in ("**Symptom.**", "**Size.**", "**Fix.**", "**Test:**"):
            assert field in s, f"{title!r} lacks {field}"
        test_line = s[s.index("**Test:**"):].splitlines()[0]
        assert REF.search(test_line) or "none" in test_line, f"{title!r}: no test named"


# --------------------------------------------------------------------------- demonstrations
def test_x_over_255_in_jax_is_a_multiply_by_the_reciprocal():
    """XLA:CPU computes x / 255 as x * (1/255), eagerly and under jit, with the divisor a constant
    or an argument; torch on CPU (and NumPy) divide. For 126 of the 256 byte values the two
    differ by one ulp (<= 6e-8)."""
    torch = pytest.importorskip("torch")
    if jax.default_backend() != "cpu":
        pytest.skip("measured on XLA:CPU")
    u = np.arange(256, dtype=np.float32)
    div, mul = u / np.float32(255), u * np.float32(1 / 255)
    assert np.sum(div != mul) == 126 and np.abs(div - mul).max() <= 6e-8
    np.testing.assert_array_equal(np.asarray(jnp.asarray(u) / 255), mul)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a, b: a / b)(u, np.float32(255))), mul)
    np.testing.assert_array_equal((torch.arange(256).to(torch.uint8) / 255).numpy(), div)  # torch CPU: a division


def test_naive_bce_overflows_where_the_stable_form_does_not():
    """log(-expm1(log_sigmoid(l))) for log(1 - p): exact to ~1e-6 for |l| <= 30, inf from l ~ 87.3 on
    (float32 exp underflows); torch's max(l, 0) - l x + log1p(exp(-|l|)) stays finite."""
    torch = pytest.importorskip("torch")
    logits = np.linspace(-120, 120, 24001).astype(np.float32)
    want = torch.nn.functional.binary_cross_entropy_with_logits(
        torch.from_numpy(logits), torch.zeros(len(logits)), reduction="none").numpy()
    naive = np.asarray(-jnp.log(-jnp.expm1(jax.nn.log_sigmoid(logits))))  # x = 0: -log(1 - p)
    stable = np.maximum(logits, 0) + np.log1p(np.exp(-np.abs(logits)))
    inner = np.abs(logits) <= 30
    assert np.abs(naive[inner] - want[inner]).max() < 2e-6
    assert np.isinf(naive).any() and 87 < logits[np.isinf(naive)].min() < 88
    assert np.isfinite(stable).all() and np.abs(stable - want).max() < 1e-6


def test_max_pool_sends_the_gradient_to_the_larger_of_a_near_tie():
    """Two inputs one ulp apart (upstream rounding that differs between frameworks): the
    pooled values agree to that ulp, the whole gradient goes to another element."""
    torch = pytest.importorskip("torch")
    from flaxport import nn as fpnn

    one, up = np.float32(1), np.nextafter(np.float32(1), np.float32(2))
    torch_side = np.array([[one, up], [0, 0]], np.float32)  # torch rounded the right cell up
    flax_side = np.array([[up, one], [0, 0]], np.float32)  # XLA rounded the left one up
    t = torch.from_numpy(torch_side)[None, None].requires_grad_()
    torch.nn.functional.max_pool2d(t, 2).sum().backward()
    out, grad = jax.value_and_grad(lambda x: fpnn.max_pool(x, 2).sum())(flax_side[None, :, :, None])
    assert float(out) == float(up)  # the forward values agree exactly
    np.testing.assert_array_equal(t.grad[0, 0].numpy(), [[0, 1], [0, 0]])
    np.testing.assert_array_equal(np.asarray(grad)[0, :, :, 0], [[1, 0], [0, 0]])  # 1.0 moved, not 1e-7


def test_a_summed_loss_changes_adams_steps_through_eps():
    """Adam is scale-free except for eps: a loss summed over a batch of 128 instead of averaged
    divides eps by 128 in effect. A gradient of 1e-8 (mean) moves 0.5 lr; summed, 0.99 lr."""
    import optax

    lr, batch = 1e-3, 128
    g = jnp.array([1e-10, 1e-9, 1e-8, 1e-7, 1e-3])
    tx = optax.adam(lr)
    step_mean, _ = tx.update(g, tx.init(g))
    step_sum, _ = tx.update(batch * g, tx.init(g))
    diff = np.abs(np.asarray(step_mean) - np.asarray(step_sum)) / lr
    assert 0.48 < diff[2] < 0.5 and diff[-1] < 1e-4  # large gradients: the same step


def test_mse_loss_is_twice_optax_l2_loss():
    torch = pytest.importorskip("torch")
    import optax

    rng = np.random.default_rng(0)
    p, q = rng.normal(size=100).astype(np.float32), rng.normal(size=100).astype(np.float32)
    mse = torch.nn.functional.mse_loss(torch.from_numpy(p), torch.from_numpy(q)).item()
    assert mse == pytest.approx(2 * float(jnp.mean(optax.l2_loss(p, q))), rel=1e-6)
    assert mse == pytest.approx(float(jnp.mean(optax.squared_error(p, q))), rel=1e-6)


def test_onednn_conv_bias_gradient_is_a_float32_running_sum():
    """On CPU torch's oneDNN conv backward sums a bias gradient over the N*H*W positions in
    float32 one after another: relative error 1.7e-4 at 64x32x32 (upstream gradients mostly of
    one sign); torch's native conv and jnp.sum are within 1e-7. check_parity turns oneDNN off."""
    torch = pytest.importorskip("torch")
    if not torch.backends.mkldnn.is_available():
        pytest.skip("torch built without oneDNN")
    torch.manual_seed(0)
    x = torch.randn(64, 32, 32, 32)
    up = torch.sign(torch.randn(64, 3, 32, 32) + 1.0) / (64 * 32 * 32 * 3)  # e.g. an MAE loss's gradient
    exact = up.double().sum((0, 2, 3))

    def rel_error(onednn: bool) -> float:
        conv = torch.nn.Conv2d(32, 3, 1)
        with torch.backends.mkldnn.flags(enabled=onednn):
            (conv(x) * up).sum().backward()
        return float((conv.bias.grad.double() - exact).abs().max() / exact.abs().max())

    assert rel_error(True) > 5e-5 and rel_error(False) < 1e-6
    summed = np.asarray(jnp.sum(jnp.asarray(up.numpy()), axis=(0, 2, 3)), np.float64)
    assert np.abs(summed - exact.numpy()).max() / exact.abs().max().item() < 1e-6
