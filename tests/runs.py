"""Helpers for tests that drive a workload through the CLI and inspect its run folder."""
import importlib.util
import json

import numpy as np

HAS_TORCH = importlib.util.find_spec("torch") is not None
PNG = b"\x89PNG\r\n\x1a\n"


def train(cli, workload, workdir, *args):
    proc = cli("train", workload, "--workdir", workdir, "--no-progress", *args)
    assert proc.returncode == 0, proc.stderr
    return proc


def records(workdir):
    """metrics.jsonl as a list of dicts."""
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def evaluate(cli, workload, workdir, *args):
    proc = cli("evaluate", workload, "--workdir", workdir, *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def one_line_error(proc, *needles):
    """A non-zero exit with exactly one `flaxport: error:` line holding every needle, no traceback."""
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    mine = [l for l in proc.stderr.strip().splitlines() if l.startswith("flaxport:")]
    assert len(mine) == 1 and mine[0].startswith("flaxport: error: "), proc.stderr
    for n in needles:
        assert n in mine[0], mine[0]


def jax_state(workdir, epochs_done):
    """The whole saved Orbax train state (params, statistics, Adam moments, step) as flat NumPy leaves."""
    import jax
    import orbax.checkpoint as ocp

    tree = ocp.StandardCheckpointer().restore((workdir / "checkpoints" / str(epochs_done) / "state").absolute())
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def torch_state(workdir, epochs_done):
    """A torch checkpoint's model and optimizer state as flat NumPy arrays."""
    import torch

    sd = torch.load(workdir / "checkpoints" / f"epoch_{epochs_done}.pt", weights_only=True)["state"]
    out = {f"model.{k}": v.numpy() for k, v in sd["model"].items()}
    for pid, st in sd["opt"]["state"].items():
        out.update({f"opt.{pid}.{k}": np.asarray(v) for k, v in st.items()})
    return out


def assert_same_state(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def strip(recs):
    """metrics.jsonl records without wall-clock fields: epoch, steps, train, quality."""
    return [{k: r[k] for k in ("epoch", "steps", "train", "quality")} for r in recs]


def assert_jax_resume_exact(cli, workload, one_epoch_run, tmp_path):
    """A 1-epoch run (copied) resumed to 2 epochs equals a 2-epoch run: records and whole state."""
    import shutil

    full, cut = tmp_path / "full", tmp_path / "cut"
    train(cli, workload, full, "--config", "smoke", "--epochs", "2")
    shutil.copytree(one_epoch_run, cut)
    proc = train(cli, workload, cut, "--config", "smoke", "--epochs", "2", "--resume")
    assert f"resuming {workload} from epoch 1" in proc.stderr
    assert [r["epoch"] for r in records(cut)] == [1, 2]
    assert strip(records(full)) == strip(records(cut))  # losses and quality, exactly
    assert_same_state(jax_state(full, 2), jax_state(cut, 2))  # so `evaluate` agrees too


def assert_torch_resume_exact(workload_name, tmp_path):
    """The same for the torch twin, in-process (the CLI's torch path is tested elsewhere)."""
    from flaxport.harness import torch_loop
    from flaxport.workloads import registry

    wl = registry.get(workload_name)
    config = wl.get_config("smoke")
    kw = dict(data=wl.load_data(config), progress=False, quiet=True, options=torch_loop.EAGER)
    full = torch_loop.train(wl, config, workdir=tmp_path / "full", epochs=2, **kw)
    torch_loop.train(wl, config, workdir=tmp_path / "cut", epochs=1, **kw)
    resumed = torch_loop.train(wl, config, workdir=tmp_path / "cut", epochs=2, resume=True, **kw)
    assert [h["epoch"] for h in resumed.history] == [2]
    assert strip(records(tmp_path / "full")) == strip(records(tmp_path / "cut"))
    assert full.quality == resumed.quality
    assert_same_state(torch_state(tmp_path / "full", 2), torch_state(tmp_path / "cut", 2))
