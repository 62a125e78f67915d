"""The hostile sweep's groups for `translate` (inputs, weights files, the output folder,
optimizer and loss texts, the proof), stacks (`--seeds`, `--sweep`) and `compare` beside
trainings. tests/hostile_sweep.py runs them with its own cases; not collected by pytest.
"""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

GAN = ["--config", "smoke", "--set", "n_per_mode=50", "--no-progress"]
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


    def wide():  # 213 kB of weights: more than the sweep's file-size limit
        torch.manual_seed(1)
        return MLP(width=4096)


    mlp_instance = mlp()


    def conv():
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))


    def emb():
        torch.manual_seed(0)
        return nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(20, 2))


    def nan_weights():
        m = mlp()
        with torch.no_grad():
            m.fc1.weight.fill_(float("nan"))
        return m


    def huge_weights():
        m = mlp()
        with torch.no_grad():
            m.fc1.weight.fill_(1e30)
            m.fc2.weight.fill_(1e30)
        return m


    def exits():
        sys.exit(0)


    def exits3():
        sys.exit(3)


    def raises():
        raise RuntimeError("needs a GPU")


    def not_a_module():
        return {"fc": 1}
''')
FILES = ("model.py", "weights.safetensors", "parity.md")
WITH_STEP = FILES + ("train_step.py", "train.py")  # --optimizer writes both
# name: the command that makes the reference folder ({ref}) every case of it copies
REF_COMMANDS = {
    "translation": ["translate", "{out}/models.py:mlp", "--input", "2,8", "--out", "{ref}", "--optimizer",
                    "torch.optim.SGD(lr=0.1)", "--loss", "F.mse_loss"],
    "stack": ["train", "gan", *GAN, "--seeds", "2", "--epochs", "2", "--workdir", "{ref}"],
    "comparison": ["compare", "gan", *GAN, "--epochs", "1", "--runs", "jax-step,torch-eager", "--workdir", "{ref}"],
}


def write_files(out: Path) -> None:
    """The user's models file and the weights files the translate cases hand in."""
    import numpy as np
    import torch

    (out / "models.py").write_text(MODELS)
    (out / "exits_on_import.py").write_text("import sys\nsys.exit(0)\n")
    w = out / "weights"
    w.mkdir(exist_ok=True)
    torch.manual_seed(5)
    state = {"fc1.weight": torch.randn(16, 8), "fc1.bias": torch.randn(16), "fc2.weight": torch.randn(4, 16),
             "fc2.bias": torch.randn(4)}
    torch.save(state, w / "good.pt")
    torch.save({"model": state}, w / "under_model.pt")
    torch.save({k: v for k, v in state.items() if k != "fc2.bias"}, w / "missing.pt")
    torch.save({**state, "fc1.weight": torch.randn(16, 9)}, w / "shape.pt")
    torch.save(torch.randn(3), w / "tensor.pt")
    torch.save({**state, "fc1.weight": torch.full((16, 8), float("nan"))}, w / "nan.pt")
    (w / "garbage.pt").write_bytes(b"garbage")
    (w / "empty.safetensors").write_bytes(b"")
    (w / "short.safetensors").write_bytes(b"\x05\x00\x00")

    def safetensors(name, header, data=b""):
        text = json.dumps(header).encode() if not isinstance(header, bytes) else header
        (w / name).write_bytes(len(text).to_bytes(8, "little") + text + data)

    entry = {"dtype": "F32", "shape": [16, 8], "data_offsets": [0, 512]}
    safetensors("list.safetensors", [1, 2])
    safetensors("number.safetensors", {"fc1.weight": 5})
    safetensors("offsets.safetensors", {"fc1.weight": entry}, b"\0" * 8)
    safetensors("dtype.safetensors", {"fc1.weight": {**entry, "dtype": "Q8"}}, b"\0" * 512)
    safetensors("not-json.safetensors", b"{oops")
    safetensors("metadata.safetensors", {"__metadata__": [1]})
    (w / "huge-header.safetensors").write_bytes((2**62).to_bytes(8, "little") + b"{}")
    arrays = {k: v.numpy() for k, v in state.items()}
    header, blobs, offset = {}, [], 0
    for k, a in arrays.items():
        header[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.astype("<f4").tobytes())
        offset += a.nbytes
    safetensors("good.safetensors", header, b"".join(blobs))
    _ = np


def plant_pickle(run: Path) -> None:
    """work/evil.pt: unpickling it would create work/PLANTED."""
    import torch

    class Plant:
        def __reduce__(self):
            return (open, (str(run.parent / "PLANTED"), "w"))

    torch.save({"fc1.weight": Plant()}, run.parent / "evil.pt")


def user_file(run: Path) -> None:
    (run / "notes.txt").write_text("the user's own notes")


def older_temp(run: Path) -> None:
    (run / ".weights.safetensors.tmp4242").write_bytes(b"half a save of an older flaxport")


def killed_leftover(run: Path) -> None:
    """What a write killed before its swap leaves beside the folder (its process long gone)."""
    left = run.parent / f".{run.name}.new-999999999-x"
    left.mkdir()
    (left / "model.py").write_text("half")


def a_file(run: Path) -> None:
    shutil.rmtree(run)
    run.write_text("a file")


def nest(name: str):
    """Move the reference run into run/NAME: a training where a comparison's run would go."""
    def setup(run: Path) -> None:
        inner = run.parent / "inner"
        run.rename(inner)
        run.mkdir()
        inner.rename(run / name)
    setup.__name__ = f"nest_{name}"
    return setup


def drop(relative: str):
    def setup(run: Path) -> None:
        shutil.rmtree(run / relative)
    setup.__name__ = f"drop_{relative}"
    return setup


def edit_member_lr(run: Path) -> None:
    path = run / "seed1" / "config.json"
    saved = json.loads(path.read_text())
    saved["config"]["d_lr"] = -1.0
    path.write_text(json.dumps(saved))


def train_in(relative: str, ref: str):
    """A finished training (reference `ref`) copied into run/RELATIVE, over what was there."""
    def setup(run: Path) -> None:
        target = run / relative
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(run.parent.parent.parent / "ref" / ref, target)
    setup.__name__ = f"train_in_{relative}"
    return setup


def cases(case) -> list:
    """Every case of the new groups, made with hostile_sweep.case."""
    m = "{out}/models.py"
    tr = ["translate", f"{m}:mlp"]
    out = ["--out", "{new}"]
    opt = ["--optimizer", "torch.optim.SGD(lr=0.1)", "--loss", "F.mse_loss"]
    c = []
    # ---------------------------------------------------------------- translate: --input and FACTORY
    for spec in ("2,3", "2,8:int64", "2,8:bool", "2,8:float64", "100000,100000,1000", "99999999999999999999,8",
                 "0,8", "-2,8", "2,8:float8", "", "2,,8", "2,8 --input 2,8"):
        inputs = [a for part in spec.split(" --input ") for a in ("--input", part)]
        c.append(case(f"translate input --input {spec}", [*tr, *inputs, *out]))
    c += [
        case("translate input no --input", [*tr, *out]),
        case("translate input a 2-d input into a conv net", ["translate", f"{m}:conv", "--input", "2,8", *out]),
        case("translate input int64 into a conv net", ["translate", f"{m}:conv", "--input", "2,3,8,8:int64", *out]),
        case("translate input float ids into an embedding", ["translate", f"{m}:emb", "--input", "2,5", *out]),
        case("translate input ids into an embedding", ["translate", f"{m}:emb", "--input", "2,5:int64", *out], "ok",
             files=FILES),
        case("translate input batch of 1", [*tr, "--input", "1,8", *out], "ok", files=FILES),
        case("translate input --seed 2**70", [*tr, "--input", "2,8", "--seed", str(2**70), *out]),
        case("translate input --seed -1", [*tr, "--input", "2,8", "--seed", "-1", *out]),
        case("translate input --layout nhwcd", [*tr, "--input", "2,8", "--layout", "nhwcd", *out]),
        case("translate input FACTORY missing file", ["translate", "{out}/none.py:mlp", "--input", "2,8", *out]),
        case("translate input FACTORY without a name", ["translate", m, "--input", "2,8", *out]),
        case("translate input FACTORY unknown name", ["translate", f"{m}:nope", "--input", "2,8", *out]),
        case("translate input FACTORY raises", ["translate", f"{m}:raises", "--input", "2,8", *out]),
        case("translate input FACTORY calls sys.exit(0)", ["translate", f"{m}:exits", "--input", "2,8", *out]),
        case("translate input FACTORY calls sys.exit(3)", ["translate", f"{m}:exits3", "--input", "2,8", *out]),
        case("translate input FACTORY file exits on import", ["translate", "{out}/exits_on_import.py:x", "--input",
                                                               "2,8", *out]),
        case("translate input FACTORY returns a dict", ["translate", f"{m}:not_a_module", "--input", "2,8", *out]),
        case("translate input FACTORY an instance", ["translate", f"{m}:mlp_instance", "--input", "2,8", *out], "ok",
             files=FILES),
        case("translate input FACTORY a missing module", ["translate", "no.such.module:mlp", "--input", "2,8", *out]),
    ]
    # ---------------------------------------------------------------- translate: --weights and the proof
    for name in ("list.safetensors", "number.safetensors", "offsets.safetensors", "dtype.safetensors",
                 "not-json.safetensors", "metadata.safetensors", "huge-header.safetensors", "empty.safetensors",
                 "short.safetensors", "missing.pt", "shape.pt", "tensor.pt", "garbage.pt"):
        c.append(case(f"translate weights {name}", [*tr, "--input", "2,8", "--weights", f"{{out}}/weights/{name}",
                                                     *out]))
    c += [
        case("translate weights holding code", [*tr, "--input", "2,8", "--weights", "{work}/evil.pt", *out],
             setup=plant_pickle, kind="planted"),
        case("translate weights a folder", [*tr, "--input", "2,8", "--weights", "{out}/weights", *out]),
        case("translate weights missing", [*tr, "--input", "2,8", "--weights", "{out}/weights/none.pt", *out]),
        case("translate weights good .pt", [*tr, "--input", "2,8", "--weights", "{out}/weights/good.pt", *out], "ok",
             files=FILES),
        case("translate weights under 'model'", [*tr, "--input", "2,8", "--weights", "{out}/weights/under_model.pt",
                                                 *out], "ok", files=FILES),
        case("translate weights good .safetensors", [*tr, "--input", "2,8", "--weights",
                                                     "{out}/weights/good.safetensors", *out], "ok", files=FILES),
        case("translate weights all NaN: the proof fails", [*tr, "--input", "2,8", "--weights",
                                                            "{out}/weights/nan.pt", *out], "proof", files=FILES),
        case("translate weights NaN factory: the proof fails", ["translate", f"{m}:nan_weights", "--input", "2,8",
                                                                *out], "proof", files=FILES),
        case("translate weights overflowing float32: the proof fails", ["translate", f"{m}:huge_weights", "--input",
                                                                        "2,8", *out], "proof", files=FILES),
    ]
    # ---------------------------------------------------------------- translate: --optimizer and --loss texts
    texts = [
        ("torch.optim.Adam(lr=1e-3, betas=(0.9,))", "F.mse_loss"), ("torch.optim.SGD(lr=1e400)", "F.mse_loss"),
        ("torch.optim.SGD(lr=-1)", "F.mse_loss"), ("torch.optim.RMSprop(lr='fast')", "F.mse_loss"),
        ("torch.optim.SGD(lr=0.1, nesterov=2)", "F.mse_loss"), ("torch.optim.SGD(lr=float('nan'))", "F.mse_loss"),
        ("torch.optim.LBFGS()", "F.mse_loss"), ("torch.optim.SGD(0.1)", "F.mse_loss"),
        ("torch.optim.SGD(lr=0.1, **{'momentum': 1})", "F.mse_loss"), ("torch.optim.SGD(lr=0.1, weight_decay=-1)",
                                                                      "F.mse_loss"),
        ("torch.optim.Adam(betas=(0.9, 1.5))", "F.mse_loss"), ("torch.optim.Adam(eps=-1)", "F.mse_loss"),
        ("os.system('touch PLANTED')", "F.mse_loss"),
        ("__import__('os').system('touch PLANTED')", "F.mse_loss"),
        ("torch.optim.SGD(lr=0.1)", "nn.MSELoss(reduction='bogus')"),
        ("torch.optim.SGD(lr=0.1)", "F.cross_entropy(label_smoothing=2.0)"),
        ("torch.optim.SGD(lr=0.1)", "F.cross_entropy(ignore_index='x')"),
        ("torch.optim.SGD(lr=0.1)", "F.cross_entropy(weight=[1, 2])"),
        ("torch.optim.SGD(lr=0.1)", "F.mse_loss(size_average=True)"),
        ("torch.optim.SGD(lr=0.1)", "(lambda: __import__('os').system('touch PLANTED'))()"),
    ]
    for optimizer, loss in texts:
        c.append(case(f"translate text --optimizer {optimizer} --loss {loss}",
                      [*tr, "--input", "2,8", "--optimizer", optimizer, "--loss", loss, *out], kind="planted"))
    c += [
        case("translate text --optimizer without --loss", [*tr, "--input", "2,8", "--optimizer",
                                                           "torch.optim.SGD(lr=0.1)", *out]),
        case("translate text Adam and cross_entropy", [*tr, "--input", "2,8", "--optimizer", "torch.optim.Adam(lr=1e-3)",
                                                       "--loss", "F.cross_entropy", *out], "ok", files=WITH_STEP),
    ]
    # options and losses a user may well write, each translated and proven
    for optimizer, loss in [("torch.optim.Adam(amsgrad=True)", "F.mse_loss"), ("torch.optim.SGD(lr=0.1)", "F.kl_div")]:
        c.append(case(f"translate text --optimizer {optimizer} --loss {loss}",
                      [*tr, "--input", "2,8", "--optimizer", optimizer, "--loss", loss, *out], "ok", files=WITH_STEP))
    # ---------------------------------------------------------------- translate: the output folder
    into = ["--input", "2,8", "--out", "{run}"]
    c += [
        case("translate out again without --optimizer", [*tr, *into], "ok", ref="translation", files=FILES, load=True),
        case("translate out again with --optimizer", [*tr, *into, *opt], "ok", ref="translation", files=WITH_STEP,
             load=True),
        case("translate out another model", ["translate", f"{m}:wide", *into], "ok", ref="translation", files=FILES,
             load=True),
        case("translate out full disk while saving", ["translate", f"{m}:wide", *into], ref="translation",
             kind="fullfs", load=True),
        case("translate out SIGKILL mid-save, again", ["translate", f"{m}:wide", *into], "ok", ref="translation",
             kind="kill-set", env={"FLAXPORT_TEST_SAVE_DELAY": "30"}, files=FILES, load=True),
        case("translate out two at once", ["translate", f"{m}:wide", *into], "ok", ref="translation",
             kind="parallel", files=FILES, load=True),
        case("translate out read-only parent", [*tr, *into], ref="translation", kind="readonly-parent"),
        case("translate out under a file", [*tr, "--input", "2,8", "--out", "{out}/afile/o"]),
        case("translate out a file", [*tr, *into], ref="translation", setup=a_file),
        case("translate out holding the user's file", [*tr, *into], ref="translation", setup=user_file),
        case("translate out an older save's temporary file", [*tr, *into], "ok", ref="translation", setup=older_temp,
             files=FILES, load=True),
        case("translate out a killed write's leftover", [*tr, *into], "ok", ref="translation", setup=killed_leftover,
             files=FILES, load=True),
        case("translate out the working folder", [*tr, "--input", "2,8", "--out", "."], ref="translation"),
        case("translate out a name too long", [*tr, "--input", "2,8", "--out", "{work}/" + "o" * 300]),
        case("translate out refused input keeps the old set", [*tr, "--input", "2,3", "--out", "{run}"],
             ref="translation", load=True),
        case("translate out failed proof writes the new set", ["translate", f"{m}:nan_weights", *into], "proof",
             ref="translation", files=FILES),
    ]
    # ---------------------------------------------------------------- stacks
    st = ["train", "gan", *GAN, "--epochs", "1", "--workdir", "{new}"]
    for sweep in ("d_lr=-1e-3,1e-3", "b2=0.9,1.5", "bn_momentum=1.5", "adam_eps=-1", "b1=-0.5", "g_lr=1e-3,0.001",
                  "g_lr=abc", "batch_size=10,20", "nope=1", "g_lr=", "g_lr=inf"):
        c.append(case(f"stack --sweep {sweep}", [*st, "--sweep", sweep]))
    c += [
        case("stack --seeds 0", [*st, "--seeds", "0"]),
        case("stack --seeds -1", [*st, "--seeds", "-1"]),
        case("stack --seeds 2 --seed 2**63-1", [*st, "--seeds", "2", "--seed", str(2**63 - 1)]),
        case("stack --seeds 2 --framework torch", [*st, "--seeds", "2", "--framework", "torch"]),
        case("stack --seeds 2 --runner step", [*st, "--seeds", "2", "--runner", "step"]),
        case("stack --seeds 2 a workdir name too long", ["train", "gan", *GAN, "--seeds", "2", "--workdir",
                                                         "{work}/" + "s" * 300]),
        case("stack every member diverges", [*st, "--seeds", "2", "--set", "g_lr=1e30", "--set", "d_lr=1e30"],
             "diverged"),
    ]
    rs = ["train", "gan", *GAN, "--seeds", "2", "--workdir", "{run}"]
    c += [
        case("stack resume nothing to train", [*rs, "--resume", "--epochs", "2"], "ok", ref="stack"),
        case("stack resume one more epoch", [*rs, "--resume", "--epochs", "3"], "ok", ref="stack"),
        case("stack resume a deleted member", [*rs, "--resume", "--epochs", "2"], "ok", ref="stack",
             setup=drop("seed1"), exists=["seed1/config.json", "seed1/metrics.jsonl", "seed1/checkpoints"]),
        case("stack resume a deleted member, one more epoch", [*rs, "--resume", "--epochs", "3"], "ok", ref="stack",
             setup=drop("seed1"), exists=["seed1/config.json", "seed1/metrics.jsonl", "seed1/checkpoints"]),
        case("stack again without --resume", [*rs, "--epochs", "2"], ref="stack"),
        case("stack resume other seed", [*rs, "--resume", "--epochs", "3", "--seed", "7"], ref="stack"),
        case("stack resume other shape", [*rs, "--resume", "--epochs", "3", "--set", "z_dim=16"], ref="stack"),
        case("stack resume other members", [*rs[:-4], "--seeds", "3", "--workdir", "{run}", "--resume", "--epochs",
                                            "3"], ref="stack"),
        case("stack resume a bad --sweep", [*rs, "--resume", "--epochs", "3", "--sweep", "d_lr=-1"], ref="stack"),
        case("stack SIGKILL mid-save, resume", [*rs, "--resume", "--epochs", "4"], "ok", ref="stack", kind="kill",
             env={"FLAXPORT_TEST_SAVE_DELAY": "2"}),
        case("stack full disk while saving", [*rs, "--resume", "--epochs", "3"], ref="stack", kind="fullfs"),
        case("stack bit-flipped newest, resume", [*rs, "--resume", "--epochs", "2"], "ok", ref="stack",
             setup=_flip_newest),
        case("stack every checkpoint garbage, resume", [*rs, "--resume", "--epochs", "3"], ref="stack",
             setup=_garbage_all),
        case("stack in a single run's workdir", ["train", "gan", *GAN, "--seeds", "2", "--workdir", "{run}"],
             ref="gan-jax"),
        case("stack evaluate a member", ["evaluate", "gan", "--workdir", "{run}/seed1"], "ok", ref="stack"),
        case("stack evaluate a member whose config.json says d_lr=-1", ["evaluate", "gan", "--workdir", "{run}/seed1"],
             ref="stack", setup=edit_member_lr),
        case("stack resume a member alone", ["train", "gan", *GAN, "--workdir", "{run}/seed0", "--resume", "--epochs",
                                             "3"], "ok", ref="stack"),
    ]
    # ---------------------------------------------------------------- compare beside trainings
    cmp = ["compare", "gan", *GAN, "--epochs", "1", "--workdir", "{run}"]
    c += [
        case("compare-vs-train a finished jax run where jax-scan goes", [*cmp, "--runs", "jax-scan"], ref="gan-jax",
             setup=nest("jax-scan")),
        case("compare-vs-train a finished torch run where torch-eager goes", [*cmp, "--runs", "torch-eager"],
             ref="gan-torch", setup=nest("torch-eager")),
        case("compare-vs-train a training writing jax-step", [*cmp, "--runs", "jax-step"], kind="during-train",
             holder=["train", "gan", "--framework", "torch", *GAN, "--epochs", "3", "--workdir", "{run}/jax-step"],
             needle="is in use by process"),
        case("compare-vs-train a training holding the workdir", [*cmp, "--runs", "jax-step"], kind="during-train",
             holder=["train", "gan", "--framework", "torch", *GAN, "--epochs", "3", "--workdir", "{run}"],
             needle="is in use by process"),
        case("compare-vs-train a training while compare runs", ["train", "gan", *GAN, "--epochs", "1", "--workdir",
                                                               "{run}/jax-step"], kind="during-train",
             holder=["compare", "gan", *GAN, "--epochs", "2", "--runs", "jax-step", "--workdir", "{run}"],
             needle="is in use by process"),
        case("compare-vs-train in a single run's workdir", [*cmp, "--runs", "jax-step"], ref="gan-jax"),
        case("compare-vs-train in a stack's workdir", [*cmp, "--runs", "jax-step"], ref="stack"),
        case("compare-vs-train again in its own workdir", [*cmp, "--runs", "jax-step,torch-eager"], "ok",
             ref="comparison"),
        case("compare-vs-train again, one run fewer", [*cmp, "--runs", "jax-step"], "ok", ref="comparison",
             exists=["torch-eager/config.json"]),
        case("compare-vs-train its run taken over by a training", [*cmp, "--runs", "jax-step"], ref="comparison",
             setup=train_in("jax-step", "gan-jax")),
        case("compare-vs-train its run holding the user's file", [*cmp, "--runs", "jax-step"], ref="comparison",
             setup=lambda run: user_file(run / "jax-step")),
        case("compare-vs-train a file where its run goes", [*cmp, "--runs", "jax-scan"], ref="comparison",
             setup=lambda run: (run / "jax-scan").write_text("a file")),
        case("compare-vs-train --seeds 2 --seed 2**63-1", [*cmp[:-2], "--workdir", "{new}", "--seeds", "2", "--seed",
                                                           str(2**63 - 1)]),
        case("compare-vs-train evaluate its run (no checkpoints)", ["evaluate", "gan", "--workdir", "{run}/jax-step"],
             ref="comparison"),
        case("compare-vs-train a training takes its run over", ["train", "gan", *GAN, "--workdir", "{run}/jax-step",
                                                                "--resume", "--epochs", "2"], "ok", ref="comparison"),
    ]
    for one in c:  # a refused comparison leaves every file it found as it was, though runs train in it
        if one["name"].startswith("compare-vs-train") and one["expect"] == "error":
            one["keep"] = True
    return c


def _flip_newest(run: Path) -> None:
    d = run / "checkpoints"
    step = max(int(p.name) for p in d.iterdir() if p.name.isdigit())
    big = max((p for p in (d / str(step) / "state").rglob("*") if p.is_file() and p.parent.name == "d"),
              key=lambda p: p.stat().st_size)
    data = bytearray(big.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0x5A
    big.write_bytes(bytes(data))


def _garbage_all(run: Path) -> None:
    for p in (run / "checkpoints").rglob("*"):
        if p.is_file():
            p.write_bytes(b"garbage")
