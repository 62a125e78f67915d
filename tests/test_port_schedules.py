"""Every torch.optim.lr_scheduler scheduler that is a function of the step count, as an optax
schedule: its rate (and OneCycleLR's / CyclicLR's cycled momentum) at every step of a run long
enough to cross all its boundaries equals torch's in float64. LambdaLR's lambda is translated
from its source (HuggingFace's warm-up schedules are LambdaLRs of a functools.partial)."""
import math

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from flaxport.port.optimizers import schedule_links  # noqa: E402

lrs = torch.optim.lr_scheduler
STEPS = 40
WARMUP, TOTAL = 6, 30


def _warmup_then_decay(step):
    """A def with an early return, a local and a closure-free constant."""
    if step < WARMUP:
        return (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, TOTAL - WARMUP)
    return max(0.05, 0.5 * (1.0 + math.cos(math.pi * progress)))


def _lambda_with_closure(power):
    return lambda step: (1 - min(step, TOTAL) / TOTAL) ** power if step > 2 else 0.5


CASES = {
    "step": lambda o: lrs.StepLR(o, step_size=7, gamma=0.5),
    "multistep": lambda o: lrs.MultiStepLR(o, milestones=[5, 12, 12, 30], gamma=0.3),
    "constant": lambda o: lrs.ConstantLR(o, factor=0.25, total_iters=9),
    "linear": lambda o: lrs.LinearLR(o, start_factor=0.1, end_factor=0.9, total_iters=17),
    "exponential": lambda o: lrs.ExponentialLR(o, gamma=0.93),
    "polynomial": lambda o: lrs.PolynomialLR(o, total_iters=25, power=2.0),
    "cosine": lambda o: lrs.CosineAnnealingLR(o, T_max=15, eta_min=0.01),
    "warm_restarts": lambda o: lrs.CosineAnnealingWarmRestarts(o, T_0=5, eta_min=0.001),
    "warm_restarts_mult": lambda o: lrs.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2, eta_min=0.001),
    "one_cycle": lambda o: lrs.OneCycleLR(o, max_lr=0.5, total_steps=STEPS),
    "one_cycle_three_phase_linear": lambda o: lrs.OneCycleLR(o, max_lr=0.5, total_steps=STEPS + 3, three_phase=True,
                                                             anneal_strategy="linear", pct_start=0.2),
    "cyclic": lambda o: lrs.CyclicLR(o, base_lr=0.01, max_lr=0.2, step_size_up=4, step_size_down=7),
    "cyclic_triangular2": lambda o: lrs.CyclicLR(o, 0.01, 0.2, step_size_up=5, mode="triangular2"),
    "cyclic_exp_range": lambda o: lrs.CyclicLR(o, 0.01, 0.2, step_size_up=3, mode="exp_range", gamma=0.97),
    "sequential_warmup_cosine": lambda o: lrs.SequentialLR(o, [lrs.LinearLR(o, start_factor=0.1, total_iters=8),
                                                               lrs.CosineAnnealingLR(o, T_max=20)], milestones=[8]),
    "sequential_three": lambda o: lrs.SequentialLR(o, [lrs.ConstantLR(o, factor=0.5, total_iters=4),
                                                       lrs.ExponentialLR(o, gamma=0.9), lrs.StepLR(o, 5)],
                                                   milestones=[6, 20]),
    "chained": lambda o: lrs.ChainedScheduler([lrs.LinearLR(o, start_factor=0.2, total_iters=10),
                                               lrs.ExponentialLR(o, gamma=0.95), lrs.MultiStepLR(o, [15, 25])]),
    "lambda_def": lambda o: lrs.LambdaLR(o, _warmup_then_decay),
    "lambda_closure": lambda o: lrs.LambdaLR(o, _lambda_with_closure(1.5)),
}


def _torch_rates(make, steps=STEPS):
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    sched = make(opt)
    lr, momentum = [], []
    links = schedule_links.from_torch(sched)  # as check_step reads it: before the first step
    for _ in range(steps):
        lr.append(opt.param_groups[0]["lr"])
        momentum.append(opt.param_groups[0]["momentum"])
        opt.step()
        sched.step()
    return np.array(lr), np.array(momentum), links


@pytest.mark.parametrize("case", sorted(CASES))
def test_rate_at_every_step_float64(case):
    want, momentum, links = _torch_rates(CASES[case])
    with jax.enable_x64(True):
        schedule = schedule_links.build(links.lr[0], links.lambdas)
        got = np.array([float(schedule(k)) for k in range(STEPS)])
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, err_msg=case)
        if links.momentum:
            cycled = schedule_links.build(links.momentum[0], links.lambdas)
            np.testing.assert_allclose([float(cycled(k)) for k in range(STEPS)], momentum, rtol=1e-12, atol=1e-15)
    assert len(set(np.round(want, 12))) >= 2, "the case crosses no boundary"


@pytest.mark.parametrize("name", ["get_linear_schedule_with_warmup", "get_cosine_schedule_with_warmup",
                                  "get_cosine_with_hard_restarts_schedule_with_warmup",
                                  "get_polynomial_decay_schedule_with_warmup"])
def test_huggingface_warmup_schedules(name):
    """transformers' schedules are LambdaLRs of a functools.partial of a module-level def."""
    transformers = pytest.importorskip("transformers")
    make = getattr(transformers, name)
    want, _, links = _torch_rates(lambda o: make(o, num_warmup_steps=WARMUP, num_training_steps=TOTAL))
    source = links.lambdas["lr_lambda"].source
    assert source.startswith("def lr_lambda(current_step):") and "num_warmup_steps = 6" in source
    with jax.enable_x64(True):
        schedule = schedule_links.build(links.lr[0], links.lambdas)
        got = np.array([float(schedule(k)) for k in range(STEPS)])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_schedule_links_write_readable_calls():
    _, _, links = _torch_rates(CASES["sequential_warmup_cosine"], steps=1)
    assert links.lr[0].code == ("sequential(schedules=[linear_lr(base_lr=0.1, start_factor=0.1, end_factor=1.0, "
                                "total_iters=8), cosine_annealing_lr(base_lr=0.1, T_max=20, eta_min=0.0)], "
                                "milestones=(8,))")
    assert schedule_links.functions(links.lr) == ["sequential", "linear_lr", "cosine_annealing_lr"]


def test_chained_cosine_with_eta_min_is_refused():
    from flaxport.port.schedules import UnsupportedSchedulerError

    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.1)
    sched = lrs.ChainedScheduler([lrs.CosineAnnealingLR(opt, T_max=5, eta_min=0.01), lrs.ExponentialLR(opt, 0.9)])
    with pytest.raises(UnsupportedSchedulerError, match="ChainedScheduler of CosineAnnealingLR: only schedulers"):
        schedule_links.from_torch(sched)
