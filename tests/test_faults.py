"""Faults a hostile or clumsy user causes, on every framework: each ends with one clear line,
nothing lost, nothing half-written, no code run from a file the user was handed.

One section per finding of the reliability review (docs/reliability.md maps each promise to
its test). Commands run in this process through flaxport.cli.main where they can (a
subprocess costs ~4 s of imports); a real process where that is the point: SIGKILL during
a save, two trainings at once, a file-size limit standing in for a full disk, messages
printed at interpreter exit, a read-only mount.
"""
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest

from flaxport.cli import main
from flaxport.errors import TrainingDiverged
from runs import assert_same_state, records, strip

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.keras]

GAN = ["--config", "smoke", "--set", "n_per_mode=50", "--no-progress"]  # 10 steps an epoch
VAE = ["--config", "smoke", "--no-progress"]  # 11 steps an epoch
ARGS = {"jax": ("gan", GAN), "torch": ("gan", GAN), "keras": ("vae", VAE)}


def _run(capsys, *args):
    """(exit code, stdout, stderr) of `flaxport ARGS` run in this process."""
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line(rc, err, *needles, code=2):
    """Exit `code` with one `flaxport: error:` line holding every needle, no traceback."""
    assert rc == code, (rc, err)
    assert "Traceback" not in err, err
    mine = [l for l in err.strip().splitlines() if l.startswith("flaxport:") or "Error" in l]
    assert len(mine) == 1 and mine[0].startswith("flaxport: error: "), err
    for n in needles:
        assert n in mine[0], mine[0]
    return mine[0]


def _train(capsys, framework, workdir, *extra):
    workload, args = ARGS[framework]
    return _run(capsys, "train", workload, "--framework", framework, "--workdir", workdir, *args, *extra)


def _files(workdir) -> dict:
    """{relative path: bytes} of every file of a run."""
    return {str(p.relative_to(workdir)): p.read_bytes() for p in sorted(workdir.rglob("*")) if p.is_file()}


def _ckpts(workdir) -> list:
    return sorted(p.name for p in (workdir / "checkpoints").iterdir())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """{framework: a finished 2-epoch run} (gan on jax and torch, vae on keras); copy before damaging."""
    base = tmp_path_factory.mktemp("trained")
    for framework in ARGS:
        workload, args = ARGS[framework]
        assert main(["train", workload, "--framework", framework, "--workdir", str(base / framework),
                     "--epochs", "2", *args]) == 0
    return {f: base / f for f in ARGS}


@pytest.fixture
def copy(trained, tmp_path):
    def make(framework):
        return shutil.copytree(trained[framework], tmp_path / framework)
    return make


# --------------------------------------------------------------------------- 1. no code from a checkpoint

