"""Kernel Inception Distance: the unbiased polynomial-kernel MMD^2, subsets, and the Flax feature extractor."""
import itertools
import re

import numpy as np
import pytest

from flaxport.metrics import kid as K


def _brute_mmd2(x, y):
    """The paper's formula written out pair by pair (no matrices, no shortcuts)."""
    d = len(x[0])

    def k(u, v):
        return (sum(a * b for a, b in zip(u, v)) / d + 1.0) ** 3

    m, n = len(x), len(y)
    xx = sum(k(x[i], x[j]) for i, j in itertools.permutations(range(m), 2)) / (m * (m - 1))
    yy = sum(k(y[i], y[j]) for i, j in itertools.permutations(range(n), 2)) / (n * (n - 1))
    xy = sum(k(x[i], y[j]) for i in range(m) for j in range(n)) / (m * n)
    return xx + yy - 2 * xy


def _gauss(n, d, shift=0.0, seed=0):
    return np.random.default_rng(seed).normal(shift, 1.0, (n, d))


def test_matches_brute_force_and_is_symmetric():
    x, y = _gauss(9, 4, seed=1), _gauss(6, 4, shift=0.7, seed=2)  # unequal sizes on purpose
    mean, std = K.kid(x, y)
    assert mean == pytest.approx(_brute_mmd2(x.tolist(), y.tolist()), rel=1e-12, abs=1e-12) and std == 0.0
    assert K.kid(y, x) == (mean, 0.0)  # whole sets: exactly symmetric
    # Subsets: each is the same formula on the drawn rows.
    rng = np.random.default_rng(3)
    want = []
    for _ in range(4):
        ia, ib = rng.choice(9, 5, replace=False), rng.choice(6, 5, replace=False)
        want.append(_brute_mmd2(x[ia].tolist(), y[ib].tolist()))
    got = K.kid(x, y, subset_size=5, n_subsets=4, seed=3)
    np.testing.assert_allclose(got, (np.mean(want), np.std(want)), rtol=1e-10)


def test_same_distribution_is_near_zero_shift_grows():
    a, b = _gauss(400, 16, seed=10), _gauss(400, 16, seed=11)
    same, _ = K.kid(a, b)
    assert abs(same) < 0.03  # about 4 standard deviations of this estimate at n = 400 (measured: 0.008)
    # A set against itself is slightly negative, not 0: the within-set mean leaves out the
    # diagonal, the cross mean keeps it, so KID = -2/n (mean k(x_i, x_i) - mean_{i != j} k(x_i, x_j)).
    self_kid, _ = K.kid(a, a)
    kaa = K.polynomial_kernel(a, a)
    off = (kaa.sum() - np.trace(kaa)) / (400 * 399)
    assert self_kid == pytest.approx(-2 / 400 * (np.trace(kaa) / 400 - off), rel=1e-9)
    assert -0.1 < self_kid < 0
    values = [K.kid(a, _gauss(400, 16, shift=s, seed=12))[0] for s in (0.1, 0.3, 0.6, 1.0)]
    assert values[0] > same and all(v2 > 2 * v1 for v1, v2 in zip(values, values[1:])), values
    assert values[-1] > 1.0
    # With subsets the draws depend on the argument order, so symmetry holds in distribution:
    # both orders estimate the whole-set value.
    c, shifted = _gauss(500, 16, seed=14), _gauss(600, 16, shift=0.3, seed=13)
    whole = K.kid(c, shifted)[0]
    ab, ba = K.kid(c, shifted, subset_size=300, n_subsets=10)[0], K.kid(shifted, c, subset_size=300, n_subsets=10)[0]
    assert ab == pytest.approx(whole, rel=0.15) and ba == pytest.approx(whole, rel=0.15)


def test_large_sets_use_subsets_with_a_spread(monkeypatch):
    monkeypatch.setattr(K, "SUBSET_SIZE", 100)  # the rule at a tenth of the scale (1000 by default)
    a, b = _gauss(120, 8, seed=0), _gauss(110, 8, shift=0.5, seed=1)
    mean, std = K.kid(a, b, n_subsets=5)  # auto: subsets of min(100, 120, 110) = 100
    assert std > 0 and mean > 0
    assert (mean, std) == K.kid(a, b, n_subsets=5, seed=0) != K.kid(a, b, n_subsets=5, seed=1)
    assert K.kid(a, b, subset_size=100, n_subsets=5) == (mean, std)
    assert K.kid(a[:100], b[:90], n_subsets=5)[1] == 0.0  # neither set above SUBSET_SIZE: whole sets


@pytest.mark.parametrize("a,b,kw,needle", [
    (np.zeros((1, 3)), np.zeros((4, 3)), {}, "N >= 2"),
    (np.zeros((4, 3, 1)), np.zeros((4, 3)), {}, "features (N, D)"),
    (np.zeros((4, 3)), np.zeros((4, 2)), {}, "feature widths differ: 3 and 2"),
    (np.full((4, 3), np.nan), np.zeros((4, 3)), {}, "NaN or inf"),
    (np.zeros((4, 3)), np.zeros((5, 3)), {"subset_size": 5}, "subset_size must be in 2..4"),
    (np.zeros((4, 3)), np.zeros((5, 3)), {"subset_size": 2, "n_subsets": 0}, "n_subsets must be >= 1"),
])
def test_bad_inputs(a, b, kw, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        K.kid(a, b, **kw)


def test_flax_features_take_the_penultimate_layer():
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return nn.Dense(6, name="inner")(x)

    class Classifier(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool = True):
            x = x.reshape(x.shape[0], -1)
            x = nn.relu(nn.Dense(12)(x))
            x = nn.relu(Block(name="block")(x))
            return nn.Dense(3)(x)

    model = Classifier()
    images = np.random.default_rng(0).uniform(0, 1, (7, 4, 4, 3)).astype(np.float32)
    # Hand-made parameters in Flax's layout: model.init would cost a compile of its own.
    rng = np.random.default_rng(1)

    def dense(n_in, n_out):
        return {"kernel": rng.normal(0, 0.3, (n_in, n_out)).astype(np.float32),
                "bias": rng.normal(0, 0.1, n_out).astype(np.float32)}

    p = {"Dense_0": dense(48, 12), "block": {"inner": dense(12, 6)}, "Dense_1": dense(6, 3)}
    variables = {"params": p}
    h0 = np.maximum(images.reshape(7, -1) @ p["Dense_0"]["kernel"] + p["Dense_0"]["bias"], 0)
    inner = h0 @ p["block"]["inner"]["kernel"] + p["block"]["inner"]["bias"]

    extractor: K.FeatureExtractor = K.flax_features(model.apply, variables, batch_size=3,
                                                     apply_kwargs={"train": False})
    feats = extractor(images)  # 7 images in batches of 3: the last batch is padded
    assert feats.shape == (7, 6) and feats.dtype == np.float32
    np.testing.assert_allclose(feats, np.maximum(inner, 0), rtol=1e-5, atol=1e-6)  # input of the head
    named = K.flax_features(model.apply, variables, layer="block/inner", take="output",
                            preprocess=lambda x: 2 * x)(images / 2)  # preprocess runs before the model
    np.testing.assert_allclose(named, inner, rtol=1e-5, atol=1e-5)
    mean, _ = K.kid_images(extractor, images, images[::-1])
    assert mean == pytest.approx(K.kid(feats, feats[::-1])[0])
    with pytest.raises(ValueError, match="no submodule 'nosuch' was called; called: Dense_0, block/inner, block"):
        K.flax_features(model.apply, variables, layer="nosuch")(images)
