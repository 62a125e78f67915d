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