class _Plant:
    """Unpickling this creates a file: what a checkpoint holding code could do instead."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_checkpoint_holding_code_is_refused_unread_on_torch_and_keras(copy, capsys, tmp_path):
    marker = tmp_path / "planted"
    run = copy("torch")
    for p in (run / "checkpoints").iterdir():
        p.unlink()
    meta = {"workload": "gan", "framework": "torch", "variant": "smoke", "seed": 0, "epochs_done": 2}
    torch.save({"state": _Plant(marker), "meta": meta}, run / "checkpoints" / "epoch_2.pt")
    for args in (["evaluate", "gan"], ["sample", "gan"], ["train", "gan", "--framework", "torch", "--resume",
                                                         "--epochs", "3", *GAN]):
        rc, _, err = _run(capsys, *args, "--workdir", run)
        _one_line(rc, err, "no good checkpoint", "2: it holds Python objects other than tensors, refused unread")
        assert not marker.exists(), args

    keras_run = copy("keras")
    path = keras_run / "checkpoints" / "epoch_2.npz"
    meta = json.loads(str(np.load(path)["__meta__"]))
    with open(path, "wb") as f:
        np.savez(f, __meta__=np.array(json.dumps(meta)), planted=np.array([_Plant(marker)], dtype=object))
    (keras_run / "checkpoints" / "epoch_1.npz").unlink()
    rc, _, err = _run(capsys, "evaluate", "vae", "--workdir", keras_run)
    _one_line(rc, err, "no good checkpoint", "2: unreadable")
    assert not marker.exists()


# --------------------------------------------------------------------------- 2. a refused --resume changes nothing

@pytest.mark.parametrize("framework", ["jax", "torch", "keras"])
def test_a_refused_resume_leaves_every_file_of_the_run_byte_identical(copy, capsys, framework):
    run = copy(framework)
    before = _files(run)
    other_shape = ["--set", "z_dim=256"] if framework != "keras" else ["--set", "hidden=64"]
    for extra, needle in ((["--seed", "7"], "seed=0, not 7"), (other_shape, "does not fit"),
                          (["--config", "default"], "variant='smoke', not 'default'")):
        rc, _, err = _train(capsys, framework, run, "--resume", "--epochs", "3", *extra)
        _one_line(rc, err, needle)
        assert _files(run) == before, extra
    workload = ARGS[framework][0]
    rc, out, err = _run(capsys, "evaluate", workload, "--workdir", run)
    assert rc == 0, err
    assert json.loads(out)["epochs_done"] == 2


def test_a_run_refused_after_its_workdir_was_claimed_leaves_no_workdir_behind(trained, capsys, tmp_path):
    # The torch weights do not fit z_dim=16: found while building the state, after the claim.
    rc, _, err = _run(capsys, "train", "gan", "--workdir", tmp_path / "new" / "run", "--set", "z_dim=16",
                      "--init-from", trained["torch"] / "checkpoints" / "epoch_2.pt", *GAN)
    _one_line(rc, err, "shape mismatch")
    assert not (tmp_path / "new").exists()


# --------------------------------------------------------------------------- 3. one writer per workdir

def test_a_second_writer_is_refused_while_a_run_holds_the_workdir(copy, capsys):
    from flaxport.harness.workdir import claim

    run = copy("jax")
    before = _files(run)
    held = claim(run, {"workload": "gan", "framework": "jax"}, resume=True, has_checkpoint=lambda w: True)
    try:
        rc, _, err = _train(capsys, "jax", run, "--resume", "--epochs", "3")
        _one_line(rc, err, f"is in use by this process ({os.getpid()})")
    finally:
        held.release()
    assert _files(run) == before


# --------------------------------------------------------------------------- 4. torch and keras checkpoints

def _flip_a_tensor_byte(path):
    """Flip one byte in the middle of the file's largest stored tensor (inside the zip's data)."""
    with zipfile.ZipFile(path) as z:
        big = max(z.infolist(), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    header = 30 + int.from_bytes(data[big.header_offset + 26: big.header_offset + 28], "little") + \
        int.from_bytes(data[big.header_offset + 28: big.header_offset + 30], "little")
    data[big.header_offset + header + big.file_size // 2] ^= 0x10
    path.write_bytes(bytes(data))


DAMAGES = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "zero-byte": lambda p: p.write_bytes(b""),
    "bit-flipped": _flip_a_tensor_byte,
}


@pytest.mark.parametrize("framework,damage", [("torch", "truncated"), ("torch", "zero-byte"),
                                              ("torch", "bit-flipped"), ("keras", "bit-flipped")])
def test_a_damaged_checkpoint_falls_back_to_the_newest_good_one(trained, copy, capsys, framework, damage):
    run = copy(framework)
    suffix = ".pt" if framework == "torch" else ".npz"
    newest = run / "checkpoints" / f"epoch_2{suffix}"
    DAMAGES[damage](newest)
    workload = ARGS[framework][0]
    rc, out, err = _run(capsys, "evaluate", workload, "--workdir", run)
    assert rc == 0, err
    assert f"flaxport: warning: checkpoint {newest} is damaged (" in err and "using checkpoint 1 instead" in err
    if damage == "bit-flipped" and framework == "torch":
        assert "does not match its checksum" in err  # torch's zip reader checks no CRC: the checksum does
    assert json.loads(out)["epochs_done"] == 1

    rc, _, err = _train(capsys, framework, run, "--resume", "--epochs", "2")  # epoch 2 again, to the same bits
    assert rc == 0, err
    assert f"resuming {workload} ({framework}) from epoch 1" in err
    assert [p.name.split("-")[0] for p in (run / "checkpoints-damaged").iterdir()] == [f"epoch_2{suffix}"]
    assert strip(records(run)) == strip(records(trained[framework]))
    assert_same_state(_state(trained[framework], framework, 2), _state(run, framework, 2))


def _state(run, framework, epochs):
    """A torch or keras checkpoint's state as flat NumPy arrays (read without unpickling)."""
    from flaxport.harness.store import _as_numpy, _leaves

    if framework == "torch":
        payload = torch.load(run / "checkpoints" / f"epoch_{epochs}.pt", weights_only=True)
        return {k: np.asarray(_as_numpy(v) if _as_numpy(v) is not None else v)
                for k, v in _leaves(payload["state"])}
    with np.load(run / "checkpoints" / f"epoch_{epochs}.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files if k != "__meta__"}


def test_stray_files_do_not_break_resume_and_unfinished_saves_are_cleaned(copy, capsys):
    run = copy("torch")
    ckpts = run / "checkpoints"
    shutil.copy(ckpts / "epoch_1.pt", ckpts / "epoch_007.pt")  # a hand-made copy: not a checkpoint name
    (ckpts / "tmp-epoch-x1y2.pt").write_bytes(b"half a save")  # what a killed save leaves
    rc, _, err = _train(capsys, "torch", run, "--resume", "--epochs", "3")
    assert rc == 0, err
    assert "resuming gan (torch) from epoch 2" in err
    assert _ckpts(run) == ["epoch_007.pt", "epoch_1.pt", "epoch_2.pt", "epoch_3.pt"]


@pytest.mark.parametrize("framework", ["torch", "keras", "jax"])
def test_a_state_holding_nan_is_never_saved(tmp_path, framework):
    from flaxport.harness.store import open_store

    store = open_store(framework, tmp_path / "checkpoints")
    good = {"net": {"w": np.ones((3, 2), np.float32)}, "opt": {"m": np.zeros(2, np.float32)}}
    bad = {"net": {"w": np.ones((3, 2), np.float32)}, "opt": {"m": np.array([0.0, np.inf], np.float32)}}
    if framework == "torch":
        good, bad = ({k: {n: torch.from_numpy(a) for n, a in v.items()} for k, v in t.items()} for t in (good, bad))
    meta = {"workload": "gan", "epochs_done": 1}
    try:
        store.save(1, good, meta, step=10)
        with pytest.raises(TrainingDiverged, match=r"NaN/inf by step 20 \(epoch 2; first: opt.m\).*last good "
                                                   r"checkpoint: epoch 1"):
            store.save(2, bad, {**meta, "epochs_done": 2}, step=20)
        assert store.latest() == 1
    finally:
        store.close()
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == (["1"] if framework == "jax" else [f"epoch_1.{'pt' if framework == 'torch' else 'npz'}"])


@pytest.mark.parametrize("framework,extra,needle", [
    ("jax", ["--set", "g_lr=1e30", "--set", "d_lr=1e30"], "loss became NaN/inf at step 1"),
    ("torch", ["--set", "g_lr=1e30", "--set", "d_lr=1e30"], "loss became NaN/inf at step 1"),
    ("torch", ["--set", "g_lr=1e38", "--set", "d_lr=1e38"], "the update overflowed float32 at step 1"),
    ("keras", ["--set", "lr=1e30"], "loss became NaN/inf at step"),
])
def test_a_diverged_run_exits_3_on_every_framework_with_nothing_saved(capsys, tmp_path, framework, extra, needle):
    rc, _, err = _train(capsys, framework, tmp_path / "run", *extra)
    _one_line(rc, err, needle, "last good checkpoint: none", code=3)
    assert not (tmp_path / "run" / "checkpoints").exists() or not _ckpts(tmp_path / "run")


# --------------------------------------------------------------------------- 6. user errors: one line, exit 2

BAD_SETTINGS = [
    (["train", "gan", "--set", "batch_size=1"], "batch_size must be at least 2"),
    (["train", "gan", "--set", "modes="], "modes must be a non-empty list"),
    (["train", "gan", "--set", "g_widths=0"], "g_widths must be a non-empty list of whole numbers >= 1"),
    (["train", "ddim", "--set", "widths="], "widths must be a non-empty list"),
    (["train", "cnn", "--set", "image_size=2"], "image_size must be at least 4"),
    (["train", "ddim", "--set", "warmup_steps=-1"], "warmup_steps must be a whole number, at least 0"),
    (["train", "cnn", "--framework", "torch", "--set", "num_classes=3"], "num_classes must be at least 10"),
    (["train", "vae", "--set", "hidden=300000000"], "parameters with their gradients and Adam moments"),
    (["train", "vae", "--set", "iwae_k=100000000"], "iwae_k=100000000 importance samples"),
    (["train", "gan", "--seed", str(2**70)], "--seed must be a whole number from 0 to 2**63 - 1"),
    (["train", "gan", "--framework", "torch", "--set", "g_lr=nan"], "g_lr must be a finite number >= 0"),
    (["train", "ddim", "--framework", "torch", "--set", "ema=nan"], "ema must be a number from 0 to 1"),
    (["train", "gan", "--set", "b2=1.5"], "b2 must be a number in [0, 1)"),
    (["train", "gan", "--set", "runner=foo"], "runner must be one of step, scan"),
    (["parity", "gan", "--atol", "nan"], "--atol must be a finite number >= 0"),
]


@pytest.mark.parametrize("args,needle", BAD_SETTINGS, ids=[" ".join(a[1:]) for a, _ in BAD_SETTINGS])
def test_a_bad_setting_is_one_line_naming_it(capsys, tmp_path, args, needle):
    if args[0] == "train":  # smoke and one epoch: where a setting is accepted, the run stays short
        args = [*args, "--config", "smoke", "--epochs", "1", "--no-progress", "--workdir", tmp_path / "run"]
    rc, _, err = _run(capsys, *args)
    _one_line(rc, err, needle)
    assert not (tmp_path / "run").exists()


def test_every_config_field_has_a_rule_and_every_variant_keeps_them():
    """A field without a rule would take any value a user types: each one needs its line in RULES."""
    import dataclasses

    from flaxport.workloads import registry, validate

    for name in registry.names():
        wl = registry.get(name)
        for variant in wl.variants:
            config = wl.get_config(variant)
            missing = [f.name for f in dataclasses.fields(config) if f.name != "variant"
                       and f.name not in validate.rules(config)]
            assert not missing, f"{name}: no rule for {missing} (add them to RULES in its config.py)"
            validate.check(config, f"{name} {variant}")
            validate.check_memory(name, config)  # no variant is refused on this machine


def test_memory_refusals_name_the_estimate_and_the_setting(copy, capsys):
    run = copy("jax")
    rc, _, err = _run(capsys, "sample", "gan", "--workdir", run, "--n", 10**12)
    line = _one_line(rc, err, "--n 1000000000000: gan needs about", "n_eval=1000000000000 generated samples")
    assert " TB of memory" in line or " PB of memory" in line


def _edit_config(run, edit):
    saved = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps(edit(saved)))


