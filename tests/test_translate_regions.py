"""A `with torch.autocast(enabled=False):` region inside forward (timm's EfficientViT attention)
translates as the ops it holds; an enabled one is refused in one line naming the module."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch import nn  # noqa: E402


class Attention(nn.Module):
    def __init__(self, enabled=False):
        super().__init__()
        self.enabled = enabled
        self.qkv = nn.Linear(8, 24)
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=self.enabled):
            weights = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, -1)
            y = weights @ v
        return self.proj(y.to(x.dtype))


class Net(nn.Module):
    def __init__(self, enabled=False):
        super().__init__()
        self.attn = Attention(enabled)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.attn(x).mean(1))


def test_autocast_off_region_translates_as_its_ops():
    from flaxport.translate import translate

    torch.manual_seed(0)
    t = translate(Net().eval(), torch.randn(2, 5, 8))
    assert t.report.ok, str(t.report)
    assert [r.torch_name for r in t.report.rows] == ["attn.qkv", "attn.proj", "attn", "head", "output"]
    assert "jax.nn.softmax" in t.source and "autocast" not in t.source


def test_autocast_on_region_is_refused_by_name():
    from flaxport.translate import translate
    from flaxport.translate.errors import TranslateError

    with pytest.raises(TranslateError, match=r"^attn runs ops under torch.autocast\(enabled=True\)"):
        translate(Net(enabled=True).eval(), torch.randn(2, 5, 8))
