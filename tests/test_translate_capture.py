"""torch.export's symbolic sizes: every axis free where export reasons about them quickly; only
the batch axis where that reasoning runs past its CPU-time budget (window attention), and the
translation still proves."""
import contextlib
import math

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch import nn  # noqa: E402


class Windows(nn.Module):
    """Attention inside 2x2 windows of a (N, C, H, W) map, as Swin partitions it."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(4, 12)

    def forward(self, x):
        n, c, h, w = x.shape
        windows = x.permute(0, 2, 3, 1).reshape(n, h // 2, 2, w // 2, 2, c).transpose(2, 3).reshape(-1, 4, c)
        q, k, v = self.qkv(windows).chunk(3, -1)
        y = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        return y.reshape(n, h // 2, w // 2, 2, 2, c).transpose(2, 3).reshape(n, h, w, c).permute(0, 3, 1, 2)


def test_every_axis_is_free_when_export_is_quick():
    from flaxport.translate import translate

    t = translate(Windows().eval(), torch.randn(2, 4, 8, 8), check=False)
    assert t.plan.captures["eval"].dynamic == "all"
    assert t.plan.captures["train"].dynamic == "all"


def test_export_past_its_budget_keeps_the_batch_axis_free(monkeypatch):
    import numpy as np

    from flaxport.translate import capture, translate

    @contextlib.contextmanager
    def spent(seconds):
        # the budget as already spent, so the test does not hang on the machine's speed
        if seconds is not None:
            raise capture._OverTime(f"over {seconds} CPU seconds")
        yield

    monkeypatch.setattr(capture, "_cpu_time_limit", spent)
    module = Windows().eval()
    t = translate(module, torch.randn(2, 4, 8, 8))
    assert t.report.ok, str(t.report)
    assert {c.dynamic for c in t.plan.captures.values()} == {"batch"}
    assert "any size along axis 0" in t.source
    x = torch.randn(5, 4, 8, 8)  # another batch size than the example's
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(np.asarray(t.model(x.numpy())), want, rtol=1e-5, atol=1e-5)


def test_cpu_time_limit_stops_a_busy_block():
    from flaxport.translate import capture

    with pytest.raises(capture._OverTime):
        with capture._cpu_time_limit(0.05):
            while True:
                sum(range(1000))


class SamePadding(nn.Module):
    """TF-style 'same' padding from the input's size (timm's PNASNet, EfficientNet-TF): the sizes
    are ceil and floor of true divisions."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2)

    def forward(self, x):
        h, w = x.shape[-2:]
        pad_h = max((math.ceil(h / 2) - 1) * 2 + 3 - h, 0)
        pad_w = max((math.ceil(w / 2) - 1) * 2 + 3 - w, 0)
        x = nn.functional.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2])
        return self.conv(x)[..., : math.floor(h / 3) + 1]


@pytest.mark.parametrize("size", [(9, 9), (8, 11)])
def test_ceil_and_floor_of_true_divisions_are_written_out(size):
    import numpy as np

    from flaxport.translate import translate

    module = SamePadding().eval()
    t = translate(module, torch.randn(2, 3, 9, 10))
    assert t.report.ok, str(t.report)
    assert "math.ceil(" in t.source
    x = torch.randn(1, 3, *size)
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(np.asarray(t.model(x.numpy())), want, rtol=1e-5, atol=1e-5)


class SizedAttention(nn.Module):
    """timm Twins' attention: its forward takes the image's sizes as one argument named `size`."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, size):
        H, W = size
        B, N, C = x.shape
        y = x.transpose(1, 2).reshape(B, C, H, W)[..., ::2, ::2]
        return self.proj(y.flatten(2).transpose(1, 2))


class SizedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 2, stride=2)
        self.attn = SizedAttention()

    def forward(self, x):
        x = self.stem(x)
        size = x.shape[-2:]
        return self.attn(x.flatten(2).transpose(1, 2), size).mean(1)


def test_sizes_asked_of_the_caller_take_names_the_forward_leaves_free():
    from flaxport.translate import translate

    t = translate(SizedNet().eval(), torch.randn(2, 3, 8, 12))
    assert t.report.ok, str(t.report)
    assert "def __call__(self, x, size1, size2):" in t.source  # "size" is the forward's own


class MaxPoolSame(nn.Module):
    """timm's MaxPool2dSame: TensorFlow's 'SAME' padding, computed from the size it is given."""

    def forward(self, x):
        ih, iw = x.shape[-2:]
        pad_h = max((math.ceil(ih / 2) - 1) * 2 + 3 - ih, 0)
        pad_w = max((math.ceil(iw / 2) - 1) * 2 + 3 - iw, 0)
        x = nn.functional.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2], value=-math.inf)
        return nn.functional.max_pool2d(x, 3, 2)


class SameStem(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 7, stride=2, padding=3), nn.ReLU(), MaxPoolSame())
        self.proj = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = self.proj(self.backbone(x))
        return y.flatten(2).transpose(1, 2) + y.shape[-1]


def test_a_sequential_whose_element_asks_for_sizes_is_a_class_that_passes_them():
    """nnx.Sequential passes one value along; the padding sizes come from the Sequential's own input."""
    import numpy as np

    from flaxport.translate import translate

    module = SameStem().eval()
    t = translate(module, torch.randn(2, 3, 19, 22))
    assert t.report.ok, str(t.report)
    assert "nnx.Sequential" not in t.source and "class Sequential(nnx.Module):" in t.source
    with torch.no_grad():
        x = torch.randn(3, 3, 27, 16)
        want = module(x).numpy()
    np.testing.assert_allclose(np.asarray(t.model(x.numpy())), want, rtol=1e-4, atol=1e-4)


