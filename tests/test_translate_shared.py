"""What torch shares stays shared: a weight tied between two modules (an LM head and its
embedding) and a module reached by several paths (timm CoaT's crpe1, handed to each block) are
one object in the translation, so the train step moves them as torch does; the files load them
as one."""
import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch import nn  # noqa: E402


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(11, 8)
        self.mid = nn.Linear(8, 8)
        self.head = nn.Linear(8, 11, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.mid(self.wte(ids)))).mean(1)


class PositionConv(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x):
        return x + self.conv(x.transpose(1, 2)).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, dim, shared_crpe):
        super().__init__()
        self.qkv = nn.Linear(dim, dim)
        self.crpe = shared_crpe

    def forward(self, x):
        return self.qkv(x) + self.crpe(x)


class Block(nn.Module):
    def __init__(self, dim, shared_crpe):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.attn = Attention(dim, shared_crpe)

    def forward(self, x):
        return x + self.attn(self.norm(x))


class SharedBlocks(nn.Module):
    """crpe1 is registered first (its first name) and never called by it; mix_a = mix_b is one
    module called twice, on two sequence lengths (CoaT's mlp2 = mlp3 = mlp4)."""

    def __init__(self, dim=8):
        super().__init__()
        self.crpe1 = PositionConv(dim)
        self.blocks = nn.ModuleList([Block(dim, self.crpe1) for _ in range(2)])
        self.mix_a = self.mix_b = nn.Sequential(nn.Linear(dim, dim), nn.GELU())
        self.head = nn.Linear(dim, 3)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        x = self.mix_a(x) + self.mix_b(x[:, :2]).mean(1, keepdim=True)
        return self.head(x.mean(1))


def _load(directory):
    spec = importlib.util.spec_from_file_location("shared_model", directory / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.load(str(directory))


@pytest.mark.parametrize("case", ["tied weight", "shared module"])
def test_shared_weights_train_as_one(case, tmp_path):
    from flaxport.translate import translate
    from flaxport.translate.train_step import write_train_step

    torch.manual_seed(0)
    if case == "tied weight":
        module, x = TiedLM(), torch.randint(0, 11, (2, 5))
        y, tie = torch.randint(0, 11, (2,)), "self.head.weight = self.wte.weight"
    else:
        module, x = SharedBlocks(), torch.randn(2, 5, 8)
        y, tie = torch.randint(0, 3, (2,)), "self.blocks[1].attn.crpe = self.crpe1"
    module.train()
    t = translate(module, x)
    assert t.report.ok, str(t.report)
    assert tie in t.source
    step = write_train_step(t, module, "torch.optim.SGD(lr=0.5)", "torch.nn.functional.cross_entropy",
                            batch=(x, y))
    # without the tie the second name trains on its own half of the gradient: off by 0.1 after one step
    assert step.ok, step.markdown()

    t.save(tmp_path / "out")
    model = _load(tmp_path / "out")
    model.eval()
    if case == "tied weight":
        assert model.head.weight is model.wte.weight
    else:
        assert model.blocks[0].attn.crpe is model.blocks[1].attn.crpe is model.crpe1
        assert model.mix_a is model.mix_b
    with torch.no_grad():
        want = module.eval()(x).numpy()
    np.testing.assert_allclose(np.asarray(model(x.numpy())), want, rtol=1e-5, atol=1e-5)
