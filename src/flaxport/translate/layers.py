"""torch.nn layers that become runtime layer classes (runtime/layers.py), and the
parameter-free torch modules whose ops are written inline.

A layer's constructor arguments are read from the torch module's attributes (not from the
graph), so `BatchNorm2d(64, eps=1e-3, momentum=0.01)` comes out as torch built it. A layer
is used only when its captured ops are the ones its class implements (e.g. a Conv2d with
padding_mode='reflect' is translated op by op instead).
"""
from __future__ import annotations

import dataclasses
import functools

from flaxport.translate import marks


@dataclasses.dataclass
class LayerSpec:
    runtime: str  # class name in the runtime
    args: callable  # module -> [(name, value, default)]; default POSITIONAL: always passed, by position
    ops: frozenset  # ATen ops allowed in its frame
    outputs: dict = dataclasses.field(default_factory=dict)  # core-op getitem index -> (access, top-level position)
    core: str = ""  # multi-output layers: the op whose getitems are the outputs (or marks.RESULT: the tagged results)
    state: int = 1  # tensors torch takes as its one state argument (LSTM's (h, c): 2)
    marked: bool = False  # called as the user called it: arguments and results tagged (marks.py)


POSITIONAL = "<positional>"


def _same(v):
    return v[0] if isinstance(v, (tuple, list)) and len(set(v)) == 1 else v


def _linear(m):
    return [("in_features", m.in_features, POSITIONAL), ("out_features", m.out_features, POSITIONAL),
            ("bias", m.bias is not None, True)]


def _conv(m):
    padding = m.padding if isinstance(m.padding, str) else _same(tuple(m.padding))
    return [("in_channels", m.in_channels, POSITIONAL), ("out_channels", m.out_channels, POSITIONAL),
            ("kernel_size", _same(tuple(m.kernel_size)), POSITIONAL), ("stride", _same(tuple(m.stride)), 1),
            ("padding", padding, 0), ("dilation", _same(tuple(m.dilation)), 1), ("groups", m.groups, 1),
            ("bias", m.bias is not None, True)]


def _conv_transpose(m):
    return [("in_channels", m.in_channels, POSITIONAL), ("out_channels", m.out_channels, POSITIONAL),
            ("kernel_size", _same(tuple(m.kernel_size)), POSITIONAL), ("stride", _same(tuple(m.stride)), 1),
            ("padding", _same(tuple(m.padding)), 0), ("output_padding", _same(tuple(m.output_padding)), 0),
            ("groups", m.groups, 1), ("bias", m.bias is not None, True), ("dilation", _same(tuple(m.dilation)), 1)]


def _batch_norm(m):
    return [("num_features", m.num_features, POSITIONAL), ("eps", m.eps, 1e-5), ("momentum", m.momentum, 0.1),
            ("affine", m.affine, True), ("track_running_stats", m.track_running_stats, True)]


def _layer_norm(m):
    shape = tuple(m.normalized_shape)
    return [("normalized_shape", shape[0] if len(shape) == 1 else shape, POSITIONAL), ("eps", m.eps, 1e-5),
            ("elementwise_affine", m.elementwise_affine, True),
            ("bias", getattr(m, "bias", POSITIONAL) is not None or not m.elementwise_affine, True)]


def _group_norm(m):
    return [("num_groups", m.num_groups, POSITIONAL), ("num_channels", m.num_channels, POSITIONAL), ("eps", m.eps, 1e-5),
            ("affine", m.affine, True)]


def _embedding(m):
    return [("num_embeddings", m.num_embeddings, POSITIONAL), ("embedding_dim", m.embedding_dim, POSITIONAL),
            ("padding_idx", m.padding_idx, None)]


def _rnn(m):
    return [("input_size", m.input_size, POSITIONAL), ("hidden_size", m.hidden_size, POSITIONAL),
            ("num_layers", m.num_layers, 1), ("bias", m.bias, True), ("batch_first", m.batch_first, False),
            ("dropout", float(m.dropout), 0.0), ("bidirectional", m.bidirectional, False)]


