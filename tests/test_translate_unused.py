"""Modules the forward never calls: their weights are left out of the translation, and said so."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch import nn  # noqa: E402


class TextAndVision(nn.Module):
    """A multimodal model given only text: the vision tower (a Linear inside a block) holds weights
    the forward never reads."""

    def __init__(self):
        super().__init__()
        self.vision = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8))
        self.embed = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, ids):
        # made before any float value exists: its dtype is read from a weight the model holds
        offset = torch.full((4,), 0.5, dtype=self.head.weight.dtype)
        return self.head(self.embed(ids)) + offset


def test_weights_of_an_uncalled_module_are_left_out(tmp_path):
    from flaxport.translate import translate
    from flaxport.translate.proof import check_train

    module = TextAndVision().eval()
    ids = torch.randint(0, 20, (2, 5))
    t = translate(module, ids)
    assert t.report.ok, t.report.first_divergence
    assert sorted(t.unused) == ["vision.0.bias", "vision.0.weight", "vision.1.bias", "vision.1.weight"]
    assert "self.vision" not in t.source
    report = check_train(t, module)
    assert report.ok, report.first_divergence
    t.save(tmp_path)
    import importlib.util

    spec = importlib.util.spec_from_file_location("model", tmp_path / "model.py")
    model_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model_py)
    model = model_py.load(tmp_path)
    with torch.no_grad():
        want = module(ids).numpy()
    np.testing.assert_allclose(np.asarray(model(ids.numpy())), want, rtol=1e-5, atol=1e-5)


class NamedLikeTheRuntime(nn.Module):
    """Attributes named like runtime functions (`conv`, `layer_norm`) and a docstring naming runtime
    layers (Conv2d, BatchNorm2d): the file carries only the pieces the model calls."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Linear(4, 8)
        self.layer_norm = nn.Linear(8, 4)

    def forward(self, x):
        return self.layer_norm(torch.relu(self.conv(x)))


class SmallConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.conv(x))))
        return self.fc(x.mean((2, 3)))


class TiedUnits(nn.Module):
    """An output layer sharing its embedding's weight."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(self.embed(ids))


class WithUncalledTiedPart(nn.Module):
    """SeamlessM4T v2 given text: its text-to-unit model, whose head is tied to its embedding, is
    never called."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.units = TiedUnits()

    def forward(self, x):
        return self.linear(x)


def test_weights_tied_inside_an_uncalled_module_are_left_out_with_it():
    from flaxport.translate import translate

    module = WithUncalledTiedPart().eval()
    t = translate(module, torch.randn(2, 4))
    assert t.report.ok, str(t.report)
    assert "units" not in t.source[:t.source.index("def load(")]  # neither built nor tied
    assert sorted(t.unused) == ["units.embed.weight", "units.head.weight"]


@pytest.mark.parametrize("make, shape", [(NamedLikeTheRuntime, (2, 4)), (SmallConvNet, (2, 3, 8, 8))],
                         ids=["named-like-the-runtime", "conv-net"])
def test_every_definition_in_the_file_is_used(make, shape):
    """No dead code: each top-level function or class of model.py is read by another part of the
    file (`load` is the file's entry point)."""
    import ast

    from flaxport.translate import translate

    torch.manual_seed(0)
    t = translate(make().eval(), torch.randn(*shape))
    assert t.report.ok, str(t.report)
    tree = ast.parse(t.source)
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name == "load":
            continue
        others = [ast.walk(n) for n in tree.body if n is not node]
        read = {x.id if isinstance(x, ast.Name) else x.attr for walk in others for x in walk
                if isinstance(x, (ast.Name, ast.Attribute))}
        assert node.name in read, f"{node.name} is defined in model.py and never used"
    if make is NamedLikeTheRuntime:
        assert "def conv(" not in t.source and "def layer_norm(" not in t.source


def test_every_name_the_file_defines_besides_the_models_classes_is_one_a_model_name_avoids():
    """A torch class or attribute named like a top-level name of model.py (the runtime pieces, the
    imports, `load`, the native-conv import) would shadow it: naming.RESERVED holds each one."""
    import ast

    from flaxport.translate import translate
    from flaxport.translate.naming import RESERVED

    torch.manual_seed(0)
    t = translate(SmallConvNet().eval(), torch.randn(2, 3, 8, 8), conv="native", check=False)
    tree = ast.parse(t.source)
    defined = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node in tree.body:
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign) and node in tree.body:
            defined |= {n.id for n in node.targets if isinstance(n, ast.Name)}
    assert "flaxport_conv" in defined and "load" in defined
    assert sorted(defined - set(t.class_names) - RESERVED) == []


class TrainingBranch(nn.Module):
    """Branches on self.training: its class needs the runtime's TorchModule as a base."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x):
        y = self.conv(x)
        return y * 2 if self.training else y


@pytest.mark.parametrize("make", [SmallConvNet, TrainingBranch], ids=["conv-net", "training-branch"])
def test_the_models_classes_come_first_and_the_copied_runtime_after_a_divider(make):
    """model.py reads top down as the model: its classes and load(), then the marked runtime
    section (a base class the classes derive from is the one piece above them)."""
    import ast

    from flaxport.translate import translate
    from flaxport.translate.emit import DIVIDER

    torch.manual_seed(0)
    t = translate(make().train(), torch.randn(2, 3, 8, 8), check=False)
    head, divider, runtime = t.source.partition(DIVIDER.splitlines()[1])
    assert divider, "no divider before the runtime pieces"
    defined = [n.name for n in ast.parse(t.source).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    above = [n for n in defined if f"\nclass {n}(" in head or f"\ndef {n}(" in head]
    bases = {"TorchModule"} if make is TrainingBranch else set()
    assert set(above) == set(t.class_names) | {"load"} | bases, above
    assert above[-1] == "load" and above[-2] == t.root_class
    assert "class Conv2d(" in runtime and "def read_safetensors(" in runtime
    namespace = {}
    exec(compile(t.source, "model.py", "exec"), namespace)  # noqa: S102 - the file it wrote, defined in order
