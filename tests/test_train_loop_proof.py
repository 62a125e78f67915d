"""check_step proves a whole torch training loop in float64: 20 steps that cross the schedule's
boundaries, with gradient clipping active, two param groups (no weight decay on biases and norms,
another learning rate for the head), 4 micro-batches accumulated per step and BatchNorm updated by
each: the loss, every gradient, parameter, optimizer moment and both groups' learning rates at
every step. A real bug in any part of the loop (the schedule stepped per epoch instead of per step,
decay on the norms, clipping after the step) fails it.
"""
import copy

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from flaxport.port import check_step  # noqa: E402
from flaxport.translate import translate  # noqa: E402

lrs = torch.optim.lr_scheduler
STEPS = 20
CLIP = 0.1  # the summed gradient norm runs 0.29 down to 0.12 unclipped: clipped at most steps


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1, bias=False)  # a bias before BN: rounding noise
        self.bn = nn.BatchNorm2d(6)
        self.head = nn.Linear(6, 4)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


def groups(module, head_lr):
    """The usual split: no decay on biases and norm weights; the head at its own rate."""
    decay = [p for n, p in module.named_parameters() if p.ndim > 1 and not n.startswith("head")]
    no_decay = [p for n, p in module.named_parameters() if p.ndim <= 1 and not n.startswith("head")]
    head = list(module.head.parameters())
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}, {"params": head, "lr": head_lr}]


@pytest.fixture(scope="module")
def problem():
    torch.manual_seed(0)
    module = Net().train()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 3, 6, 6, generator=g)
    y = torch.randint(0, 4, (16,), generator=g)
    t = translate(module, x[:4])
    return module, t, x, y


def _loop(module, head_lr=0.05):
    m = copy.deepcopy(module).double()
    opt = torch.optim.AdamW(groups(m, head_lr), lr=0.02, weight_decay=0.1)
    warmup = lrs.LinearLR(opt, start_factor=0.2, total_iters=5)
    sched = lrs.SequentialLR(opt, [warmup, lrs.CosineAnnealingLR(opt, T_max=8, eta_min=0.001)], milestones=[5])
    return m, opt, sched


def _check(problem, **kwargs):
    module, t, x, y = problem
    m, opt, sched = _loop(module)
    with jax.enable_x64(True):
        return check_step(m, opt, F.cross_entropy, t, (x.double(), y), steps=STEPS, scheduler=sched, accumulate=4,
                          clip_grad_norm=CLIP, **kwargs)


def test_twenty_steps_of_a_whole_loop_float64(problem):
    report = _check(problem)
    assert report.dtype == "float64" and report.strict_ok, str(report)
    assert max(r.max_abs for r in report.rows) < 1e-9, str(report)
    phases = {r.phase for r in report.rows}
    assert phases == {"loss", "grad", "running_stats", "param", "moment", "lr"}
    assert {r.step for r in report.rows} == set(range(1, STEPS + 1))
    assert {r.torch_name for r in report.rows if r.phase == "lr"} == {"lr[group 0]", "lr[group 1]", "lr[group 2]"}
    assert "3 param groups" in report.optimizer and f"clip_grad_norm_({CLIP:g}, 2)" in report.optimizer
    assert "accumulate 4" in report.optimizer

    # the loop really crosses what it claims: warm-up, then the cosine down and back up; clipping on
    module, t, x, y = problem
    m, opt, sched = _loop(module)
    rates, clipped = [], 0
    for _ in range(STEPS):
        opt.zero_grad()
        for xs, ys in zip(x.double().chunk(4), y.chunk(4)):
            (F.cross_entropy(m(xs), ys) / 4).backward()
        clipped += float(torch.nn.utils.clip_grad_norm_(m.parameters(), CLIP)) > CLIP
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates[0] < rates[4] and min(rates[5:]) < 0.002 and rates[-1] > min(rates[5:]) * 2, rates
    assert clipped >= STEPS // 2, clipped


@pytest.mark.slow
@pytest.mark.parametrize("bug", ["schedule_per_epoch", "decay_on_norms"])
def test_a_port_with_a_loop_bug_fails(problem, monkeypatch, bug):
    """Two bugs a hand port makes, put into the JAX side: the schedule stepped every 2 steps
    (per epoch) where torch steps it every step, and weight decay on every group where torch's
    second group has none. The report names the first tensor that parts."""
    from flaxport.port import optim

    if bug == "schedule_per_epoch":
        every = optim._every
        monkeypatch.setattr(optim, "_every", lambda schedule, steps: every(schedule, 2))
    else:
        hypers = optim.group_hypers
        monkeypatch.setattr(optim, "group_hypers", lambda opt: [{**h, "weight_decay": 0.1} for h in hypers(opt)])
    report = _check(problem)
    assert not report.ok, str(report)
    first = report.first_divergence
    if bug == "schedule_per_epoch":
        assert (first.phase, first.step) == ("lr", 2), str(report)  # LinearLR's second step
    else:
        assert first.phase == "param" and first.torch_name.startswith("bn."), str(report)


@pytest.mark.slow
def test_train_step_py_of_the_whole_loop_is_proven(problem):
    """write_train_step from the torch objects themselves (3 param groups, SequentialLR,
    clip_grad_norm_, 4 micro-batches): train_step.py holds PARAM_GROUPS by NNX path, the schedule
    functions and ACCUMULATE, and its own step equals torch's loop over 12 steps in float64."""
    from flaxport.translate.train_step import write_train_step

    module, t, x, y = problem
    opt = torch.optim.AdamW(groups(module, 0.05), lr=0.02, weight_decay=0.1)
    sched = lrs.SequentialLR(opt, [lrs.LinearLR(opt, start_factor=0.2, total_iters=5),
                                   lrs.CosineAnnealingLR(opt, T_max=8, eta_min=0.001)], milestones=[5])
    step = write_train_step(t, module, opt, F.cross_entropy, batch=(x, y), steps=12, scheduler=sched,
                            clip_grad_norm=CLIP, accumulate=4)
    assert step.ok and max(r[2] for r in step.rows) < 1e-12, step.markdown()
    source = step.source
    assert '"bn/bias": 1,  # bn.bias' in source and "ACCUMULATE = 4" in source
    assert "def make_optimizer(param_paths, scheduler_every=1):" in source
    assert "clip_grad_norm(max_norm=0.1, norm_type=2.0)" in source and "def sequential(" in source
    assert "lr[group 2]" in {r.torch_name for r in step.report.rows}