def _rnn_tanh_or_relu(m):
    args = _rnn(m)
    return args[:3] + [("nonlinearity", m.nonlinearity, "tanh")] + args[3:]


def _multihead_attention(m):
    return [("embed_dim", m.embed_dim, POSITIONAL), ("num_heads", m.num_heads, POSITIONAL),
            ("dropout", float(m.dropout), 0.0), ("bias", m.in_proj_bias is not None, True),
            ("add_bias_kv", m.bias_k is not None, False), ("add_zero_attn", m.add_zero_attn, False),
            ("kdim", m.kdim, m.embed_dim), ("vdim", m.vdim, m.embed_dim), ("batch_first", m.batch_first, False)]


def _dropout(m):
    return [("rate", float(m.p), POSITIONAL)]


_CONV_OPS = frozenset({"aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default", "aten.conv1d.padding",
                       "aten.conv2d.padding", "aten.conv3d.padding", "aten.convolution.default"})
_CONVT_OPS = frozenset({"aten.conv_transpose1d.default", "aten.conv_transpose2d.input",
                        "aten.conv_transpose3d.input", "aten.convolution.default"})
_BN_OPS = frozenset({"aten.batch_norm.default", "aten.add.Tensor"})
_DROPOUT_OPS = frozenset({"aten.dropout.default", "aten.feature_dropout.default"})


@functools.cache
def specs() -> dict:
    """torch layer class -> LayerSpec (one table a process: it is asked for every module of every capture)."""
    from torch import nn

    table = {
        nn.Linear: LayerSpec("Linear", _linear, frozenset({"aten.linear.default"})),
        nn.Conv1d: LayerSpec("Conv1d", _conv, _CONV_OPS),
        nn.Conv2d: LayerSpec("Conv2d", _conv, _CONV_OPS),
        nn.Conv3d: LayerSpec("Conv3d", _conv, _CONV_OPS),
        nn.ConvTranspose1d: LayerSpec("ConvTranspose1d", _conv_transpose, _CONVT_OPS),
        nn.ConvTranspose2d: LayerSpec("ConvTranspose2d", _conv_transpose, _CONVT_OPS),
        nn.ConvTranspose3d: LayerSpec("ConvTranspose3d", _conv_transpose, _CONVT_OPS),
        nn.BatchNorm1d: LayerSpec("BatchNorm1d", _batch_norm, _BN_OPS),
        nn.BatchNorm2d: LayerSpec("BatchNorm2d", _batch_norm, _BN_OPS),
        nn.BatchNorm3d: LayerSpec("BatchNorm3d", _batch_norm, _BN_OPS),
        nn.LayerNorm: LayerSpec("LayerNorm", _layer_norm, frozenset({"aten.layer_norm.default"})),
        nn.GroupNorm: LayerSpec("GroupNorm", _group_norm, frozenset({"aten.group_norm.default"})),
        nn.Embedding: LayerSpec("Embedding", _embedding, frozenset({"aten.embedding.default"})),
        nn.LSTM: LayerSpec("LSTM", _rnn, frozenset({"aten.lstm.input", "aten.zeros.default", "getitem"}),
                           {0: ("[0]", 0), 1: ("[1][0]", 1), 2: ("[1][1]", 1)}, "aten.lstm.input", state=2),
        nn.GRU: LayerSpec("GRU", _rnn, frozenset({"aten.gru.input", "aten.zeros.default", "getitem"}),
                          {0: ("[0]", 0), 1: ("[1]", 1)}, "aten.gru.input"),
        nn.RNN: LayerSpec("RNN", _rnn_tanh_or_relu, frozenset({"aten.rnn_tanh.input", "aten.zeros.default", "getitem"}),
                          {0: ("[0]", 0), 1: ("[1]", 1)}, "aten.rnn_tanh.input"),
        # the whole forward, whatever ops its options capture; its results (out, weights) by position
        nn.MultiheadAttention: LayerSpec("MultiheadAttention", _multihead_attention, frozenset(),
                                         {0: ("[0]", 0), 1: ("[1]", 1)}, marks.RESULT,
                                         marked=True),
        nn.Dropout: LayerSpec("nnx.Dropout", _dropout, _DROPOUT_OPS),
        nn.Dropout1d: LayerSpec("nnx.Dropout", _dropout, _DROPOUT_OPS),
        nn.Dropout2d: LayerSpec("nnx.Dropout", _dropout, _DROPOUT_OPS),
        nn.Dropout3d: LayerSpec("nnx.Dropout", _dropout, _DROPOUT_OPS),
    }
    return table