@pytest.mark.parametrize("edit,needle", [
    (lambda s: [s], "holds a JSON list, not a run's settings"),
    (lambda s: {**s, "config": {**s["config"], "batch_size": "10"}}, "batch_size must be of type int (like 10), got '10'"),
    (lambda s: {k: v for k, v in s.items() if k != "config"}, "no \"config\""),
    (lambda s: {k: v for k, v in s.items() if k != "framework"}, "framework must be one of jax, torch, keras"),
    (lambda s: {**s, "config": {**s["config"], "variant": "huge"}}, "unknown config variant 'huge'"),
    (lambda s: {**s, "config": {**s["config"], "n_eval": -5}}, "n_eval must be a whole number, at least 1, got -5"),
    (lambda s: {**s, "config": {**s["config"], "seed": 2**64}}, "seed must be a whole number from 0"),
])
def test_a_hand_edited_config_json_is_one_line(copy, capsys, edit, needle):
    run = copy("jax")
    _edit_config(run, edit)
    for args in (["evaluate", "gan"], ["sample", "gan"], ["convert", "gan", run, run.parent / "out.pt"]):
        rc, _, err = _run(capsys, *(args if args[0] == "convert" else [*args, "--workdir", run]))
        _one_line(rc, err, needle)
    assert not (run.parent / "out.pt").exists()


