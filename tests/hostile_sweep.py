"""The hostile-user sweep behind docs/reliability.md: every command, workload and framework
driven the way a careless or hostile user would, one real `flaxport` process per case.

    python tests/hostile_sweep.py --out /tmp/sweep [--jobs 2] [--only SUBSTRING]

A case is *handled* when it ends as it should: exit 0 for a legitimate use, else exactly
one `flaxport: error:` line, the last (no traceback; `flaxport: warning:` lines may come
before it), and exit 2 (bad input) or 3 (diverged run), or,
for a translation whose proof must fail, exit 1 with one `flaxport: parity failed:` line.
*Data lost* counts the cases after which a file the run had before (config.json, metrics,
a checkpoint, a translation's files) changed or vanished although the command was refused,
a finished checkpoint vanished after a successful one, a temporary file or folder was left
behind, a refused command left a new folder, an output folder holds a mix of sets or does
not load, or a training beside the command did not end whole. The groups of translate,
stacks and compare beside trainings are in tests/hostile_groups.py.
Writes OUT/results.jsonl (one record a case) and prints the totals. Not collected by pytest.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import hostile_groups

PY = [sys.executable, "-m", "flaxport"]
GAN = ["--config", "smoke", "--set", "n_per_mode=50", "--no-progress"]
SMOKE = ["--config", "smoke", "--no-progress"]
# name: (workload, framework, train flags, epochs) of the reference runs every case copies.
REFS = {
    "gan-jax": ("gan", "jax", GAN, 2), "gan-torch": ("gan", "torch", GAN, 2),
    "vae-keras": ("vae", "keras", SMOKE, 2), "vae-jax": ("vae", "jax", SMOKE, 1),
    "vae-torch": ("vae", "torch", SMOKE, 1), "cnn-jax": ("cnn", "jax", SMOKE, 1),
    "cnn-torch": ("cnn", "torch", SMOKE, 1), "ddim-jax": ("ddim", "jax", SMOKE, 1),
    "ddim-torch": ("ddim", "torch", SMOKE, 1),
}
BAD_SETS = {  # per workload: --set values that must be refused in one line
    "gan": ["batch_size=1", "batch_size=0", "batch_size=ten", "modes=", "g_widths=0", "g_widths=", "d_widths=-4",
            "z_dim=0", "g_lr=nan", "d_lr=inf", "g_lr=-1", "b1=1", "b2=1.5", "bn_momentum=2", "n_eval=0",
            "n_per_mode=-5", "runner=foo", "d_batchnorm=maybe", "nope=1", "variant=default", "hidden=3"],
    "cnn": ["image_size=2", "num_classes=3", "conv_widths=", "hidden=0", "lr=nan", "b2=1", "eval_batch=0",
            "conv_impl=cuda", "channels=2", "data=mnist", "hidden=3000000000"],
    "vae": ["hidden=3000000", "iwae_k=100000", "latents=0", "batch_size=0", "lr=inf", "n_samples=0",
            "b1=-0.1", "data=cifar10"],
    "ddim": ["widths=", "widths=8,0", "warmup_steps=-1", "ema=nan", "ema=1.5", "image_size=17",
             "embedding_dims=7", "min_signal_rate=0.99", "lr_schedule=warmup_cosine", "kid_images=1",
             "norm_mean=0.5", "block_depth=0", "channels=1"],
}
TWIN_SETS = {  # (framework, --set value) that failed differently in a twin
    "gan": [("torch", "batch_size=1"), ("torch", "g_lr=nan"), ("torch", "b2=1.5"), ("torch", "g_widths=0"),
            ("torch", "n_eval=0")],
    "cnn": [("torch", "num_classes=3"), ("torch", "image_size=2")],
    "vae": [("keras", "hidden=3000000"), ("keras", "lr=nan"), ("keras", "batch_size=0"), ("torch", "iwae_k=100000")],
    "ddim": [("torch", "ema=nan"), ("torch", "widths=")],
}


def sh(args, cwd, env=None, timeout=600, preexec=None):
    t0 = time.time()
    try:
        p = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **(env or {})}, preexec_fn=preexec)
        return p.returncode, p.stdout, p.stderr, time.time() - t0
    except subprocess.TimeoutExpired as e:
        return "timeout", "", str(e.stderr or ""), time.time() - t0


def newest_epoch(snapshot: dict):
    """Epochs of the newest checkpoint named in a files() snapshot (N/... or epoch_N.ext), or None."""
    found = [int(m[1]) for k in snapshot if (m := re.match(r"checkpoints/(?:epoch_)?(0|[1-9]\d*)(?:/|\.pt$|\.npz$)", k))]
    return max(found, default=None)


def files(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()} if d.is_dir() else {}


# --------------------------------------------------------------------------- setups (damage a copy of a run)

def ckpt_files(run: Path) -> list:
    return sorted((p for p in (run / "checkpoints").iterdir() if p.name.startswith("epoch_")),
                  key=lambda p: int(p.stem.split("_")[1]))


def newest(run: Path) -> Path:
    d = run / "checkpoints"
    if any(p.name.isdigit() for p in d.iterdir()):
        step = max(int(p.name) for p in d.iterdir() if p.name.isdigit())
        state = d / str(step) / "state"
        return max((p for p in state.rglob("*") if p.is_file() and p.parent.name == "d"), key=lambda p: p.stat().st_size)
    return ckpt_files(run)[-1]


def truncate(run):
    p = newest(run)
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def zero(run):
    newest(run).write_bytes(b"")


def flip(run):
    p = newest(run)
    data = bytearray(p.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0x5A
    p.write_bytes(bytes(data))


def garbage_all(run):
    d = run / "checkpoints"
    for p in d.rglob("*"):
        if p.is_file():
            p.write_bytes(b"garbage")


def stray(run):
    first = ckpt_files(run)[0]
    shutil.copy(first, first.with_name(f"epoch_007{first.suffix}"))
    (run / "checkpoints" / f"tmp-epoch-left{first.suffix}").write_bytes(b"half")


def no_ckpts(run):
    shutil.rmtree(run / "checkpoints")


def plant_pickle(run):
    import torch

    class Plant:
        def __reduce__(self):
            return (open, (str(run.parent / "PLANTED"), "w"))

    for p in ckpt_files(run):
        p.unlink()
    torch.save({"state": Plant(), "meta": {"epochs_done": 1}}, run / "checkpoints" / "epoch_1.pt")


def plant_npz(run):
    import numpy as np

    class Plant:
        def __reduce__(self):
            return (open, (str(run.parent / "PLANTED"), "w"))

    for p in ckpt_files(run):
        p.unlink()
    with open(run / "checkpoints" / "epoch_1.npz", "wb") as f:
        np.savez(f, __meta__=np.array("{}"), x=np.array([Plant()], dtype=object))


def edit_config(change):
    def setup(run):
        path = run / "config.json"
        saved = json.loads(path.read_text())
        new = change(saved)
        path.write_text(new if isinstance(new, str) else json.dumps(new))
    return setup


CONFIG_EDITS = {
    "list": lambda s: [s], "string-batch": lambda s: {**s, "config": {**s["config"], "batch_size": "10"}},
    "no-config": lambda s: {k: v for k, v in s.items() if k != "config"},
    "no-framework": lambda s: {k: v for k, v in s.items() if k != "framework"},
    "unknown-variant": lambda s: {**s, "config": {**s["config"], "variant": "huge"}},
    "negative-count": lambda s: {**s, "config": {**s["config"], "epochs": -3}},
    "nan-lr": lambda s: {**s, "config": {**s["config"], "lr": float("nan"), "g_lr": float("nan")}},
    "not-json": lambda s: "{oops", "empty": lambda s: "", "other-workload": lambda s: {**s, "workload": "cnn"},
    "huge-seed": lambda s: {**s, "config": {**s["config"], "seed": 2**70}},
}


# --------------------------------------------------------------------------- the catalogue

def case(name, argv, expect="error", ref=None, setup=None, env=None, kind="cmd", needle=None, files=None,
         load=False, exists=(), holder=None):
    """files: the names the output folder ({run}, else {new}) must hold afterwards; load: its
    model.py must load its weights; exists: paths under {run} that must exist afterwards;
    holder: the command (a training, a comparison) running beside it (kind during-train)."""
    return dict(name=name, argv=[str(a) for a in argv], expect=expect, ref=ref, setup=setup, env=env or {},
                kind=kind, needle=needle, files=files, load=load, exists=list(exists),
                holder=[str(a) for a in holder] if holder else None)


def catalogue(out: Path) -> list:
    cases = []
    for workload, values in BAD_SETS.items():  # every bad value on jax; the framework-specific ones on the twins
        for v in values:
            cases.append(case(f"set {workload} jax {v}", ["train", workload, *SMOKE, "--set", v, "--workdir", "{new}"]))
        for fw, v in TWIN_SETS.get(workload, ()):
            cases.append(case(f"set {workload} {fw} {v}", ["train", workload, "--framework", fw, *SMOKE, "--set", v,
                                                          "--workdir", "{new}"]))
    flags = [
        ("epochs 0", ["train", "gan", "--epochs", "0"]), ("epochs -1", ["train", "gan", "--epochs", "-1"]),
        ("epochs abc", ["train", "gan", "--epochs", "abc"]), ("seed -1", ["train", "gan", "--seed", "-1"]),
        ("seed 2**70", ["train", "gan", "--seed", str(2**70)]), ("seed abc", ["train", "gan", "--seed", "x"]),
        ("config nope", ["train", "gan", "--config", "nope"]), ("framework tf", ["train", "gan", "--framework", "tf"]),
        ("workload nope", ["train", "nope"]), ("data nope", ["train", "cnn", "--data", "mnist"]),
        ("data cifar missing", ["train", "cnn", "--data", "cifar10", "--data-dir", "{out}/empty"]),
        ("data-dir a file", ["train", "cnn", "--data", "cifar10", "--data-dir", "{out}/afile"]),
        ("torch-variant nope", ["train", "gan", "--framework", "torch", "--torch-variant", "fast"]),
        ("init-from missing", ["train", "gan", "--init-from", "{out}/none.pt"]),
        ("init-from garbage", ["train", "gan", "--init-from", "{out}/afile"]),
        ("init-from torch framework", ["train", "gan", "--framework", "torch", "--init-from", "{out}/afile"]),
        ("devices 0", ["train", "gan", "--devices", "0"]), ("devices 3", ["train", "gan", "--devices", "3"]),
        ("devices torch", ["train", "gan", "--framework", "torch", "--devices", "1"]),
        ("keras gan", ["train", "gan", "--framework", "keras"]),
        ("workdir is a file", ["train", "gan", "--workdir", "{out}/afile/run"]),
        ("workdir name too long", ["train", "gan", "--workdir", "{work}/" + "w" * 300]),
        ("unknown flag", ["train", "gan", "--bogus"]), ("set no =", ["train", "gan", "--set", "g_lr"]),
        ("help", ["--help"]),
    ]
    for name, argv in flags:
        expect = "ok" if name in ("help", ) else "error"
        if argv and argv[0] == "train" and "--workdir" not in argv:  # the case's flags last: they win
            argv = [*argv[:2], *(GAN if argv[1] == "gan" else SMOKE), *argv[2:], "--workdir", "{new}"]
        cases.append(case(f"flag {name}", argv, expect))
    cases.append(case("env FLAXPORT_DATA a file", ["train", "ddim", *SMOKE, "--workdir", "{new}"],
                      env={"FLAXPORT_DATA": "{out}/afile"}))
    cases.append(case("env KERAS_BACKEND bogus", ["train", "vae", "--framework", "keras", *SMOKE, "--workdir", "{new}"],
                      env={"KERAS_BACKEND": "bogus"}))

    for ref, (workload, fw, args, epochs) in REFS.items():
        tr = ["train", workload, "--framework", fw, *args, "--workdir", "{run}"]
        ext = {"jax": "", "torch": ".pt", "keras": ".npz"}[fw]
        main = ref in ("gan-jax", "gan-torch", "vae-keras")
        cases += [
            case(f"{ref} train again without --resume", tr, ref=ref),
            case(f"{ref} resume other seed", [*tr, "--resume", "--seed", "7", "--epochs", epochs + 1], ref=ref),
            case(f"{ref} resume other config", [*tr, "--resume", "--config", "default", "--epochs", epochs + 1], ref=ref),
            case(f"{ref} resume other framework", ["train", workload, "--framework",
                                                   "torch" if fw != "torch" else "jax", *args, "--workdir", "{run}",
                                                   "--resume"], ref=ref),
            case(f"{ref} evaluate", ["evaluate", workload, "--workdir", "{run}"], "ok", ref=ref),
        ]
        cases += [] if not main else [
            case(f"{ref} evaluate as other workload", ["evaluate", "vae" if workload != "vae" else "gan",
                                                        "--workdir", "{run}"], ref=ref),
            case(f"{ref} sample --n 0", ["sample", workload, "--workdir", "{run}", "--n", "0"], ref=ref),
            case(f"{ref} resume nothing to train", [*tr, "--resume", "--epochs", epochs], "ok", ref=ref),
        ]
        cases += [
            case(f"{ref} truncated newest, evaluate", ["evaluate", workload, "--workdir", "{run}"],
                 "ok" if epochs > 1 else "error", ref=ref, setup=truncate),
            case(f"{ref} bit-flipped newest, evaluate", ["evaluate", workload, "--workdir", "{run}"],
                 "ok" if epochs > 1 else "error", ref=ref, setup=flip),
            case(f"{ref} every checkpoint garbage, resume", [*tr, "--resume", "--epochs", epochs + 1], ref=ref,
                 setup=garbage_all),
            case(f"{ref} no checkpoints, evaluate", ["evaluate", workload, "--workdir", "{run}"], ref=ref,
                 setup=no_ckpts),
        ]
        if main:
            shape = ["--set", "z_dim=16"] if workload == "gan" else ["--set", "hidden=64"]
            cases += [
                case(f"{ref} resume other shape", [*tr, "--resume", *shape, "--epochs", epochs + 1], ref=ref),
                case(f"{ref} resume", [*tr, "--resume", "--epochs", epochs + 1], "ok", ref=ref),
                case(f"{ref} sample", ["sample", workload, "--workdir", "{run}"], "ok", ref=ref),
                case(f"{ref} sample --n huge", ["sample", workload, "--workdir", "{run}", "--n", 10**12], ref=ref),
                case(f"{ref} sample --steps", ["sample", workload, "--workdir", "{run}", "--steps", "5"], ref=ref),
                case(f"{ref} zero-byte newest, resume", [*tr, "--resume", "--epochs", epochs + 1], "ok", ref=ref,
                     setup=zero),
                case(f"{ref} sample into read-only workdir", ["sample", workload, "--workdir", "{run}"], ref=ref,
                     kind="readonly"),
                case(f"{ref} full disk while saving", [*tr, "--resume", "--epochs", epochs + 1], ref=ref,
                     kind="fullfs"),
                case(f"{ref} SIGKILL mid-save, resume", [*tr, "--resume", "--epochs", epochs + 2], "ok", ref=ref,
                     kind="kill", env={"FLAXPORT_TEST_SAVE_DELAY": "2"}),
                case(f"{ref} two trainings at once", [*tr, "--resume", "--epochs", epochs + 2], ref=ref,
                     kind="concurrent", env={"FLAXPORT_TEST_SAVE_DELAY": "6"}, needle="is in use by process"),
                case(f"{ref} diverges", ["train", workload, "--framework", fw, *args, "--workdir", "{new}",
                                         *(["--set", "lr=1e30"] if workload == "vae" else
                                           ["--set", "g_lr=1e30", "--set", "d_lr=1e30"])], "diverged"),
            ]
            for edit in CONFIG_EDITS:
                cases.append(case(f"{ref} config.json {edit}, evaluate", ["evaluate", workload, "--workdir", "{run}"],
                                  ref=ref, setup=edit_config(CONFIG_EDITS[edit])))
            if fw == "torch":
                cases.append(case(f"{ref} stray epoch_007 and temp, resume", [*tr, "--resume", "--epochs", epochs + 1],
                                  "ok", ref=ref, setup=stray, needle="from epoch 2"))
                cases.append(case(f"{ref} checkpoint holding code, evaluate",
                                  ["evaluate", workload, "--workdir", "{run}"], ref=ref, setup=plant_pickle,
                                  kind="planted"))
            if fw == "keras":
                cases.append(case(f"{ref} archive holding objects, evaluate",
                                  ["evaluate", workload, "--workdir", "{run}"], ref=ref, setup=plant_npz,
                                  kind="planted"))
        if ref in ("vae-jax", "vae-torch"):
            cases.append(case(f"{ref} full disk while saving", [*tr, "--resume", "--epochs", epochs + 1], ref=ref,
                              kind="fullfs"))
        if fw == "jax":
            cases.append(case(f"{ref} convert to .pt", ["convert", workload, "{run}", "{out}/conv/{name}.pt"], "ok",
                              ref=ref))
            cases.append(case(f"{ref} convert to a missing folder",
                              ["convert", workload, "{run}", "{out}/no/such/{name}.pt"], ref=ref))
        _ = ext
    cases += [
        case("convert from nothing", ["convert", "gan", "{out}/none.pt", "{new}"]),
        case("convert garbage .pt", ["convert", "gan", "{out}/garbage.pt", "{new}"]),
        case("convert into a file", ["convert", "gan", "{ref:gan-torch}/checkpoints/epoch_2.pt", "{out}/afile"]),
        case("convert torch run's checkpoint", ["convert", "gan", "{ref:gan-torch}/checkpoints/epoch_2.pt", "{new}"],
             "ok"),
        case("convert to a workdir onto a full disk", ["convert", "gan", "{ref:gan-torch}/checkpoints/epoch_2.pt",
                                                       "{new}"], kind="fullfs-small"),
        case("convert to .pt onto a full disk", ["convert", "gan", "{ref:gan-jax}", "{new}.pt"], kind="fullfs-small"),
        case("convert to .safetensors onto a full disk", ["convert", "gan", "{ref:gan-jax}", "{new}.safetensors"],
             kind="fullfs-small"),
        case("convert with bad --set", ["convert", "gan", "{ref:gan-torch}/checkpoints/epoch_2.pt", "{new}",
                                        "--set", "b2=2"]),
        case("parity --atol nan", ["parity", "gan", "--atol", "nan"]),
        case("parity --rtol -1", ["parity", "gan", "--rtol", "-1"]),
        case("parity --weights garbage", ["parity", "gan", "--weights", "{out}/garbage.pt"]),
        case("parity --set bad", ["parity", "gan", "--set", "g_widths=0"]),
        case("parity --seed huge", ["parity", "gan", "--seed", str(2**64)]),
        case("parity ok", ["parity", "gan"], "ok"),
        case("export gan", ["export", "gan", "--workdir", "{ref:gan-jax}", "--out", "{out}/x.bin"]),
        case("export --n 0", ["export", "ddim", "--workdir", "{ref:ddim-jax}", "--out", "{out}/x.bin", "--n", "0"]),
        case("export to a missing folder", ["export", "ddim", "--workdir", "{ref:ddim-jax}", "--out",
                                            "{out}/no/such/x.bin"]),
        case("export to a folder", ["export", "ddim", "--workdir", "{ref:ddim-jax}", "--out", "{out}"]),
        case("export keras run", ["export", "ddim", "--workdir", "{ref:vae-keras}", "--out", "{out}/x.bin"]),
        case("compare --runs bogus", ["compare", "gan", *GAN, "--runs", "jax-warp", "--workdir", "{new}"]),
        case("compare --seeds 0", ["compare", "gan", *GAN, "--seeds", "0", "--workdir", "{new}"]),
        case("compare bad --set", ["compare", "gan", *GAN, "--set", "b1=1", "--workdir", "{new}"]),
        case("data download unknown", ["data", "download", "mnist"]),
        case("data download into a file", ["data", "download", "cifar10", "--data-dir", "{out}/afile"]),
        case("data list", ["data", "list"], "ok"),
        case("evaluate a missing workdir", ["evaluate", "gan", "--workdir", "{out}/none"]),
        case("sample a missing workdir", ["sample", "gan", "--workdir", "{out}/none"]),
        case("env --gemm bad", ["env", "--gemm", "1,x"]),
    ]
    return cases + hostile_groups.cases(case)


# --------------------------------------------------------------------------- running a case

def one_line_error(rc, err, code, prefix="flaxport: error: ") -> bool:
    """Exit `code`, no traceback, and one flaxport line that is not a warning (a stack's
    dropped members are warned about before it), the last line, starting with `prefix`."""
    lines = err.strip().splitlines()
    mine = [l for l in lines if l.startswith("flaxport:") and not l.startswith("flaxport: warning:")]
    return (rc == code and "Traceback" not in err and len(mine) == 1 and lines[-1] == mine[0]
            and mine[0].startswith(prefix))


def fsize(limit):
    def start():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return start


def run_case(c, out: Path, i: int) -> dict:
    work = out / "cases" / f"{i:03d}"
    shutil.rmtree(work, ignore_errors=True)  # a case of an earlier sweep into the same OUT
    work.mkdir(parents=True)
    run = work / "run"
    if c["ref"]:
        shutil.copytree(out / "ref" / c["ref"], run)
    if c["setup"]:
        c["setup"](run)
    subs = {"{run}": str(run), "{new}": str(work / "new"), "{out}": str(out), "{name}": f"{i:03d}",
            "{work}": str(work)}

    def fill(a):
        for k, v in subs.items():
            a = a.replace(k, v)
        if a.startswith("{ref:"):
            name, rest = a[5:].split("}", 1)
            a = str(out / "ref" / name) + rest
        return a

    argv, env = [fill(a) for a in c["argv"]], {k: fill(v) for k, v in c["env"].items()}
    before = files(run)
    rc, err, extra = None, "", {}
    t0 = time.time()
    if c["kind"] in ("readonly", "readonly-parent"):
        ro = run if c["kind"] == "readonly" else work
        mount = f"mount --bind {ro} {ro} && mount -o remount,ro,bind {ro} && exec \"$@\""
        rc, _, err, _ = sh(["unshare", "-m", "sh", "-c", mount, "sh", *PY, *argv], work, env)
    elif c["kind"] in ("fullfs", "fullfs-small"):
        rc, _, err, _ = sh([*PY, *argv], work, env, preexec=fsize(60_000 if c["kind"] == "fullfs" else 3000))
    elif c["kind"] in ("kill", "kill-set"):
        rc, err = _killed_then_again(c, argv, env, work, run, before, extra)
    elif c["kind"] == "concurrent":
        p = subprocess.Popen([*PY, *argv], cwd=work, env={**os.environ, **env}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        mark = (run / "config.json").stat().st_mtime_ns
        while p.poll() is None and (run / "config.json").stat().st_mtime_ns == mark:
            time.sleep(0.01)  # the first writer passed its checks (it rewrote config.json) and trains
        rc, _, err, _ = sh([*PY, *argv[:-2], "--seed", "5", "--epochs", argv[-1]], work)
        _, first_err = p.communicate()
        extra["first_rc"] = p.returncode
        extra["epochs"] = [json.loads(l)["epoch"] for l in (run / "metrics.jsonl").read_text().splitlines()]
    elif c["kind"] == "parallel":  # the same command twice at once: both end, one set in place
        ps = [subprocess.Popen([*PY, *argv], cwd=work, env={**os.environ, **env}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(2)]
        ends = [(p.communicate()[1], p.returncode) for p in ps]
        err, rc = ends[0]
        extra["second_rc"] = ends[1][1]
    elif c["kind"] == "during-train":
        rc, err = _beside_a_holder(c, argv, work, fill, extra)
    else:
        rc, _, err, _ = sh([*PY, *argv], work, env)
    secs = time.time() - t0
    code = {"ok": 0, "error": 2, "diverged": 3, "proof": 1}[c["expect"]]
    if c["expect"] == "ok":
        handled = rc == 0
    elif c["expect"] == "proof":  # the files are written, the proof failed: exit 1, one line saying where
        handled = one_line_error(rc, err, code, prefix="flaxport: parity failed: ")
    else:
        handled = one_line_error(rc, err, code)
    if c["needle"] and c["needle"] not in err:
        handled = False
    lost = []
    after = files(run)
    if c["ref"]:
        trained = re.search(r"^epoch \d+(/\d+)? \|", err, re.M) is not None
        if c["expect"] not in ("ok", "proof") and not trained and c["kind"] not in ("kill", "concurrent"):
            # refused before training: the run must be exactly as it was
            lost = [k for k in before if after.get(k) != before[k]] + [k for k in after if k not in before]
        elif c["expect"] not in ("ok", "proof") and c["kind"] not in ("kill", "concurrent"):
            # stopped while training (full disk, NaN): every checkpoint it had is as it was
            lost = [k for k in before if k.startswith("checkpoints/") and after.get(k) != before[k]]
        elif newest_epoch(before) is not None and (newest_epoch(after) or -1) < newest_epoch(before):
            lost = ["the newest checkpoint"]  # a successful run may prune old ones, never lose the newest
        lost = [k for k in lost if not k.startswith("tb/")] + extra.get("temp_left", [])
    if c.get("keep"):  # every file it found stays as it was, whatever the command trained
        lost += [k for k in before if after.get(k) != before[k] and k not in lost]
    lost += _what_else_was_lost(c, work, run, rc)
    if c["kind"] == "planted" and (out / "cases" / f"{i:03d}" / "PLANTED").exists():
        handled, lost = False, lost + ["code ran"]
    if c["kind"] == "concurrent":
        handled = handled and extra["first_rc"] == 0 and extra["epochs"] == sorted(set(extra["epochs"]))
    if c["kind"] in ("kill", "kill-set"):
        handled = handled and extra["killed_mid_save"] and not extra["temp_left"]
    if c["kind"] == "parallel":
        handled = handled and extra["second_rc"] == 0
    if c["kind"] == "during-train":
        handled = handled and extra["holder_rc"] == 0
        lost += [] if extra["holder_whole"] else ["the training beside it"]
    last = (err.strip().splitlines() or [""])[-1][:300]
    return dict(name=c["name"], argv=argv, expect=c["expect"], rc=rc, handled=handled, lost=lost,
                seconds=round(secs, 1), last_line=last, **{k: v for k, v in extra.items() if k != "temp_left"})


def _killed_then_again(c, argv, env, work, run, before, extra):
    """SIGKILL in the middle of a save (a checkpoint, or an output set complete but not yet
    renamed into place), then the same command again: (its exit code, stderr)."""
    p = subprocess.Popen([*PY, *argv], cwd=work, env={**os.environ, **env}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    if c["kind"] == "kill":
        ck = run / "checkpoints"

        def saving():
            return any(".orbax-checkpoint-tmp" in q.name or q.name.startswith("tmp-epoch-") for q in ck.iterdir())
    else:
        def saving():
            return any(q.name.startswith(f".{run.name}.new-") and (q / "parity.md").exists() for q in work.iterdir())
    while p.poll() is None and not saving():
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.communicate()
    extra["killed_mid_save"] = p.returncode == -signal.SIGKILL and (c["kind"] == "kill" or files(run) == before)
    rc, _, err, _ = sh([*PY, *argv], work)  # again, after the kill
    if c["kind"] == "kill":
        extra["temp_left"] = [q.name for q in (run / "checkpoints").iterdir() if "tmp" in q.name]
    else:
        extra["temp_left"] = [q.name for q in work.iterdir() if q.name.startswith(f".{run.name}.")]
    return rc, err


def _beside_a_holder(c, argv, work, fill, extra):
    """The case's command while another (a training, a comparison) holds its folder: (exit code,
    stderr). The other one must end as if it had been alone."""
    holder = [fill(a) for a in c["holder"]]
    folder = Path(holder[holder.index("--workdir") + 1])
    ready = folder / "config.json" if holder[0] == "train" else folder / "jax-step" / "config.json"
    long = ["--set", "n_per_mode=2000", "--epochs", "15"] if holder[0] == "compare" else []
    p = subprocess.Popen([*PY, *holder, *long], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "FLAXPORT_TEST_SAVE_DELAY": "3"})
    while p.poll() is None and not ready.exists():
        time.sleep(0.01)
    rc, _, err, _ = sh([*PY, *argv], work)
    extra["holder_err"] = p.communicate()[1].strip().splitlines()[-1:]
    extra["holder_rc"] = p.returncode
    whole = p.returncode == 0
    if holder[0] == "train":
        epochs = int(holder[holder.index("--epochs") + 1])
        metrics = folder / "metrics.jsonl"
        seen = [json.loads(l)["epoch"] for l in metrics.read_text().splitlines()] if metrics.exists() else []
        whole = whole and seen == list(range(1, epochs + 1)) and newest_epoch(files(folder)) == epochs
    extra["holder_whole"] = whole
    return rc, err


def _what_else_was_lost(c, work: Path, run: Path, rc) -> list:
    """A temporary file or folder beside the run, a refused command's new folder, an output
    folder that is not exactly the set it should be or does not load, a path that should exist."""
    lost = [f"left {q.name}" for q in work.iterdir() if q.name.startswith((f".{run.name}.", ".new."))]
    if c["expect"] == "error":
        lost += [f"left {q.name}" for q in work.iterdir() if q.name.startswith("new")]
    folder = run if c["ref"] or "{run}" in " ".join(c["argv"]) else work / "new"
    if c["files"] is not None and rc in (0, 1):
        held = sorted(q.name for q in folder.iterdir()) if folder.is_dir() else []
        if held != sorted(c["files"]):
            lost.append(f"{folder.name} holds {held}, not {sorted(c['files'])}")
    if c["load"] and folder.is_dir():
        code = f"import sys; sys.path.insert(0, {str(folder)!r}); import model; model.load({str(folder)!r})"
        load_rc, _, load_err, _ = sh([sys.executable, "-c", code], work)
        if load_rc != 0:
            lost.append(f"{folder.name} does not load: {(load_err.strip().splitlines() or [''])[-1][:120]}")
    lost += [f"no {p}" for p in c["exists"] if not (run / p).exists()]
    return lost


def make_refs(out: Path, jobs: int) -> None:
    (out / "ref").mkdir(parents=True, exist_ok=True)
    (out / "afile").write_text("not a folder")
    (out / "garbage.pt").write_bytes(b"garbage")
    (out / "empty").mkdir(exist_ok=True)
    (out / "conv").mkdir(exist_ok=True)
    hostile_groups.write_files(out)

    def make(name):
        workload, fw, args, epochs = REFS[name]
        d = out / "ref" / name
        if (d / "metrics.jsonl").exists():
            return
        rc, _, err, _ = sh([*PY, "train", workload, "--framework", fw, *args, "--epochs", str(epochs),
                            "--workdir", str(d)], out)
        if rc != 0:
            raise SystemExit(f"reference run {name} failed: {err[-2000:]}")

    def make_other(name):
        d = out / "ref" / name
        if d.exists():
            return
        argv = [a.replace("{out}", str(out)).replace("{ref}", str(d)) for a in hostile_groups.REF_COMMANDS[name]]
        rc, _, err, _ = sh([*PY, *argv], out)
        if rc != 0:
            raise SystemExit(f"reference {name} failed: {err[-2000:]}")

    with cf.ThreadPoolExecutor(jobs) as ex:
        list(ex.map(make, REFS))
        list(ex.map(make_other, hostile_groups.REF_COMMANDS))


GROUPS = (("set ", "a bad --set value"), ("flag ", "a bad flag"),
          ("env ", "the environment (FLAXPORT_DATA, KERAS_BACKEND) and `flaxport env`"),
          ("gan-jax", "a jax run (gan)"), ("gan-torch", "a torch run (gan)"), ("vae-keras", "a keras run (vae)"),
          ("translate input", "translate: --input and FACTORY"),
          ("translate weights", "translate: --weights files, and the proof on meaningless numbers"),
          ("translate text", "translate: --optimizer and --loss texts"),
          ("translate out", "translate: the output folder (again, full disk, SIGKILL, two at once, read-only)"),
          ("stack ", "stacks (--seeds, --sweep): bad values, resume, a deleted member, SIGKILL, full disk"),
          ("compare-vs-train", "compare beside trainings (in its folders, holding them, taken over)"),
          ("", "other runs (cnn, ddim, vae on jax and torch)"))


def summarize(results: list) -> str:
    """A markdown table: cases, handled, data lost, by what the case does."""
    rows = {}
    for r in results:
        if r["name"].split()[0] in ("convert", "parity", "export", "compare", "data", "evaluate", "sample", "env"):
            group = "env " if r["name"].startswith("env ") else "other commands"
        else:
            group = next(g for g, _ in GROUPS if r["name"].startswith(g))
        row = rows.setdefault(group, [0, 0, 0])
        row[0] += 1
        row[1] += bool(r["handled"])
        row[2] += bool(r["lost"])
    names = dict(GROUPS, **{"other commands": "convert, parity, export, compare, data, a missing workdir"})
    lines = ["| cases that ... | tried | handled | data lost |", "|---|---|---|---|"]
    for group, (n, ok, lost) in rows.items():
        lines.append(f"| {names[group]} | {n} | {ok} | {lost} |")
    total = [sum(v[i] for v in rows.values()) for i in range(3)]
    lines.append(f"| **all** | **{total[0]}** | **{total[1]}** | **{total[2]}** |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", default=None, help="run the cases whose name holds this (A|B: either)")
    ap.add_argument("--summary", action="store_true", help="only summarise OUT/results.jsonl")
    args = ap.parse_args()
    out = Path(args.out).absolute()
    if args.summary:
        print(summarize([json.loads(l) for l in (out / "results.jsonl").read_text().splitlines()]))
        return 0
    make_refs(out, args.jobs)
    cases = [c for c in catalogue(out) if not args.only or any(o in c["name"] for o in args.only.split("|"))]
    results = []
    with cf.ThreadPoolExecutor(args.jobs) as ex, open(out / "results.jsonl", "w") as log:
        for r in ex.map(lambda ic: run_case(ic[1], out, ic[0]), enumerate(cases)):
            results.append(r)
            log.write(json.dumps(r) + "\n")
            log.flush()
            mark = "ok " if r["handled"] and not r["lost"] else "BAD"
            print(f"{mark} {r['name']}: rc={r['rc']} {r['last_line'][:160]}", flush=True)
    handled = sum(r["handled"] for r in results)
    lost = sum(bool(r["lost"]) for r in results)
    print(json.dumps({"cases": len(results), "handled": handled, "not_handled": len(results) - handled,
                      "data_lost": lost}))
    print(summarize(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
