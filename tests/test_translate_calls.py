"""A module called more than once is one class with one `return`: each call returns what any
call's caller reads (RAFT's update block returns the hidden state and the flow; after the last
iteration only the flow is read), and a result no caller reads is bound to `_`."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch import nn  # noqa: E402


class Update(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, hidden, x):
        hidden = torch.tanh(self.gru(hidden) + x)
        return hidden, self.head(hidden)


class Refine(nn.Module):
    def __init__(self, iterations=3):
        super().__init__()
        self.update = Update()
        self.iterations = iterations

    def forward(self, x):
        hidden, flows = torch.zeros_like(x), []
        for _ in range(self.iterations):
            hidden, flow = self.update(hidden, x)
            flows.append(flow)
        return torch.stack(flows)


def test_the_last_call_reading_less_is_the_same_class():
    from flaxport.translate import translate

    module = Refine().eval()
    t = translate(module, torch.randn(2, 8))
    assert t.report.ok, str(t.report)
    update = t.source[t.source.index("class Update("):t.source.index("class Refine(")]
    assert update.count("return ") == 1, update
    call_lines = [line.strip() for line in t.source.splitlines() if "self.update(" in line]
    assert len(call_lines) == 3
    assert call_lines[-1].startswith("_, "), call_lines  # the last hidden state: read by no one
    x = torch.randn(4, 8)
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(np.asarray(t.model(x.numpy())), want, rtol=1e-5, atol=1e-5)


class Affine(nn.Module):
    def forward(self, x, scale, shift):
        return x * scale + shift


class TwoAffines(nn.Module):
    """One parameter-free module called with other numbers each time, in both modes."""

    def __init__(self):
        super().__init__()
        self.affine = Affine()
        self.lin = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        return self.affine(self.drop(self.lin(x)), 2.0, 0.5) + self.affine(x, 3.0, 0.5) * self.affine(x, 3.0, -1.0)


def test_constants_the_calls_differ_in_are_arguments_named_as_in_torch():
    from flaxport.translate import translate

    module = TwoAffines().eval()
    t = translate(module, torch.randn(2, 4))
    assert t.report.ok, str(t.report)
    assert "def __call__(self, x, scale, shift):" in t.source
    assert "return x * scale + shift" in t.source
    top = " ".join(t.source[t.source.index("class TwoAffines("):t.source.index("\ndef load(")].split())
    for call in ("self.affine(self.drop(self.lin(x)), 2.0, 0.5)", "self.affine(x, 3.0, 0.5)", "self.affine(x, 3.0, -1.0)"):
        assert call in top.replace("( ", "(").replace(" )", ")"), top[:600]
    x = torch.randn(3, 4)
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(np.asarray(t.model(x.numpy())), want, rtol=1e-5, atol=1e-5)


class Rotary(nn.Module):
    """Reads another buffer per call, chosen by a string argument (HF ModernBERT's rotary embedding)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("full_inv_freq", torch.rand(4), persistent=False)
        self.register_buffer("sliding_inv_freq", torch.rand(4))

    def forward(self, x, layer_type):
        return x * getattr(self, f"{layer_type}_inv_freq")


class Layers(nn.Module):
    def __init__(self):
        super().__init__()
        self.rotary = Rotary()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.rotary(self.lin(x), "full") + self.rotary(x, "sliding") * self.rotary(x, "full")


class Resize(nn.Module):
    """Called with a target size taken from a tensor's shape (HF Mask2Former's mask predictor)."""

    def forward(self, x, size):
        y = nn.functional.interpolate(x, size=size, mode="nearest")
        return y.sum((2, 3)) if size[0] < 4 else y.mean((2, 3))


class Pyramid(nn.Module):
    def __init__(self):
        super().__init__()
        self.resize = Resize()

    def forward(self, x, small, large):
        return self.resize(x, small.shape[-2:]) + self.resize(x, large.shape[-2:])


def test_calls_with_different_code_branch_on_the_argument_that_chose_it():
    from flaxport.translate import translate

    module = Layers().eval()
    t = translate(module, torch.randn(2, 4))
    assert t.report.ok, str(t.report)
    rotary = t.source[t.source.index("class Rotary("):t.source.index("class Layers(")]
    assert "def __call__(self, x, layer_type):" in rotary
    assert 'if layer_type == "full":' in rotary and 'elif layer_type == "sliding":' in rotary, rotary
    assert 'self.rotary(x, "sliding")' in t.source
    x = torch.randn(3, 4)
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(np.asarray(t.model(x.numpy())), want, rtol=1e-5, atol=1e-5)


class Grid(nn.Module):
    """A position grid from the input's size: torch.export keeps the size symbolic for a 4x4 map
    and fixes it for a 1x1 one (DETR's sine position embedding over its smallest feature map)."""

    def forward(self, x):
        h, w = x.shape[-2:]
        return x + torch.arange(h, dtype=x.dtype)[:, None] * 0.5 + torch.arange(w, dtype=x.dtype)[None, :]


class TwoMaps(nn.Module):
    def __init__(self):
        super().__init__()
        self.grid = Grid()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, big, small):
        return self.grid(self.conv(big)).mean((2, 3)) + self.grid(small).mean((2, 3))


