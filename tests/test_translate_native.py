"""translate's default conv="native": the generated file runs its float32 convolutions on flaxport's
CPU kernels (counted in the jaxpr: strided, grouped, depthwise, dilated and unevenly padded
ones too), the forward and three SGD steps match torch, conv="xla" writes XLA's convolution
only, and the file still runs where flaxport cannot be imported.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flaxport import kernels  # noqa: E402

pytestmark = [pytest.mark.torch,
              pytest.mark.skipif(not kernels.available(), reason=f"no native kernels: {kernels.unavailable_reason()}")]

from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402


class Mixed(nn.Module):
    """Six convolutions of every kind the kernels run: 3x3 and 5x5 'same' (one functional), stride 2,
    depthwise, 10 channels out with padding that differs per axis, dilation."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.body_weight = nn.Parameter(torch.randn(32, 16, 5, 5) * 0.05)
        self.bn = nn.BatchNorm2d(32)
        self.down = nn.Conv2d(32, 32, 3, stride=2, padding=1)
        self.depthwise = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.narrow = nn.Conv2d(32, 10, 3, padding=(1, 0))
        self.dilated = nn.Conv2d(10, 16, 3, padding=2, dilation=2)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = torch.relu(self.bn(F.conv2d(h, self.body_weight, padding="same")))
        h = self.dilated(self.narrow(self.depthwise(self.down(h))))
        return self.head(h.mean((2, 3)))


