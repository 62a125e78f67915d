"""The run lifecycle every loop shares: checks first, then the workdir changes; resume; finish."""
import json
import types

import numpy as np
import pytest

from flaxport.errors import UserError
from flaxport.harness.lifecycle import Lifecycle
from flaxport.harness.store import open_store


class State:
    """A run's state as the file store sees it (load_state_dict / a dict of arrays)."""

    def __init__(self, w):
        self.w = np.asarray(w, np.float32)

    def state_dict(self):
        return {"w": self.w}

    def load_state_dict(self, d):
        self.w = np.asarray(d["w"])


def workload(pictures: list):
    def write_pictures(workdir, data, artifacts, label):
        pictures.append((label, artifacts))
        return []

    return types.SimpleNamespace(name="toy", write_pictures=write_pictures)


def run(workdir, pictures, *, resume, seed, epochs, evaluations):
    """A two-line "training": each epoch adds 1 to w; returns (state, quality, start)."""
    store = open_store("keras", workdir / "checkpoints")
    with Lifecycle(workload(pictures), workdir, "keras", resume=resume, quiet=True,
                   has_checkpoint=lambda w: store.latest() is not None) as life:
        life.open(store)
        state, _ = life.restore(State([0.0]), {**life.identity, "seed": seed})
        life.begin({"seed": seed}, epochs)

        def evaluate():
            evaluations.append(float(state.w[0]))
            return {"w": float(state.w[0])}, {"epoch": float(state.w[0])}

        quality, artifacts = {}, {}
        with life.epochs(steps=1, progress=False) as log:
            for epoch in range(life.start, epochs):
                log.start(epoch, epochs)
                state.w = state.w + 1
                quality, artifacts = log.end(epoch, {"loss": np.array([1.0])}, 0.01, 0.01, evaluate)
                life.save(epoch + 1, state.state_dict(), 1)
        quality, artifacts = life.finish(log, evaluate, None, "run", quality, artifacts)
        return state, quality, life.start


def test_a_run_resumes_where_its_checkpoint_ends_and_says_so_in_its_files(tmp_path):
    workdir, pictures, evaluations = tmp_path / "run", [], []
    state, quality, start = run(workdir, pictures, resume=False, seed=0, epochs=2, evaluations=evaluations)
    assert (start, float(state.w[0]), quality) == (0, 2.0, {"w": 2.0})
    assert json.loads((workdir / "config.json").read_text()) == {"workload": "toy", "framework": "keras",
                                                                 "config": {"seed": 0}}
    state, quality, start = run(workdir, pictures, resume=True, seed=0, epochs=3, evaluations=evaluations)
    assert (start, float(state.w[0])) == (2, 3.0)
    epochs = [json.loads(line)["epoch"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2, 3]
    assert [label for label, _ in pictures] == ["toy run, epoch 2", "toy run, epoch 3"]


def test_a_finished_run_resumed_trains_nothing_and_still_reports_its_quality(tmp_path):
    workdir, pictures, evaluations = tmp_path / "run", [], []
    run(workdir, pictures, resume=False, seed=0, epochs=1, evaluations=evaluations)
    state, quality, start = run(workdir, pictures, resume=True, seed=0, epochs=1, evaluations=evaluations)
    assert (start, quality, evaluations) == (1, {"w": 1.0}, [1.0, 1.0])
    assert pictures[-1] == ("toy run, epoch 1", {"epoch": 1.0})


def test_another_runs_checkpoint_is_refused_before_anything_is_written(tmp_path):
    workdir, pictures = tmp_path / "run", []
    run(workdir, pictures, resume=False, seed=0, epochs=1, evaluations=[])
    before = {p.name: p.read_bytes() for p in sorted(workdir.rglob("*")) if p.is_file()}
    with pytest.raises(UserError, match="is from seed=0, not 1"):
        run(workdir, pictures, resume=True, seed=1, epochs=2, evaluations=[])
    assert {p.name: p.read_bytes() for p in sorted(workdir.rglob("*")) if p.is_file()} == before
    with pytest.raises(UserError, match="already holds checkpoints; pass --resume"):
        run(workdir, pictures, resume=False, seed=0, epochs=2, evaluations=[])


def test_a_run_refused_in_a_new_workdir_leaves_no_folder_behind(tmp_path):
    workdir = tmp_path / "new" / "run"
    with pytest.raises(RuntimeError, match="the model cannot be built"):
        with Lifecycle(workload([]), workdir, "jax", resume=False, has_checkpoint=lambda w: False):
            raise RuntimeError("the model cannot be built")
    assert not (tmp_path / "new").exists()
