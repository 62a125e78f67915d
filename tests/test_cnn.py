"""The cnn workload through the CLI: files a run writes, evaluate, CIFAR-10, errors, exactness.

Expensive runs (one smoke epoch per framework) are module-scoped and shared; tests that
change a run work on a copy.
"""
import json
import math

import numpy as np
import pytest

import runs
from conftest import run_cli
from flaxport.data import cifar10

N_TEST = 359  # digits test split
HAS_TORCH = runs.HAS_TORCH
needs_torch = [pytest.mark.torch, pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch")]


def _train(cli, workdir, *args):
    return runs.train(cli, "cnn", workdir, *args)


def _evaluate(cli, workdir, *args):
    return runs.evaluate(cli, "cnn", workdir, *args)


_records, _one_line_error = runs.records, runs.one_line_error
_jax_state, _assert_same_state = runs.jax_state, runs.assert_same_state


@pytest.fixture(scope="module")
def jax_smoke(tmp_path_factory):
    work = tmp_path_factory.mktemp("cnn") / "jax"
    return work, _train(run_cli, work, "--config", "smoke", "--framework", "jax", "--runner", "step")


@pytest.fixture(scope="module")
def torch_smoke(tmp_path_factory):
    if not HAS_TORCH:
        pytest.skip("needs PyTorch")
    work = tmp_path_factory.mktemp("cnn") / "torch"
    return work, _train(run_cli, work, "--config", "smoke", "--framework", "torch", "--torch-variant", "eager")


SMOKE = [pytest.param("jax_smoke", id="jax"), pytest.param("torch_smoke", id="torch", marks=needs_torch)]


# -- 1, 2: a smoke run on digits and its evaluation ------------------------------------------

@pytest.mark.parametrize("run", SMOKE)
def test_smoke_run_writes_metrics_pictures_and_a_consistent_confusion_matrix(run, request):
    work, proc = request.getfixturevalue(run)
    assert "data: digits" in proc.stderr
    [rec] = _records(work)
    assert rec["epoch"] == 1 and rec["steps"] == 1438 // 32
    loss, q = rec["train"]["loss"], rec["quality"]
    assert math.isfinite(loss) and 0 < loss < math.log(10)  # below chance after one epoch
    assert 0 < q["val_loss"] < math.log(10) and 0.5 < q["accuracy"] <= 1
    assert rec["epoch_seconds"] > 0
    printed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert printed["quality"] == q and len(printed["epoch_seconds"]) == 1

    for f in ("confusion.png", "learning_curve.png"):
        assert (work / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f
    conf = json.loads((work / "confusion.json").read_text())
    cm = np.array(conf["matrix"])
    assert cm.shape == (10, 10) and len(conf["classes"]) == 10
    assert cm.sum() == N_TEST
    assert (cm.sum(axis=1) == np.bincount(_digits_test_labels(), minlength=10)).all()  # rows are true classes
    assert round(np.trace(cm) / N_TEST, 6) == q["accuracy"]


def _digits_test_labels():
    from flaxport.data import digits

    return digits.load().test["label"]


@pytest.mark.parametrize("run", SMOKE)
def test_evaluate_reproduces_the_final_quality(run, request, cli):
    work, _ = request.getfixturevalue(run)
    out = _evaluate(cli, work)
    assert out["epochs_done"] == 1
    assert out["quality"] == _records(work)[-1]["quality"]


# -- 3: CIFAR-10 end to end on a fixture -----------------------------------------------------

def test_cifar10_fixture_trains_and_evaluates(cli, tmp_path):
    data_dir = tmp_path / "data"
    cifar10.write_fixture(data_dir, n_per_batch=10, archive=True)
    ds = cifar10.load(data_dir)
    assert ds.train["image"].shape == (50, 32, 32, 3) and ds.test["image"].shape == (10, 32, 32, 3)
    assert ds.train["image"].dtype == np.uint8 and len(ds.train["label"]) == 50 and len(ds.test["label"]) == 10

    work = tmp_path / "run"
    proc = _train(cli, work, "--data", "cifar10", "--data-dir", data_dir, "--config", "smoke")
    assert "data: cifar10" in proc.stderr and "50/10 train/test" in proc.stderr
    [rec] = _records(work)
    assert rec["steps"] == 1  # 50 images, batch 32: the partial batch is dropped
    assert json.loads((work / "config.json").read_text())["config"]["data"] == "cifar10"
    conf = json.loads((work / "confusion.json").read_text())
    assert conf["classes"] == cifar10.CLASSES and np.array(conf["matrix"]).sum() == 10

    # evaluate finds the dataset from config.json and the data dir from the flag.
    proc = cli("evaluate", "cnn", "--workdir", work, "--data-dir", data_dir)
    assert proc.returncode == 0, proc.stderr
    assert "data: cifar10" in proc.stderr
    assert json.loads(proc.stdout)["quality"] == rec["quality"]


# -- 4: errors a user can make ---------------------------------------------------------------

def test_sample_rewrites_pictures_and_refuses_n(jax_smoke, cli):
    work, _ = jax_smoke
    (work / "confusion.png").unlink()
    proc = cli("sample", "cnn", "--workdir", work)
    assert proc.returncode == 0, proc.stderr
    assert (work / "confusion.png").exists()
    assert json.loads(proc.stdout.strip().splitlines()[-1])["quality"] == _records(work)[-1]["quality"]
    _one_line_error(cli("sample", "cnn", "--workdir", work, "--n", "5"), "--n", "cnn draws no samples")


def _truncated_archive(tmp_path):
    path = cifar10.write_fixture(tmp_path / "trunc", n_per_batch=10, archive=True)
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])
    return tmp_path / "trunc", [str(path), "truncated"]