def test_paths_that_cannot_be_used_are_one_line(copy, capsys, tmp_path, monkeypatch):
    run = copy("jax")
    rc, _, err = _run(capsys, "convert", "gan", run, tmp_path / "no" / "such" / "folder" / "out.pt")
    _one_line(rc, err, "no folder")
    monkeypatch.setenv("FLAXPORT_DATA", str(run / "config.json"))
    rc, _, err = _run(capsys, "train", "ddim", "--workdir", tmp_path / "ddim", "--config", "smoke")
    _one_line(rc, err, "$FLAXPORT_DATA", "is not a directory")
    assert not (tmp_path / "ddim").exists()


# --------------------------------------------------------------------------- real processes

def _python_flaxport(*args):
    return [sys.executable, "-m", "flaxport", *map(str, args)]


def _wait_for(predicate, proc, what, timeout=300.0):
    t0 = time.monotonic()
    while not predicate():
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_sigkill_during_a_save_then_resume_is_bit_exact_with_no_temp_left(trained, capsys, tmp_path, framework):
    from flaxport.harness.store import SAVE_DELAY_ENV

    run, (workload, args) = tmp_path / "run", ARGS[framework]
    ckpts, ext = run / "checkpoints", (".pt" if framework == "torch" else ".npz")
    cmd = _python_flaxport("train", workload, "--framework", framework, "--epochs", 2, "--workdir", run, *args)
    # Keras runs on XLA, whose CPU pool in this process was made on one core (conftest): the
    # killed run gets the same pool, so its numbers are this process's to the last bit.
    pin = (lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})) if framework == "keras" else None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=pin,
                            env={**os.environ, SAVE_DELAY_ENV: "2"})  # every save waits complete, not yet renamed

    def second_save():
        names = [p.name for p in ckpts.iterdir()] if ckpts.is_dir() else []
        return f"epoch_1{ext}" in names and any(n.startswith("tmp-epoch-") for n in names)

    try:
        _wait_for(second_save, proc, "the second save")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    rc, _, err = _train(capsys, framework, run, "--resume", "--epochs", "2")
    assert rc == 0, err
    assert f"resuming {workload} ({framework}) from epoch 1" in err
    assert _ckpts(run) == [f"epoch_1{ext}", f"epoch_2{ext}"]  # the killed save's temporary file is gone
    assert strip(records(run)) == strip(records(trained[framework]))
    assert_same_state(_state(trained[framework], framework, 2), _state(run, framework, 2))


