"""`flaxport translate` as a hostile or clumsy user meets it: every mistake one line naming its
real cause, the output folder written as one set (the old complete set or the new one, never
a mix), and a proof that fails on numbers that mean nothing.

The translate twin of tests/test_faults.py; docs/reliability.md maps each promise to its test.
Commands run in this process through flaxport.cli.main where they can; in a real process
where that is the point (what torch prints to the real stderr, a file-size limit standing in
for a full disk, SIGKILL during the save, a read-only mount).
"""
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from flaxport.cli import main
from flaxport.errors import UserError

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

MODELS = textwrap.dedent('''
    import sys

    import torch
    from torch import nn


    class MLP(nn.Module):
        def __init__(self, width=16):
            super().__init__()
            self.fc1 = nn.Linear(8, width)
            self.fc2 = nn.Linear(width, 4)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))


    def mlp():
        torch.manual_seed(0)
        return MLP()


    def wide():
        torch.manual_seed(0)
        return MLP(width=4096)


    def nan_weights():
        m = mlp()
        with torch.no_grad():
            m.fc1.weight.fill_(float("nan"))
        return m


    class OneValueVariance(nn.Module):
        def forward(self, x):
            return x.var(dim=1)  # NaN for rows of one value: torch's answer

    def one_value_variance():
        return OneValueVariance()


    def huge_weights():
        m = mlp()
        with torch.no_grad():  # float64 holds the products; float32 overflows to inf
            m.fc1.weight.fill_(1e30)
            m.fc2.weight.fill_(1e30)
        return m


    class Mask(nn.Module):
        def forward(self, x):
            return torch.full((x.shape[1], x.shape[1]), float("-inf")).triu(1)


    class Masked(nn.Module):
        """A submodule returning an -inf mask: a value, the same on both sides, not a failure."""

        def __init__(self):
            super().__init__()
            self.mask, self.fc = Mask(), nn.Linear(8, 8)

        def forward(self, x):
            return torch.softmax(self.fc(x) @ x.transpose(1, 2) + self.mask(x), -1) @ x


    def masked():
        torch.manual_seed(0)
        return Masked()


    def exits():
        sys.exit(0)
''')
OLD_SET = {"model.py", "weights.safetensors", "parity.md"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "my_models.py"
    path.write_text(MODELS)
    return path


def _run(capsys, *args):
    rc = main(["translate", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line(rc, err, *needles, code=2):
    assert rc == code, (rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flaxport: error: ") and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _files(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.is_dir() else {}


def _siblings(folder) -> list:
    """Anything a write of `folder` left beside it."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


@pytest.fixture(scope="module")
def translated(models, tmp_path_factory):
    """A finished translation of mlp() with train_step.py: the earlier output the cases replace."""
    out = tmp_path_factory.mktemp("earlier") / "out"
    assert main(["translate", f"{models}:mlp", "--input", "2,8", "--out", str(out), "--optimizer",
                 "torch.optim.SGD(lr=0.1)", "--loss", "F.mse_loss"]) == 0
    return out


# --------------------------------------------------------------------------- every mistake one line

@pytest.mark.parametrize("spec,needles", [
    ("2,3", ["--input 2,3: the forward fails on the example inputs at my_models.py:15", "in fc1 (Linear(in_features=8",
             "mat1 and mat2 shapes cannot be multiplied (2x3 and 8x16)"]),
    ("2,8:int64", ["--input 2,8:int64: the forward fails", "in fc1 (Linear", "must have the same dtype"]),
    ("2,8:bool", ["--input 2,8:bool: the forward fails", "in fc1 (Linear", "but got Bool and Float"]),
    ("100000,100000,1000", ["--input 100000,100000,1000: the example inputs need 40 TB of memory, more than the"]),
    ("99999999999999999999,8", ["every size must be below 2**63"]),
])
def test_an_input_the_model_cannot_take_is_one_line_naming_where(models, tmp_path, capsys, spec, needles):
    rc, _, err = _run(capsys, f"{models}:mlp", "--input", spec, "--out", tmp_path / "o")
    _one_line(rc, err, *needles)
    assert not (tmp_path / "o").exists()


def test_torch_prints_nothing_of_its_own_on_the_commonest_mistake(models, tmp_path, cli):
    """torch logs a failed capture's traceback to the real stderr (not sys.stderr): a real process."""
    proc = cli("translate", f"{models}:mlp", "--input", "2,3", "--out", tmp_path / "o")
    _one_line(proc.returncode, proc.stderr, "--input 2,3: the forward fails", "in fc1 (Linear")


def test_a_factory_that_exits_is_one_line_and_writes_nothing(models, tmp_path, capsys):
    rc, _, err = _run(capsys, f"{models}:exits", "--input", "2,8", "--out", tmp_path / "o")
    _one_line(rc, err, "calling exits() failed: it called sys.exit(0)")
    assert not (tmp_path / "o").exists()


def _safetensors(path, header, data=b""):
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)
    return path


def test_a_weights_file_that_is_not_safetensors_is_one_line(models, tmp_path):
    from flaxport.cli.translate import load_factory, load_weights

    entry = {"dtype": "F32", "shape": [16, 8], "data_offsets": [0, 512]}
    cases = {
        "a list": (_safetensors(tmp_path / "list.safetensors", [1, 2]), "its header is a JSON list"),
        "a number entry": (_safetensors(tmp_path / "num.safetensors", {"fc1.weight": 5}),
                           "fc1.weight: not a tensor entry"),
        "a 2**62 header": (tmp_path / "huge.safetensors", "its header length (4611686018427387904 bytes) runs past"),
        "offsets past the data": (_safetensors(tmp_path / "off.safetensors", {"fc1.weight": entry}, b"\0" * 8),
                                  "data_offsets [0, 512] are not a range inside the 8 bytes"),
        "a short tensor": (_safetensors(tmp_path / "short.safetensors", {"fc1.weight": {**entry, "shape": [16, 9]}},
                                        b"\0" * 512), "512 bytes of data for a F32 tensor of shape [16, 9]"),
    }
    (tmp_path / "huge.safetensors").write_bytes((2**62).to_bytes(8, "little") + b"{}")
    net = load_factory(f"{models}:mlp")
    for what, (path, needle) in cases.items():
        with pytest.raises(UserError, match="not a readable safetensors file") as e:
            load_weights(net, path)
        assert needle in str(e.value), (what, str(e.value))


@pytest.mark.parametrize("flag,text,needle", [
    ("--optimizer", "torch.optim.Adam(lr=1e-3, betas=(0.9,))", "betas=(0.9,) must be a tuple of 2 numbers"),
    ("--optimizer", "torch.optim.SGD(lr=1e400)", "lr=inf is not a finite number"),
    ("--optimizer", "torch.optim.SGD(lr=0.1, nesterov=2)", "nesterov=2 must be True or False"),
    ("--optimizer", "torch.optim.RMSprop(lr='fast')", "lr='fast' must be a number"),
    ("--loss", "nn.MSELoss(reduction='bogus')", "torch refuses these options: ValueError: bogus is not a valid value"),
    ("--loss", "F.cross_entropy(label_smoothing=2.0)", "label_smoothing must be between 0.0 and 1.0"),
    ("--loss", "F.cross_entropy(ignore_index='x')", "ignore_index='x' must be a number (like -100)"),
])
def test_an_optimizer_or_loss_text_torch_would_refuse_is_one_line_naming_it(flag, text, needle):
    from flaxport.translate.train_step import parse_loss, parse_optimizer

    with pytest.raises(UserError) as e:
        (parse_optimizer if flag == "--optimizer" else parse_loss)(text)
    assert str(e.value).startswith(f"{flag} {text!r}: ") and needle in str(e.value), str(e.value)
    assert "torch.export" not in str(e.value)


# --------------------------------------------------------------------------- the output folder: one set

def test_retranslating_replaces_the_whole_set_and_an_old_train_step_goes_with_it(models, translated, tmp_path,
                                                                                 capsys):
    out = shutil.copytree(translated, tmp_path / "out")
    (out / ".weights.safetensors.tmp4242").write_bytes(b"half a save of an older flaxport")
    assert {"train_step.py", "model.py"} <= set(_files(out))
    rc, _, err = _run(capsys, f"{models}:mlp", "--input", "2,8", "--out", out)
    assert rc == 0, err
    assert set(_files(out)) == OLD_SET  # no train_step.py for a model it was not written for
    assert _siblings(out) == []


def test_a_folder_holding_the_users_own_files_is_refused_before_any_work(models, tmp_path, capsys):
    out = tmp_path / "project"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    rc, _, err = _run(capsys, f"{models}:mlp", "--input", "2,8", "--out", out)
    _one_line(rc, err, f"cannot write --out {out}: it holds files that are not an earlier output (notes.txt)")
    assert _files(out) == {"notes.txt": b"mine"}


def test_an_out_under_a_file_or_too_long_is_one_line(models, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    for out, needle in ((tmp_path / "afile" / "o", "afile is a file, not a folder"),
                        (tmp_path / ("o" * 300), "File name too long")):
        rc, _, err = _run(capsys, f"{models}:mlp", "--input", "2,8", "--out", out)
        _one_line(rc, err, "cannot write --out", needle)


def test_a_failed_write_keeps_the_old_set_and_leaves_no_temporary_folder(translated, tmp_path, monkeypatch):
    """Fault injected: the disk fills after model.py, with and without the one-rename swap."""
    from flaxport import fileset
    from flaxport.translate.save import FILES as names

    out = shutil.copytree(translated, tmp_path / "out")
    before = _files(out)

    def fill(d):
        (d / "model.py").write_text("new")
        raise OSError(28, "No space left on device")

    for exchange in (True, False):
        if not exchange:
            monkeypatch.setattr(fileset, "_exchange", lambda a, b: False)
        with pytest.raises(UserError, match=r"cannot write --out .*: No space left on device \(the earlier files are "
                                            r"kept\)"):
            fileset.write(out, fill, names, "--out")
        assert _files(out) == before and _siblings(out) == []
    fileset.write(out, lambda d: (d / "model.py").write_text("new"), names, "--out")  # the two-rename swap
    assert _files(out) == {"model.py": b"new"} and _siblings(out) == []


def test_what_a_killed_write_left_is_put_right_by_the_next_one(tmp_path):
    """A kill between the two renames of the fallback swap leaves the old set aside and no folder:
    the next write puts it back before it writes; its unfinished new set is removed."""
    from flaxport import fileset

    dead = _dead_pid()
    old = tmp_path / f".out.old-{dead}-x"
    new = tmp_path / f".out.new-{dead}-y"
    old.mkdir()
    new.mkdir()
    (old / "model.py").write_text("old")
    (new / "model.py").write_text("half")
    assert fileset.clean_leftovers(tmp_path / "out") == [new, old]
    assert _files(tmp_path / "out") == {"model.py": b"old"} and _siblings(tmp_path / "out") == []


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _fsize_limited(limit):
    def start():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), as on a full disk
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return start


@pytest.mark.slow
def test_a_full_disk_during_the_save_is_one_line_and_keeps_the_old_set(models, translated, tmp_path):
    out = shutil.copytree(translated, tmp_path / "out")
    before = _files(out)
    proc = subprocess.run([sys.executable, "-m", "flaxport", "translate", f"{models}:wide", "--input", "2,8",
                           "--out", str(out)], capture_output=True, text=True, preexec_fn=_fsize_limited(100_000),
                          timeout=600)
    _one_line(proc.returncode, proc.stderr, f"cannot write --out {out}: File too large (the earlier files are kept)")
    assert _files(out) == before and _siblings(out) == []


@pytest.mark.slow
def test_sigkill_during_the_save_keeps_the_old_set_and_the_next_run_cleans_up(models, translated, tmp_path, cli):
    out = shutil.copytree(translated, tmp_path / "out")
    before = _files(out)
    proc = subprocess.Popen([sys.executable, "-m", "flaxport", "translate", f"{models}:wide", "--input", "2,8",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "FLAXPORT_TEST_SAVE_DELAY": "30"})  # the set complete, not renamed
    t0 = time.monotonic()
    while not any((tmp_path / name / "parity.md").exists() for name in _siblings(out)):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() - t0 < 300
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert _files(out) == before and len(_siblings(out)) == 1
    r = cli("translate", f"{models}:wide", "--input", "2,8", "--out", out)
    assert r.returncode == 0, r.stderr
    assert set(_files(out)) == OLD_SET and _siblings(out) == []
    assert _files(out)["weights.safetensors"] != before["weights.safetensors"]


@pytest.mark.slow
def test_a_read_only_out_is_one_line(models, translated, tmp_path):
    out = shutil.copytree(translated, tmp_path / "ro" / "out")
    before = _files(out)
    cmd = [sys.executable, "-m", "flaxport", "translate", f"{models}:mlp", "--input", "2,8", "--out", str(out)]
    if os.geteuid() == 0:  # root writes through permissions: a read-only mount, in a namespace of its own
        if not shutil.which("unshare"):
            pytest.skip("running as root without unshare: no way to make a read-only folder")
        ro = tmp_path / "ro"
        cmd = ["unshare", "-m", "sh", "-c", f"mount --bind {ro} {ro} && mount -o remount,ro,bind {ro} && "
               "exec \"$@\"", "sh", *cmd]
    else:
        (tmp_path / "ro").chmod(0o555)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    (tmp_path / "ro").chmod(0o755)
    if os.geteuid() == 0 and "mount" in proc.stderr and "flaxport" not in proc.stderr:
        pytest.skip(f"no mount namespace here: {proc.stderr.strip()}")
    _one_line(proc.returncode, proc.stderr, f"cannot write --out {out}")
    assert _files(out) == before


# --------------------------------------------------------------------------- the proof and meaningless numbers

def _translate(models, name, *inputs):
    from flaxport.cli.translate import load_factory
    from flaxport.translate import translate

    return translate(load_factory(f"{models}:{name}").eval(), *inputs)


def test_the_proof_fails_on_nan_weights_naming_the_first_submodule(models):
    t = _translate(models, "nan_weights", torch.randn(2, 8))
    first = t.report.first_divergence
    assert not t.report.ok and first.torch_name == "fc1"
    assert "torch computes NaN/inf here (32 of 32 values): nothing to compare" in first.note


def test_the_proof_fails_when_float32_overflows_though_float64_holds(models):
    t = _translate(models, "huge_weights", torch.randn(2, 8))
    first = t.report.first_divergence  # the first layer whose float32 output overflows
    assert not t.report.ok and first.torch_name == "fc2"
    assert first.note.startswith("float32: torch computes NaN/inf here"), first.note


def test_a_mask_of_minus_inf_on_both_sides_is_a_value_not_a_failure(models):
    t = _translate(models, "masked", torch.randn(2, 5, 8))
    assert t.report.ok, str(t.report)
    mask = next(r for r in t.report.rows if r.torch_name == "mask")
    assert mask.ok and mask.max_abs == 0.0


def test_nan_an_op_makes_of_finite_values_is_its_answer_compared_by_place(models):
    t = _translate(models, "one_value_variance", torch.randn(3, 1))
    assert t.report.ok, str(t.report)
    output = next(r for r in t.report.rows if r.torch_name == "output")
    assert output.note == "NaN or inf on both sides at the same places (3 of 3 values)"


def test_a_translation_that_gives_nan_where_torch_does_not_fails(models, monkeypatch):
    """Fault injected: relu translated as x * nan."""
    from flaxport.translate import ops
    from flaxport.translate.ops import call

    monkeypatch.setitem(ops.OPS, "aten.relu.default", lambda c, node: call("jax.numpy.multiply", c.x("self"),
                                                                           "jax.numpy.nan"))
    t = _translate(models, "mlp", torch.randn(2, 8))
    assert not t.report.ok
    assert "the translation computes NaN/inf where torch does not" in t.report.first_divergence.note


def test_nan_torch_makes_where_the_translation_does_not_is_said_that_way_round():
    from flaxport.translate.proof import _row

    torch_side, jax_side = np.array([1.0, np.inf, np.nan]), np.array([1.0, 2.0, 3.0])
    row = _row("forward", "a", "a", torch_side, jax_side, 1e-5, 1e-5, garbage_in=False)
    assert not row.ok and row.note == "torch computes NaN/inf where the translation does not (2 values)"
    row = _row("forward", "a", "a", jax_side, torch_side, 1e-5, 1e-5, garbage_in=False)
    assert row.note == "the translation computes NaN/inf where torch does not (2 values)"


def test_the_cli_names_the_nan_row_as_the_reason(models, tmp_path, capsys):
    rc, out, err = _run(capsys, f"{models}:nan_weights", "--input", "2,8", "--out", tmp_path / "o")
    assert rc == 1
    assert err.strip().splitlines() == [f"flaxport: parity failed: at 'fc1': torch computes NaN/inf here (32 of 32 "
                                        f"values): nothing to compare; check the weights and the inputs; see "
                                        f"{tmp_path / 'o' / 'parity.md'}"]
    assert "**FAIL, first**" in (tmp_path / "o" / "parity.md").read_text()