def layer_spec(module, frames) -> LayerSpec | None:
    """The LayerSpec translating this module, or None (translate it op by op)."""
    from torch import nn

    table = specs()
    base = next((c for c in type(module).__mro__ if c in table), None)
    if base is None or type(module).forward is not base.forward:
        return None  # not a layer, or a subclass with a forward of its own
    spec = table[base]
    if isinstance(module, nn.RNN) and module.nonlinearity == "relu":
        spec = dataclasses.replace(spec, ops=frozenset({"aten.rnn_relu.input", "aten.zeros.default", "getitem"}),
                                   core="aten.rnn_relu.input")
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and module.padding_mode != "zeros":
        return None
    if _unbatched(module, frames):
        return None  # an unbatched input (C, *S): the op table's convolution takes it
    if isinstance(module, nn.LSTM) and getattr(module, "proj_size", 0):
        return None
    if isinstance(module, nn.Embedding) and (module.max_norm is not None or module.scale_grad_by_freq):
        return None
    if isinstance(module, nn.LayerNorm) and not module.elementwise_affine and getattr(module, "bias", POSITIONAL):
        return None
    if spec.marked:  # every call captured with its tags
        return spec if frames and all(marks.arguments(f) for f in frames) else None
    for frame in frames:
        for node in frame.all_nodes():
            name = "getitem" if "getitem" in str(node.target) else str(node.target)
            if name not in spec.ops and not _is_sym(node):
                return None
    return spec


def marks_calls(module) -> bool:
    """Is `module` a layer whose calls the capture tags (marks.py), to be called as the user did?"""
    table = specs()
    base = next((c for c in type(module).__mro__ if c in table), None)
    return base is not None and table[base].marked and type(module).forward is base.forward


def _unbatched(module, frames) -> bool:
    """Is a convolution layer called on an input without a batch axis?"""
    from torch import nn

    if not isinstance(module, (nn.modules.conv._ConvNd,)):
        return False
    for frame in frames:
        for node in frame.all_nodes():
            if str(node.target) in _CONV_OPS | _CONVT_OPS and node.args and hasattr(node.args[0], "meta") and \
                    node.args[0].meta["val"].ndim == module.weight.ndim - 1:
                return True
    return False


def dropout_broadcast(module, ndim: int | None = None) -> tuple:
    """nnx.Dropout broadcast_dims for torch's channel dropouts on an input of `ndim` axes (one draw
    per (sample, channel)): as torch draws them, Dropout1d/3d take an input one axis short as one
    sample (a draw per channel), Dropout2d draws per the first two axes whatever the rank."""
    from torch import nn

    n = {nn.Dropout1d: 1, nn.Dropout2d: 2, nn.Dropout3d: 3}.get(type(module), 0)
    if not n or ndim is None:
        return tuple(range(2, 2 + n))
    if n != 2 and ndim == n + 1:  # unbatched (C, *spatial)
        return tuple(range(1, ndim))
    return tuple(range(2, ndim))


def is_inline(module) -> bool:
    """A parameter-free torch.nn module with no children and no train/eval behaviour: its ops
    are written where it is called (ReLU, GELU, MaxPool2d, Flatten, Identity, Upsample, ...)."""
    from torch import nn

    if type(module).__module__.split(".")[:2] != ["torch", "nn"]:
        return False
    if isinstance(module, (nn.modules.dropout._DropoutNd, nn.Sequential, nn.ModuleList, nn.ModuleDict)):
        return False
    if any(True for _ in module.children()):
        return False
    return not any(True for _ in module.parameters(recurse=False)) and not any(True for _ in module.buffers(False))


def _is_sym(node) -> bool:
    import torch

    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool))
