"""GAN quality metrics and the mixture data: numbers a reader can check by hand."""
import numpy as np
import pytest

from flaxport.data import mixture
from flaxport.workloads.gan.quality import quality

MODES = (0.0, 0.5)


def test_a_perfect_sampler_scores_near_the_sampling_noise_floor():
    rng = np.random.default_rng(1)
    ref = mixture.sample(rng, MODES, 0.1, 5000)
    q = quality(mixture.sample(rng, MODES, 0.1, 5000), ref, MODES)
    assert q["w1"] < 0.01 and q["ks"] < 0.03
    assert q["mode_share"] == pytest.approx([0.5, 0.5], abs=0.02)


def test_a_collapsed_sampler_is_caught():
    rng = np.random.default_rng(2)
    ref = mixture.sample(rng, MODES, 0.1, 5000)
    one_mode = rng.normal(0.0, 0.1, 10000)
    q = quality(one_mode, ref, MODES)
    assert q["mode_share"][0] > 0.95
    assert q["w1"] == pytest.approx(0.25, abs=0.02)  # half the mass moved by 0.5
    assert q["ks"] > 0.4


def test_nan_samples_give_infinite_distance_not_a_crash():
    q = quality(np.array([0.1, np.nan]), np.zeros(10), MODES)
    assert q["w1"] == float("inf")


def test_mixture_is_fixed_by_its_seed_and_held_out_draw_differs():
    a, b = mixture.load(data_seed=0), mixture.load(data_seed=0)
    np.testing.assert_array_equal(a.train["x"], b.train["x"])
    assert a.train["x"].shape == (20000, 1) and a.train["x"].dtype == np.float32
    assert not np.array_equal(a.train["x"], a.test["x"])
    assert abs(a.train["x"].mean() - 0.25) < 0.01


@pytest.mark.slow
def test_the_quick_config_of_make_demo_learns_both_modes(tmp_path):
    """`make demo`'s promise, on the JAX twin: both modes found, near the data, in 20 short epochs."""
    from flaxport.harness import loop
    from flaxport.workloads import registry

    gan = registry.get("gan")
    config = gan.get_config("quick")
    run = loop.train(gan, config, workdir=tmp_path / "quick", data=gan.load_data(config), checkpoints=False,
                     progress=False, quiet=True)
    assert len(run.history) == 20
    assert run.quality["w1"] < 0.03  # seed 0 ends at 0.013; the default config stays above 0.2
    assert run.quality["mode_share"] == pytest.approx([0.5, 0.5], abs=0.05)
