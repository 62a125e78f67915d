"""The runtime's MultiheadAttention against torch.nn.MultiheadAttention, in float64: every option
torch's layer takes, its masks, both return paths (with and without the attention weights)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from flaxport.runtime.layers import MultiheadAttention  # noqa: E402

E, HEADS, L, S, N = 16, 4, 5, 7, 3


def _pair(**options):
    """(torch layer in .double(), runtime layer holding the same weights, in float64)."""
    torch.manual_seed(0)
    theirs = torch.nn.MultiheadAttention(E, HEADS, **options).double().eval()
    with torch.no_grad():  # torch starts its biases and bias_k at zero or small: make every weight count
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ours = MultiheadAttention(E, HEADS, **options, rngs=nnx.Rngs(0))
    state = dict(nnx.to_flat_state(nnx.state(ours, nnx.Param)))
    for name, value in theirs.state_dict().items():
        state[tuple(name.split("."))].set_value(jnp.asarray(value.numpy()))
    assert len(state) == len(theirs.state_dict())  # no variable torch lacks, none missing
    ours.eval()
    return theirs, ours


def _inputs(batch_first=False, kdim=E, vdim=E, batched=True):
    g = torch.Generator().manual_seed(1)

    def seq(length, width):
        shape = ((N, length, width) if batch_first else (length, N, width)) if batched else (length, width)
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    return seq(L, E), seq(S, kdim), seq(S, vdim)


def _run(theirs, ours, args, **kw):
    with torch.no_grad():
        want = theirs(*args, **kw)
    jax_kw = {k: (jnp.asarray(v.numpy()) if torch.is_tensor(v) else v) for k, v in kw.items()}
    got = ours(*(jnp.asarray(a.numpy()) for a in args), **jax_kw)
    for w, g in zip(want, got):
        assert (w is None) == (g is None)
        if w is not None:
            np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("options", [{}, {"batch_first": True}, {"bias": False}, {"add_bias_kv": True},
                                     {"add_zero_attn": True}, {"kdim": 6, "vdim": 10},
                                     {"kdim": 6, "vdim": 10, "add_bias_kv": True, "add_zero_attn": True}])
@pytest.mark.parametrize("need_weights", [True, False])
def test_the_layer_computes_what_torchs_does_with_every_option(options, need_weights):
    with jax.enable_x64(True):
        theirs, ours = _pair(**options)
        args = _inputs(options.get("batch_first", False), options.get("kdim", E), options.get("vdim", E))
        padding = torch.zeros(N, S, dtype=torch.bool)
        padding[1, -3:] = True
        _run(theirs, ours, args, need_weights=need_weights)
        _run(theirs, ours, args, key_padding_mask=padding, need_weights=need_weights)
        _run(theirs, ours, args, need_weights=need_weights, average_attn_weights=False)


@pytest.mark.parametrize("mask_kind", ["bool 2-D", "float 2-D", "float per head", "causal"])
def test_masks_as_torch_reads_them(mask_kind):
    with jax.enable_x64(True):
        theirs, ours = _pair(batch_first=True)
        args = _inputs(batch_first=True)
        g = torch.Generator().manual_seed(2)
        if mask_kind == "bool 2-D":
            mask = torch.rand(L, S, generator=g) > 0.7
            mask[:, 0] = False  # every query sees a key: no row of -inf only
        elif mask_kind == "float 2-D":
            mask = torch.randn(L, S, generator=g, dtype=torch.float64)
        elif mask_kind == "float per head":
            mask = torch.randn(N * HEADS, L, S, generator=g, dtype=torch.float64)
        else:
            mask = torch.triu(torch.full((L, S), float("-inf"), dtype=torch.float64), diagonal=1)
        causal = mask_kind == "causal"
        padding = torch.zeros(N, S, dtype=mask.dtype)
        padding[2, -2:] = True if mask.dtype == torch.bool else -5.0
        for need_weights in (True, False):
            _run(theirs, ours, args, attn_mask=mask, need_weights=need_weights, is_causal=causal)
            _run(theirs, ours, args, attn_mask=mask, key_padding_mask=padding, need_weights=need_weights)


def test_an_unbatched_sequence():
    with jax.enable_x64(True):
        theirs, ours = _pair()
        args = _inputs(batched=False)
        padding = torch.tensor([False] * (S - 2) + [True] * 2)
        for need_weights in (True, False):
            _run(theirs, ours, args, key_padding_mask=padding, need_weights=need_weights)


def test_dropout_drops_attention_weights_in_train_mode_only():
    _, ours = _pair(dropout=0.5)
    query = jnp.ones((L, N, E))
    eval_out, eval_weights = ours(query, query, query)
    ours.train()
    out, weights = ours(query, query, query)
    assert np.isfinite(np.asarray(out)).all()
    assert np.any(np.asarray(weights) != np.asarray(eval_weights))  # some weights dropped or scaled by 2
    ours.eval()
    np.testing.assert_array_equal(np.asarray(ours(query, query, query)[0]), np.asarray(eval_out))
