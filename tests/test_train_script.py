"""train.py, written beside train_step.py, run as a user runs it (where flaxport cannot be imported):
a run stopped and resumed from its Orbax checkpoint takes the uninterrupted run's steps to the bit;
a torch run stopped at step k and continued by train.py --from-torch-checkpoint matches the
uninterrupted torch run's next 10 steps in float64 (AdamW with a StepLR schedule, BatchNorm);
mistakes are one line and exit 2.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from flaxport.translate import translate  # noqa: E402
from flaxport.translate.train_step import write_train_step  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from translate_zoo import _REFUSE  # noqa: E402

OPTIMIZER, SCHEDULER = "torch.optim.AdamW(lr=1e-2, weight_decay=0.1)", "StepLR(step_size=4, gamma=0.5)"

DATA = """
import numpy as np
rng = np.random.default_rng(0)
X = rng.normal(size=(48, 3, 8, 8))
Y = rng.integers(0, 5, size=48)
loader = [(X[i:i + 8], Y[i:i + 8]) for i in range(0, 48, 8)]  # 6 batches, then it starts over
"""


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.head = nn.Linear(6 * 2 * 2, 5)

    def forward(self, x):
        return self.head(F.max_pool2d(torch.relu(self.bn(self.conv(x))), 2).flatten(1))


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    torch.manual_seed(0)
    module = Net().train()
    t = translate(module, torch.randn(8, 3, 8, 8))
    write_train_step(t, module, OPTIMIZER, "F.cross_entropy", scheduler=SCHEDULER, check=False)
    out = tmp_path_factory.mktemp("net")
    t.save(out)
    (out / "data.py").write_text(textwrap.dedent(DATA))
    torch.save(module.state_dict(), out / "initial.pt")
    return out


def _train(out, *flags, check=True):
    """train.py run where flaxport (and, without --from-torch-checkpoint, torch) cannot be imported."""
    refuse = _REFUSE if "--from-torch-checkpoint" not in flags else _REFUSE.replace('("flaxport", "torch")',
                                                                                     '("flaxport",)')
    code = refuse + f"import sys, runpy; sys.argv = ['train.py'] + {list(map(str, flags))!r}; " \
                    f"runpy.run_path({str(out / 'train.py')!r}, run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code], cwd=out, capture_output=True, text=True, timeout=600,
                          check=False) if not check else subprocess.run(
        [sys.executable, "-c", code], cwd=out, capture_output=True, text=True, timeout=600, check=True)


def _losses(workdir):
    return [json.loads(line)["loss"] for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_a_run_resumed_from_its_checkpoint_is_the_uninterrupted_run(written):
    whole, parts = written / "whole", written / "parts"
    _train(written, "--data", "data.py:loader", "--steps", 8, "--workdir", whole)
    _train(written, "--data", "data.py:loader", "--steps", 5, "--workdir", parts)
    _train(written, "--data", "data.py:loader", "--steps", 8, "--workdir", parts, "--resume")
    assert _losses(whole) == _losses(parts) and len(_losses(parts)) == 8
    assert sorted(int(p.name) for p in (whole / "checkpoints").iterdir()) == [8]
    assert sorted(int(p.name) for p in (parts / "checkpoints").iterdir()) == [5, 8]
    import orbax.checkpoint as ocp

    read = [ocp.StandardCheckpointer().restore(w / "checkpoints" / "8" / "default") for w in (whole, parts)]
    import jax

    for a, b in zip(jax.tree.leaves(read[0]), jax.tree.leaves(read[1])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_torch_run_continued_by_train_py_matches_torch_float64(written):
    """torch takes 3 steps and saves model, optimizer, scheduler and step; torch goes on to step 13,
    and train.py --from-torch-checkpoint goes from 3 to 13 on the same batches: the same weights."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("data_for_test", written / "data.py")
    data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(data)
    module = Net().double().train()
    module.load_state_dict(torch.load(written / "initial.pt"))
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    for step in range(1, 14):
        x, y = data.loader[(step - 1) % len(data.loader)]
        opt.zero_grad()
        F.cross_entropy(module(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
        sched.step()
        if step == 3:
            torch.save({"model": module.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                        "step": 3}, written / "ckpt.pt")
    run = _train(written, "--data", "data.py:loader", "--steps", 13, "--workdir", written / "continued",
                 "--precision", "float64", "--from-torch-checkpoint", written / "ckpt.pt")
    assert json.loads(run.stdout.splitlines()[-1])["steps"] == 13
    import jax
    import orbax.checkpoint as ocp

    with jax.enable_x64(True):
        saved = ocp.StandardCheckpointer().restore(written / "continued" / "checkpoints" / "13" / "default")["state"]
        params = [np.asarray(a) for a in saved[0]]
    assert params[0].dtype == np.float64
    spec = importlib.util.spec_from_file_location("written_model", written / "model.py")
    model_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model_py)
    layouts = getattr(model_py, "CHANNELS_LAST_COLUMNS", {})  # the head's columns as model.py holds them
    # train_step.py's parameter leaves are in NNX path order: bn/bias, bn/weight, conv/weight, head/bias, head/weight
    names = ["bn.bias", "bn.weight", "conv.weight", "head.bias", "head.weight"]
    for got, name in zip(params, names):
        want = module.state_dict()[name].detach().numpy()
        want = model_py.columns_channels_last(want, layouts[name]) if name in layouts else want
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("flags, says", [
    (["--data", "nowhere.py:loader", "--steps", "2"], "--data 'nowhere.py:loader': write it as file.py:name"),
    (["--data", "data.py:nothing", "--steps", "2"], "data.py has no 'nothing'"),
    (["--data", "data.py:loader", "--steps", "2", "--mesh", "data=3"], "--mesh 'data=3' needs 3 devices; there are 1"),
    (["--data", "data.py:loader", "--steps", "2", "--mesh", "model=1"], "the axes are data and fsdp"),
    (["--data", "data.py:loader", "--steps", "2", "--resume", "--from-torch-checkpoint", "x.pt"], "choose one"),
])
def test_mistakes_are_one_line_and_exit_2(written, flags, says):
    run = _train(written, *flags, "--workdir", written / "mistakes", check=False)
    assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_a_loss_that_turns_nan_stops_with_exit_3_and_no_checkpoint_of_it(written):
    """Batch 4 holds a NaN: steps 1-3 are recorded, the checkpoint of step 2 is kept, none of step 4."""
    (written / "nan_data.py").write_text(textwrap.dedent(DATA) + "loader[3][0][0, 0, 0, 0] = np.nan\n")
    workdir = written / "diverged"
    run = _train(written, "--data", "nan_data.py:loader", "--steps", 6, "--save-every", 2, "--workdir", workdir,
                 check=False)
    assert run.returncode == 3 and "the loss is nan at step 4" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert len(_losses(workdir)) == 3 and all(np.isfinite(_losses(workdir)))
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()) == [2]