@pytest.mark.slow
def test_two_trainings_in_one_workdir_one_is_refused(capsys, tmp_path):
    from flaxport.harness.store import SAVE_DELAY_ENV

    run = tmp_path / "run"
    first = subprocess.Popen(_python_flaxport("train", "gan", "--framework", "torch", "--epochs", 2, "--workdir", run,
                                              *GAN), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, SAVE_DELAY_ENV: "1"})
    try:
        _wait_for(lambda: (run / "config.json").exists(), first, "the first run to start")
        rc, _, err = _train(capsys, "torch", run, "--seed", "7", "--epochs", "2")
        _one_line(rc, err, f"workdir {run} is in use by process {first.pid}")
    finally:
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert [r["epoch"] for r in records(run)] == [1, 2]
    assert json.loads((run / "config.json").read_text())["config"]["seed"] == 0
    assert torch.load(run / "checkpoints" / "epoch_2.pt", weights_only=True)["meta"]["seed"] == 0


def _fsize_limited(limit):
    def start():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return start


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["jax", "torch", "keras"])
def test_a_full_disk_is_one_line_and_keeps_the_earlier_checkpoints(trained, tmp_path, framework):
    run = shutil.copytree(trained[framework], tmp_path / "run")
    before = _ckpts(run)
    workload, args = ARGS[framework]
    fast = ["--runner", "step"] if framework == "jax" else []  # compiles in a third of the time of scan
    proc = subprocess.run(_python_flaxport("train", workload, "--framework", framework, "--workdir", run,
                                           "--resume", "--epochs", 3, *args, *fast),
                          capture_output=True, text=True, preexec_fn=_fsize_limited(60_000), timeout=600)
    _one_line(proc.returncode, proc.stderr, "cannot write checkpoint 3", "File too large",
              "earlier checkpoints kept: 1, 2")
    assert len(proc.stderr.strip().splitlines()) <= 5, proc.stderr  # data, training, resuming, epoch 3, error
    assert _ckpts(run) == before  # no partial checkpoint or temporary file


