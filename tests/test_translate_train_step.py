"""train_step.py: `translate --optimizer ... --loss ...` writes the translated model's jitted train
step, with the torch optimizer as optax source and the torch loss as JAX source, proven against
torch for 3 steps (in parity.md), runnable without flaxport or torch; bad optimizer or loss
text is one line and exit 2, and is never run.
"""
import json
import textwrap
from typing import NamedTuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from flaxport.cli import main  # noqa: E402

MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False)  # a bias before BN: noise (porting.md)
            self.bn = nn.BatchNorm2d(8)
            self.head = nn.Linear(8 * 2 * 2, 5)

        def forward(self, x):
            h = torch.relu(self.bn(self.conv(x)))
            return self.head(nn.functional.max_pool2d(h, 2).flatten(1))


    def net():
        torch.manual_seed(0)
        return Net()
''')


@pytest.mark.parametrize("text", [
    "torch.optim.SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)",
    "torch.optim.SGD(lr=0.1, momentum=0.9, dampening=0.2, maximize=True)",
    "torch.optim.Adam(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1)",
    "torch.optim.Adam(lr=1e-2, amsgrad=True)",
    "optim.AdamW(lr=1e-2)",
    "RMSprop(lr=1e-2, momentum=0.5, centered=True)",
    "torch.optim.Adagrad(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.2)",
    "torch.optim.Adadelta(weight_decay=0.1)",
    "torch.optim.Adamax()",
    "torch.optim.NAdam(decoupled_weight_decay=True, weight_decay=0.1)",
    "torch.optim.RAdam(weight_decay=0.1)",
    "torch.optim.ASGD(t0=2)",
    "torch.optim.Rprop()",
    "torch.optim.Adafactor(weight_decay=0.01)",
    "torch.optim.Muon()",
])
def test_make_optimizer_takes_optax_from_torchs_steps(text):
    """The optimizer written as source is optax_from_torch's chain: 4 updates, same to the bit."""
    import jax
    import jax.numpy as jnp
    import optax

    from flaxport.port.optim import optax_from_torch
    from flaxport.translate.train_step import optimizer_source, parse_optimizer

    name, kwargs = parse_optimizer(text)
    body, extra = optimizer_source(name, kwargs)
    ns = {"optax": optax, "jax": jax, "jnp": jnp, "NamedTuple": NamedTuple}
    for code in extra:
        exec(code, ns)
    exec("def make_optimizer():\n" + textwrap.indent(body, "    "), ns)
    written, reference = ns["make_optimizer"](), optax_from_torch({"name": name.lower(), **kwargs})
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32), "b": jnp.zeros(4, jnp.float32)}
    if name == "Muon":  # matrices only
        params = {"w": params["w"], "v": jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)}
    p1 = p2 = params
    s1, s2 = written.init(params), reference.init(params)
    for _ in range(4):
        g = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
        u1, s1 = written.update(g, s1, p1)
        u2, s2 = reference.update(g, s2, p2)
        p1, p2 = optax.apply_updates(p1, u1), optax.apply_updates(p2, u2)
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("flag, text, says", [
    ("--optimizer", "torch.optim.LBFGS(lr=1)", "LBFGS is not translated: LBFGS re-evaluates the loss through a "
                                               "closure"),
    ("--optimizer", "torch.optim.SparseAdam()", "SparseAdam is not translated: SparseAdam steps only on sparse"),
    ("--optimizer", "torch.optim.Lion(lr=1e-3)", "Lion is not a torch.optim optimizer (translated: SGD, Adam"),
    ("--optimizer", "torch.optim.AdamW(lr=-1.0)", "Invalid learning rate"),
    ("--optimizer", "torch.optim.AdamW(lr=__import__('os').getpid())", "must be a literal"),
    ("--optimizer", "os.system('touch pwned')", "name a torch.optim class"),
    ("--optimizer", "torch.optim.AdamW(model.parameters(), lr=1e-3)", "keyword arguments only"),
    ("--optimizer", "torch.optim.AdamW(lr=", "not a Python expression"),
    ("--loss", "torch.nn.functional.ctc_loss", "ctc_loss is not written into train_step.py: torch.export cannot "
                                               "capture aten._ctc_loss"),
    ("--loss", "nn.GaussianNLLLoss()", "GaussianNLLLoss is not written into train_step.py: it checks"),
    ("--loss", "nn.AdaptiveLogSoftmaxWithLoss()", "it holds weights of its own"),
    ("--loss", "torch.nn.functional.focal_loss", "not one of the losses"),
    ("--loss", "nn.CrossEntropyLoss(weight=(1.0, 'a'))", "weight= must be numbers"),
    ("--loss", "F.cross_entropy(smoothing=0.1)", "has no option 'smoothing'"),
    ("--loss", "(lambda o, t: o).__class__", "write a name"),
])
def test_bad_optimizer_or_loss_text_is_one_line_and_exit_2(tmp_path, capsys, flag, text, says):
    models = tmp_path / "my_models.py"
    models.write_text(MODELS)
    other = {"--optimizer": ("--loss", "torch.nn.functional.cross_entropy"),
             "--loss": ("--optimizer", "torch.optim.Adam(lr=1e-3)")}[flag]
    out = tmp_path / "out"
    code = main(["translate", f"{models}:net", "--input", "2,3,8,8", "--out", str(out), flag, text, *other])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    assert not out.exists() and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("flags, says", [
    (["--scheduler", "torch.optim.lr_scheduler.ReduceLROnPlateau()"], "ReduceLROnPlateau is not translated: it lowers"),
    (["--scheduler", "StepLR(gamma=0.5)"], "torch refuses it: StepLR.__init__() missing 1 required positional"),
    (["--scheduler", "LambdaLR(lr_lambda=lambda s: __import__('os').system('touch pwned'))"],
     "lr_lambda is not translated: it calls `__import__('os').system`"),
    (["--scheduler", "StepLR(step_size=get())"], "step_size= must be a literal"),
    (["--scheduler", "os.system('x')"], "os.system is not a torch.optim.lr_scheduler class"),
    (["--accumulate", "3"], "--accumulate 3: the example batch of 4 does not split into 3 equal micro-batches"),
    (["--clip-grad-norm", "-1"], "--clip-grad-norm -1: clipping needs a positive bound"),
    (["--scheduler-every", "0"], "--accumulate and --scheduler-every are at least 1"),
])
def test_bad_training_flags_are_one_line_and_exit_2(tmp_path, capsys, flags, says):
    models = tmp_path / "my_models.py"
    models.write_text(MODELS)
    out = tmp_path / "out"
    code = main(["translate", f"{models}:net", "--input", "4,3,8,8", "--out", str(out), "--optimizer",
                 "torch.optim.SGD(lr=0.1)", "--loss", "F.cross_entropy", *flags])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and says in err, err
    assert not out.exists() and not (tmp_path / "pwned").exists()


def test_training_flags_without_an_optimizer_are_one_line(tmp_path, capsys):
    code = main(["translate", "x.py:net", "--input", "2,3", "--out", str(tmp_path / "o"), "--accumulate", "2"])
    assert code == 2 and "need --optimizer and --loss" in capsys.readouterr().err


def test_optimizer_without_loss_is_one_line(tmp_path, capsys):
    code = main(["translate", "x.py:net", "--input", "2,3", "--out", str(tmp_path / "o"), "--optimizer", "Adam()"])
    err = capsys.readouterr().err
    assert code == 2 and "needs both --optimizer and --loss" in err


@pytest.mark.slow
def test_train_step_is_proven_and_runs_without_flaxport_or_torch(tmp_path, capsys):
    """The CLI writes train_step.py and proves it (parity.md); the file, run where flaxport and
    torch cannot be imported, takes the same 3 AdamW steps as torch (float32)."""
    models = tmp_path / "my_models.py"
    models.write_text(MODELS)
    out = tmp_path / "net"
    code = main(["translate", f"{models}:net", "--input", "4,3,8,8", "--out", str(out), "--train",
                 "--optimizer", "torch.optim.AdamW(lr=1e-2, weight_decay=0.01)",
                 "--loss", "nn.CrossEntropyLoss(label_smoothing=0.1)"])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    assert "train step (5 steps, torch.optim.AdamW(lr=0.01, weight_decay=0.01), F.cross_entropy): OK" in stdout
    assert {p.name for p in out.iterdir()} == {"model.py", "weights.safetensors", "train_step.py", "train.py",
                                               "parity.md"}
    md = (out / "parity.md").read_text()
    assert "## Train step (train_step.py)" in md and "| 5 | `bn.running_var` |" in md
    source = (out / "train_step.py").read_text()
    assert "optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-08, eps_root=0.0)" in source
    assert "label_smoothing=0.1" in source and "import torch" not in source and "flaxport" not in source.split('"""')[2]

    import importlib.util

    import translate_zoo as zoo

    torch.manual_seed(0)

    spec = importlib.util.spec_from_file_location("user_models_ts", models)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tm = mod.net().train()
    x = torch.randn(6, 3, 8, 8)  # another batch size than the example's
    y = torch.randint(0, 5, (6,))
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "y.npy", y.numpy().astype(np.int32))
    zoo.run_without_flaxport_or_torch(f"""
        import importlib.util, json
        import numpy as np
        def load(name):
            spec = importlib.util.spec_from_file_location(name, {str(out)!r} + "/" + name + ".py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        model = load("model").load({str(out)!r})
        train_step, state, write_back = load("train_step").make_train_step(model)
        x, y = np.load({str(tmp_path / 'x.npy')!r}), np.load({str(tmp_path / 'y.npy')!r})
        losses = []
        for _ in range(3):
            state, loss = train_step(state, x, y)
            losses.append(float(loss))
        write_back(state)
        model.eval()
        np.save({str(tmp_path / 'eval.npy')!r}, np.asarray(model(x)))
        json.dump(losses, open({str(tmp_path / 'losses.json')!r}, "w"))
    """)
    opt = torch.optim.AdamW(tm.parameters(), lr=1e-2, weight_decay=0.01)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tm(x), y, label_smoothing=0.1)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    np.testing.assert_allclose(json.loads((tmp_path / "losses.json").read_text()), losses, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # parameters and BatchNorm statistics after the steps, through an eval forward
        want = tm.eval()(x).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "eval.npy"), want, rtol=1e-4, atol=1e-4)


def test_the_written_train_step_takes_a_step_and_a_broken_one_is_named(tmp_path):
    """check_written imports the train_step.py it finds and takes one step from load(): the file as
    written steps; one whose step crashes (injected) or whose loss is not finite is a problem line."""
    import importlib.util

    from flaxport.translate import translate
    from flaxport.translate.train_step import write_train_step
    from flaxport.translate.written import check_written

    models = tmp_path / "my_models.py"
    models.write_text(MODELS)
    spec = importlib.util.spec_from_file_location("user_models_written", models)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    module = mod.net().train()
    t = translate(module, torch.randn(4, 3, 8, 8))
    write_train_step(t, module, "torch.optim.SGD(lr=0.1)", "torch.nn.functional.cross_entropy", check=False)
    t.save(tmp_path / "net")
    assert check_written(t, module, tmp_path / "net").problem == ""
    path = tmp_path / "net" / "train_step.py"
    source = path.read_text()
    path.write_text(source.replace("    def step(state, x, targets):\n",
                                   "    def step(state, x, targets):\n        x = x[:, :2]\n"))
    problem = check_written(t, module, tmp_path / "net").problem
    assert problem.startswith("train_step.py's first step fails: ") and "\n" not in problem, problem
    path.write_text(source.replace("return loss, jax.tree.leaves", "return loss * jnp.nan, jax.tree.leaves"))
    assert check_written(t, module, tmp_path / "net").problem == "train_step.py's first step gives a loss of nan"


# --------------------------------------------------------------------------- translate + check_step
def _bert_loss(outputs, targets):
    """A regression head's loss on BertModel's (last_hidden_state, pooler_output)."""
    return torch.nn.functional.mse_loss(outputs[0], targets) + outputs[1].square().mean()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "bert", "lstm"])
def test_translation_takes_three_adam_steps_like_torch(name):
    """A torchvision-style ResNet-18 (batch 8), a tiny HuggingFace BERT (dropout masks made equal) and a 2-layer
    bidirectional LSTM classifier, translated, then check_step with 3 Adam steps: float32 rows off are
    each float32 rounding (rechecked in float64), and in float64 every loss, gradient, BatchNorm
    statistic, parameter and moment agrees to 1e-8."""
    import copy

    import jax

    import translate_zoo as zoo
    from flaxport.port import check_step
    from flaxport.translate import translate_function

    if name == "bert":
        pytest.importorskip("transformers")
    module, inputs, t = zoo.translated(name)
    g = torch.Generator().manual_seed(3)
    if name == "resnet18":
        # batch 8, not the example's 2: BatchNorm over the 2 values of a 1x1 map outputs +-1 whatever
        # its input, its gradient is near zero, and Adam turns that into lr-sized steps, so rounding
        # at 1e-16 reaches 1e-5 by step 3 even in float64 (docs/porting.md); 8 values are well posed
        inputs = (torch.randn(8, 3, 32, 32, generator=g),)
    out = module(*inputs)
    flax_loss = None
    if name == "bert":
        loss_fn, targets = _bert_loss, torch.randn(out[0].shape, generator=g)
        # a loss of the user's own: check_step takes its JAX form, translated from the torch function
        flax_loss = translate_function(_bert_loss, (out[0].detach(), out[1].detach()), targets)
    else:
        loss_fn = torch.nn.functional.cross_entropy
        targets = torch.randint(0, out.shape[1], (out.shape[0],), generator=g)
    report = check_step(module, torch.optim.Adam(module.parameters(), lr=1e-3), loss_fn, t, (inputs, targets),
                        steps=3, flax_loss_fn=flax_loss)
    assert report.ok, str(report)
    assert all(r.rounding for r in report.rows if not r.ok), str(report)
    report64 = report.float64_report  # the float64 recheck of the rows float32 failed, when any did
    if report64 is None:
        with jax.enable_x64(True):
            tm = copy.deepcopy(module).double()
            xs = tuple(x.double() if x.is_floating_point() else x for x in inputs)
            y64 = targets.double() if targets.is_floating_point() else targets
            report64 = check_step(tm, torch.optim.Adam(tm.parameters(), lr=1e-3), loss_fn, t, (xs, y64), steps=3,
                                  flax_loss_fn=flax_loss)
    assert report64.dtype == "float64" and report64.strict_ok, str(report64)
    assert max(r.max_abs for r in report64.rows) < 1e-8, str(report64)
    assert {r.phase for r in report64.rows} >= {"loss", "grad", "param", "moment"}
    if name == "resnet18":
        assert "layer4.1.bn2.running_var" in {r.torch_name for r in report64.rows if r.phase == "running_stats"}
    if name == "bert":
        # the attention weights' dropout inside F.scaled_dot_product_attention included
        assert "masks made equal" in report.dropout and "7 calls a forward" in report.dropout, report.dropout


DENSE = textwrap.dedent('''
    import torch
    from torch import nn
    from torch.nn import functional as F


    class NormAct(nn.BatchNorm2d):
        """timm's BatchNormAct2d: its own forward calls F.batch_norm on its buffers."""

        def forward(self, x):
            return torch.relu(F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                           self.training, self.momentum, self.eps))


    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 6, 3, padding=1)
            self.norm1, self.conv1 = NormAct(6), nn.Conv2d(6, 4, 3, padding=1)
            self.norm2, self.conv2 = NormAct(10), nn.Conv2d(10, 4, 1)
            self.head = nn.Linear(14, 5)

        def forward(self, x):
            x = self.stem(x)
            features = [x, self.conv1(self.norm1(x))]
            features.append(self.conv2(self.norm2(torch.cat(features, 1))))
            return self.head(torch.cat(features, 1).mean((2, 3)))


    def dense():
        torch.manual_seed(0)
        return Dense()