def test_the_plan_is_never_changed_the_kinds_rendering_decides_come_as_a_revised_copy():
    """The Sequential above becomes a class only once its element's body asks for sizes: the classes
    stage hands emit a revised copy of the plan; the plan it was given still says what it said."""
    from flaxport.translate.capture import capture
    from flaxport.translate.classes import build_classes
    from flaxport.translate.plan import Plan

    module, x = SameStem().eval(), torch.randn(2, 3, 19, 22)
    captures = {mode: capture(module, (x,), {}, train=mode == "train") for mode in ("eval", "train")}
    plan = Plan(module, captures)
    assert (plan.kinds["backbone"], plan.kinds["backbone.1"]) == ("sequential", "element")
    with pytest.raises(TypeError):
        plan.kinds["backbone"] = "generated"  # a read-only mapping: no later stage writes it
    classes = build_classes(plan)
    assert (classes.plan.kinds["backbone"], classes.plan.kinds["backbone.1"]) == ("generated", "inline")
    assert (plan.kinds["backbone"], plan.kinds["backbone.1"]) == ("sequential", "element")


def test_every_axis_free_gets_a_budget_from_the_static_export(monkeypatch):
    from flaxport.translate import capture, translate

    budgets = []
    real = capture._cpu_time_limit

    def spy(seconds):
        budgets.append(seconds)
        return real(seconds)

    monkeypatch.setattr(capture, "_cpu_time_limit", spy)
    t = translate(Windows().eval(), torch.randn(2, 4, 8, 8), check=False)
    static = t.plan.f64.export_seconds
    assert static is not None and static > 0
    assert budgets[0] == capture.dynamic_budget(static)
    assert capture.dynamic_budget(0.1) == capture.DYNAMIC_EXPORT_FLOOR
    assert capture.dynamic_budget(3.0) == 3.0 * capture.DYNAMIC_EXPORT_FACTOR
    assert capture.dynamic_budget(100.0) == capture.DYNAMIC_EXPORT_SECONDS
    assert capture.dynamic_budget(None) == capture.DYNAMIC_EXPORT_SECONDS


class PerExample(nn.Module):
    """torch.vmap inside forward (HF Gemma4's audio tower, NVIDIA's streaming ASR encoders)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x, y):
        scores = torch.vmap(lambda a, b: (a * b).sum(0) + a.max())(self.proj(x), y)
        return torch.nn.functional.gelu(x) * scores[:, None]


def test_vmap_in_forward_becomes_batched_ops():
    from flaxport.translate import translate

    module = PerExample().eval()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    t = translate(module, x, y)
    assert t.report.ok, str(t.report)
    assert "vmap" not in t.source and "batch_dim" not in t.source
    assert "self.proj(x)" in t.source


class PadScores(nn.Module):
    """Grounding DINO's contrastive head: scores written into a tensor of -inf, which is returned."""

    def forward(self, queries, text):
        scores = queries @ text.transpose(-1, -2)
        padded = torch.full((*scores.shape[:-1], 9), float("-inf"))
        padded[..., : scores.shape[-1]] = scores
        return padded


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = PadScores()
        self.proj = nn.Linear(4, 4)

    def forward(self, x, text, z):
        first = self.head(self.proj(x), text)
        return first, first.amax(-1), self.head(z, text)


def test_a_tensor_written_in_place_and_returned_is_the_written_value_in_the_output():
    """The model returns what the head wrote (not the -inf it started from) for both calls, one
    also read later: one class with one code."""
    from flaxport.translate import translate

    t = translate(TwoHeads().eval(), torch.randn(2, 5, 4), torch.randn(2, 3, 4), torch.randn(2, 6, 4))
    assert t.report.ok, t.report.first_divergence
    assert t.source.count("class PadScores") == 1 and "-jnp.inf" in t.source


class RescaledBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.out = nn.Linear(8, 8)

    def forward(self, hidden):
        return hidden + self.out(self.norm(hidden))


class Rescaling(nn.Module):
    """HF RWKV: the forward rescales its blocks' output weights in place when the mode changes, so a
    train-mode capture hands the blocks arrays (the rescaled weights) an eval-mode one does not."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([RescaledBlock(), RescaledBlock()])
        self.rescaled = False

    def forward(self, x):
        if self.rescaled != (not self.training):
            with torch.no_grad():
                for i, block in enumerate(self.blocks):
                    block.out.weight.mul_(2 ** i) if self.training else block.out.weight.div_(2 ** i)
            self.rescaled = not self.training
        for block in self.blocks:
            x = block(x)
        return x


def test_a_module_given_other_arrays_in_train_mode_is_translated_in_eval_mode_only(tmp_path):
    from flaxport.translate import translate
    from flaxport.translate.written import check_written

    module, x = Rescaling().eval(), torch.randn(2, 3, 8)
    with torch.no_grad():
        module(x)
    t = translate(module, x)
    assert t.report.ok, t.report.first_divergence
    assert list(t.plan.captures) == ["eval"] and "self.training" not in t.source
    assert t.notes == ["train mode could not be translated (blocks.0, blocks.1 given other arrays in train mode than "
                       "in eval mode); the model is translated in eval mode only"]
    t.save(tmp_path)
    assert check_written(t, module, tmp_path).problem == ""
