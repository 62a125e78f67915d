"""flaxport.translate: torch models in, Flax NNX source + weights + proof out.

Coverage: the workloads' torch twins, a zoo written in plain torch (translate_zoo.py) and
HuggingFace models from tiny configs each translate and pass the float64 proof at every
submodule boundary, and one train-mode forward (BatchNorm statistics included) matches
torch; the translated model runs at other sizes; the generated file runs without flaxport or
torch; the way back to torch names is exact.
"""
import ast
import dataclasses
import json
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

import translate_zoo as zoo  # noqa: E402


def _outputs(model, *inputs):
    """The model's outputs, jitted (one compile; eager would compile op by op)."""
    import jax
    from flax import nnx

    from flaxport.translate.proof import FAST_COMPILE

    graphdef, state = nnx.split(model)
    run = jax.jit(lambda s, xs: nnx.merge(graphdef, s)(*xs), compiler_options=FAST_COMPILE)
    return [np.asarray(a) for a in jax.tree.leaves(run(state, list(inputs)))]


def _torch_outputs(module, *inputs):
    with torch.no_grad():
        out = module(*inputs)
    return [a.numpy() for a in torch.utils._pytree.tree_leaves(out) if torch.is_tensor(a)]


def _assert_runs_like_torch_at_other_sizes(module, inputs, t, name):
    """t.model on _resized inputs computes what the torch module computes (float32 tolerance)."""
    import jax
    import jax.numpy as jnp

    other = _resized(inputs, name)
    got = _outputs(t.model, *[jnp.asarray(x.numpy()) for x in other])
    with torch.no_grad():  # leaves in JAX's order (a dict's by sorted key), as _outputs gives them
        want = jax.tree.leaves(jax.tree.map(lambda a: a.numpy(), module.eval()(*other)))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(w).max())))


def _resized(inputs, name):
    """Other sizes than the example's: batch 3, and a longer sequence / larger image where the model allows."""
    if name == "graph":  # another graph: 9 nodes, 20 edges
        g = torch.Generator().manual_seed(7)
        return [torch.randn(9, 6, generator=g), torch.randint(0, 3, (9,), generator=g),
                torch.randint(0, 9, (2, 20), generator=g), torch.tensor([0] * 4 + [1] * 5)]
    out = []
    for x in inputs:
        shape = list(x.shape)
        shape[0] = 3
        if name in ("transformer", "bert", "gpt2") and len(shape) == 2:
            shape[1] = shape[1] + 3
        if name in ("resnet18", "mobilenet", "unet", "aspp") and len(shape) == 4:
            shape[2:] = [s * 2 for s in shape[2:]]
        g = torch.Generator().manual_seed(7)
        if x.dtype == torch.bool:
            out.append(torch.rand(shape, generator=g) > 0.3)
        elif x.dtype == torch.int64:  # ids below the example's largest: inside every embedding table
            out.append(torch.randint(0, int(x.max()) + 1, shape, generator=g))
        else:
            out.append(torch.randn(shape, generator=g) if x.min() < 0 else torch.rand(shape, generator=g))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.WORKLOADS + zoo.NAMES)
def test_translation_passes_the_float64_proof_and_runs_at_other_sizes(name):
    import jax.numpy as jnp

    module, inputs, t = zoo.translated(name)
    r = t.report
    assert r.precision == "float64" and r.ok, str(r)
    assert r.max_abs < 1e-12, str(r)  # float64: the translation is exact, not merely close
    assert sum(row.phase == "forward" for row in r.rows) >= 3
    assert all(f is not None for f in r.float32) and max(f[0] for f in r.float32) < 1e-3
    other = _resized(inputs, name)
    got = _outputs(t.model, *[jnp.asarray(x.numpy()) for x in other])
    want = _torch_outputs(module.eval(), *other)
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(w).max())))


@pytest.mark.parametrize("name", zoo.MORE)
def test_more_shapes_of_torch_code(name):
    """Dict outputs, Conv1d/InstanceNorm/AvgPool1d, a GRU state handed to another GRU, split,
    torch.where, reflect padding, PixelShuffle, Dropout2d, max(...).values, a class token and
    nn.MultiheadAttention over patches, adaptive max-pool, argmax, weight_norm'd Conv1d, nn.RNN,
    LocalResponseNorm and ChannelShuffle in a Sequential, nn.Bilinear, F.cosine_similarity, a conv
    whose groups are the batch size, LSTMCell/GRUCell/RNNCell in an unrolled loop, a spatial
    transformer (affine_grid, grid_sample), an OrderedDict Sequential called twice with a ModuleDict
    head and a namedtuple out, F.unfold/F.fold, message passing on an edge list (index_add_, scatter_,
    scatter_reduce); each also at batch 3 (the graph: other node and edge counts)."""
    module, inputs, t = zoo.translated(name)
    assert t.report.ok and t.report.precision == "float64", str(t.report)
    _assert_runs_like_torch_at_other_sizes(module, inputs, t, name)


