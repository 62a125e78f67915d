"""The Flax harness: runners agree, resume is bit-exact, NaN stops cleanly."""
import os
import jax
import numpy as np
import pytest

from flaxport.errors import TrainingDiverged, UserError
from flaxport.harness import loop, rng
from flaxport.harness.epoch import epoch_batches
from flaxport.harness.metrics import first_nonfinite
from flaxport.workloads import registry

GAN = registry.get("gan")
SMOKE = GAN.get_config("smoke")


def _leaves(state):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(state)]


def _train(tmp_path, name, **kw):
    kw.setdefault("epochs", 2)
    data = GAN.load_data(SMOKE)
    return loop.train(GAN, SMOKE, workdir=tmp_path / name, data=data, progress=False, quiet=True, **kw)


@pytest.mark.slow
def test_step_and_scan_runners_give_the_same_numbers(tmp_path):
    scan = _train(tmp_path, "scan", runner="scan", checkpoints=False)
    step = _train(tmp_path, "step", runner="step", checkpoints=False)
    for a, b in zip(_leaves(scan.state), _leaves(step.state)):
        np.testing.assert_array_equal(a, b)
    assert [h["train"] for h in scan.history] == [h["train"] for h in step.history]


@pytest.mark.slow
def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    full = _train(tmp_path, "full", epochs=3)
    _train(tmp_path, "cut", epochs=1)
    resumed = _train(tmp_path, "cut", epochs=3, resume=True)
    assert [h["epoch"] for h in resumed.history] == [2, 3]
    for a, b in zip(_leaves(full.state), _leaves(resumed.state)):
        np.testing.assert_array_equal(a, b)
    lines = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3  # epoch 1 from the first run, 2 and 3 from the resumed one


@pytest.mark.slow
def test_a_workdir_with_checkpoints_is_not_overwritten_without_resume(tmp_path):
    _train(tmp_path, "run", epochs=1)
    with pytest.raises(UserError, match="--resume"):
        _train(tmp_path, "run", epochs=1)


@pytest.mark.slow
def test_nan_loss_stops_with_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    _train(tmp_path, "run", epochs=1)
    # Poison one sample so that it lands in batch `nan_at` of the resumed epoch 2.
    nan_at = 5
    data = GAN.load_data(SMOKE)
    steps = len(data.train["x"]) // SMOKE.batch_size
    batches = epoch_batches({"x": data.train["x"]}, rng.stream(0, "data"), 1, SMOKE.batch_size, steps)
    target = np.asarray(batches["x"][nan_at - 1, 0, 0])
    data.train["x"] = np.where(data.train["x"] == target, np.nan, data.train["x"]).astype(np.float32)
    with pytest.raises(TrainingDiverged, match=f"step {steps + nan_at} \\(epoch 2\\)"):
        loop.train(GAN, SMOKE, workdir=tmp_path / "run", data=data, epochs=2, resume=True, progress=False, quiet=True)
    ckpts = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit())
    assert ckpts == ["1"]  # the diverged epoch was not saved


def test_first_nonfinite():
    assert first_nonfinite({"a": np.array([1.0, 2.0]), "b": np.array([0.0, 0.0])}) is None
    assert first_nonfinite({"a": np.array([1.0, np.inf, np.nan]), "b": np.array([0.0, 0.0, np.nan])}) == 1


def test_rng_streams_are_named_and_counter_based():
    a, b = rng.stream(0, "data"), rng.stream(0, "train")
    assert not np.array_equal(jax.random.key_data(a), jax.random.key_data(b))
    np.testing.assert_array_equal(jax.random.key_data(rng.at(a, 7)), jax.random.key_data(rng.at(rng.stream(0, "data"), 7)))
    assert not np.array_equal(jax.random.key_data(rng.stream(1, "data")), jax.random.key_data(a))


def test_epoch_batches_is_a_permutation_without_the_partial_batch():
    x = np.arange(23, dtype=np.float32)[:, None]
    b = epoch_batches({"x": x}, rng.stream(0, "data"), 0, 5, 4)["x"]
    assert b.shape == (4, 5, 1)
    assert len(set(np.asarray(b).ravel().tolist())) == 20
    b2 = epoch_batches({"x": x}, rng.stream(0, "data"), 1, 5, 4)["x"]
    assert not np.array_equal(np.asarray(b), np.asarray(b2))  # reshuffled every epoch


@pytest.mark.slow
@pytest.mark.torch
def test_torch_loop_resume_is_exact_too(tmp_path):
    torch = pytest.importorskip("torch")
    import dataclasses

    from flaxport.harness import torch_loop

    data = GAN.load_data(SMOKE)
    # Same settings on both sides (one thread): torch rounds differently per thread count.
    kw = dict(data=data, progress=False, quiet=True, options=dataclasses.replace(torch_loop.TUNED, threads=1))
    full = torch_loop.train(GAN, SMOKE, workdir=tmp_path / "full", epochs=2, **kw)
    torch_loop.train(GAN, SMOKE, workdir=tmp_path / "cut", epochs=1, **kw)
    resumed = torch_loop.train(GAN, SMOKE, workdir=tmp_path / "cut", epochs=2, resume=True, **kw)
    a, b = full.state.state_dict(), resumed.state.state_dict()
    for net in ("G", "D"):
        for k, v in a[net].items():
            assert (v == b[net][k]).all(), k
    assert full.history[-1]["train"] == resumed.history[-1]["train"]

    # With measured threads, a resumed run keeps the count its checkpoint was trained with.
    auto = dict(kw, options=torch_loop.TUNED)
    torch_loop.train(GAN, SMOKE, workdir=tmp_path / "auto", epochs=1, **auto)
    saved = torch.load(tmp_path / "auto" / "checkpoints" / "epoch_1.pt", weights_only=False)["meta"]["threads"]
    again = torch_loop.train(GAN, SMOKE, workdir=tmp_path / "auto", epochs=2, resume=True, **auto)
    assert again.settings["threads"] == saved


_FAULTS = """
import resource, sys
import numpy as np
from flaxport.harness.cpu import tune_allocator
tune_allocator()
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.empty(int(sys.argv[1]) << 20, np.uint8)
    a[::4096] = 1  # touch every page
    del a
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(max(faults[2:]))
"""


# 64 MB: above glibc's largest mmap threshold, as XLA's step buffers are; 2.5 GB: above the
# largest trim threshold a positive int can set, as a big model's train step frees at once.
@pytest.mark.parametrize("malloc,megabytes,most", [("default", 64, None), ("", 64, 8), ("", 2560, 8)])
def test_allocator_reuses_big_blocks_instead_of_faulting_them_in_again(malloc, megabytes, most):
    import subprocess
    import sys

    env = {**os.environ, "FLAXPORT_MALLOC": malloc}
    proc = subprocess.run([sys.executable, "-c", _FAULTS, str(megabytes)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    faults = int(proc.stdout.strip())
    if most is None:  # glibc's defaults: the block is mapped afresh every time, so every
        # page faults in again (a fault per 2 MB even with transparent huge pages)
        assert faults >= 32, faults
    else:
        assert faults <= most, faults
