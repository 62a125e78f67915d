"""The op table against PyTorch's own operator tests (OpInfo's op_db).

Each OpInfo entry's first 3 float32 CPU samples become modules whose forward calls the op on the
sample's tensors, passed in by name (flaxport.bench.coverage.opinfo), so torch.export keeps their
sizes symbolic. Each is translated and proved: float64 at every output (the proof), and the float32
column within rounding. An entry the translation refuses is listed in REFUSED with the reason the
refusal must give.

The default run takes SLICE (one or two entries per op family and per mechanism); FLAXPORT_OPINFO=all
runs every entry (669; slow: the count docs/translate.md quotes comes from it).
"""
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")  # op_db imports it
pytestmark = pytest.mark.torch

# float32 against torch, relative to the output's largest magnitude: rounding (1e-7 x the op's condition)
FLOAT32_RTOL = 1e-4
# other dtypes, the same: their own rounding
RTOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}

SLICE = [
    # elementwise, reductions (0-d inputs among the samples), matrix products
    "abs", "add", "div.floor_rounding", "pow", "where", "clamp", "sum", "cumsum", "amax", "var_mean",
    "max.reduction_with_dim", "logsumexp", "matmul", "addmm", "einsum",
    # decomposed by torch (no handler of their own): an alias, a composite, a long one
    "mT", "logaddexp2", "nn.functional.margin_ranking_loss",
    # shapes: symbolic splits, strided views, boolean-mask writes, scatters
    "chunk", "movedim", "as_strided", "diagonal_scatter", "index_put", "scatter_reduce.amax", "index_reduce.mean",
    # convolution and pooling (unbatched inputs among the samples, max-pool indices), normalisation, embeddings
    "nn.functional.conv2d", "nn.functional.conv_transpose2d", "nn.functional.max_pool2d", "nn.functional.max_unpool2d",
    "nn.functional.layer_norm", "nn.functional.batch_norm", "nn.functional.embedding_bag",
    # matrix functions, FFTs, special functions
    "linalg.solve", "linalg.inv", "linalg.eigh", "fft.rfft", "fft.ifft2", "special.i1", "polygamma.polygamma_n_1",
    "special.chebyshev_polynomial_t",
    # outputs that are not plain values: .item(), torch.empty, sizes; refusals
    "item", "empty_like", "broadcast_shapes", "nonzero", "special.bessel_y0", "resize_",
    # draws: functional dropout on in an eval-mode model (torch's masks replayed), random samples
    # an op takes as an input (fractional max-pool); NaN an op makes of finite values (var of one value)
    "nn.functional.dropout", "nn.functional.fractional_max_pool2d", "var.unbiased",
]
# (entry, dtype): the other dtypes the translation claims, on a few entries
DTYPES = [("add", torch.int64), ("mul", torch.bool), ("cumsum", torch.int32), ("sum", torch.bfloat16),
          ("nn.functional.conv2d", torch.bfloat16), ("matmul", torch.float16), ("where", torch.int64)]

# Why an entry cannot translate (part of the one-line message the translation gives).
VALUE_SIZED = "size depends on tensor values"
NO_JAX = "no counterpart"
SIGNS = "unique only up to sign"
REFUSED = {  # entry: the reasons its samples are refused with
    "nonzero": (VALUE_SIZED,), "special.bessel_y0": (NO_JAX,), "linalg.eigh": (SIGNS,),
}


def _names():
    if os.environ.get("FLAXPORT_OPINFO") == "all":
        from flaxport.bench.coverage import opinfo

        return [pytest.param(n, marks=pytest.mark.slow) for n in opinfo.names()]
    return SLICE


def _check(name, dtype=None):
    from flaxport.bench.coverage import opinfo
    from flaxport.translate import translate
    from flaxport.translate.errors import TranslateError

    refused = 0
    for i, (module, args, kwargs) in enumerate(opinfo.build(name, dtype)):
        try:
            t = translate(module, *args, **kwargs)
        except TranslateError as e:
            assert name in REFUSED, f"{name} sample {i} refused: {e}"
            assert any(why in str(e) for why in REFUSED[name]), f"{name} sample {i}: {e}"
            refused += 1
            continue
        r = t.report
        assert r.ok and r.precision == "float64", f"{name} sample {i}:\n{r}"
        rtol = RTOL.get(dtype, FLOAT32_RTOL)
        for row, f32 in zip(r.rows, r.float32):
            assert f32 is not None and f32[1] <= rtol, f"{name} sample {i}, float32 {row.torch_name}:\n{r}"
    assert (refused > 0) == (name in REFUSED), f"{name}: listed as refused ({REFUSED.get(name)}) but translates"


@pytest.mark.parametrize("name", _names())
def test_opinfo_samples_translate_and_pass_the_proof(name):
    _check(name)


@pytest.mark.parametrize("name,dtype", DTYPES, ids=[f"{n}-{str(d)[6:]}" for n, d in DTYPES])
def test_opinfo_samples_of_other_dtypes(name, dtype):
    _check(name, dtype)