def test_spatial_transformer_trains_like_torch():
    """Gradients through grid_sample and affine_grid (to the image and to theta): three SGD steps
    against torch's, float32."""
    from flaxport.port import check_step

    module, (x,), t = zoo.translated("stn")
    target = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    report = check_step(module, torch.optim.SGD(module.parameters(), lr=0.1), torch.nn.functional.mse_loss, t,
                        (x, target), steps=3)
    assert report.ok, str(report)
    assert {r.phase for r in report.rows} >= {"loss", "grad", "param"}


def test_message_passing_trains_like_torch():
    """Gradients through index_add_, scatter_reduce (amax without self, mean) and the gathers h[src]:
    three SGD steps against torch's, float32."""
    from flaxport.port import check_step

    module, inputs, t = zoo.translated("graph")
    assert "scatter(jnp.zeros_like(h), 0, index, messages, reduce=\"amax\", include_self=False)" in t.source
    target = torch.randn(2, generator=torch.Generator().manual_seed(5))
    report = check_step(module, torch.optim.SGD(module.parameters(), lr=0.1), torch.nn.functional.mse_loss, t,
                        (inputs, target), steps=3)
    assert report.ok, str(report)


def test_weight_norm_keeps_torchs_names_and_state_dict():
    """weight_norm'd convs: g and v under torch's parametrizations names, in the file and back."""
    module, inputs, t = zoo.translated("tcn")
    assert 'self.parametrizations = nnx.Dict({"weight": ParametrizationList(rngs=rngs)})' in t.source
    assert "class ParametrizedConv1d2(" in t.source  # parametrize makes a class per module: numbered, not clobbered
    want = module.state_dict()
    got = t.state_dict()
    assert set(got) >= {"c1.parametrizations.weight.original0", "c2.parametrizations.weight.original1"}
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value.numpy(), err_msg=name)


