"""The ddim workload through the CLI: train (both twins), evaluate, sample, export, resume,
Flowers 102 on a fixture, one-line errors, and KID of a trained model against init.

Every run uses the smoke config (16x16 digits, widths 8-16, 5-step sampler). The module
shares one data dir (the KID classifier trains once, ~30 s on 2 cores, then loads from
its cache) and one persistent XLA compilation cache (later runs load the executables an
earlier run compiled: same numbers, seconds instead of ~10 s of UNet compile).
"""
import functools
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import runs
from conftest import run_cli
from flaxport.data import flowers102

N_TRAIN, N_TEST = 1438, 359
STEPS = N_TRAIN // 64
QUALITY = ["digit_classes_covered", "digit_confident_share", "kid", "kid_floor", "sample_seconds", "val_image_loss",
           "val_loss"]
FLOWERS_QUALITY = ["kid", "kid_floor", "sample_seconds", "val_image_loss", "val_loss"]  # no digit scores
HAS_TORCH = runs.HAS_TORCH
HAS_FLATBUFFERS = importlib.util.find_spec("flatbuffers") is not None  # jax.export serialises with it
needs_torch = [pytest.mark.torch, pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch")]
_records, _one_line_error = runs.records, runs.one_line_error


def _scores(quality):
    """quality without sample_seconds, a timing."""
    return {k: v for k, v in quality.items() if k != "sample_seconds"}


def _strip(records):
    return [{**r, "quality": _scores(r["quality"])} for r in runs.strip(records)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def cli(tmp_path_factory, data_dir):
    env = {"FLAXPORT_DATA": str(data_dir), "JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("xla_cache")),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    return functools.partial(run_cli, env=env)


@pytest.fixture(scope="module")
def jax_smoke(tmp_path_factory, cli):
    work = tmp_path_factory.mktemp("ddim") / "jax"
    return work, runs.train(cli, "ddim", work, "--config", "smoke")


@pytest.fixture(scope="module")
def torch_cli(cli):
    """One torch thread: on a busy 2-core machine an OpenMP barrier waits for a core another
    job holds; 2 threads ran the smoke UNet 20x slower than 1 (0.41 / 0.02 s a forward).
    The same count for train and evaluate, so their reductions round alike."""
    return functools.partial(run_cli, env={**cli.keywords["env"], "OMP_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def torch_smoke(tmp_path_factory, torch_cli, jax_smoke):  # after jax_smoke: the classifier is cached
    if not HAS_TORCH:
        pytest.skip("needs PyTorch")
    work = tmp_path_factory.mktemp("ddim") / "torch"
    return work, runs.train(torch_cli, "ddim", work, "--config", "smoke", "--framework", "torch")


SMOKE = [pytest.param("jax_smoke", id="jax"), pytest.param("torch_smoke", id="torch", marks=needs_torch)]


def _png_size(path):
    from PIL import Image

    with Image.open(path) as im:
        return im.size


# -- train, evaluate, sample -------------------------------------------------------------------

@pytest.mark.parametrize("run", SMOKE)
def test_smoke_run_writes_losses_kid_and_samples(run, request, data_dir):
    work, proc = request.getfixturevalue(run)
    assert "data: digits" in proc.stderr and f"{N_TRAIN}/{N_TEST} train/test" in proc.stderr
    [rec] = _records(work)
    assert rec["epoch"] == 1 and rec["steps"] == STEPS
    assert sorted(rec["train"]) == ["image_loss", "loss"] and sorted(rec["quality"]) == QUALITY
    assert all(math.isfinite(v) for v in (*rec["train"].values(), *rec["quality"].values()))
    # 22 steps from keras's init: the noise MAE is still near E|N(0,1)| = 0.80, and the
    # samples are noise: far from digits in KID, none a digit to the classifier.
    q = rec["quality"]
    assert 0.5 < rec["train"]["loss"] < 0.9 and q["kid"] > 50 * q["kid_floor"] > 0
    assert q["digit_confident_share"] < 0.1 and q["digit_classes_covered"] <= 2
    assert json.loads(proc.stdout.strip().splitlines()[-1])["quality"] == rec["quality"]
    saved = json.loads((work / "config.json").read_text())["config"]
    from flaxport.data import digits
    from flaxport.workloads.ddim import step

    stats = step.data_stats(digits.load(size=16, channels=3).train["image"])  # configure: keras's adapt()
    assert saved["norm_mean"] == list(stats["norm_mean"]) and saved["norm_std"] == list(stats["norm_std"])
    # 16 samples: a 4x4 grid of ~90-pixel cells (4 inches at 100 dpi, the narrowest figure)
    # under a 3-line title; diffusion.png: 6 samples along the 5-step reverse process.
    assert (work / "samples.png").read_bytes()[:8] == runs.PNG and _png_size(work / "samples.png") == (400, 440)
    assert _png_size(work / "diffusion.png") == (540, 650)
    assert list((data_dir / "features").glob("cnn-digits-*.npz"))  # the classifier, cached in the data dir


@pytest.mark.parametrize("run", SMOKE)
def test_evaluate_reproduces_the_final_quality(run, request, cli):
    work, _ = request.getfixturevalue(run)
    out = runs.evaluate(request.getfixturevalue("torch_cli") if run == "torch_smoke" else cli, "ddim", work)
    assert out["epochs_done"] == 1
    assert _scores(out["quality"]) == _scores(_records(work)[-1]["quality"])  # fixed noise, fixed weights


def test_sample_takes_steps_and_n(jax_smoke, cli):
    work, _ = jax_smoke
    (work / "samples.png").unlink()
    proc = cli("sample", "ddim", "--workdir", work, "--steps", "3", "--n", "5")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["pictures"] == [str(work / "samples.png"), str(work / "diffusion.png")]
    assert _png_size(work / "samples.png") == (400, 260)  # 5 images: 3 columns, 2 rows of 0.9 inch
    # KID uses its own step count (kid_diffusion_steps), so --steps leaves it alone.
    assert out["quality"]["kid"] == _records(work)[-1]["quality"]["kid"]


@pytest.mark.parametrize("args,needles", [
    (["--steps", "0"], ["--steps must be at least 1, got 0"]),
    (["--steps", "x"], ["--steps", "invalid int value"]),
    (["--n", "0"], ["--n must be at least 1"]),
])
def test_sample_flags_are_checked_in_one_line(jax_smoke, cli, args, needles):
    _one_line_error(cli("sample", "ddim", "--workdir", jax_smoke[0], *args), *needles)


def test_steps_on_a_workload_without_a_sampler_is_one_line(cli, tmp_path):
    _one_line_error(cli("sample", "cnn", "--workdir", tmp_path, "--steps", "3"), "--steps: cnn has no iterative sampler")


@pytest.mark.slow
@pytest.mark.torch
def test_compare_puts_both_twins_samples_side_by_side(torch_cli, tmp_path, jax_smoke):  # classifier cached
    if not HAS_TORCH:
        pytest.skip("needs PyTorch")
    work = tmp_path / "cmp"
    proc = torch_cli("compare", "ddim", "--config", "smoke", "--epochs", "1", "--runs", "jax-step,torch-eager",
                     "--workdir", work, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads((work / "report.json").read_text())
    assert [r["name"] for r in rep["runs"]] == ["jax-step", "torch-eager"]
    assert all(sorted(r["quality"]) == QUALITY for r in rep["runs"])
    # compare.png: curves and speed bars above, each twin's samples below (taller than curves alone).
    width, height = _png_size(work / "compare.png")
    assert width > 800 and height > 600
    for name in ("jax-step", "torch-eager"):
        assert (work / name / "samples.png").exists() and (work / name / "diffusion.png").exists()


# -- exactness ---------------------------------------------------------------------------------

def test_jax_resume_is_bit_identical_to_an_uninterrupted_run(cli, tmp_path, jax_smoke):
    """runs.assert_jax_resume_exact, less the sample_seconds timing."""
    full, cut = tmp_path / "full", tmp_path / "cut"
    runs.train(cli, "ddim", full, "--config", "smoke", "--epochs", "2")
    shutil.copytree(jax_smoke[0], cut)
    proc = runs.train(cli, "ddim", cut, "--config", "smoke", "--epochs", "2", "--resume")
    assert "resuming ddim from epoch 1" in proc.stderr
    assert [r["epoch"] for r in _records(cut)] == [1, 2]
    assert _strip(_records(full)) == _strip(_records(cut))
    runs.assert_same_state(runs.jax_state(full, 2), runs.jax_state(cut, 2))  # EMA weights and statistics too


# -- export ------------------------------------------------------------------------------------

def _restored_generate(work, noise, steps):
    """flaxport sample's generate, in this process, on the run's EMA weights."""
    from flaxport.cli.evaluate import restore
    from flaxport.workloads.ddim import step

    _, config, _, _, state, _ = restore("ddim", work)
    return np.asarray(step.generate(config, state.ema_variables(), noise, steps)), config, state


def test_exported_sampler_is_generate(jax_smoke):
    """In memory (no serialisation): the artifact's function is the sampler, weights inside."""
    from flaxport.workloads.ddim import export

    noise = np.random.default_rng(5).standard_normal((4, 16, 16, 3)).astype(np.float32)
    want, config, state = _restored_generate(jax_smoke[0], noise, 3)
    exported = export.export_sampler(config, state.ema_variables(), 4, 3)
    assert [a.shape for a in exported.in_avals] == [(4, 16, 16, 3)]  # the noise is the only input
    np.testing.assert_allclose(np.asarray(exported.call(noise)), want, rtol=0, atol=1e-5)
    assert 0 <= want.min() and want.max() <= 1


@pytest.mark.skipif(not HAS_FLATBUFFERS, reason="jax.export serialises with flatbuffers, not installed")
def test_export_round_trip_in_a_fresh_process(jax_smoke, cli, tmp_path):
    work, _ = jax_smoke
    out = tmp_path / "sampler.jaxexport"
    proc = cli("export", "ddim", "--workdir", work, "--out", out, "--steps", "3", "--n", "4")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["input"] == {"shape": [4, 16, 16, 3], "dtype": "float32"} and info["steps"] == 3
    noise = np.random.default_rng(6).standard_normal((4, 16, 16, 3)).astype(np.float32)
    np.save(tmp_path / "noise.npy", noise)
    script = ("import sys, jax, numpy as np\n"
              f"e = jax.export.deserialize(bytearray(open({str(out)!r}, 'rb').read()))\n"
              f"np.save({str(tmp_path / 'images.npy')!r}, np.asarray(e.call(np.load({str(tmp_path / 'noise.npy')!r}))))\n"
              "assert not [m for m in sys.modules if m.startswith('flaxport')]\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    want, _, _ = _restored_generate(work, noise, 3)
    np.testing.assert_allclose(np.load(tmp_path / "images.npy"), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("args,needles", [
    (["--n", "0"], ["--n must be at least 1"]),
    (["--steps", "-2"], ["--steps must be at least 1"]),
])
def test_export_flags_are_checked_in_one_line(cli, tmp_path, args, needles):
    _one_line_error(cli("export", "ddim", "--workdir", tmp_path, "--out", tmp_path / "x", *args), *needles)
    _one_line_error(cli("export", "vae", "--workdir", tmp_path, "--out", tmp_path / "x"), "vae has no sampler")


# -- Flowers 102 and data errors --------------------------------------------------------------

def test_flowers102_fixture_trains_at_32(cli, tmp_path):
    data_dir = flowers102.write_fixture(tmp_path / "flowers", n_images=24)
    work = tmp_path / "run"
    proc = runs.train(cli, "ddim", work, "--config", "smoke", "--data", "flowers102", "--data-dir", data_dir,
                      "--set", "image_size=32", "--set", "batch_size=8")
    assert "data: flowers102" in proc.stderr
    [rec] = _records(work)
    n_train = flowers102.load(data_dir, 32).meta["n_train"]
    assert rec["steps"] == n_train // 8 and sorted(rec["quality"]) == FLOWERS_QUALITY
    assert all(math.isfinite(v) for v in rec["quality"].values())
    saved = json.loads((work / "config.json").read_text())["config"]
    assert saved["data"] == "flowers102" and saved["image_size"] == 32 and len(saved["norm_mean"]) == 3
    assert len(set(saved["norm_mean"])) == 3  # colour images: three different channel means
    assert _png_size(work / "samples.png") == (400, 440)  # 4x4 grid of 32x32 images


@pytest.mark.parametrize("case", ["missing", "size"])
def test_data_errors_are_one_line(cli, tmp_path, case):
    if case == "missing":
        args = ["--data", "flowers102", "--data-dir", tmp_path / "nosuch"]
        needles = ["flowers102", "102flowers.tgz", "missing", "flaxport data download flowers102"]
    else:
        args, needles = ["--set", "image_size=15"], ["image_size 15 must be divisible by 2"]
    _one_line_error(cli("train", "ddim", "--config", "smoke", "--workdir", tmp_path / "run", *args), *needles)
    assert not (tmp_path / "run").exists()


# -- quality -----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", pytest.param("torch", marks=needs_torch)])
def test_quick_config_draws_digits_the_classifier_recognises(framework, request, tmp_path):
    """The quick config (digits at 8x8, 1,344 steps: a minute or two): the EMA network's
    pictures are digits, most of them confidently, of most classes, and KID falls.
    Measured (jax, seed 0, shared 2-core machine): confident share 0.67, 10 classes, KID
    0.33 -> 0.037 over the 6 epochs. With keras's constant EMA decay (--set ema_warmup=false)
    the same run draws noise: share 0, KID 51."""
    cli = request.getfixturevalue("torch_cli" if framework == "torch" else "cli")
    work = tmp_path / framework
    runs.train(cli, "ddim", work, "--config", "quick", "--framework", framework)
    records = _records(work)
    last = records[-1]["quality"]
    assert len(records) == 6 and records[-1]["steps"] == N_TRAIN * 5 // 32
    assert last["digit_confident_share"] >= 0.5 and last["digit_classes_covered"] >= 8, last
    assert last["kid"] < records[0]["quality"]["kid"] / 3, [r["quality"]["kid"] for r in records]
    assert 0 < last["kid_floor"] < last["kid"]


@pytest.mark.slow
def test_ema_check_scores_the_ema_and_the_online_network(jax_smoke, cli, tmp_path, capsys):
    """ema_check: the EMA half is the run's own last record; the online half is another network."""
    from flaxport.cli import ema_check

    cmd = [sys.executable, "-m", "flaxport.cli.ema_check", "--workdir", str(jax_smoke[0])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **cli.keywords["env"]})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["framework"] == "jax" and out["epochs_done"] == 1
    assert _scores(out["ema"]) == _scores(_records(jax_smoke[0])[-1]["quality"])
    assert sorted(out["online"]) == QUALITY and out["online"]["val_loss"] != out["ema"]["val_loss"]
    assert ema_check.main(["--workdir", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a flaxport run directory" in err[0]


def test_sampling_benchmark_interleaves_both_twins_and_they_agree(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "sampling.json"
    cmd = [sys.executable, "-m", "flaxport.bench.ddim_sampling", "--config", "smoke", "--rounds", "2", "--n", "8",
           "--steps", "3"]
    proc = subprocess.run(cmd + ["--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "| jax |" in proc.stdout and "| torch-eager |" in proc.stdout
    result = json.loads(out.read_text())
    assert result["rounds"] == 2 and all(len(v) == 2 and min(v) > 0 for v in result["seconds"].values())
    assert result["jax_speedup_vs_torch_eager"] > 0
    assert 0 < result["max_abs_image_difference"] < 1e-4  # a random head: the samples are not trivially equal
    bad = subprocess.run(cmd[:3] + ["--rounds", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--rounds must be at least 1" in bad.stderr.strip().splitlines()[-1]