@pytest.mark.slow
def test_no_traceback_at_exit_after_a_refusal_in_a_real_process(trained, tmp_path, cli):
    run = shutil.copytree(trained["jax"], tmp_path / "run")
    for args in (["--workdir", run, "--resume", "--seed", "7"],  # refused while Orbax is open
                 ["--workdir", tmp_path / "new", "--set", "runner=foo"]):
        proc = cli("train", "gan", *args, *GAN)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and lines[-1].startswith("flaxport: error: "), proc.stderr
        assert not any(w in l for l in lines[:-1] for w in ("Traceback", "Error", "ERROR", "flaxport:")), proc.stderr


@pytest.mark.slow
def test_sample_into_a_read_only_workdir_is_one_line(trained, tmp_path):
    run = shutil.copytree(trained["torch"], tmp_path / "run")
    cmd = _python_flaxport("sample", "gan", "--workdir", run)
    if os.geteuid() == 0:  # root writes through permissions: mount the run read-only, in a namespace of its own
        if not shutil.which("unshare"):
            pytest.skip("running as root without unshare: no way to make a read-only folder")
        mount = f"mount --bind {run} {run} && mount -o remount,ro,bind {run} && exec \"$@\""
        cmd = ["unshare", "-m", "sh", "-c", mount, "sh", *cmd]
    else:
        run.chmod(0o555)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if os.geteuid() == 0 and "mount" in proc.stderr and "flaxport" not in proc.stderr:
        pytest.skip(f"no mount namespace here: {proc.stderr.strip()}")
    run.chmod(0o755)
    _one_line(proc.returncode, proc.stderr, f"cannot write pictures to {run}", "read-only")


# --------------------------------------------------------------------------- compare never deletes another run

def _compare(capsys, workdir, *extra):
    return _run(capsys, "compare", "gan", *GAN, "--epochs", "1", "--runs", "jax-step", "--workdir", workdir, *extra)


def test_compare_never_removes_a_finished_training_at_a_runs_place(copy, capsys, tmp_path):
    work = tmp_path / "cmp"
    work.mkdir()
    shutil.copytree(copy("jax"), work / "jax-step")  # a finished training (two checkpoints) at the run's place
    before = _files(work)
    rc, _, err = _compare(capsys, work)
    _one_line(rc, err, f"{work / 'jax-step'} holds a run or files that no earlier comparison here made")
    assert _files(work) == before


@pytest.mark.slow
def test_compare_replaces_its_own_earlier_runs_and_no_other(capsys, tmp_path):
    """The comparison's own earlier run is replaced (report.json says it made it); once a training
    took its folder over, or while a training holds the folder or the workdir, it is refused."""
    from flaxport.harness.workdir import claim

    work = tmp_path / "cmp"
    rc, _, err = _compare(capsys, work)
    assert rc == 0, err
    made = json.loads((work / "report.json").read_text())["made"]
    assert list(made) == ["jax-step"] and made["jax-step"] is not None
    rc, _, err = _compare(capsys, work)  # again: its own run is replaced
    assert rc == 0, err
    (work / "jax-step" / "notes.txt").write_text("mine")  # a file of the user's in the comparison's run
    rc, _, err = _compare(capsys, work)
    _one_line(rc, err, "has changed since the comparison wrote it")
    assert (work / "jax-step" / "notes.txt").read_text() == "mine"
    (work / "jax-step" / "notes.txt").unlink()

    # A training that takes the comparison's folder over (it kept no checkpoints) is its own from then on.
    rc, _, err = _train(capsys, "jax", work / "jax-step", "--epochs", "1")
    assert rc == 0, err
    before = _files(work)
    rc, _, err = _compare(capsys, work)
    _one_line(rc, err, "holds checkpoints", "which a comparison never keeps: another run trained there")
    assert _files(work) == before

    # A training holding the comparison's folder, or its workdir: named, nothing touched.
    shutil.rmtree(work / "jax-step" / "checkpoints")
    for held_dir in (work / "jax-step", work):
        held = claim(held_dir, {}, resume=True, has_checkpoint=lambda w: False)
        try:
            before = _files(work)
            rc, _, err = _compare(capsys, work)
            _one_line(rc, err, f"workdir {held_dir} is in use by this process ({os.getpid()})")
            assert _files(work) == before
        finally:
            held.release()