def test_multihead_attention_is_called_as_the_user_called_it_on_any_sequence_length():
    """nn.MultiheadAttention is the runtime's layer, built and called with torch's arguments as the
    source wrote them (three arrays: the general path), whatever the sequence length, here (H // 4)
    * (W // 4) + 1 of the image: the model runs on another image size."""
    import jax.numpy as jnp

    module, inputs, t = zoo.translated("patches")
    src = t.source
    assert "self.attn = MultiheadAttention(16, 2, batch_first=True, rngs=rngs)" in src, src
    assert "a, _ = self.attn(self.ln(h), self.ln(h), self.ln(h), need_weights=False)" in src, src
    assert src.index("class MultiheadAttention(nnx.Module):") > src.index("def load(")  # the runtime's, copied
    x = torch.randn(3, 3, 8, 12)  # 2 x 3 patches: a sequence of 7
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(np.asarray(t.model(jnp.asarray(x.numpy()))), want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet", "transformer", "lstm", "ddim", "tcn", "rnn"])
def test_one_train_mode_forward_matches_torch_in_float64(name):
    """Outputs (dropout off on both sides) and every buffer torch updated: running_mean,
    running_var and num_batches_tracked of each BatchNorm."""
    from flaxport.translate.proof import check_train

    module, inputs, t = zoo.translated(name)
    report = check_train(t, module)
    assert report.ok, str(report)
    if name in ("resnet18", "mobilenet", "ddim", "tcn"):
        stats = [r.torch_name for r in report.rows if r.phase == "running_stats"]
        assert any(s.endswith("running_var") for s in stats) and any(s.endswith("num_batches_tracked") for s in stats)


@pytest.mark.slow
@pytest.mark.parametrize("name", zoo.HF)
def test_huggingface_models_translate_and_pass(name):
    pytest.importorskip("transformers")
    test_translation_passes_the_float64_proof_and_runs_at_other_sizes(name)


def _import_roots(nodes) -> set:
    roots = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots.add(node.module.split(".")[0])
    return roots


def test_generated_file_imports_only_jax_flax_numpy_and_the_standard_library():
    """flaxport only as an optional import (its CPU kernels), inside a try that takes its absence."""
    for name in ("resnet18", "lstm"):
        tree = ast.parse(zoo.translated(name)[2].source)
        optional = [n for n in ast.walk(tree) if isinstance(n, ast.Try)
                    and any(isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in n.handlers)]
        inside = {id(n) for t in optional for b in t.body for n in ast.walk(b)}
        required = _import_roots(n for n in ast.walk(tree) if id(n) not in inside)
        assert required <= {"jax", "flax", "numpy", "functools", "itertools", "json", "math", "os"}, required
        assert _import_roots(n for t in optional for b in t.body for n in ast.walk(b)) <= {"flaxport"}


def test_resnet18_reads_like_a_hand_written_nnx_resnet():
    """torch's class and attribute names, one class per torch class (two for BasicBlock: with and
    without downsample), sizes from x.shape, and no more than twice the lines a hand-written NNX
    ResNet-18 takes (~100 for its classes)."""
    t = zoo.translated("resnet18")[2]
    assert t.class_names == ["BasicBlock", "BasicBlockWithDownsample", "ResNet"]
    src = t.source
    classes = src[src.index("class BasicBlock("):src.index("def load(")]
    assert len([line for line in classes.splitlines() if line.strip()]) <= 200
    for line in ("self.conv1 = Conv2d(3, 8, 7, stride=2, padding=3, bias=False, rngs=rngs)",
                 "self.downsample = nnx.Sequential(", "out = self.bn1(out)", "identity = self.downsample(x)",
                 "x = x.reshape(x.shape[0], -1)", "x = self.layer4(x)"):
        assert line in classes, line
    assert re.search(r"\n    x \(\d+, 3, \d+, \d+\), any size along axes 0, 2 and 3\n", src)  # no export symbols
    assert "class BatchNorm2d" in src and "num_batches_tracked" in src  # torch's BatchNorm, carried along
    assert "class LSTM" not in src and "scaled_dot_product_attention" not in src  # only what it uses


def test_generated_files_are_black_formatted():
    """model.py (and a train step's file) as black leaves it: a user's formatter changes nothing."""
    import black

    from flaxport.translate.emit import WIDTH

    for name in ("resnet18", "lstm"):
        src = zoo.translated(name)[2].source
        assert black.format_str(src, mode=black.Mode(line_length=WIDTH)) == src, name
        assert max(len(line) for line in src.splitlines() if not line.lstrip().startswith(("#", '"'))) <= WIDTH


def test_saved_model_loads_without_flaxport_or_torch(tmp_path):
    module, inputs, t = zoo.translated("unet")
    t.save(tmp_path / "unet")
    assert {p.name for p in (tmp_path / "unet").iterdir()} == {"model.py", "weights.safetensors", "parity.md"}
    x = _resized(inputs, "unet")[0]
    np.save(tmp_path / "x.npy", x.numpy())
    zoo.run_without_flaxport_or_torch(f"""
        import importlib.util
        import numpy as np
        spec = importlib.util.spec_from_file_location("model", {str(tmp_path / 'unet' / 'model.py')!r})
        model_py = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(model_py)
        model = model_py.load({str(tmp_path / 'unet')!r})
        np.save({str(tmp_path / 'y.npy')!r}, np.asarray(model(np.load({str(tmp_path / 'x.npy')!r}))))
    """)
    want = _torch_outputs(module.eval(), x)[0]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-4)
    md = (tmp_path / "unet" / "parity.md").read_text()
    assert "**parity (float64, eval mode): OK" in md and "| `down1.conv1` |" in md