def _native_calls(t, x) -> int:
    """How many of flaxport's forward kernels (dense and depthwise) the float32 eval forward of t.model calls."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(t.model)
    jaxpr = jax.make_jaxpr(lambda s, x: nnx.merge(graphdef, s)(x))(state, x)
    text = str(jaxpr)
    return text.count("target_name=flaxport_conv_fwd") + text.count("target_name=flaxport_depthwise_fwd")


def test_the_cnn_runs_its_convolutions_on_the_kernels_and_matches_torch():
    import jax.numpy as jnp

    import translate_zoo as zoo
    from flaxport.translate import translate

    module, (x,) = zoo.make("cnn")
    t = zoo.translated("cnn")[2]  # the default: conv="native"
    assert t.report.ok, str(t.report)
    assert any("float64 figures check XLA's convolution" in n for n in t.notes)
    assert _native_calls(t, jnp.asarray(x.numpy())) == 2
    assert "from flaxport.kernels import conv as flaxport_conv" in t.source
    xla_only = translate(module, x, conv="xla", check=False).source
    assert "flaxport_conv" not in xla_only and "from flaxport" not in xla_only
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(np.asarray(t.model(jnp.asarray(x.numpy()))), want, rtol=1e-5, atol=1e-5)


def test_every_kind_of_convolution_runs_on_the_kernels_and_three_sgd_steps_match_torch():
    """Forward proof, six kernel calls for six convolutions, and check_step's three SGD steps in
    float32: the kernels' weight and input gradients against torch's (SGD, not Adam: Adam's first
    steps turn float32 rounding of near-zero gradients into lr-sized differences)."""
    import jax.numpy as jnp

    from flaxport.port import check_step
    from flaxport.translate import translate

    torch.manual_seed(0)
    module = Mixed().train()
    x = torch.randn(4, 3, 12, 12, generator=torch.Generator().manual_seed(1))
    t = translate(module, x)
    assert t.report.ok, str(t.report)
    t.model.eval()
    assert _native_calls(t, jnp.asarray(x.numpy())) == 6
    t.model.train()
    targets = torch.randint(0, 4, (4,), generator=torch.Generator().manual_seed(2))
    report = check_step(module, torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9), F.cross_entropy, t,
                        (x, targets), steps=3, recheck_float64=False)
    assert report.ok, str(report)
    assert {r.phase for r in report.rows} >= {"loss", "grad", "param"}


def test_the_native_file_runs_where_flaxport_cannot_be_imported(tmp_path):
    """Without flaxport the file's convolutions are XLA's: same numbers up to float32 rounding."""
    import translate_zoo as zoo
    from flaxport.translate import translate

    module, (x,) = zoo.make("cnn")
    translate(module, x, conv="native", check=False).save(tmp_path / "cnn")
    np.save(tmp_path / "x.npy", x.numpy())
    zoo.run_without_flaxport_or_torch(f"""
        import importlib.util
        import numpy as np
        spec = importlib.util.spec_from_file_location("model", {str(tmp_path / 'cnn' / 'model.py')!r})
        model_py = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(model_py)
        assert model_py.flaxport_conv is None
        model = model_py.load({str(tmp_path / 'cnn')!r})
        np.save({str(tmp_path / 'y.npy')!r}, np.asarray(model(np.load({str(tmp_path / 'x.npy')!r}))))
    """)
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-5, atol=1e-5)


def test_a_kernel_that_computes_something_else_fails_the_proof(monkeypatch):
    """The float64 column runs XLA's convolution, so where the file runs the kernels the float32 column
    is checked too: a kernel 1% off is caught at the first convolution."""
    import translate_zoo as zoo
    from flaxport.kernels import conv as kernel_conv
    from flaxport.translate import translate

    right = kernel_conv.convolution
    monkeypatch.setattr(kernel_conv, "convolution", lambda *args: right(*args) * 1.01)
    module, (x,) = zoo.make("cnn")
    report = translate(module, x).report
    assert not report.ok and report.first_divergence.torch_name == "conv1", str(report)
    assert "on flaxport's kernels" in report.first_divergence.note


def test_the_translate_benchmark_times_every_model_and_they_agree(tmp_path):
    """`python -m flaxport.bench.translate` (make bench): the four translations and the two hand-written
    CNNs, each timed, all computing the same log-probabilities."""
    import json
    import subprocess
    import sys

    out = tmp_path / "translate.json"
    subprocess.run([sys.executable, "-m", "flaxport.bench.translate", "--rounds", "1", "--calls", "1", "--json",
                    str(out)], check=True, capture_output=True, timeout=600)
    figures = json.loads(out.read_text())
    names = {"translated (nchw, --conv xla)", "translated (nhwc, --conv xla)", "translated (nchw)",
             "translated (nhwc)", "hand-written (native conv)", "hand-written (xla conv)"}
    assert set(figures["median_ms"]) == names and all(ms > 0 for ms in figures["median_ms"].values())
    assert max(figures["max_abs_output_difference"].values()) < 1e-5


def test_the_kernels_check_allows_float32_rounding_as_the_model_amplifies_it():
    """The float32 figure of a row is judged against rounding: relative to max|torch|, over the
    absolute tolerance, and scaled by what the float64 column shows the model doing to rounding."""
    from types import SimpleNamespace

    from flaxport.translate.proof import ATOL, native_kernel_fault

    exact = SimpleNamespace(max_rel=1e-16)
    assert "on flaxport's kernels" in native_kernel_fault(exact, (0.01, 0.01), ATOL)  # a kernel 1% off
    assert native_kernel_fault(exact, (1e-7, 0.5), ATOL) == ""  # zero output: rounding only
    assert native_kernel_fault(exact, (1e-6, 1e-6), ATOL) == ""
    amplifying = SimpleNamespace(max_rel=5e-11)  # MobileNetV2's ReLU6 stack in float64
    assert native_kernel_fault(amplifying, (0.002, 0.0012), ATOL) == ""
    assert "on flaxport's kernels" in native_kernel_fault(amplifying, (0.9, 0.9), ATOL)


def test_a_float32_figure_xla_shares_is_rounding_not_the_kernels():
    """A row off in float32 on flaxport's kernels fails the proof only where XLA's convolutions get it
    right; where XLA is as far off (a top-k choice of queries that float32 rounding flips, HF D-FINE),
    the row stays proved with a note. XLA is run only when a row is suspect."""
    from flaxport.translate.proof import ATOL, Row, blame_kernels

    def rows():
        return [Row("forward", name, name, (2, 4), 1e-17, 1e-16, True) for name in ("queries", "head")]

    asked = []

    def xla(figures):
        return lambda: asked.append(1) or figures

    flipped = rows()
    blame_kernels(flipped, [(0.6, 0.6), (1e-7, 1e-7)], ATOL, xla({("forward", "queries"): (0.5, 0.5)}))
    assert [r.ok for r in flipped] == [True, True] and "XLA's convolutions" in flipped[0].note
    wrong = rows()
    blame_kernels(wrong, [(0.6, 0.6), (1e-7, 1e-7)], ATOL, xla({("forward", "queries"): (1e-7, 1e-7)}))
    assert [r.ok for r in wrong] == [False, True] and "on flaxport's kernels" in wrong[0].note
    assert len(asked) == 2
    fine = rows()
    blame_kernels(fine, [(1e-7, 1e-7), (1e-7, 1e-7)], ATOL, xla({}))
    assert all(r.ok for r in fine) and len(asked) == 2
