"""The train-mode proof against a model that rounding decides: a float64 difference no larger than
twice torch's own change under 1e-14 nudges of its inputs is marked as rounding (with the figure);
anything larger stays a divergence; the nudged runs draw what the first run drew."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch import nn  # noqa: E402

from flaxport.port.report import SENSITIVE  # noqa: E402
from flaxport.translate import translate  # noqa: E402
from flaxport.translate.proof import check_train  # noqa: E402
from flaxport.translate.sensitivity import NUDGE, torch_spread  # noqa: E402


class Cancelling(nn.Module):
    """1e10 * x0 - 1e10 * x1 on x0 ~ x1: a 1e-14 change of x moves the output by ~1e-4."""

    def __init__(self):
        super().__init__()
        self.mix = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            self.mix.weight.copy_(torch.tensor([[1e10, -1e10]]))

    def forward(self, x):
        return self.mix(x)


def _translated_then_moved(relative: float):
    """A translation of Cancelling, then torch's first weight moved by `relative` of itself (the
    translation keeps the original): the two differ by 1e10 * relative."""
    module = Cancelling().double()
    x = torch.tensor([[1.0, 1.0 + 1e-11]], dtype=torch.float64)
    t = translate(module, x, check=False)
    with torch.no_grad():
        module.mix.weight[0, 0] *= 1 + relative
    return t, module


def test_a_difference_within_torchs_own_spread_is_rounding():
    t, module = _translated_then_moved(3e-15)  # 3e-5 apart: over the 1.1e-5 tolerance
    report = check_train(t, module)
    row = report.rows[0]
    assert not row.ok and row.cause.startswith(SENSITIVE), row
    assert 3e-5 * 0.9 < row.max_abs < 3e-5 * 1.1
    assert report.ok and not report.strict_ok
    assert "torch's own outputs move" in str(report)


def test_a_difference_beyond_it_stays_a_divergence():
    t, module = _translated_then_moved(1e-12)  # 1e-2 apart: 100 times torch's own spread
    report = check_train(t, module)
    assert not report.ok
    assert report.first_divergence.cause == ""


class Noisy(nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x)


def test_the_nudged_runs_draw_what_the_first_drew():
    x = torch.linspace(1.0, 2.0, 12, dtype=torch.float64).reshape(3, 4)
    state = torch.get_rng_state()
    first = Noisy()(x).numpy()
    moved = torch_spread(Noisy(), {}, [x], {}, state, lambda m, a, k: [m(*a, **k).numpy()], {"output": first}, {})
    assert 0 < moved["output"] <= 2 * NUDGE * np.abs(x.numpy()).max()  # the inputs' move, not another draw