def test_state_dict_round_trip_and_load_state_dict():
    """t.state_dict() is torch's state_dict (names, shapes, layouts, int64 counters), exactly;
    load_state_dict takes it back; state_dict(tree) converts a params-shaped tree (gradients)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    module, inputs, t = zoo.translated("resnet18")
    sd, want = t.state_dict(), module.state_dict()
    assert list(sd) == list(want)
    for k, v in want.items():
        assert sd[k].dtype == v.numpy().dtype and sd[k].shape == tuple(v.shape), k
        np.testing.assert_array_equal(sd[k], v.numpy(), err_msg=k)
    model = t.new_model()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p, x):
        return jnp.sum(nnx.merge(graphdef, p, rest)(x) ** 2)

    grads = jax.jit(jax.grad(loss))(params, jnp.asarray(inputs[0].numpy()))
    gsd = t.state_dict(grads)
    assert set(gsd) == {k for k, _ in module.named_parameters()}
    m = module.double()  # torch's gradient of the same loss, in float64 against ours in float32
    m.zero_grad()
    (m(inputs[0].double()) ** 2).sum().backward()
    module.float()
    for k, p in m.named_parameters():
        np.testing.assert_allclose(gsd[k], p.grad.numpy(), rtol=2e-3, atol=1e-3 * float(p.grad.abs().max()), err_msg=k)
    changed = {k: v * 0 + 1 for k, v in sd.items()}
    t.load_state_dict(changed)
    assert all(np.all(v == 1) for v in t.state_dict().values())
    t.load_state_dict(sd)
    with pytest.raises(Exception, match="missing"):
        t.load_state_dict({k: v for k, v in sd.items() if k != "fc.bias"})


def test_translate_leaves_the_torch_module_as_it_found_it():
    from flaxport.translate import translate

    module, inputs = zoo.make("gan_d")
    module.train()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    generator = torch.get_rng_state()
    t = translate(module, *inputs)
    assert module.training and t.mode == "train"
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert torch.equal(torch.get_rng_state(), generator)  # its train-mode runs draw from a fork
    assert json.loads(t.report.to_json())["ok"]


class BFloat16Constant(torch.nn.Module):
    """A constant torch keeps in bfloat16 (HF RecurrentGemma's embedding normaliser), which NumPy lacks."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("normalizer", torch.tensor(4.0 ** 0.5, dtype=torch.bfloat16), persistent=False)

    def forward(self, x):
        return self.linear(x) * self.normalizer.type(x.dtype)


def test_a_bfloat16_buffer_stays_bfloat16_in_the_model_and_its_weights_file(tmp_path):
    import jax.numpy as jnp

    from flaxport.runtime.loader import read_safetensors
    from flaxport.translate import translate
    from flaxport.translate.written import check_written

    module = BFloat16Constant().eval()
    t = translate(module, torch.randn(3, 4))
    assert t.report.ok, str(t.report)
    t.save(tmp_path / "o")
    arrays, _ = read_safetensors(tmp_path / "o" / "weights.safetensors")
    assert arrays["normalizer"].dtype == jnp.bfloat16 and float(arrays["normalizer"]) == 2.0
    assert check_written(t, module, tmp_path / "o").problem == ""


def test_cnn_translation_matches_the_hand_written_flax_cnn():
    """The translated cnn twin against the workload's own hand-written Flax CNN (weights ported by
    the workload's key map): same outputs on the same images, NCHW in for one, NHWC for the other."""
    import jax.numpy as jnp

    from flaxport.workloads.cnn import config as cnn_config
    from flaxport.workloads.cnn import convert, model

    module, inputs, t = zoo.translated("cnn")
    cfg = dataclasses.replace(cnn_config.get_config("default"), conv_impl="xla")
    variables = convert.torch_to_flax(cfg, module.state_dict())
    hand = model.cnn(cfg).apply(variables, jnp.asarray(inputs[0].numpy().transpose(0, 2, 3, 1)), train=False)
    ours = t.model(jnp.asarray(inputs[0].numpy()))
    np.testing.assert_allclose(np.asarray(ours), np.asarray(hand), rtol=1e-5, atol=1e-5)


def test_translate_function_carries_a_torch_loss_into_jax():
    """F.cross_entropy with label smoothing and ignore_index, and F.mse_loss(reduction='sum'):
    values and gradients equal torch's in float64, under jax.jit; other batch sizes work."""
    import jax
    import jax.numpy as jnp
    import torch.nn.functional as F

    from flaxport.translate import translate_function

    g = torch.Generator().manual_seed(3)
    logits, targets = torch.randn(6, 5, generator=g), torch.tensor([0, 1, -100, 3, 4, 1])
    ce = translate_function(F.cross_entropy, logits, targets, label_smoothing=0.1)
    mse = translate_function(F.mse_loss, logits, torch.randn(6, 5, generator=g), reduction="sum")
    assert ce.report.ok and mse.report.ok
    assert "def cross_entropy_jax(input, target):" in ce.source and "import torch" not in ce.source
    x = torch.randn(9, 5, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 5, (9,), generator=g)
    F.cross_entropy(x, y, label_smoothing=0.1).backward()
    with jax.enable_x64(True):
        xj = jnp.asarray(x.detach().numpy())
        value, grad = jax.jit(jax.value_and_grad(lambda a: ce(a, jnp.asarray(y.numpy()))))(xj)
        np.testing.assert_allclose(float(value), F.cross_entropy(x, y, label_smoothing=0.1).item(), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(grad), x.grad.numpy(), rtol=1e-10, atol=1e-14)
        b = torch.randn(9, 5, generator=g, dtype=torch.float64)
        np.testing.assert_allclose(float(mse(xj, jnp.asarray(b.numpy()))),
                                   F.mse_loss(x.detach(), b, reduction="sum").item(), rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cnn", "unet", "mobilenet"])
def test_layout_nhwc_keeps_image_values_channels_last_and_passes(name):
    """--layout nhwc: convs, norms, pools, resampling, concatenation and elementwise ops on
    (N, H, W, C); transposes only where another op reads a value (the flatten before a
    Linear) and at the model's inputs and outputs, which stay in torch's layout."""
    from flaxport.translate import translate

    module, inputs = zoo.make(name)
    t = translate(module, *inputs, layout="nhwc")
    assert t.report.ok and t.report.precision == "float64", str(t.report)
    assert "channels_last=True" in t.source
    src = t.source[t.source.index(f"class {t.class_names[0]}("):t.source.index("\ndef load(")]
    assert src.count(".transpose(0, 2, 3, 1)") <= 2 and src.count(".transpose(0, 3, 1, 2)") <= 2
    _assert_runs_like_torch_at_other_sizes(module, inputs, t, name)


class _FlatHead(torch.nn.Module):
    """conv -> pool -> flatten -> linear on a map that is not square (3 x 2), in one statement (so
    the pooled map would be written inline, but the flatten must name it to check its shape)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 3 * 2, 5)

    def forward(self, x):
        return self.fc(torch.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1))


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_a_flatten_read_by_a_linear_stays_channels_last(layout, tmp_path):
    """The linear after a flatten holds its weight's columns in (h, w, c) order, so the flatten of a
    channels-last map needs no transpose: the proof still passes, torch's state_dict comes back
    exactly, load() from the saved torch weights gives the same model, and a map of another shape
    with the same size is refused rather than mixed up."""
    import jax.numpy as jnp

    from flaxport.translate import translate

    torch.manual_seed(0)
    module = _FlatHead().eval()
    x = torch.rand(2, 3, 6, 4)
    t = translate(module, x, layout=layout)
    assert t.report.ok
    assert "CHANNELS_LAST_COLUMNS = {\"fc.weight\": (8, 3, 2)}" in t.source
    assert "# fc's weight holds its columns in (h, w, c) order (load() puts them so), for 3x2 maps" in t.source
    assert "but for the Linear weights in\nCHANNELS_LAST_COLUMNS" in t.source.split("\"\"\"")[1]
    torch_weight = module.fc.weight.detach().numpy()
    np.testing.assert_array_equal(t.state_dict()["fc.weight"], torch_weight)
    held = np.asarray(t.model.fc.weight[...])
    np.testing.assert_array_equal(held, torch_weight.reshape(5, 8, 3, 2).transpose(0, 2, 3, 1).reshape(5, 48))
    t.save(tmp_path)
    namespace: dict = {}
    exec(compile(t.source, str(tmp_path / "model.py"), "exec"), namespace)
    loaded = namespace["load"](str(tmp_path))
    np.testing.assert_array_equal(np.asarray(loaded.fc.weight[...]), held)
    np.testing.assert_allclose(np.asarray(loaded(jnp.asarray(x.numpy()))), _torch_outputs(module, x)[0],
                               rtol=1e-5, atol=1e-6)
    other = torch.rand(2, 3, 4, 6)  # a 2x3 map: the same 48 features in torch, in another order
    _torch_outputs(module, other)
    with pytest.raises(AssertionError, match="fc was translated for 3x2 maps"):
        t.model(jnp.asarray(other.numpy()))


def test_a_class_nested_in_itself_builds_every_child():
    """timm's DLA: a Tree holds Trees (levels > 1) or blocks (level 1), a projection only where the
    channels change. The classes are decided from the deepest instances up, so every generated
    class builds all the children its __call__ uses."""
    import torch
    from torch import nn

    from flaxport.translate import translate

    class Tree(nn.Module):
        def __init__(self, levels, cin, cout):
            super().__init__()
            self.project = nn.Identity()
            if cin != cout:
                self.project = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))
            if levels == 1:
                self.tree1, self.tree2 = nn.Conv2d(cin, cout, 3, padding=1), nn.Conv2d(cout, cout, 3, padding=1)
            else:
                self.tree1, self.tree2 = Tree(levels - 1, cin, cout), Tree(levels - 1, cout, cout)

        def forward(self, x):
            return self.tree2(self.tree1(x) + self.project(x))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.body = Tree(1, 3, 8), Tree(3, 8, 16)

        def forward(self, x):
            return self.body(self.stem(x))

    torch.manual_seed(0)
    t = translate(Net().eval(), torch.randn(2, 3, 8, 8))
    assert t.report.ok and t.report.precision == "float64", str(t.report)
    tree = ast.parse(t.source)
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith(("Tree", "Net"))):
        built = {a.attr for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"
                 for a in ast.walk(f) if isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Store)}
        used = {a.attr for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__call__"
                for a in ast.walk(f) if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name)
                and a.value.id == "self"}
        assert used <= built, (cls.name, used - built, t.source)


def test_a_module_list_with_an_identity_keeps_its_later_items_at_torchs_index():
    """HRNet's fuse layers: ModuleLists of ModuleLists whose diagonal is nn.Identity (inlined, no
    object in the file) and whose other items are called by index: the hole stays a None."""
    import torch
    from torch import nn

    from flaxport.translate import translate

    class Fuse(nn.Module):
        def __init__(self):
            super().__init__()
            self.fuse_layers = nn.ModuleList([
                nn.ModuleList([nn.Identity(), nn.Sequential(nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4))]),
                nn.ModuleList([nn.Conv2d(4, 8, 1), nn.Identity()])])

        def forward(self, a, b):
            xs, out = [a, b], []
            for fuse in self.fuse_layers:
                y = None
                for j, f in enumerate(fuse):
                    y = f(xs[j]) if y is None else y + f(xs[j])
                out.append(torch.relu(y))
            return out

    torch.manual_seed(0)
    t = translate(Fuse().eval(), torch.randn(2, 4, 5, 5), torch.randn(2, 8, 5, 5))
    assert t.report.ok and t.report.precision == "float64", str(t.report)
    assert "nnx.List([None, nnx.Sequential(" in t.source
    assert set(t.state_dict()) == set(Fuse().state_dict())


def test_a_sequential_with_a_forward_of_its_own_runs_that_forward():
    """torchvision DeepLabV3's ASPPPooling: an nn.Sequential subclass whose forward runs its children
    and then resizes back to the input's size. It is a class of its own, not an nnx.Sequential."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    from flaxport.translate import translate

    class ASPPPooling(nn.Sequential):
        def __init__(self, cin, cout):
            super().__init__(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout),
                             nn.ReLU())

        def forward(self, x):
            size = x.shape[-2:]
            for mod in self:
                x = mod(x)
            return F.interpolate(x, size=size, mode="bilinear", align_corners=False)

    class ASPP(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.ModuleList([nn.Conv2d(4, 8, 3, padding=1), ASPPPooling(4, 8)])

        def forward(self, x):
            return torch.cat([conv(x) for conv in self.convs], 1)

    class Net(nn.Module):  # the head an nn.Sequential, its input's size an expression of the image's
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 4, 3, stride=2, padding=1)
            self.head = nn.Sequential(ASPP(), nn.Conv2d(16, 2, 1))

        def forward(self, x):
            return self.head(self.stem(x))

    torch.manual_seed(0)
    module, x = Net().eval(), torch.randn(2, 3, 12, 12)
    t = translate(module, x)
    assert t.report.ok and t.report.precision == "float64", str(t.report)
    # the resize reads the size from ASPPPooling's own input, not from arguments a Sequential cannot pass
    assert "class ASPPPooling(nnx.Module)" in t.source and "def __call__(self, x):" in t.source
    assert "size=(x.shape[2], x.shape[3])" in t.source
    assert set(t.state_dict()) == set(module.state_dict())
    _assert_runs_like_torch_at_other_sizes(module, (x,), t, "aspp")