''')


def _translated_image_model(tmp_path, capsys, text, factory):
    """`flaxport translate` of `factory` in the module `text` on a (4, 3, 6, 6) batch, with an SGD
    train step proven against torch's -> the output folder."""
    models = tmp_path / f"{factory}_models.py"
    models.write_text(text)
    out = tmp_path / factory
    code = main(["translate", f"{models}:{factory}", "--input", "4,3,6,6", "--out", str(out), "--train",
                 "--optimizer", "torch.optim.SGD(lr=0.1, momentum=0.9)", "--loss", "nn.CrossEntropyLoss()"])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    assert "train step (5 steps, torch.optim.SGD(lr=0.1, momentum=0.9), F.cross_entropy): OK" in stdout
    return out


def test_a_functional_batch_norm_and_channel_concatenation_train_as_torch_channels_last_inside(tmp_path, capsys):
    """F.batch_norm in a module's own forward and torch.cat of feature maps (DenseNet) are written as
    the file's channels-last functions (XLA then drops the transposes between them and the
    convolutions); the train step they make is proven against torch's, running statistics too."""
    out = _translated_image_model(tmp_path, capsys, DENSE, "dense")
    source = (out / "model.py").read_text()
    assert "concatenate_channels([x, " in source and "training=True" in source and "training=False" in source
    assert "jnp.concatenate" not in source.split("def concatenate_channels")[0]
    md = (out / "parity.md").read_text()
    assert "`norm2.running_var`" in md


ACTIVATED = textwrap.dedent('''
    import torch
    from torch import nn
    from torch.nn import functional as F


    class Block(nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.conv1, self.act = nn.Conv2d(channels, 2 * channels, 1), nn.GELU()
            self.conv2 = nn.Conv2d(2 * channels, channels, 3, padding=1)
            self.norm, self.gate = nn.BatchNorm2d(channels), nn.Conv2d(channels, channels, 1)

        def forward(self, x):
            y = F.silu(self.norm(self.conv2(self.act(self.conv1(x)))))
            y = y * torch.sigmoid(self.gate(y.mean((2, 3), keepdim=True)))  # squeeze-and-excite
            return F.relu6(y) + x


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.blocks = nn.Sequential(Block(8), Block(8))
            self.head = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 5))

        def forward(self, x):
            return self.head(self.blocks(torch.tanh(self.stem(x))).mean((2, 3)))


    def net():
        torch.manual_seed(0)
        return Net()
