"""`flaxport translate`: files written, summary, exit codes, one line per user error."""
import json
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from flaxport.cli import main  # noqa: E402

MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.conv = nn.Conv2d(c, c, 3, padding=1)
            self.bn = nn.BatchNorm2d(c)

        def forward(self, x):
            return x + torch.relu(self.bn(self.conv(x)))


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
            self.blocks = nn.Sequential(Block(8), Block(8))
            self.head = nn.Linear(8, 5)

        def forward(self, x):
            h = self.blocks(self.stem(x))
            return self.head(nn.functional.gelu(8 * h.mean((2, 3))))


    def net():
        torch.manual_seed(0)
        return Net()


    class Airy(nn.Module):
        def forward(self, x):
            return torch.special.airy_ai(x).sum((1, 2))


    class Bessel(nn.Module):
        def forward(self, x):
            return torch.special.bessel_y1(x)


    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = Airy(), Bessel()

        def forward(self, x):
            return self.a(x) + self.b(x).sum((1, 2)) + self.a(x * 2)


    def two():
        return Two()


    class Branch(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x * 2
            return x


    def branch():
        return Branch()


    def broken():
        raise RuntimeError("needs a GPU")


    def normed():
        return nn.Sequential(nn.utils.parametrizations.spectral_norm(nn.Conv1d(2, 4, 3)), nn.ReLU())


    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(8, 16, batch_first=True)
            self.head = nn.Linear(16, 3)

        def forward(self, x, state, mask=None):
            out, (h, c) = self.rnn(x, state)
            logits = self.head(out)
            if mask is not None:
                logits = logits.masked_fill(~mask[..., None], 0.0)
            return logits, h, c


    def tagger():
        torch.manual_seed(0)
        return Tagger()


    class Mixer(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, parts):
            return self.proj(parts["a"]) * parts["b"]


    def mixer():
        torch.manual_seed(0)
        return Mixer()
''')


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("user")
    (d / "my_models.py").write_text(MODELS)
    return d / "my_models.py"


def _run(argv, capsys):
    code = main(["translate", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_translate_writes_the_files_and_the_summary(models, tmp_path, cli):
    out = tmp_path / "net"
    r = cli("translate", f"{models}:net", "--input", "2,3,16,16", "--out", out, "--train")
    assert r.returncode == 0, r.stderr
    assert "translated Net: 3 classes (Block, Net" in r.stdout or "translated Net:" in r.stdout
    assert "parity (float64, eval mode): OK" in r.stdout and "parameters" in r.stdout
    assert {p.name for p in out.iterdir()} == {"model.py", "weights.safetensors", "parity.md"}
    from flaxport.runtime.loader import read_safetensors

    arrays, meta = read_safetensors(out / "weights.safetensors")
    assert meta["mode"] == "train"  # --train: load() returns the model in train mode
    assert "blocks.0.bn.num_batches_tracked" in arrays and arrays["blocks.0.bn.num_batches_tracked"].dtype.name == "int64"
    assert "class Block(nnx.Module):" in (out / "model.py").read_text()


def test_conv_native_writes_the_optional_kernel_import_and_says_what_the_proof_ran(models, tmp_path, capsys):
    code, out, err = _run([f"{models}:net", "--input", "2,3,16,16", "--out", tmp_path / "net", "--conv", "native"],
                          capsys)
    assert code == 0, err
    assert "note: conv native: " in out and "parity (float64, eval mode): OK" in out
    source = (tmp_path / "net" / "model.py").read_text()
    assert "    from flaxport.kernels import conv as flaxport_conv\nexcept ImportError:\n" in source
    assert "Note: conv native: " in (tmp_path / "net" / "parity.md").read_text()


def test_weights_are_loaded_without_unpickling_and_must_fit(models, tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("user_models", models)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(1)
    state = mod.Net().state_dict()
    torch.save(state, tmp_path / "good.pt")
    torch.save({"state_dict": {k: v for k, v in state.items() if k != "head.bias"}}, tmp_path / "missing.pt")
    torch.save({k: (v[:1] if k == "head.weight" else v) for k, v in state.items()}, tmp_path / "shape.pt")

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"weights": Evil()}, tmp_path / "pickle.pt")
    from flaxport.cli.translate import load_factory, load_weights

    net = load_factory(f"{models}:net")
    load_weights(net, tmp_path / "good.pt")
    assert torch.equal(net.head.weight, state["head.weight"])
    from flaxport.errors import UserError

    with pytest.raises(UserError, match=r"does not fit Net: 1 missing \(head.bias\)"):
        load_weights(net, tmp_path / "missing.pt")
    with pytest.raises(UserError, match=r"shape\(s\) differ, e.g. head.weight \(1, 8\) vs \(5, 8\)"):
        load_weights(net, tmp_path / "shape.pt")
    with pytest.raises(UserError, match="weights_only"):
        load_weights(net, tmp_path / "pickle.pt")
    assert "pwned" not in capsys.readouterr().out
    from flaxport.translate.save import write_safetensors

    write_safetensors(tmp_path / "w.safetensors", {k: v.numpy() for k, v in state.items()})
    other = load_factory(f"{models}:net")
    load_weights(other, tmp_path / "w.safetensors")
    assert all(torch.equal(other.state_dict()[k], v) for k, v in state.items())


def test_every_unsupported_op_is_listed_with_its_module_and_line(models, tmp_path, capsys):
    code, out, err = _run([f"{models}:two", "--input", "2,3,3", "--out", tmp_path / "two"], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[0] == "flaxport: error: 2 op(s) with no translation:"
    assert any("aten.special_airy_ai" in line and "in a " in line and "my_models.py" in line and
               "return torch.special.airy_ai(x).sum((1, 2))" in line for line in lines), err
    assert any("aten.special_bessel_y1" in line and "in b " in line for line in lines), err
    assert len(lines) == 3  # `a` is called twice: listed once
    assert not (tmp_path / "two").exists()


def test_user_errors_are_one_line_each(models, tmp_path, capsys):
    cases = [
        ([f"{models}:nope", "--input", "2,3", "--out", tmp_path / "o"], "has no 'nope'"),
        ([f"{tmp_path}/missing.py:net", "--input", "2,3", "--out", tmp_path / "o"], "no such file"),
        ([f"{models}:broken", "--input", "2,3", "--out", tmp_path / "o"], "calling broken() failed: RuntimeError: needs a GPU"),
        (["no.such.module:net", "--input", "2,3", "--out", tmp_path / "o"], "cannot import no.such.module"),
        ([f"{models}:net", "--input", "2,three", "--out", tmp_path / "o"], "comma-separated sizes"),
        ([f"{models}:net", "--input", "2,3:float8", "--out", tmp_path / "o"], "dtype 'float8'"),
        ([f"{models}:net", "--out", tmp_path / "o"], "needs --input"),
        ([f"{models}:net", "--input", "2,3,16,16", "--out", tmp_path / "o", "--weights", tmp_path / "x.pt"],
         "no such file"),
        ([f"{models}:branch", "--input", "2,3", "--out", tmp_path / "o"],
         "forward branches on a tensor's value"),
        ([f"{models}:net", "--input", "2,3,16", "--out", tmp_path / "o"],  # torch's own forward refuses it: named
         "--input 2,3,16: the forward fails on the example inputs at my_models.py:24 "
         "`h = self.blocks(self.stem(x))`, in stem (Conv2d(3, 8, kernel_size=(3, 3)"),
        ([f"{models}:net", "--input", "2,3,16,16", "--out", tmp_path / "o", "--conv", "cudnn"],
         "argument --conv: invalid choice: 'cudnn'"),
        ([f"{models}:net", "--input", "2,3,16,16", "--out", tmp_path / "o", "--seed", str(2**70)],
         "--seed must be a whole number from 0 to 2**63 - 1"),
        ([f"{models}:normed", "--input", "2,2,9", "--out", tmp_path / "o"],
         "0.weight: parametrized (spectral_norm, orthogonal, ...), which has no translation (weight_norm has); "
         "fold it into a plain weight first with torch.nn.utils.parametrize.remove_parametrizations"),
    ]
    for argv, message in cases:
        code, out, err = _run(argv, capsys)
        assert code == 2, (argv, err)
        assert len(err.strip().splitlines()) == 1 and message in err, (argv, err)
        assert "Traceback" not in err


def test_a_wrong_translation_exits_1_names_the_submodule_and_still_writes_the_files(models, tmp_path, capsys,
                                                                                    monkeypatch):
    """Fault injected: GELU translated as jax.nn.gelu's tanh approximation (docs/porting.md, entry 8)."""
    from flaxport.translate import ops
    from flaxport.translate.ops import call

    monkeypatch.setitem(ops.OPS, "aten.gelu.default", lambda c, node: call("jax.nn.gelu", c.x("self")))
    out = tmp_path / "wrong"
    code, stdout, err = _run([f"{models}:net", "--input", "2,3,16,16", "--out", out], capsys)
    assert code == 1
    assert "FAILED, first divergence at 'head'" in stdout
    assert "parity failed: the translation of 'head' computes something else" in err
    assert {p.name for p in out.iterdir()} == {"model.py", "weights.safetensors", "parity.md"}
    assert "**FAIL, first**" in (out / "parity.md").read_text()
    report = json.loads(json.dumps({"ok": False}))
    assert report["ok"] is False


def test_tuple_dict_and_keyword_inputs_are_given_as_forward_takes_them(models, tmp_path, capsys):
    """An LSTM's (h, c) as one tuple argument, a keyword mask, a dict: proved in float64, and the
    written file takes them as torch's forward does."""
    import importlib.util

    import jax.numpy as jnp
    import numpy as np

    out = tmp_path / "tagger"
    code, text, err = _run([f"{models}:tagger", "--input", "2,5,8", "--input", "(1,2,16;1,2,16)",
                            "--input", "mask=2,5:bool", "--out", out], capsys)
    assert code == 0, err
    assert "parity (float64, eval mode): OK" in text
    source = (out / "model.py").read_text()
    assert "out, (h, c) = self.rnn(x, state)" in source and "def __call__(self, x, state, mask):" in source
    assert "mask=(2, 5) bool" in (out / "parity.md").read_text()
    spec = importlib.util.spec_from_file_location("tagger_model", out / "model.py")
    written = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(written)
    model = written.load(str(out))
    torch.manual_seed(0)
    twin = torch.nn.LSTM(8, 16, batch_first=True)  # the factory's LSTM: its weights are the file's
    x, h, c = torch.randn(2, 5, 8), torch.randn(1, 2, 16), torch.randn(1, 2, 16)
    _, (h_torch, _) = twin(x, (h, c))
    _, h_jax, _ = model(jnp.asarray(x.numpy()), (jnp.asarray(h.numpy()), jnp.asarray(c.numpy())),
                        jnp.ones((2, 5), bool))
    np.testing.assert_allclose(np.asarray(h_jax), h_torch.detach().numpy(), atol=1e-5)

    code, text, err = _run([f"{models}:mixer", "--input", "{a=3,4;b=3,4}", "--out", tmp_path / "mixer"], capsys)
    assert code == 0 and "parity (float64, eval mode): OK" in text, err


@pytest.mark.parametrize("given, message", [
    ("(1,2,16;1,2,16", "'(' without its ')'"),
    ("{h=1,2;c}", "a dict's items are NAME=VALUE"),
    ("(1,2;;3)", "an empty item"),
    ("{h=1,2;h=3}", "'h' twice"),
    ("(1,2);3)", "a closing bracket without its opening one"),
    ("mask=2,x", "comma-separated sizes"),
])
def test_a_bad_nested_input_is_one_line(models, tmp_path, capsys, given, message):
    code, _, err = _run([f"{models}:tagger", "--input", "2,5,8", "--input", given, "--out", tmp_path / "o"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "o").exists()


def test_a_keyword_input_given_twice_is_refused(models, tmp_path, capsys):
    code, _, err = _run([f"{models}:tagger", "--input", "2,5,8", "--input", "(1,2,16;1,2,16)", "--input",
                         "mask=2,5:bool", "--input", "mask=2,5:bool", "--out", tmp_path / "o"], capsys)
    assert code == 2 and "--input mask=...: given twice" in err, err


def test_written_files_that_do_not_run_as_proved_exit_1(models, tmp_path, capsys, monkeypatch):
    """Fault injected: weights.safetensors written with one tensor doubled. The proof of the model in
    memory passes; the files, loaded and run as a user runs them, do not."""
    from flaxport.translate import save

    write = save.write_safetensors

    def doubled(path, arrays, metadata=None):
        arrays = dict(arrays, **{"head.weight": arrays["head.weight"] * 2})
        write(path, arrays, metadata)

    monkeypatch.setattr(save, "write_safetensors", doubled)
    code, out, err = _run([f"{models}:net", "--input", "2,3,16,16", "--out", tmp_path / "o"], capsys)
    assert code == 1 and "parity (float64, eval mode): OK" in out
    assert len(err.strip().splitlines()) == 1
    assert "the written files do not run as proved: model.py's output 0 is off by" in err


@pytest.mark.parametrize("dtypes, passes", [("jnp.float32,", True), ("jnp.float32, jnp.float64", False)],
                         ids=["float32-only", "both-dtypes"])
def test_float32_outputs_off_pass_only_where_the_files_agree_in_float64(models, tmp_path, dtypes, passes):
    """Fault injected into the written model.py: its output shifted by 1 in float32 only (what a
    model amplifying rounding looks like: a top-k reordered, a deep ReLU6 stack) passes with a note,
    since the same files in float64 agree with torch; shifted in float64 too, it fails."""
    import importlib.util

    from flaxport.translate import translate
    from flaxport.translate.written import check_written

    spec = importlib.util.spec_from_file_location("user_models_float64", models)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    module = mod.net().eval()
    t = translate(module, torch.randn(2, 3, 16, 16))
    t.save(tmp_path / "o")
    path = tmp_path / "o" / "model.py"
    path.write_text(path.read_text() + textwrap.dedent(f"""

        _forward = {t.root_class}.__call__


        def _shifted(self, x):
            out = _forward(self, x)
            return out + 1.0 if out.dtype in ({dtypes}) else out


        {t.root_class}.__call__ = _shifted
        """))
    check = check_written(t, module, tmp_path / "o")
    if passes:
        assert check.problem == "" and check.note.startswith("model.py's output 0 is off by 1 in float32"), check
        assert "in float64 the files agree with torch within" in check.note
    else:
        assert check.problem.startswith("model.py's output 0 is off by 1 in float32"), check
