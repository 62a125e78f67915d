"""Data parallelism: 4 devices and 2 processes train the numbers of 1 device.

Several CPU devices need XLA_FLAGS before JAX starts, and several processes need their
own interpreters, so those runs happen in subprocesses; the one-device reference runs
here. Every run trains the same global batch (20, split 4 or 2 ways).

The config sets adam_eps=1e-4 (torch's default is 1e-8). The biases that feed a
BatchNorm have an analytically zero gradient: what is left is rounding noise, which
depends on the order of the additions (1 device vs an all-reduce of 4). Adam divides
a gradient by its own running size, so with eps=1e-8 that noise moves those biases
(and the running means that include them) by ~lr per step in a direction that differs
between the runs: 1e-3 apart after 100 steps, although no output depends on them.
A larger eps keeps noise at the size of noise; every other leaf agrees to ~1e-7 either way.
"""
import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from flaxport.errors import UserError
from flaxport.harness import distributed
from flaxport.workloads import registry
from runs import one_line_error, records

GAN = registry.get("gan")
SETS = {"batch_size": 20, "adam_eps": 1e-4, "n_per_mode": 100}  # 200 examples: 10 steps an epoch
CONFIG = dataclasses.replace(GAN.get_config("smoke"), **SETS)
SET_FLAGS = [a for k, v in SETS.items() for a in ("--set", f"{k}={v}")]
EPOCHS = 2
TOL = 1e-5


def _flat(state) -> dict:
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(state)}


def _assert_close(ref: dict, other: dict, what: str):
    assert sorted(ref) == sorted(other)
    worst = max(float(np.max(np.abs(ref[k].astype(np.float64) - other[k]), initial=0.0)) for k in ref)
    assert worst <= TOL, f"{what}: max |difference| {worst:.2e}"
    return worst