''')


def test_activations_and_gates_of_feature_maps_compute_channels_last_so_the_train_step_keeps_no_map_in_torch_layout(
        tmp_path, capsys):
    """An activation of a convolution's output is written `apply_channels_last(jax.nn.gelu, ...)`
    and a map times a per-channel gate `multiply_channels(y, gate)`: what their gradients keep is
    then in the convolutions' layout, and the compiled train step materialises no feature map in
    torch's (N, C, H, W) layout (written inline, XLA kept GELU's, SiLU's and sigmoid's values
    transposed). Activations of other values stay plain."""
    import importlib.util
    import re

    import jax.numpy as jnp

    out = _translated_image_model(tmp_path, capsys, ACTIVATED, "net")
    source = (out / "model.py").read_text()
    for fn in ("jax.nn.gelu", "jax.nn.silu", "jax.nn.sigmoid", "jax.nn.relu6", "jnp.tanh"):
        assert f"apply_channels_last({fn}, " in source, fn
    assert re.search(r"multiply_channels\(\s*y, apply_channels_last\(jax\.nn\.sigmoid, ", source)
    assert "lambda input: jax.nn.gelu(input, approximate=False)" in source  # the head's (N, 16)

    def module(name):
        spec = importlib.util.spec_from_file_location(name, out / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    step, state, _ = module("train_step").make_train_step(module("model").load(str(out)))
    hlo = step.lower(state, jnp.zeros((4, 3, 6, 6)), jnp.zeros((4,), jnp.int32)).compile().as_text()
    entry = hlo[hlo.index("\nENTRY"):]
    entry = entry[:entry.index("\n}")]
    assert re.findall(r"%\S+ = f32\[4,6,6,(?:8|16)\]", entry)  # XLA:CPU's layouts: the maps channels-last
    assert not re.findall(r"%\S+ = f32\[4,(?:8|16),6,6\]", entry), "feature maps in torch's layout"