def test_sizes_a_block_passes_to_a_child_are_the_childs_parameters():
    """timm EdgeNeXt's positional encoding: a block inside an nn.Sequential calls a child with sizes
    it read from its input (`self.pos(B, H, W)`). The child takes them as parameters, in its
    forward's order; the block reads them from its own arrays, so it takes one input and fits
    the nnx.Sequential (it asked for the image's sizes, which a Sequential cannot pass)."""
    import torch
    from torch import nn

    from flaxport.translate import translate

    class Pos(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(3, 8)

        def forward(self, B, H, W):
            ys = torch.arange(H, dtype=torch.float32)[:, None].expand(H, W)
            xs = torch.arange(W, dtype=torch.float32)[None, :].expand(H, W)
            grid = torch.stack([ys, xs, ys * xs], -1)
            return self.proj(grid).permute(2, 0, 1)[None].expand(B, -1, -1, -1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(8, 8, 3, padding=1)
            self.pos = Pos()

        def forward(self, x):
            B, C, H, W = x.shape
            return x + self.conv(x) + self.pos(B, H, W)

    class Net(nn.Module):  # the blocks' sizes are expressions of the image's (a strided stem)
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.blocks = nn.Sequential(Block(), Block())

        def forward(self, x):
            return self.blocks(self.stem(x))

    torch.manual_seed(0)
    module, x = Net().eval(), torch.randn(2, 3, 9, 9)
    t = translate(module, x)
    assert t.report.ok, str(t.report)  # in float32: the grid is float32 in the source
    assert "    def __call__(self, B, H, W):" in t.source
    assert "self.pos(x.shape[0], x.shape[2], x.shape[3])" in t.source
    assert "self.blocks = nnx.Sequential(Block(rngs=rngs), Block(rngs=rngs))" in t.source
    _assert_runs_like_torch_at_other_sizes(module, (x,), t, "edgenext")


def test_a_sequential_of_named_children_called_one_by_one_keeps_their_names():
    """timm MetaFormer's head: an nn.Sequential built from an OrderedDict whose children the forward
    calls one by one (`self.head.norm(x)`). It is an nnx.Dict by child name, so the weights land
    under torch's names (an nnx.List by position left them without a torch value)."""
    from collections import OrderedDict

    import torch
    from torch import nn

    from flaxport.translate import translate

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.head = nn.Sequential(OrderedDict([("pool", nn.AdaptiveAvgPool2d(1)), ("norm", nn.BatchNorm2d(8)),
                                                   ("flatten", nn.Flatten(1)), ("fc", nn.Linear(8, 4))]))

        def forward(self, x):
            x = self.head.norm(self.head.pool(self.stem(x)))
            return self.head.fc(self.head.flatten(x))

    torch.manual_seed(0)
    module = Net().eval()
    t = translate(module, torch.randn(2, 3, 8, 8))
    assert t.report.ok, str(t.report)
    assert 'self.head = nnx.Dict({"norm": BatchNorm2d(8), "fc": Linear(8, 4, rngs=rngs)})' in t.source
    assert 'self.head["fc"](' in t.source
    assert set(t.state_dict()) == set(module.state_dict())


def test_a_module_read_only_through_a_method_holds_its_variables():
    """timm Eva's rotary embedding: the forward calls `self.rope.get_embed(n)`, never the module
    itself, so no call of it is captured, but its buffer and parameter are read. It becomes a class
    with only a constructor holding them, under torch's names."""
    import torch
    from torch import nn

    from flaxport.translate import translate

    class Rope(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.register_buffer("periods", torch.linspace(1.0, 4.0, dim))
            self.scale = nn.Parameter(torch.linspace(0.5, 1.5, dim))

        def get_embed(self, n):
            return torch.sin(torch.arange(n, dtype=torch.float32)[:, None] / self.periods) * self.scale

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.rope = Rope(8)

        def forward(self, x):
            return self.fc(x) + self.rope.get_embed(x.shape[1])

    torch.manual_seed(0)
    module = Net().eval()
    t = translate(module, torch.randn(2, 5, 8))
    assert t.report.ok, str(t.report)
    rope = t.source[t.source.index("class Rope(nnx.Module):"):t.source.index("class Net(")]
    assert "self.periods = Buffer(" in rope and "self.scale = nnx.Param(" in rope and "__call__" not in rope
    assert set(t.state_dict()) == set(module.state_dict())


def test_blocks_whose_sizes_agree_are_one_class():
    """Two instances of one block class, the first seeing its sizes as symbols export fixed, the
    second as plain integers: the same literals either way, so one generated class for both."""
    import torch
    from torch import nn

    from flaxport.translate import translate

    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.norm = nn.LayerNorm(c)
            self.fc = nn.Linear(c, c)

        def forward(self, x):
            B, C, H, W = x.shape
            h = self.fc(self.norm(x.permute(0, 2, 3, 1)))
            return x + h.permute(0, 3, 1, 2).reshape(B, C, H, W)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.blocks = nn.Sequential(Block(8), Block(8))

        def forward(self, x):
            return self.blocks(self.stem(x))

    torch.manual_seed(0)
    t = translate(Net().eval(), torch.randn(2, 3, 8, 8))
    assert t.report.ok, str(t.report)
    assert t.source.count("class Block") == 1, t.source
    assert "self.blocks = nnx.Sequential(Block(rngs=rngs), Block(rngs=rngs))" in t.source


def test_a_custom_op_of_the_users_is_translated_from_its_own_torch_code():
    """A torch.library.custom_op is one opaque call in torch.export's graph: its Python function
    is traced like a decomposition, so the ops it runs translate and the proof holds."""
    from flaxport.translate import translate

    @torch.library.custom_op("flaxport_test::scaled_gelu", mutates_args=())
    def scaled_gelu(x: torch.Tensor, scale: float) -> torch.Tensor:
        return torch.nn.functional.gelu(x) * scale + x.mean(-1, keepdim=True)

    @scaled_gelu.register_fake
    def _(x, scale):
        return torch.empty_like(x)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, 6)

        def forward(self, x):
            return scaled_gelu(self.fc(x), 1.5)

    torch.manual_seed(0)
    t = translate(Block().eval(), torch.randn(3, 6))
    assert t.report.ok, str(t.report)
    assert "jax.nn.gelu(" in t.source and "# flaxport_test.scaled_gelu, as torch decomposes it" in t.source


def test_a_model_only_static_export_captures_translates_and_the_inputs_stay_unmarked():
    """AlexNet's shape at 64 pixels: the dynamic export fails on a size guard torch cannot solve;
    the static export after it must not find the example tensors marked dynamic by the first try."""
    from torch import nn

    from flaxport.translate import translate

    torch.manual_seed(0)
    features = nn.Sequential(nn.Conv2d(3, 4, 11, stride=4, padding=2), nn.MaxPool2d(3, 2),
                             nn.Conv2d(4, 4, 5, padding=2), nn.MaxPool2d(3, 2), nn.Conv2d(4, 4, 3, padding=1),
                             nn.MaxPool2d(3, 2), nn.AdaptiveAvgPool2d(6))
    x = torch.randn(2, 3, 64, 64)
    t = translate(features.eval(), x)
    assert t.report.ok, str(t.report)
    assert not any(name.startswith("_dynamo") for name in vars(x))


@pytest.mark.parametrize("layer, shape, broadcast", [
    ("Dropout2d", (4, 8), ""),  # torch draws per element of a 2-D input
    ("Dropout1d", (6, 8), "(2,)"),  # unbatched (C, L), made (1, C, L) first: a draw per channel
    ("Dropout2d", (2, 6, 3, 8), "(2, 3)"),
])
def test_a_channel_dropout_draws_as_torch_does_for_the_rank_it_is_given(layer, shape, broadcast, tmp_path):
    """The written model runs in train mode with the mask shape torch uses for that input's rank."""
    import importlib.util

    import jax.numpy as jnp
    from torch import nn

    from flaxport.translate import translate

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = getattr(nn, layer)(0.5)

        def forward(self, x):
            return self.drop(x)

    t = translate(Block().eval(), torch.randn(*shape))
    assert t.report.ok
    line = next(line for line in t.source.splitlines() if "nnx.Dropout(" in line)
    assert (f"broadcast_dims={broadcast}" in line) if broadcast else "broadcast_dims" not in line, line
    t.save(tmp_path)
    spec = importlib.util.spec_from_file_location("written", tmp_path / "model.py")
    written = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(written)
    model = written.load(tmp_path)
    model.train()
    dropped = np.asarray(model(jnp.ones(shape))) == 0
    if layer == "Dropout1d":  # whole channels
        assert all(row.all() or not row.any() for row in dropped)


def test_a_module_overriding_train_with_its_own_signature_is_put_in_each_mode_directly():
    """translate and its proofs set torch's modes on the module and its children themselves: a
    train() of the user's taking a phase name is never called with a bool."""
    from torch import nn

    from flaxport.translate import translate
    from flaxport.translate.proof import check_train

    class Phased(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.norm = nn.Linear(4, 4), nn.BatchNorm1d(4)

        def train(self, phase: str = "fit"):
            if not isinstance(phase, str):
                raise TypeError("train takes a phase name")
            for module in self.modules():
                module.training = phase == "fit"
            return self

        def forward(self, x):
            return self.norm(self.fc(x))

    torch.manual_seed(0)
    module = Phased().train("predict")
    t = translate(module, torch.randn(5, 4))
    assert t.report.ok and set(t.plan.captures) == {"eval", "train"}
    assert check_train(t, module).ok


@pytest.mark.parametrize("order", ["h, c", "c, h"])
def test_an_lstm_given_its_state_is_called_with_the_pair(order):
    """nn.LSTM(x, (h, c)) becomes self.rnn(x, (h, c)), whatever order forward takes h and c in."""
    from torch import nn

    from flaxport.translate import translate

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.fc = nn.LSTM(4, 6, batch_first=True), nn.Linear(6, 2)

        def forward(self, x, first, second):
            h, c = (first, second) if order == "h, c" else (second, first)
            out, (h_n, c_n) = self.rnn(x, (h, c))
            return self.fc(out[:, -1]), h_n, c_n

    torch.manual_seed(0)
    t = translate(Tagger().eval(), torch.randn(3, 5, 4), torch.randn(1, 3, 6), torch.randn(1, 3, 6))
    assert t.report.ok, str(t.report)
    pair = "(first, second)" if order == "h, c" else "(second, first)"
    assert f"self.rnn(x, {pair})" in t.source


def test_a_cast_in_a_train_mode_branch_refers_only_to_values_already_defined():
    """A float cast of integer ids in a class whose train and eval code differ: its dtype follows a
    value defined before it, never the statement's own result (HF Falcon's rotary frequencies)."""
    from torch import nn

    from flaxport.translate import translate
    from flaxport.translate.proof import check_train

    class Rotary(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("inv_freq", torch.rand(4))

        def forward(self, positions):
            freqs = positions[..., None].float() * self.inv_freq
            return nn.functional.dropout(freqs.sin(), 0.5, self.training)

    torch.manual_seed(0)
    module = Rotary().eval()
    t = translate(module, torch.arange(6).reshape(2, 3))
    assert t.report.ok, str(t.report)
    assert not re.search(r"(\w+) = .*\.astype\(\1\.dtype\)", t.source), t.source
    assert check_train(t, module).ok
