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

    sd = torch.load(workdir / "checkpoints" / f"epoch_{epochs_done}.pt", weights_only=False)["state"]
    out = {f"model.{k}": v.numpy() for k, v in sd["model"].items()}
    for pid, st in sd["opt"]["state"].items():
        out.update({f"opt.{pid}.{k}": np.asarray(v) for k, v in st.items()})
    return out


def assert_same_state(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