@pytest.mark.parametrize("case", ["empty", "truncated", "mixture", "nosuch"])
def test_data_errors_are_one_line(cli, tmp_path, case):
    if case == "empty":
        (tmp_path / "empty").mkdir()
        args, needles = ["--data", "cifar10", "--data-dir", tmp_path / "empty"], ["cifar10", str(tmp_path / "empty")]
    elif case == "truncated":
        data_dir, needles = _truncated_archive(tmp_path)
        args = ["--data", "cifar10", "--data-dir", data_dir]
    else:
        args, needles = ["--data", case], [f"--data {case!r}", "digits, cifar10"]
    _one_line_error(cli("train", "cnn", "--config", "smoke", "--workdir", tmp_path / "run", *args), *needles)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_unknown_conv_impl_is_a_user_error(cli, tmp_path):
    proc = cli("train", "cnn", "--config", "smoke", "--set", "conv_impl=nosuch", "--workdir", tmp_path / "run")
    _one_line_error(proc, "conv_impl", "nosuch", "native, im2col, xla")
    assert not (tmp_path / "run").exists()  # refused before anything was written


# -- 5, 6: exactness --------------------------------------------------------------------------

def test_jax_resume_is_bit_identical_to_an_uninterrupted_run(cli, tmp_path, jax_smoke):
    runs.assert_jax_resume_exact(cli, "cnn", jax_smoke[0], tmp_path)


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch")
def test_torch_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    runs.assert_torch_resume_exact("cnn", tmp_path)


@pytest.mark.slow  # 13 s; `compare` below checks the two runners' quality too
def test_step_and_scan_runners_agree_exactly(cli, tmp_path, jax_smoke):
    step, _ = jax_smoke
    scan = tmp_path / "scan"
    _train(cli, scan, "--config", "smoke", "--runner", "scan")
    assert json.loads((scan / "config.json").read_text())["config"]["runner"] == "scan"
    assert runs.strip(_records(scan)) == runs.strip(_records(step))
    _assert_same_state(_jax_state(scan, 1), _jax_state(step, 1))


# -- 7, 8: quality at the default config, compare --------------------------------------------

@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch")
def test_default_config_reaches_95_percent_in_both_frameworks(cli, tmp_path):
    acc = {}
    for fw in ("jax", "torch"):
        _train(cli, tmp_path / fw, "--framework", fw)  # default config: 5 epochs, step runner, eager torch
        records = _records(tmp_path / fw)
        assert [r["epoch"] for r in records] == [1, 2, 3, 4, 5]
        acc[fw] = records[-1]["quality"]["accuracy"]
    assert min(acc.values()) >= 0.95, acc
    # The twins start from different random weights and shuffles, so this is seed noise, not
    # parity (test_cnn_parity checks that). Measured, seeds 0-4: jax 0.964-0.981, torch
    # 0.961-0.978, per-seed gaps 0-0.014 (seed 0: 0.9777 vs 0.9638, 5 of 359 images), and
    # torch moves up to 0.02 between consecutive epochs of one run. 0.01 would fail at seed 0.
    assert abs(acc["jax"] - acc["torch"]) <= 0.02, acc


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="needs PyTorch")
def test_compare_reports_every_run(cli, tmp_path):
    runs = ["torch-tuned", "jax-step", "jax-scan"]
    work = tmp_path / "cmp"
    proc = cli("compare", "cnn", "--epochs", "2", "--runs", ",".join(runs), "--workdir", work, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads((work / "report.json").read_text())
    assert [r["name"] for r in rep["runs"]] == runs
    for r in rep["runs"]:
        assert len(r["epoch_seconds"]) == 2 and all(s > 0 for s in r["epoch_seconds"])
        assert 0.5 < r["quality"]["accuracy"] <= 1
    by_name = {r["name"]: r for r in rep["runs"]}
    assert by_name["jax-step"]["quality"] == by_name["jax-scan"]["quality"]
    md = (work / "report.md").read_text()
    for name in runs:
        assert f"| {name} |" in md, name
