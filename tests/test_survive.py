"""A run survives SIGKILL, damaged checkpoints, NaN and a full disk.

Every test starts from one uninterrupted 6-epoch GAN run (checkpointed every epoch,
Orbax keeps 4, 5 and 6) and must end with its numbers or with one clear error line.
"""
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from flaxport.errors import TrainingDiverged, UserError
from flaxport.harness import loop, rng
from flaxport.harness.checkpoint import SAVE_DELAY_ENV, Checkpointer
from flaxport.workloads import registry
from runs import one_line_error, records, strip

GAN = registry.get("gan")
SMOKE = GAN.get_config("smoke")  # 100 steps an epoch
EPOCHS = 6
META = {"workload": "gan", "framework": "jax", "variant": "smoke", "seed": 0}


def _flat(state) -> dict:
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(state)}


def _assert_identical(a: dict, b: dict):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _restore(workdir, step=None):
    ckpt = Checkpointer(workdir / "checkpoints")
    try:
        state, meta = ckpt.restore(GAN.init_state(SMOKE, rng.streams(0)["init"]), META, step)
    finally:
        ckpt.close()
    return _flat(state), meta


def _steps(workdir):
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


def _array_file(workdir, step):
    """The biggest array file of checkpoint `step` (the Adam moments of G)."""
    files = [p for p in (workdir / "checkpoints" / str(step) / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    return max(files, key=lambda p: p.stat().st_size)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("base") / "run"
    result = loop.train(GAN, SMOKE, workdir=workdir, data=GAN.load_data(SMOKE), epochs=EPOCHS, progress=False,
                        quiet=True)
    assert _steps(workdir) == [4, 5, 6]
    return workdir, _flat(result.state)


@pytest.fixture
def run(base, tmp_path):
    """A copy of the base run to damage."""
    shutil.copytree(base[0], tmp_path / "run")
    return tmp_path / "run"


def _wait(predicate, proc, what, timeout=300.0):
    t0 = time.monotonic()
    while not predicate():
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_ends_bit_identical(base, tmp_path, tmp_path_factory, capsys):
    workdir = tmp_path / "run"
    ckpts = workdir / "checkpoints"
    cmd = [sys.executable, "-m", "flaxport", "train", "gan", "--config", "smoke", "--epochs", str(EPOCHS),
           "--workdir", str(workdir), "--no-progress", "--resume"]
    # Every save sleeps 0.3 s before Orbax finalises it, so kills land in saves often. The
    # compilation cache spares the resumed runs a compile (it does not change the numbers).
    slow = {**os.environ, SAVE_DELAY_ENV: "0.3", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "jax-cache")}

    def saving():
        return ckpts.is_dir() and any(".orbax-checkpoint-tmp" in p.name for p in ckpts.iterdir())

    def finished():
        return set(_steps(workdir)) if ckpts.is_dir() else set()

    draw = random.Random(20240601)  # random kill points, the same ones every time
    kills = []
    for n in range(3):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=slow)
        before = finished()
        if n == 0:  # inside the very first save: its directory exists, nothing is finalised
            _wait(saving, proc, "a checkpoint write")
        elif n == 1:  # between saves: a checkpoint just finalised, the next epoch training
            _wait(lambda: finished() - before and not saving(), proc, "a finished checkpoint")
        else:  # a random moment after this run's first new checkpoint
            _wait(lambda: finished() - before, proc, "a new checkpoint")
            time.sleep(draw.uniform(0.0, 0.5))
        during_save = saving()
        assert proc.poll() is None, "the run finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
        assert proc.returncode == -signal.SIGKILL and "Traceback" not in err, err[-2000:]
        kills.append({"finished": sorted(finished()), "during_save": during_save})
    assert kills[0]["during_save"] and kills[0]["finished"] == []

    # The last resume runs here (the same loop the CLI runs; one interpreter start saved).
    result = loop.train(GAN, SMOKE, workdir=workdir, data=GAN.load_data(SMOKE), epochs=EPOCHS, resume=True,
                        progress=False)
    assert f"resuming gan from epoch {max(kills[-1]['finished'])}" in capsys.readouterr().err
    assert not any(".orbax-checkpoint-tmp" in p.name for p in ckpts.iterdir())  # leftovers removed
    assert not (workdir / "checkpoints-damaged").exists()
    base_dir, base_state = base
    assert strip(records(workdir)) == strip(records(base_dir))  # every epoch's losses and quality
    _assert_identical(base_state, _flat(result.state))  # bit for bit: params, statistics, Adam moments, step
    _assert_identical(base_state, _restore(workdir)[0])  # and so is the checkpoint it wrote
    print(json.dumps({"kills": kills}))  # for the record (pytest -s)


