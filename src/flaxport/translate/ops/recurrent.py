"""RNN cells (nn.LSTMCell, nn.GRUCell, nn.RNNCell): one time step, as torch's cell ops compute it.

The whole-sequence nn.LSTM / GRU / RNN are runtime layer classes (translate/layers.py)."""
from __future__ import annotations

from flaxport.translate.ops.table import call, op


def _cell(c, helper: str, **extra):
    biases = {k: c.x(k) for k in ("b_ih", "b_hh") if c.has(k)}
    return call(c.helper(helper), c.x("input"), c.x("hx"), c.x("w_ih"), c.x("w_hh"), **biases, **extra)


@op("aten.lstm_cell.default")
def lstm_cell(c, node):
    return _cell(c, "lstm_cell")


@op("aten.gru_cell.default")
def gru_cell(c, node):
    return _cell(c, "gru_cell")


@op("aten.rnn_tanh_cell.default")
def rnn_tanh_cell(c, node):
    return _cell(c, "rnn_cell")


@op("aten.rnn_relu_cell.default")
def rnn_relu_cell(c, node):
    return _cell(c, "rnn_cell", nonlinearity=repr("relu"))
