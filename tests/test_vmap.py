"""Many runs as one program (harness.vmap): members equal their single runs, one workdir
each, resume after SIGKILL to the same bits, bad input refused in one line."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from flaxport.cli import main
from flaxport.harness import loop
from flaxport.harness.checkpoint import SAVE_DELAY_ENV
from flaxport.workloads import registry
from runs import assert_same_state, jax_state, records, strip

GAN = registry.get("gan")
VAE = registry.get("vae")
GAN_ARGS = ["train", "gan", "--config", "smoke", "--epochs", "3", "--seeds", "2", "--sweep", "d_lr=1e-4,4e-4",
            "--no-progress"]
GAN_MEMBERS = ["d_lr=1e-4_seed0", "d_lr=1e-4_seed1", "d_lr=4e-4_seed0", "d_lr=4e-4_seed1"]


def _cli(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def gan_stack(tmp_path_factory):
    """4 GAN members (d_lr x seeds), 3 epochs, through the CLI in this process."""
    work = tmp_path_factory.mktemp("gan") / "stack"
    assert main([*GAN_ARGS, "--workdir", str(work)]) == 0
    return work


def _assert_close(single: dict, member: dict, rel=1e-4):
    """Every array within `rel` of its single-run twin (relative to the array's norm)."""
    assert sorted(single) == sorted(member)
    for k, a in single.items():
        a = np.asarray(a, np.float64)
        err = np.linalg.norm((a - member[k]).ravel()) / max(np.linalg.norm(a.ravel()), 1e-30)
        assert err < rel, (k, err)


def _stack_member_state(stack, epochs_done: int, index: int) -> dict:
    """Member `index` of the stack's own checkpoint `epochs_done`, as flat NumPy leaves."""
    return {k: v[index] for k, v in jax_state(stack, epochs_done).items()}


@pytest.mark.slow
def test_gan_members_match_their_single_runs(gan_stack, tmp_path):
    import dataclasses

    data = GAN.load_data(GAN.get_config("smoke"))
    for seed, d_lr, member in ((1, 1e-4, "d_lr=1e-4_seed1"), (0, 4e-4, "d_lr=4e-4_seed0")):
        config = dataclasses.replace(GAN.get_config("smoke"), d_lr=d_lr)
        single = tmp_path / member
        loop.train(GAN, config, workdir=single, seed=seed, epochs=3, data=data, progress=False, quiet=True)
        # Epoch 1: every state array (the stack's checkpoint, sliced) and the losses. On this CPU
        # (XLA 0.10.2, 4 members) they are the same bits; docs/vmap.md says where they are not.
        _assert_close(jax_state(single, 1), _stack_member_state(gan_stack, 1, GAN_MEMBERS.index(member)))
        for key, value in records(single)[0]["train"].items():
            assert records(gan_stack / member)[0]["train"][key] == pytest.approx(value, rel=1e-4)
        _assert_close(jax_state(single, 3), jax_state(gan_stack / member, 3), rel=1e-2)  # the member's own checkpoint
        saved = json.loads((gan_stack / member / "config.json").read_text())
        assert saved["config"]["d_lr"] == d_lr and saved["config"]["seed"] == seed


@pytest.mark.slow
def test_every_member_is_a_run_directory_and_the_sweep_is_summarised(gan_stack, capsys):
    for name in GAN_MEMBERS:
        assert {"config.json", "metrics.jsonl", "histogram.png", "checkpoints"} <= {p.name for p in (gan_stack / name).iterdir()}
    code, out, _ = _cli(["evaluate", "gan", "--workdir", gan_stack / "d_lr=4e-4_seed1"], capsys)
    assert code == 0 and json.loads(out)["quality"] == records(gan_stack / "d_lr=4e-4_seed1")[-1]["quality"]
    rep = json.loads((gan_stack / "sweep.json").read_text())
    assert rep["swept"] == {"d_lr": [1e-4, 4e-4]} and rep["seeds"] == [0, 1] and rep["metric"] == "w1"
    finals = {n: records(gan_stack / n)[-1]["quality"]["w1"] for n in GAN_MEMBERS}
    row = next(r for r in rep["settings"] if r["settings"] == {"d_lr": 4e-4})
    assert row["quality"]["w1"]["mean"] == pytest.approx(np.mean([finals["d_lr=4e-4_seed0"], finals["d_lr=4e-4_seed1"]]), abs=1e-6)
    assert "| d_lr=0.0004 | 2 |" in (gan_stack / "sweep.md").read_text()
    assert (gan_stack / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A finished stack, asked again without --resume, is refused: a typo never overwrites it.
    code, _, err = _cli([*GAN_ARGS, "--workdir", gan_stack], capsys)
    assert code == 2 and "already holds checkpoints; pass --resume" in err


@pytest.fixture(scope="module")
def vae_stack(tmp_path_factory):
    """2 seeds x lr {1e-3 (the default), 1e12 (diverges)}, one epoch, through harness.vmap."""
    from flaxport.harness import vmap

    config = VAE.get_config("smoke")
    data = VAE.load_data(config)
    members = vmap.plan(0, 2, vmap.parse_sweep(config, ["lr=1e-3,1e12"]))
    work = tmp_path_factory.mktemp("vae") / "stack"
    results = vmap.train_stack(VAE, config, members, workdir=work, data=data, progress=False)
    return work, data, {m.name: r for m, r in zip(members, results)}


@pytest.mark.slow
def test_vae_members_match_their_single_runs_to_float32_rounding(vae_stack, tmp_path):
    work, data, results = vae_stack
    config = VAE.get_config("smoke")
    for seed in (1,):  # member 1 of 4: a stack that mixed its members up would fail here
        single = loop.train(VAE, config, workdir=tmp_path / str(seed), seed=seed, data=data, progress=False, quiet=True)
        member = results[f"lr=1e-3_seed{seed}"]
        # XLA's batched matmuls round differently from the single run's: close, not equal.
        _assert_close(jax_state(tmp_path / str(seed), 1), jax_state(work / f"lr=1e-3_seed{seed}", 1))
        for key, value in single.history[0]["train"].items():
            assert member.history[0]["train"][key] == pytest.approx(value, rel=1e-4)


@pytest.mark.slow
def test_a_diverging_member_is_dropped_and_the_others_finish(vae_stack):
    work, _, results = vae_stack
    for seed in (0, 1):
        r = results[f"lr=1e12_seed{seed}"]
        assert r.quality == {} and "NaN/inf" in r.settings["dropped"]
        assert not (work / f"lr=1e12_seed{seed}" / "checkpoints").exists() and records(work / f"lr=1e12_seed{seed}") == []
    rep = json.loads((work / "checkpoints" / "1" / "meta" / "metadata").read_text())
    assert sorted(rep["dropped"]) == ["lr=1e12_seed0", "lr=1e12_seed1"]


@pytest.mark.parametrize("args, needles", [
    (["--seeds", "0"], ["--seeds must be at least 1, got 0"]),
    (["--sweep", "g_lr=1e-4,abc"], ["--sweep g_lr: cannot read 'abc' as float"]),
    (["--sweep", "batch_size=10,20"], ["--sweep batch_size: changes shapes", "gan sweeps g_lr, d_lr"]),
    (["--sweep", "g_widths=64"], ["--sweep g_widths: changes shapes"]),
    (["--sweep", "bn_eps=0.1,0.8"], ["--sweep bn_eps: is not a hyperparameter the vectorised step can carry"]),
    (["--sweep", "g_lr=1e-4,0.0001"], ["--sweep g_lr: '0.0001' is listed twice"]),
    (["--seeds", "2", "--framework", "torch"], ["--seeds/--sweep train one vectorised JAX program"]),
    (["--seeds", "1000000"], ["1000000 members need about", "GiB free; train fewer members at once"]),
    # the values --set refuses, --sweep refuses too (a member would train a config evaluate refuses)
    (["--sweep", "d_lr=-1e-3,1e-3"], ["--sweep d_lr=-1e-3: d_lr must be a finite number >= 0, got -0.001"]),
    (["--sweep", "b2=0.9,1.5"], ["--sweep b2=1.5: b2 must be a number in [0, 1)"]),
    (["--sweep", "bn_momentum=1.5"], ["--sweep bn_momentum=1.5: bn_momentum must be a number from 0 to 1"]),
    (["--sweep", "adam_eps=-1"], ["--sweep adam_eps=-1: adam_eps must be a finite number >= 0, got -1.0"]),
    (["--sweep", "b1=-0.5"], ["--sweep b1=-0.5: b1 must be a number in [0, 1)"]),
    (["--seeds", "2", "--seed", str(2**63 - 1)], [f"--seed {2**63 - 1} with --seeds 2: the last seed, {2**63}, is "
                                                  "past 2**63 - 1"]),
])
def test_bad_stacks_are_refused_in_one_line_before_anything_is_written(args, needles, tmp_path, capsys):
    work = tmp_path / "w"
    code, _, err = _cli(["train", "gan", "--config", "smoke", "--workdir", work, *args], capsys)
    mine = [line for line in err.splitlines() if line.startswith("flaxport:")]
    assert code == 2 and len(mine) == 1 and mine[0].startswith("flaxport: error: "), err
    assert all(n in mine[0] for n in needles), mine[0]
    assert not work.exists()


@pytest.mark.slow
def test_sigkill_then_resume_ends_bit_identical(gan_stack, tmp_path, tmp_path_factory):
    work = tmp_path / "stack"
    ckpts = work / "checkpoints"
    cmd = [sys.executable, "-m", "flaxport", *GAN_ARGS, "--workdir", str(work), "--resume"]
    # Saves sleep 0.3 s before Orbax finalises them, so a kill lands in one; the compilation
    # cache spares the restarts a compile (it does not change the numbers).
    env = {**os.environ, SAVE_DELAY_ENV: "0.3", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "jax-cache")}

    def finished():
        return {int(p.name) for p in ckpts.iterdir() if p.name.isdigit()} if ckpts.is_dir() else set()

    def saving():
        return ckpts.is_dir() and any(".orbax-checkpoint-tmp" in p.name for p in ckpts.iterdir())

    draw = random.Random(20261124)
    for n in range(2):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        before = finished()
        t0 = time.monotonic()
        while not (saving() if n == 0 else finished() - before):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() - t0 < 300
            time.sleep(0.005)
        if n:
            time.sleep(draw.uniform(0.0, 0.3))
        assert proc.poll() is None, "the stack finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
        assert proc.returncode == -signal.SIGKILL and "Traceback" not in err, err[-2000:]
    assert main([*GAN_ARGS, "--workdir", str(work), "--resume"]) == 0
    for name in GAN_MEMBERS:
        assert strip(records(work / name)) == strip(records(gan_stack / name))
        assert_same_state(jax_state(gan_stack / name, 3), jax_state(work / name, 3))
    assert not any(".orbax-checkpoint-tmp" in p.name for p in ckpts.iterdir())


@pytest.mark.slow
@pytest.mark.torch
def test_compare_seeds_reports_member_steps_per_second_of_every_run(cli, tmp_path):
    pytest.importorskip("torch")
    work = tmp_path / "cmp"
    proc = cli("compare", "gan", "--config", "smoke", "--epochs", "2", "--seeds", "2", "--workdir", work,
               "--runs", "torch-tuned,jax-vmap,torch-vmap", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    rep = json.loads((work / "report.json").read_text())
    rates = rep["member_steps_per_second"]
    assert sorted(rates) == ["jax-vmap", "torch-tuned", "torch-vmap"] and all(v > 0 for v in rates.values())
    summary = {s["name"]: s for s in rep["summary"]}
    assert summary["jax-vmap"]["members"] == summary["torch-vmap"]["members"] == 2
    assert summary["torch-tuned"]["members"] == 1 and summary["torch-tuned"]["seeds"] == 2
    runs = {(r["name"], r["seed"]): r for r in rep["runs"]}
    for seed in (0, 1):
        # torch.func's batched kernels round apart from the sequential run's (jax-vmap's equality
        # with its single runs is tested above).
        assert runs["torch-vmap", seed]["quality"]["w1"] == pytest.approx(runs["torch-tuned", seed]["quality"]["w1"],
                                                                          rel=1e-2)
        assert records(work / "jax-vmap" / f"seed{seed}")[-1]["quality"] == runs["jax-vmap", seed]["quality"]
        assert (work / "torch-vmap" / f"seed{seed}" / "histogram.png").exists()
    md = (work / "report.md").read_text()
    assert "| members | member-steps/s | with compile |" in md and "2 members as one torch.func.vmap program" in md


def _files(top) -> dict:
    """{relative path: bytes} of every file under `top` (folders as None)."""
    return {str(p.relative_to(top)): (p.read_bytes() if p.is_file() else None) for p in sorted(top.rglob("*"))}


@pytest.mark.slow
def test_a_refused_stack_resume_leaves_the_stack_and_every_member_untouched(gan_stack, tmp_path, capsys):
    import shutil

    from flaxport.harness.workdir import lock

    work = tmp_path / "stack"
    shutil.copytree(gan_stack, work)
    before = _files(work)
    # Another shape: refused by the checkpoint's shape check, after every member was claimed.
    code, _, err = _cli([*GAN_ARGS, "--workdir", work, "--resume", "--epochs", "4", "--set", "z_dim=8"], capsys)
    mine = [line for line in err.splitlines() if line.startswith("flaxport:")]
    assert code == 2 and len(mine) == 1 and "does not fit this run's state" in mine[0], err
    # A member's workdir held by another writer: one line naming it.
    fd = lock(work / GAN_MEMBERS[2])
    try:
        code, _, err = _cli([*GAN_ARGS, "--workdir", work, "--resume", "--epochs", "4"], capsys)
    finally:
        os.close(fd)
    assert code == 2 and f"workdir {work / GAN_MEMBERS[2]} is in use by this process" in err, err
    assert _files(work) == before


@pytest.mark.slow
def test_a_damaged_stack_checkpoint_falls_back_and_retrains_to_the_same_bits(gan_stack, tmp_path, capsys):
    import shutil

    work = tmp_path / "stack"
    shutil.copytree(gan_stack, work)
    arrays = [p for p in (work / "checkpoints" / "3" / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
    biggest = max(arrays, key=lambda p: p.stat().st_size)
    data = bytearray(biggest.read_bytes())
    for i in range(1000, 1064):  # decodes, to other numbers: only the checksum can tell
        data[i] ^= 0x5A
    biggest.write_bytes(bytes(data))
    code, _, err = _cli([*GAN_ARGS, "--workdir", work, "--resume"], capsys)
    assert code == 0, err
    assert f"flaxport: warning: checkpoint {work / 'checkpoints' / '3'} is damaged (" in err
    assert "using checkpoint 2 instead" in err and len(list((work / "checkpoints-damaged").iterdir())) == 1
    assert_same_state(jax_state(gan_stack, 3), jax_state(work, 3))  # epoch 3 trained again, to the same bits
    for name in GAN_MEMBERS:
        assert strip(records(work / name)) == strip(records(gan_stack / name))


@pytest.mark.slow
@pytest.mark.parametrize("epochs", [3, 4])
def test_a_deleted_member_comes_back_whole_when_the_stack_resumes(gan_stack, tmp_path, capsys, epochs):
    """A finished stack resumed with nothing to train (3) or one more epoch (4): the member whose
    folder was deleted gets its config.json and every metrics record back, and a checkpoint."""
    import shutil

    work = tmp_path / "stack"
    shutil.copytree(gan_stack, work)
    lost = work / GAN_MEMBERS[1]
    kept = {k: v for k, v in _files(lost).items() if k in ("config.json", "metrics.jsonl")}
    shutil.rmtree(lost)
    code, _, err = _cli([*GAN_ARGS, "--workdir", work, "--resume", "--epochs", epochs], capsys)
    assert code == 0, err
    assert (lost / "config.json").read_bytes() == kept["config.json"]
    assert records(lost)[:3] == [json.loads(line) for line in kept["metrics.jsonl"].decode().splitlines()]
    assert [r["epoch"] for r in records(lost)] == list(range(1, epochs + 1))
    code, out, err = _cli(["evaluate", "gan", "--workdir", lost], capsys)
    assert code == 0 and json.loads(out)["epochs_done"] == epochs, err