def _env(tmp_path_factory, devices=None):
    # A persistent compilation cache shared by this module's subprocesses (it does not
    # change the numbers, only skips a recompile of the same program).
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "jax-cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    for k in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES, distributed.ENV_PROCESS_ID):
        env.pop(k, None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


SCRIPT = textwrap.dedent("""
    import contextlib, dataclasses, io, json, sys
    from pathlib import Path
    from flaxport.harness.cpu import tune_for_tiny_models
    tune_for_tiny_models()
    import jax, numpy as np
    from flaxport.cli import main
    from flaxport.harness import loop
    from flaxport.workloads import registry
    out = Path(sys.argv[1])
    gan = registry.get("gan")
    config = dataclasses.replace(gan.get_config("smoke"), **json.loads(sys.argv[2]))
    data = gan.load_data(config)
    report = {"visible": len(jax.devices())}
    for name, runner, devices in (("one", "scan", 1), ("scan", "scan", None)):
        r = loop.train(gan, config, workdir=out / name, data=data, epochs=int(sys.argv[3]), runner=runner,
                       devices=devices, progress=False, quiet=True, checkpoints=False)
        np.savez(out / f"{name}.npz", **{jax.tree_util.keystr(p): np.asarray(v)
                                         for p, v in jax.tree_util.tree_leaves_with_path(r.state)})
        report[name] = {"losses": [[h["train"][k] for k in sorted(h["train"])] for h in r.history],
                        "devices": r.settings["devices"]}
    for devices in ("3", "8"):  # the CLI's answer to a batch of 20 on 3 devices, and to too many devices
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["train", "gan", "--config", "smoke", "--set", "batch_size=20", "--devices", devices,
                         "--workdir", str(out / "refused"), "--no-progress"])
        report["refused_" + devices] = [code, err.getvalue()]
    print(json.dumps(report))
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """All the runs at once (they wait on each other's collectives and compilers):

    * one process seeing 4 CPU devices: the 1-device reference, then 4 devices
      (scan runner, the training set on every device);
    * two processes of one CPU device each on loopback (gloo), one workdir, via the CLI
      (step runner, each process feeding its share of every batch).
    """
    out = tmp_path_factory.mktemp("scale")
    workdir = out / "two"
    port = _free_port()
    two = [subprocess.Popen(
        [sys.executable, "-m", "flaxport", "train", "gan", "--config", "smoke", *SET_FLAGS, "--epochs", str(EPOCHS),
         "--workdir", str(workdir), "--no-progress", "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2",
         "--process-id", str(i), "--runner", "step"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(tmp_path_factory)) for i in range(2)]
    four = subprocess.run([sys.executable, "-c", SCRIPT, str(out), json.dumps(SETS), str(EPOCHS)],
                          capture_output=True, text=True, env=_env(tmp_path_factory, devices=4), timeout=600)
    outs = [p.communicate(timeout=600) for p in two]
    assert four.returncode == 0, four.stderr[-3000:]
    for p, (_, err) in zip(two, outs):
        assert p.returncode == 0, err[-3000:]
    report = json.loads(four.stdout.strip().splitlines()[-1])
    return out, report, workdir, outs


@pytest.mark.slow
def test_four_devices_train_the_numbers_of_one(runs):
    out, report, _, _ = runs
    assert report["visible"] == 4 and report["one"]["devices"] == 1 and report["scan"]["devices"] == 4
    np.testing.assert_allclose(report["scan"]["losses"], report["one"]["losses"], atol=TOL, rtol=0)
    _assert_close(dict(np.load(out / "one.npz")), dict(np.load(out / "scan.npz")), "4 devices")


@pytest.mark.slow
def test_a_batch_that_does_not_split_evenly_is_a_one_line_error(runs):
    _, report, _, _ = runs
    code, err = report["refused_3"]
    assert code == 2 and err.strip().splitlines()[-1] == (
        "flaxport: error: batch size 20 is not divisible by 3 devices; "
        "choose --devices or --set batch_size=<a multiple of 3>")
    code, err = report["refused_8"]
    assert code == 2 and "--devices 8: only 4 cpu device(s) visible" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_two_processes_train_the_numbers_of_one(runs):
    from flaxport.harness import rng
    from flaxport.harness.checkpoint import Checkpointer

    out, report, workdir, outs = runs
    # Process 0 alone reports and writes metrics.jsonl / config.json / pictures.
    assert json.loads(outs[0][0].strip().splitlines()[-1])["workdir"] == str(workdir)
    assert "workdir" not in outs[1][0]
    assert [r["epoch"] for r in records(workdir)] == list(range(1, EPOCHS + 1))
    assert (workdir / "config.json").exists() and (workdir / "histogram.png").exists()
    np.testing.assert_allclose([[r["train"][k] for k in sorted(r["train"])] for r in records(workdir)],
                               report["one"]["losses"], atol=TOL, rtol=0)
    # The checkpoint both processes wrote restores on one device, to the one-device numbers.
    ckpt = Checkpointer(workdir / "checkpoints")
    try:
        state, meta = ckpt.restore(GAN.init_state(CONFIG, rng.streams(0)["init"]), {"workload": "gan"})
    finally:
        ckpt.close()
    assert meta["epochs_done"] == EPOCHS and not ckpt.damaged
    _assert_close(dict(np.load(out / "one.npz")), _flat(state), "2 processes")


def test_join_is_a_no_op_without_a_job_and_checks_its_flags(monkeypatch):
    for k in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES, distributed.ENV_PROCESS_ID,
              "SLURM_STEP_NODELIST", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    assert distributed.join() is False  # a plain run never waits for a coordinator
    monkeypatch.setenv("SLURM_STEP_NODELIST", "node1")
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert distributed.join() is False  # srun -n1: still one process
    with pytest.raises(UserError, match="needs --coordinator"):
        distributed.join(coordinator="127.0.0.1:1234")
    with pytest.raises(UserError, match="expected HOST:PORT"):
        distributed.join("localhost", 2, 0)
    with pytest.raises(UserError, match="expected 0 to 1"):
        distributed.join("localhost:1234", 2, 2)
    monkeypatch.setenv(distributed.ENV_NUM_PROCESSES, "two")
    with pytest.raises(UserError, match="not an integer"):
        distributed.join()


def test_devices_flag_is_checked_before_anything_is_written(capsys, tmp_path):
    from flaxport.cli import main

    code = main(["train", "gan", "--config", "smoke", "--devices", "2", "--workdir", str(tmp_path / "run")])
    proc = subprocess.CompletedProcess([], code, "", capsys.readouterr().err)
    one_line_error(proc, "--devices 2: only 1 cpu device(s) visible")
    assert not (tmp_path / "run").exists()