@pytest.mark.slow
def test_garbled_and_truncated_checkpoints_fall_back_to_the_newest_good_one(base, run, capsys):
    data = bytearray(_array_file(run, 6).read_bytes())
    for i in range(1000, 1064):  # flips bits in a compressed chunk: decodes, to other numbers
        data[i] ^= 0x5A
    _array_file(run, 6).write_bytes(bytes(data))
    half = _array_file(run, 5).read_bytes()
    _array_file(run, 5).write_bytes(half[: len(half) // 2])
    result = loop.train(GAN, SMOKE, workdir=run, data=GAN.load_data(SMOKE), epochs=EPOCHS, resume=True,
                        progress=False)
    err = capsys.readouterr().err
    assert f"flaxport: warning: checkpoint {run / 'checkpoints' / '6'} is damaged (" in err
    assert "does not match its checksum" in err
    assert f"flaxport: warning: checkpoint {run / 'checkpoints' / '5'} is damaged (arrays unreadable" in err
    assert "using checkpoint 4 instead" in err and "resuming gan from epoch 4" in err
    assert len(list((run / "checkpoints-damaged").iterdir())) == 2  # kept aside for a post-mortem
    assert _steps(run) == [4, 5, 6]
    _assert_identical(base[1], _flat(result.state))  # epochs 5 and 6 trained again, to the same bits
    assert [r["epoch"] for r in records(run)] == list(range(1, EPOCHS + 1))


@pytest.mark.slow
def test_no_good_checkpoint_is_one_error_line_and_nothing_is_touched(run, cli):
    (run / "checkpoints" / "6" / "meta" / "metadata").write_text("{garbage")
    shutil.rmtree(run / "checkpoints" / "5" / "state")
    _array_file(run, 4).write_bytes(b"")
    # A process of its own: Orbax's abandoned reads would report at exit, after our line.
    proc = cli("train", "gan", "--config", "smoke", "--epochs", EPOCHS + 1, "--workdir", run, "--resume",
               "--no-progress")
    one_line_error(proc, f"no good checkpoint in {run / 'checkpoints'}", "6: meta unreadable",
                   "5: state metadata unreadable", "4: arrays unreadable")
    assert _steps(run) == [4, 5, 6] and not (run / "checkpoints-damaged").exists()


@pytest.mark.slow
def test_a_state_holding_nan_is_never_saved(run):
    ckpt = Checkpointer(run / "checkpoints")
    try:
        state, meta = ckpt.restore(GAN.init_state(SMOKE, rng.streams(0)["init"]), META)
        leaves, tree = jax.tree_util.tree_flatten(state)
        leaves[3] = leaves[3] * np.inf  # the loss can be finite while the update that follows is not
        with pytest.raises(TrainingDiverged, match=r"became NaN/inf by step 700 .*last good checkpoint: epoch 6"):
            ckpt.save(7, jax.tree_util.tree_unflatten(tree, leaves), {**meta, "epochs_done": 7}, step=700)
        assert ckpt.latest() == 6
    finally:
        ckpt.close()
    assert _steps(run) == [4, 5, 6]


@pytest.mark.slow
def test_a_full_disk_while_saving_is_one_clear_error_and_keeps_the_earlier_checkpoints(run, monkeypatch):
    import orbax.checkpoint as ocp

    ckpt = Checkpointer(run / "checkpoints")
    try:
        state, meta = ckpt.restore(GAN.init_state(SMOKE, rng.streams(0)["init"]), META)

        async def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(ocp.StandardCheckpointHandler, "async_save", full)
        with pytest.raises(UserError, match=r"cannot write checkpoint 7 in .*No space left on device "
                                            r"\(earlier checkpoints kept: 4, 5, 6\)"):
            ckpt.save(7, state, {**meta, "epochs_done": 7}, step=700)
    finally:
        ckpt.close()
    monkeypatch.undo()
    assert _steps(run) == [4, 5, 6]
    state6, meta6 = _restore(run)  # the newest good one is still good, checksums and all
    assert meta6["epochs_done"] == 6
    _assert_identical(_flat(state), state6)