def test_calls_with_different_code_and_nothing_to_tell_them_apart_are_numbered():
    from flaxport.translate import translate

    module = TwoMaps().eval()
    t = translate(module, torch.randn(2, 3, 4, 4), torch.randn(2, 3, 1, 1))
    assert t.report.ok, str(t.report)
    grid = t.source[t.source.index("class Grid("):t.source.index("class TwoMaps(")]
    assert "def __call__(self, x, variant):" in grid and "elif variant == 1:" in grid, grid
    top = " ".join(t.source[t.source.index("class TwoMaps("):t.source.index("\ndef load(")].split())
    assert "self.grid(small, 1)" in top


def test_calls_that_agree_run_the_model_no_extra_time(monkeypatch):
    from flaxport.translate import calls, translate

    def never(*args):
        raise AssertionError("an eager run for calls that agree")

    monkeypatch.setattr(calls, "_arguments_passed", never)
    t = translate(Refine().eval(), torch.randn(2, 8), check=False)
    assert t.source.count("self.update(") == 3


def test_a_branching_argument_taken_from_a_shape_is_written_as_a_tuple():
    from flaxport.translate import translate

    module = Pyramid().eval()
    x, small, large = torch.randn(2, 3, 4, 4), torch.randn(2, 1, 2, 2), torch.randn(2, 1, 8, 8)
    t = translate(module, x, small, large)
    assert t.report.ok, str(t.report)
    resize = t.source.split("class Resize(")[1].split("def load(")[0]
    assert "torch.Size" not in t.source and "if size_value == (2, 2):" in resize, resize


class HandedDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, head):
        return head[0](self.lin(x))


class HandsItsHead(nn.Module):
    """Hands a module it holds to a child's forward (HF PP-DocLayout's decoder and its order head)."""

    def __init__(self):
        super().__init__()
        self.decoder = HandedDecoder()
        self.decoder_head = nn.ModuleList([nn.Linear(4, 2)])

    def forward(self, x):
        return self.decoder(x, self.decoder_head)


def test_a_module_passed_as_an_argument_is_refused_by_name():
    from flaxport.translate import UnsupportedOpsError, translate

    with pytest.raises(UnsupportedOpsError, match="Linear at decoder_head.0 called by decoder, which does not hold it"):
        translate(HandsItsHead().eval(), torch.randn(2, 4))


class DenseLayer(nn.Module):
    """DenseNet's layer: called with the list of every feature map so far, one longer each time."""

    def __init__(self, in_channels, growth):
        super().__init__()
        self.norm = nn.BatchNorm2d(in_channels)
        self.conv = nn.Conv2d(in_channels, growth, 3, padding=1)

    def forward(self, prev_features):
        return self.conv(torch.relu(self.norm(torch.cat(prev_features, 1))))


class DenseNet(nn.Module):
    def __init__(self, stem: bool = True):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1) if stem else nn.Identity()
        self.layers = nn.ModuleList([DenseLayer((4 if stem else 3) + 2 * i, 2) for i in range(3)])

    def forward(self, x):
        features = [self.stem(x)]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


@pytest.mark.parametrize("stem", [True, False], ids=["after-a-stem", "at-the-input"])
def test_a_layer_given_a_growing_list_is_one_class_taking_the_list(tmp_path, stem):
    """The first layer's list holds a convolution's output or the model's own input: one class either way."""
    import re

    from flaxport.translate import translate
    from flaxport.translate.proof import check_train
    from flaxport.translate.written import check_written

    module = DenseNet(stem).eval()
    t = translate(module, torch.randn(2, 3, 8, 8))
    assert t.report.ok, t.report.first_divergence
    assert re.findall(r"^class (\w+)", t.source[:t.source.index("def load")], re.M) == ["DenseLayer", "DenseNet"]
    assert "def __call__(self, prev_features):" in t.source and "concatenate_channels(prev_features)" in t.source
    assert f"self.layers[2]([{'features' if stem else 'x'}, h, h2])" in t.source
    assert f"DenseLayer({6 if stem else 5}, rngs=rngs)" in t.source
    assert "def __init__(self, in_channels, *, rngs" in t.source
    assert check_train(t, module.train()).ok
    t.save(tmp_path)
    assert check_written(t, module.eval(), tmp_path).problem == ""


def test_variants_differing_in_many_children_are_numbered_not_listed():
    from flaxport.translate.classes import _variant_name

    assert _variant_name("DenseBlock", {"a"}, {"a", "b_c"}, 1) == "DenseBlockWithBC"
    assert _variant_name("DenseBlock", {"a"}, {"a", "b", "c", "d"}, 2) == "DenseBlock3"
