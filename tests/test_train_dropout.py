"""Dropout anywhere in the forward, recorded from torch and replayed into the translation, so a
train step with dropout is proven: nn.MultiheadAttention's attention dropout (inside torch's
Python attention, need_weights or not), TransformerEncoderLayer's, and F.dropout(training=True)
/ dropout1d / scaled_dot_product_attention(dropout_p=...) in a model in eval mode, which torch
applies whatever the mode and the translation then does too.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from flaxport.translate import translate  # noqa: E402
from flaxport.translate.train_step import write_train_step  # noqa: E402


class TinyGPT(nn.Module):
    """A pre-norm block: causal self-attention with attention dropout, an MLP with dropout."""

    def __init__(self, need_weights=True, vocab=11, d=16, heads=2):
        super().__init__()
        self.need_weights = need_weights
        self.embed = nn.Embedding(vocab, d)
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.1, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d), nn.Dropout(0.1))
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        size = tokens.shape[1]
        causal = torch.triu(torch.ones(size, size, dtype=torch.bool), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=self.need_weights)[0]
        x = x + self.mlp(self.ln2(x))
        return self.head(x).transpose(1, 2)  # (N, vocab, T): cross_entropy's class axis


def _tokens():
    return torch.randint(0, 11, (3, 6), generator=torch.Generator().manual_seed(0))


def test_a_transformer_with_attention_dropout_proves_its_step():
    """nn.MultiheadAttention(dropout=0.1) in train mode: torch drops the attention weights inside
    F.multi_head_attention_forward; those masks are recorded and given to the translation, so
    check_step compares every gradient, parameter and moment with dropout on."""
    torch.manual_seed(0)
    module = TinyGPT().train()
    t = translate(module, _tokens())
    step = write_train_step(t, module, "torch.optim.AdamW(lr=1e-3)", "F.cross_entropy")
    assert step.ok, step.markdown()
    assert "masks made equal" in step.report.dropout and "2 calls a forward" in step.report.dropout, \
        step.report.dropout
    assert {r.phase for r in step.report.rows} >= {"loss", "grad", "param", "moment"}


@pytest.mark.slow
@pytest.mark.parametrize("need_weights", [False, True])
def test_attention_dropout_inside_scaled_dot_product_attention_and_encoder_layers(need_weights):
    """need_weights=False sends MultiheadAttention through scaled_dot_product_attention(dropout_p);
    TransformerEncoderLayer drops in four places a forward."""
    torch.manual_seed(0)
    module = TinyGPT(need_weights=need_weights).train()
    t = translate(module, _tokens())
    step = write_train_step(t, module, "torch.optim.Adam(lr=1e-3)", "F.cross_entropy")
    assert step.ok and "2 calls a forward" in step.report.dropout, step.markdown()

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
            self.head = nn.Linear(16, 5)

        def forward(self, x):
            return self.head(self.layer(x).mean(1))

    module = Encoder().train()
    t = translate(module, torch.randn(3, 5, 16))
    step = write_train_step(t, module, "torch.optim.SGD(lr=0.1, momentum=0.9)", "F.cross_entropy")
    assert step.ok and "4 calls a forward" in step.report.dropout, step.markdown()


class AlwaysOn(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        h = F.dropout(self.fc(x), 0.3, training=True)
        h = F.dropout1d(h.transpose(1, 2), 0.2, training=True).transpose(1, 2)
        return self.head(h).mean(1)


def test_functional_dropout_with_training_true_is_on_in_eval_mode_as_in_torch(tmp_path):
    """torch applies F.dropout(x, p, training=True) whatever the module's mode: the translation
    calls its nnx.Dropout with deterministic=False, the eval-mode proof gives both sides torch's
    masks (and passes), and the written model drops in eval mode (a share p of zeros)."""
    torch.manual_seed(0)
    module = AlwaysOn().eval()
    t = translate(module, torch.randn(3, 5, 16))
    assert t.report.ok, t.report
    assert "self.dropout(self.fc(x), deterministic=False)" in t.source
    assert "deterministic=False), 1, 2)" in t.source  # the channel dropout too
    step = write_train_step(t, module, "torch.optim.Adam(lr=1e-3)", "F.cross_entropy")
    assert step.ok and "2 calls a forward" in step.report.dropout, step.markdown()

    import jax.numpy as jnp

    t.save(tmp_path / "always")
    model = t.new_model()
    model.eval()
    fc = model.fc(jnp.ones((400, 5, 16)))
    dropped = model.dropout(fc, deterministic=False)
    share = float(jnp.mean(dropped == 0))
    assert 0.25 < share < 0.35, share
    first, second = np.asarray(model(jnp.ones((2, 5, 16)))), np.asarray(model(jnp.ones((2, 5, 16))))
    assert not np.allclose(first, second)  # it draws anew each call, as torch does


@pytest.mark.slow
def test_attention_dropout_p_whatever_the_mode_is_on_in_eval_mode():
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(16, 48)
            self.head = nn.Linear(16, 5)

        def forward(self, x):
            q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 2, 24).transpose(1, 2).split(8, -1)
            o = F.scaled_dot_product_attention(q, k, v, dropout_p=0.25)
            return self.head(o.transpose(1, 2).reshape(x.shape[0], x.shape[1], 16)).mean(1)

    torch.manual_seed(0)
    module = Attention().eval()
    t = translate(module, torch.randn(3, 5, 16))
    assert t.report.ok and "functools.partial(self.attention_dropout, deterministic=False)" in t.source
    step = write_train_step(t, module, "torch.optim.Adam(lr=1e-3)", "F.cross_entropy")
    assert step.ok and "1 call a forward" in step.report.dropout, step.markdown()