def test_compare_refuses_a_single_runs_workdir_and_a_file_where_its_run_goes(copy, capsys, tmp_path):
    run = copy("torch")
    before = _files(run)
    rc, _, err = _compare(capsys, run)
    _one_line(rc, err, f"workdir {run} holds a single run (config.json); choose another --workdir")
    assert _files(run) == before
    (tmp_path / "cmp").mkdir()
    (tmp_path / "cmp" / "jax-step").write_text("mine")
    rc, _, err = _compare(capsys, tmp_path / "cmp")
    _one_line(rc, err, "jax-step is a file or a link where the comparison's run folder goes")
    assert (tmp_path / "cmp" / "jax-step").read_text() == "mine"


def test_a_workdir_name_too_long_for_the_file_system_is_one_line(capsys, tmp_path):
    rc, _, err = _train(capsys, "torch", tmp_path / ("w" * 300), "--epochs", "1")
    _one_line(rc, err, "is not writable: File name too long")


@pytest.mark.slow
@pytest.mark.parametrize("dst", ["out.pt", "out.safetensors", "workdir"])
def test_convert_onto_a_full_disk_is_one_line_and_leaves_nothing(trained, tmp_path, dst):
    src = trained["jax"] if dst != "workdir" else trained["torch"] / "checkpoints" / "epoch_2.pt"
    out = tmp_path / "out" / dst
    out.parent.mkdir()
    proc = subprocess.run(_python_flaxport("convert", "gan", src, out), capture_output=True, text=True,
                          preexec_fn=_fsize_limited(3000), timeout=600)
    _one_line(proc.returncode, proc.stderr, "cannot write", str(out), "File too large")
    assert list(out.parent.iterdir()) == []  # no half-written file or workdir, no temporary one


@pytest.mark.slow
def test_a_ctrl_c_swallowed_by_a_gc_callback_still_ends_the_command_as_interrupted(tmp_path):
    """Fault injected: a Ctrl-C landing in a garbage-collector callback (as in XLA's) as a
    command ends; Python prints "Exception ignored" there and would exit 0."""
    code = ("import gc, sys\n"
            "from flaxport import cli\n"
            "def env_run(args):\n"
            "    def callback(phase, info):\n"
            "        gc.callbacks.remove(callback)\n"
            "        raise KeyboardInterrupt\n"
            "    gc.callbacks.append(callback)\n"
            "    gc.collect()\n"
            "    return 0\n"
            "import flaxport.cli.env as env\n"
            "env.run = env_run\n"
            "sys.argv = ['flaxport', 'env']\n"
            "sys.exit(cli.main())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130 and proc.stderr.strip().splitlines() == ["flaxport: interrupted"], proc.stderr


@pytest.mark.slow
def test_nothing_is_printed_after_the_one_line_when_a_background_thread_fails_late(tmp_path):
    """Fault injected: what Orbax's write threads do after a full disk (a traceback as the process ends)."""
    code = ("import atexit, sys, threading, time\n"
            "from flaxport import cli\n"
            "from flaxport.errors import UserError\n"
            "def env_run(args):\n"
            "    atexit.register(lambda: print('Traceback (most recent call last): late', file=sys.stderr))\n"
            "    raise UserError('cannot write checkpoint 3 in RUN/checkpoints: No space left on device')\n"
            "import flaxport.cli.env as env\n"
            "env.run = env_run\n"
            "sys.argv = ['flaxport', 'env']\n"
            "sys.exit(cli.main())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "flaxport: error: cannot write checkpoint 3 in RUN/checkpoints: No space left on device"], proc.stderr
