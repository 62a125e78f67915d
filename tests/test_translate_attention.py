"""nn.MultiheadAttention translated as the runtime's layer, built with torch's arguments and called
as the source called it (its arguments tagged in the capture: translate/marks.py), proved in
float64, in train mode and as the written files."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from torch import nn  # noqa: E402

from flaxport.translate import translate  # noqa: E402
from flaxport.translate.proof import check_train  # noqa: E402
from flaxport.translate.written import check_written  # noqa: E402


class Block(nn.Module):
    """Pre-norm self-attention over padded sequences, the weights not asked for."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.attn = nn.MultiheadAttention(32, 4, dropout=0.1, batch_first=True)

    def forward(self, x, pad):
        h = self.norm(x)
        out, _ = self.attn(h, h, h, key_padding_mask=pad, need_weights=False)
        return x + out


class CrossAttention(nn.Module):
    """Keys and values of other widths, a learned key and value appended, per-head weights used."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, kdim=6, vdim=10, add_bias_kv=True)

    def forward(self, q, k, v):
        out, w = self.attn(q, k, v, average_attn_weights=False)
        return out, w.sum(1)


class Seq2Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Transformer(16, 2, 1, 1, 32, dropout=0.1)

    def forward(self, src, tgt):
        return self.model(src, tgt)


def _proved(module, *inputs, directory):
    torch.manual_seed(0)
    t = translate(module, *inputs)
    assert t.report.ok, str(t.report)
    train = check_train(t, module)
    assert train.ok, str(train)
    t.save(directory)
    written = check_written(t, module, directory)
    assert written.problem == "", written.problem
    return t


def _own_code(source: str) -> str:
    """The model's classes: the file above load() (the runtime's copied pieces come after)."""
    return source[:source.index("def load(")]


def test_self_attention_is_the_runtime_layer_called_as_written(tmp_path):
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    module = Block().eval()
    t = _proved(module, torch.randn(2, 5, 32), pad, directory=tmp_path / "block")
    own = _own_code(t.source)
    assert "self.attn = MultiheadAttention(32, 4, dropout=0.1, batch_first=True, rngs=rngs)" in own, own
    assert "out, _ = self.attn(h, h, h, key_padding_mask=pad, need_weights=False)" in own, own
    assert "class MultiheadAttention" not in own and "class MultiheadAttention(nnx.Module):" in t.source
    state = t.state_dict()  # torch's names, torch's values
    for name, value in module.state_dict().items():
        np.testing.assert_array_equal(state[name], value.numpy(), err_msg=name)
    assert {"attn.in_proj_weight", "attn.in_proj_bias", "attn.out_proj.weight"} <= set(state)


def test_cross_attention_with_other_widths_returns_the_weights_torch_does(tmp_path):
    g = torch.Generator().manual_seed(1)
    inputs = (torch.randn(5, 2, 16, generator=g), torch.randn(7, 2, 6, generator=g),
              torch.randn(7, 2, 10, generator=g))
    t = _proved(CrossAttention().eval(), *inputs, directory=tmp_path / "cross")
    own = _own_code(t.source)
    assert "self.attn = MultiheadAttention(16, 4, add_bias_kv=True, kdim=6, vdim=10, rngs=rngs)" in own, own
    assert "out, w = self.attn(q, k, v, average_attn_weights=False)" in own, own


def test_torchs_transformer_calls_each_attention_as_torch_does(tmp_path):
    g = torch.Generator().manual_seed(2)
    module = Seq2Seq().eval()
    t = _proved(module, torch.randn(6, 2, 16, generator=g), torch.randn(4, 2, 16, generator=g),
                directory=tmp_path / "seq2seq")
    own = _own_code(t.source)
    assert "self.self_attn = MultiheadAttention(16, 2, dropout=0.1, rngs=rngs)" in own, own
    assert "self.multihead_attn(x, memory, memory, need_weights=False)" in own, own  # cross attention


class CausalEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x, pad):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.encoder(x, mask=mask, src_key_padding_mask=pad, is_causal=True)


def test_each_array_a_call_is_given_takes_the_name_of_the_argument_it_came_in_as(tmp_path):
    """TransformerEncoderLayer first reads `src` through `x = src`, on a line naming only the masks:
    the eager run's record of each call names the arrays, so no parameter carries another's name."""
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    t = _proved(CausalEncoder().eval(), torch.randn(2, 5, 16), pad, directory=tmp_path / "encoder")
    own = _own_code(t.source)
    assert "def __call__(self, src, src_key_padding_mask, src_mask):" in own, own
    assert "key_padding_mask=src_key_padding_mask" in own and "attn_mask=src_mask" in own, own
    assert "def __call__(self, src_key_padding_mask, src, mask):" in own, own  # TransformerEncoder's
