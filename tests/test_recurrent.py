"""flaxport.nn.LSTM / GRU against torch.nn.LSTM / GRU: forward, gradients and train steps in
float64, torch's two biases per gate kept, and the trap of summing them measured.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import torch.nn.functional as F  # noqa: E402

from flaxport import nn as fpnn  # noqa: E402
from flaxport.errors import UserError  # noqa: E402
from flaxport.port import build_key_map, check_parity, check_step, port_weights  # noqa: E402

CONFIGS = {
    "lstm_2layer_bidir_batch_first": (torch.nn.LSTM, fpnn.LSTM, dict(num_layers=2, bidirectional=True,
                                                                    batch_first=True)),
    "lstm_time_major_no_bias": (torch.nn.LSTM, fpnn.LSTM, dict(num_layers=1, bias=False)),
    "gru_2layer_bidir_batch_first": (torch.nn.GRU, fpnn.GRU, dict(num_layers=2, bidirectional=True,
                                                                 batch_first=True)),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_forward_and_gradients_float64(name):
    """Every output (sequence, h_n, c_n) and every parameter's gradient within 1e-12, given initial
    states too; the key map keeps both biases and transposes the weights."""
    t_cls, f_cls, kw = CONFIGS[name]
    torch.manual_seed(0)
    with jax.enable_x64(True):
        tm = t_cls(5, 7, **kw).double()
        fm = f_cls(7, **kw)
        x = torch.randn(3, 4, 5, dtype=torch.float64)
        km = build_key_map(tm, fm, x)
        assert {leaf.flax_path[-1] for leaf in km.leaves} >= {"kernel_ih_l0", "kernel_hh_l0"}
        if kw.get("bias", True):
            assert {"bias_ih_l0", "bias_hh_l0"} <= {leaf.flax_path[-1] for leaf in km.leaves}
        variables = km.to_flax(tm.state_dict())
        report = check_parity(tm, fm, variables, x, train=True, atol=1e-12, rtol=1e-12, key_map=km)
        assert report.ok and report.strict_ok, str(report)
        assert len([r for r in report.rows if r.phase == "grad"]) == len(list(tm.parameters()))
        # an initial state, and unbatched input
        d = 2 if kw.get("bidirectional") else 1
        h0 = torch.randn(kw["num_layers"] * d, 3 if kw.get("batch_first") else 4, 7, dtype=torch.float64)
        hx = (h0, torch.randn_like(h0)) if t_cls is torch.nn.LSTM else h0
        want = tm(x, hx)
        got = jax.jit(fm.apply)(variables, jnp.asarray(x.numpy()), jax.tree.map(lambda t: jnp.asarray(t.numpy()), hx))
        for w, g in zip(jax.tree.leaves(jax.tree.map(lambda t: t.detach().numpy(), want)), jax.tree.leaves(got)):
            np.testing.assert_allclose(np.asarray(g), w, atol=1e-12)
        single = x[0]
        want = tm(single)[0].detach().numpy()
        np.testing.assert_allclose(np.asarray(jax.jit(fm.apply)(variables, jnp.asarray(single.numpy()))[0]), want,
                                   atol=1e-12)


def test_init_follows_torch_law():
    """Every tensor ~ U(+-1/sqrt(hidden)), as torch initialises LSTM and GRU."""
    v = jax.jit(fpnn.GRU(16, num_layers=2).init)(jax.random.key(0), jnp.zeros((5, 2, 3)))["params"]
    for name, a in v.items():
        assert np.abs(np.asarray(a)).max() <= 0.25 and np.asarray(a).std() > 0.1, name


def test_proj_size_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"proj_size=3\) is not supported") as e:
        port_weights(torch.nn.LSTM(4, 6, proj_size=3), fpnn.LSTM(6), np.zeros((2, 1, 4), np.float32))
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="proj_size"):
        fpnn.LSTM(6, proj_size=3).init(jax.random.key(0), jnp.zeros((2, 1, 4)))


# --------------------------------------------------------------------------- an LSTM classifier
class TorchLSTMClassifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.lstm = torch.nn.LSTM(8, 12, num_layers=2, bidirectional=True, batch_first=True, dropout=0.3)
        self.head = torch.nn.Linear(24, 4)

    def forward(self, tokens):
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out[:, -1])


class FlaxLSTMClassifier(nn.Module):
    @nn.compact
    def __call__(self, tokens, train: bool):
        out, _ = fpnn.LSTM(12, num_layers=2, bidirectional=True, batch_first=True, dropout=0.3, name="lstm")(
            nn.Embed(20, 8, name="embed")(tokens), deterministic=not train)
        return fpnn.Dense(4, name="head")(out[:, -1])


def _classifier(dtype):
    torch.manual_seed(0)
    tm = TorchLSTMClassifier().to(dtype)
    tokens = torch.from_numpy(np.random.default_rng(0).integers(0, 20, size=(6, 5)))
    labels = torch.tensor([0, 1, 2, 3, 0, 1])
    return tm, FlaxLSTMClassifier(), tokens, labels


@pytest.mark.slow
def test_lstm_classifier_three_adam_steps_float64():
    """check_step with the hand-written twin: loss, gradients, parameters and Adam's moments agree
    for 3 steps (the between-layer dropout off on both sides, which the report says); in float32
    too, any row off there being float32 rounding."""
    tm, fm, tokens, labels = _classifier(torch.float32)
    report = check_step(tm, torch.optim.Adam(tm.parameters(), lr=1e-2), F.cross_entropy, fm, (tokens, labels))
    assert report.ok and all(r.rounding for r in report.rows if not r.ok), str(report)
    tm, fm, tokens, labels = _classifier(torch.float64)
    opt = torch.optim.Adam(tm.parameters(), lr=1e-2)
    with jax.enable_x64(True):
        report = check_step(tm, opt, F.cross_entropy, fm, (tokens, labels), steps=3, atol=1e-10, rtol=1e-10)
    assert report.strict_ok, str(report)
    phases = {(r.step, r.phase) for r in report.rows}
    assert {(s, p) for s in (1, 2, 3) for p in ("loss", "grad", "param", "moment")} <= phases
    assert {r.torch_name for r in report.rows if r.phase == "param"} == {n for n, _ in tm.named_parameters()}
    assert "between-layer dropout p=0.3 is off on both sides" in report.dropout


# --------------------------------------------------------------------------- the two-bias trap
def test_summed_biases_take_half_of_adams_step():
    """A port onto Flax's LSTMCell (one bias per gate) sums torch's bias_ih + bias_hh: the forward
    is exact, but one Adam step moves torch's two biases by ~lr each, so their sum by ~2 lr, and
    the one Flax bias by ~lr. After one step at lr 1e-3 the effective biases differ by ~1e-3."""
    import optax

    lr, hidden = 1e-3, 4
    torch.manual_seed(0)
    with jax.enable_x64(True):
        tm = torch.nn.LSTM(3, hidden, batch_first=True).double()
        x = torch.randn(2, 5, 3, dtype=torch.float64)
        cell = nn.RNN(nn.LSTMCell(hidden, param_dtype=jnp.float64), name="rnn")
        w_ih, w_hh = tm.weight_ih_l0.detach().numpy(), tm.weight_hh_l0.detach().numpy()
        b = (tm.bias_ih_l0 + tm.bias_hh_l0).detach().numpy()
        gates = {"i": 0, "f": 1, "g": 2, "o": 3}  # torch's row blocks
        params = {"cell": {}}
        for g, k in gates.items():
            rows = slice(k * hidden, (k + 1) * hidden)
            params["cell"]["i" + g] = {"kernel": w_ih[rows].T}
            params["cell"]["h" + g] = {"kernel": w_hh[rows].T, "bias": b[rows]}
        params = jax.tree.map(jnp.asarray, params)

        apply = jax.jit(lambda p: cell.apply({"params": p}, jnp.asarray(x.numpy())))
        torch_out = tm(x)[0]
        np.testing.assert_allclose(np.asarray(apply(params)), torch_out.detach().numpy(), atol=1e-12)  # exact
        opt = torch.optim.Adam(tm.parameters(), lr=lr)
        (torch_out ** 2).mean().backward()
        opt.step()
        tx = optax.adam(lr)
        updates, _ = tx.update(jax.jit(jax.grad(lambda p: jnp.mean(apply(p) ** 2)))(params), tx.init(params), params)
        stepped = optax.apply_updates(params, updates)
    torch_move = (tm.bias_ih_l0 + tm.bias_hh_l0).detach().numpy() - b
    flax_move = np.concatenate([np.asarray(stepped["cell"]["h" + g]["bias"] - params["cell"]["h" + g]["bias"])
                                for g in gates])
    ratio = np.abs(torch_move) / np.abs(flax_move)
    assert np.all((ratio > 1.99) & (ratio < 2.01)), ratio
    assert 0.99 * lr < np.abs(torch_move - flax_move).max() < 1.01 * lr


def test_gru_new_gate_bias_cannot_be_summed():
    """GRU's b_hn sits inside r * (W_hn h + b_hn): moving it into the input-side bias (one bias per
    gate) changes the forward itself, by 0.21 here."""
    torch.manual_seed(0)
    with jax.enable_x64(True):
        tm, fm = torch.nn.GRU(3, 4, batch_first=True).double(), fpnn.GRU(4, batch_first=True)
        x = torch.randn(2, 5, 3, dtype=torch.float64)
        p = dict(port_weights(tm, fm, x)["params"])
        p["bias_ih_l0"], p["bias_hh_l0"] = p["bias_ih_l0"] + p["bias_hh_l0"], 0 * p["bias_hh_l0"]
        got = jax.jit(fm.apply)({"params": p}, jnp.asarray(x.numpy()))[0]
    assert np.abs(np.asarray(got) - tm(x)[0].detach().numpy()).max() > 0.1
