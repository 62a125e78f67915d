"""The CLI as a user meets it: one-line errors, exit codes, files in the workdir."""
import json
import subprocess
import sys

import pytest


def _one_line_error(proc, *needles):
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr
    assert len(err) >= 1 and err[-1].startswith("flaxport: error: "), proc.stderr
    assert len([l for l in err if l.startswith("flaxport:")]) == 1
    for n in needles:
        assert n in err[-1], err[-1]


def test_import_flaxport_imports_neither_torch_nor_keras():
    code = ("import sys, flaxport, flaxport.cli, flaxport.harness.loop, flaxport.workloads.gan, "
            "flaxport.workloads.gan.convert, flaxport.nn;"
            "bad = [m for m in ('torch', 'keras', 'tensorflow') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_env_prints_versions_and_devices(cli):
    proc = cli("env", "--gemm", "128,128,128")
    assert proc.returncode == 0, proc.stderr
    assert "jax_devices" in proc.stdout and "flax" in proc.stdout and "torch" in proc.stdout
    rates = {l.split()[0]: float(l.split()[1]) for l in proc.stdout.splitlines() if l.startswith("gemm_")}
    assert set(rates) == {"gemm_jax", "gemm_torch"} and all(r > 0 for r in rates.values()), proc.stdout
    bad = cli("env", "--gemm", "64,x")
    assert bad.returncode != 0 and bad.stderr.strip() == "flaxport: error: --gemm expects M,K,N integers, got '64,x'"


def test_python_m_flaxport_is_the_cli(cli):
    proc = cli("--help")
    assert proc.returncode == 0 and "train" in proc.stdout and "compare" in proc.stdout


@pytest.mark.parametrize("args,needles", [
    (["train", "nope"], ["unknown workload 'nope'"]),
    (["train", "gan", "--bogus"], ["unrecognized arguments: --bogus"]),
    (["train", "gan", "--framework", "tf"], ["invalid choice: 'tf'"]),
    (["train", "gan", "--config", "huge"], ["unknown config 'huge'"]),
    (["train", "gan", "--set", "nope=1"], ["no field 'nope'"]),
    (["train", "gan", "--set", "g_lr=fast"], ["cannot read 'fast' as float"]),
    (["train", "gan", "--epochs", "0"], ["--epochs must be at least 1"]),
    (["train", "gan", "--data", "cifar10"], ["mixture"]),
    (["compare", "gan", "--runs", "jax-warp"], ["gan has no jax-warp", "choose from torch-eager"]),
    (["evaluate", "gan", "--workdir", "/nonexistent/run"], ["not a flaxport run directory"]),
])
def test_user_errors_are_one_line(cli, args, needles):
    _one_line_error(cli(*args), *needles)


@pytest.mark.slow
def test_unwritable_workdir(cli, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    _one_line_error(cli("train", "gan", "--config", "smoke", "--workdir", blocker / "run"), "not writable")


@pytest.mark.slow
def test_train_writes_its_files_then_refuses_another_workload_and_resumes(cli, tmp_path):
    run = tmp_path / "gan"
    proc = cli("train", "gan", "--config", "smoke", "--epochs", "1", "--workdir", run, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(out["quality"]) == {"w1", "ks", "mode_share"}
    for f in ("config.json", "metrics.jsonl", "histogram.png", "checkpoints/1"):
        assert (run / f).exists(), f
    record = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert record["epoch"] == 1 and "g_loss" in record["train"] and "compile_seconds" in record

    # A run again in the same workdir without --resume is refused; nothing is lost.
    _one_line_error(cli("train", "gan", "--config", "smoke", "--workdir", run), "--resume")
    assert (run / "checkpoints" / "1").exists()

    # Another framework's (or workload's) run in this workdir is refused.
    _one_line_error(cli("train", "gan", "--config", "smoke", "--framework", "torch", "--workdir", run, "--resume"),
                    "framework='jax'")
    cfg = json.loads((run / "config.json").read_text())
    cfg["workload"] = "cnn"
    (run / "config.json").write_text(json.dumps(cfg))
    _one_line_error(cli("train", "gan", "--config", "smoke", "--workdir", run, "--resume"), "workload='cnn'")
    cfg["workload"] = "gan"
    (run / "config.json").write_text(json.dumps(cfg))

    proc = cli("train", "gan", "--config", "smoke", "--epochs", "2", "--workdir", run, "--resume", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert "resuming gan from epoch 1" in proc.stderr
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2

    proc = cli("evaluate", "gan", "--workdir", run)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["epochs_done"] == 2
    proc = cli("sample", "gan", "--workdir", run, "--n", "500")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_a_checkpoint_of_another_workload_is_refused(cli, tmp_path):
    run = tmp_path / "gan"
    assert cli("train", "gan", "--config", "smoke", "--epochs", "1", "--workdir", run).returncode == 0
    # Someone trains with another config's shapes into this workdir's checkpoint slot.
    proc = cli("train", "gan", "--config", "smoke", "--epochs", "2", "--workdir", run, "--resume",
               "--set", "z_dim=16")
    _one_line_error(proc, "does not fit")
    assert (run / "checkpoints" / "1").exists()


@pytest.mark.slow
def test_nan_loss_exits_nonzero_with_one_line(cli, tmp_path):
    proc = cli("train", "gan", "--config", "smoke", "--set", "g_lr=1e38", "--set", "d_lr=1e38",
               "--workdir", tmp_path / "nan")
    assert proc.returncode == 3
    _one_line_error(proc, "NaN", "step 1")


def test_debug_shows_the_traceback(cli):
    proc = cli("--debug", "train", "nope")
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_compare_never_deletes_a_folder_that_is_not_a_run(cli, tmp_path):
    mine = tmp_path / "cmp" / "jax-scan"
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    _one_line_error(cli("compare", "gan", "--config", "smoke", "--epochs", "1", "--runs", "jax-scan",
                        "--workdir", tmp_path / "cmp"), "no earlier comparison here made")
    assert (mine / "notes.txt").read_text() == "mine"
