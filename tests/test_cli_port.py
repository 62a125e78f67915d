"""`flaxport parity` and `flaxport convert`, and workloads.checkpoints.init_state_from_torch.

Most commands run in this process through flaxport.cli.main (a subprocess costs ~4 s of
imports); one runs as a real subprocess to show the one-line error end to end.
"""
import dataclasses
import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from flaxport.cli import main  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_matmul_precision():
    """`parity` sets jax_default_matmul_precision for its process; give this one its own back."""
    saved = jax.config.jax_default_matmul_precision
    yield
    jax.config.update("jax_default_matmul_precision", saved)


def _run(capsys, *args):
    """(exit code, stdout, stderr) of `flaxport ARGS` run in this process."""
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(rc, err, *needles):
    assert rc not in (0, 1), (rc, err)  # 1 is parity's "not within tolerance", not an error
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flaxport: error: "), err
    for n in needles:
        assert n in lines[0], lines[0]


# --------------------------------------------------------------------------- parity
# cnn: XLA's conv op compiles in half the time of the default im2col (tests/test_cnn_parity.py runs both).
# ddim: the smoke UNet (widths 8, 16; 16x16), two inputs (images, noise variances), the noise MAE.
@pytest.mark.parametrize("workload,extra", [("gan", []), ("cnn", ["--set", "conv_impl=xla"]), ("vae", ["--json"]),
                                            ("ddim", ["--config", "smoke", "--set", "batch_size=16"])])
def test_parity_passes_for_every_workload_in_eval_and_train_mode(capsys, workload, extra):
    rc, out, err = _run(capsys, "parity", workload, "--train", *extra)
    assert rc == 0, out[-3000:] + err
    if "--json" in extra:
        data = json.loads(out)
        assert data["ok"] and data["workload"] == "vae"
        assert [(r["model"], r["mode"]) for r in data["reports"]] == [("model", "eval"), ("model", "train")]
        phases = {row["phase"] for row in data["reports"][1]["rows"]}
        assert phases == {"forward", "output", "grad"}  # no BatchNorm in the VAE
    else:
        models = ("G", "D") if workload == "gan" else ("model",)
        for m in models:
            for mode in ("eval", "train"):
                assert f"== {workload} {m}, {mode} mode" in out
        assert out.strip().splitlines()[-1].startswith(f"parity {workload}: OK")
        assert "running_stats" in out and "grad" in out  # train mode: BatchNorm statistics and gradients
        assert {"cnn": "fc1", "ddim": "up0_0.norm.running_var"}.get(workload, "net.1.running_var") in out
        if workload == "ddim":  # keras's zero head was drawn at random: every gradient is compared, none is 0
            assert "head.weight" in out and "stem.weight" in out


def test_a_wrong_port_exits_1_and_names_the_layer(capsys):
    """BatchNorm1d(64, 0.8) sets eps=0.8 (the 2nd positional argument); a Flax side with torch's
    default eps 1e-5 diverges at G's first BatchNorm. (A wrong momentum shows only in train
    mode: tests/test_port_parity.py::test_flax_batchnorm_momentum_is_named_in_train_mode.)"""
    args = ["parity", "gan", "--flax-set", "bn_eps=1e-5"]
    rc, out, err = _run(capsys, *args)
    assert rc == 1 and err == ""  # a result, not an error
    assert "FIRST DIVERGENCE at torch 'net.1' / flax 'net_1' (forward)" in out
    assert out.strip().splitlines()[-1].startswith("parity gan: FAIL: first divergence in G (eval mode) at torch "
                                                   "'net.1'")
    rc, out, _ = _run(capsys, *args, "--json")  # compiled already: the same Flax module
    data = json.loads(out)
    assert rc == 1 and not data["ok"] and [r["ok"] for r in data["reports"]] == [False, False]  # G and D
    first = data["reports"][0]["first_divergence"]
    assert (first["phase"], first["torch_name"], first["flax_name"]) == ("forward", "net.1", "net_1")
    assert first["max_abs"] > 0.1


@pytest.mark.parametrize("args,needles", [
    (["parity", "gan", "--flax-set", "d_batchnorm=false"], ["'net.4'", "BatchNorm1d"]),
    (["parity", "cnn", "--flax-set", "hidden=128"], ["'fc1.weight'", "(4096, 128)"]),
    (["parity", "gan", "--atol", "-1"], [">= 0"]),
    (["parity", "nope"], ["unknown workload"]),
])
def test_parity_user_errors_are_one_line(capsys, args, needles):
    _one_line_error(*_run(capsys, *args)[::2], *needles)


# --------------------------------------------------------------------------- convert
@pytest.fixture(scope="module")
def torch_cnn_run(tmp_path_factory):
    """A torch twin run dir as harness/torch_loop.py leaves it, after 6 Adam steps on digits,
    with a non-default hidden width (convert must read it from the run's config.json)."""
    from flaxport.data import digits
    from flaxport.harness import torch_loop
    from flaxport.harness.workdir import claim
    from flaxport.workloads.cnn import config as config_lib
    from flaxport.workloads.cnn import step_torch

    config = dataclasses.replace(config_lib.get_config("smoke"), hidden=64, conv_impl="xla")  # xla: quick compile
    run = tmp_path_factory.mktemp("torch-run")
    with claim(run, {"workload": "cnn", "framework": "torch"}, resume=False, has_checkpoint=lambda w: False) as held:
        held.commit({**dataclasses.asdict(config), "seed": 0})
    ts = step_torch.init_state(config, 0)
    data = digits.load(size=32, channels=3)
    for i in range(6):
        batch = {k: torch.from_numpy(v[i * 32:(i + 1) * 32]) for k, v in data.train.items()}
        step_torch.train_step(config, ts, batch, None)
    meta = {"workload": "cnn", "framework": "torch", "variant": "smoke", "seed": 0, "epochs_done": 1}
    torch_loop.checkpoint_store(run).save(1, ts.state_dict(), meta)
    return run / "checkpoints" / "epoch_1.pt", config, ts, data


def test_convert_torch_run_to_workdir_evaluates_and_comes_back_bit_exact(capsys, tmp_path, torch_cnn_run):
    from flaxport.workloads.cnn import step_torch

    ckpt, config, ts, data = torch_cnn_run
    work = tmp_path / "flax"
    rc, out, err = _run(capsys, "convert", "cnn", ckpt, work)
    assert rc == 0, err
    assert json.loads(out)["workdir"] == str(work)
    saved = json.loads((work / "config.json").read_text())
    assert (saved["workload"], saved["framework"], saved["config"]["hidden"]) == ("cnn", "jax", 64)
    assert (work / "checkpoints" / "0").is_dir()

    rc, out, err = _run(capsys, "evaluate", "cnn", "--workdir", work)
    assert rc == 0, err
    quality = json.loads(out)["quality"]
    want, _ = step_torch.evaluate(config, ts, data, 0)
    assert quality["accuracy"] == want["accuracy"] and quality["accuracy"] > 0.2
    assert quality["val_loss"] == pytest.approx(want["val_loss"], abs=1e-5)

    for suffix in (".pt", ".safetensors"):
        back = tmp_path / f"back{suffix}"
        rc, out, err = _run(capsys, "convert", "cnn", work, back)
        assert rc == 0, err
        if suffix == ".pt":
            got = torch.load(back, weights_only=True)
        else:
            from safetensors.torch import load_file

            got = load_file(back)
        sd = ts.model.state_dict()
        assert sorted(got) == sorted(sd) and (suffix != ".pt" or list(got) == list(sd))
        for k, v in sd.items():  # num_batches_tracked (6) included
            assert got[k].dtype == v.dtype and torch.equal(got[k], v.contiguous()), k


def test_convert_gan_safetensors_round_trip_and_parity_of_a_file(capsys, tmp_path):
    """The GAN's two models in one flat file (G./D. prefixes); back as .safetensors bit-exact,
    as .pt a {"G", "D"} dict; `parity --weights` checks that file."""
    from safetensors.torch import load_file, save_file

    from flaxport.workloads.gan import config as config_lib
    from flaxport.workloads.gan import step_torch

    ts = step_torch.init_state(config_lib.get_config("default"), 5)
    with torch.no_grad():
        ts.D.net[1].running_var.uniform_(0.5, 2.0)
        ts.G.net[1].num_batches_tracked.fill_(12)
    flat = {f"{m}.{k}": v for m, net in (("G", ts.G), ("D", ts.D)) for k, v in net.state_dict().items()}
    src = tmp_path / "gan.safetensors"
    save_file(flat, src)
    assert _run(capsys, "convert", "gan", src, tmp_path / "w")[0] == 0
    assert _run(capsys, "convert", "gan", tmp_path / "w", tmp_path / "back.safetensors")[0] == 0
    back = load_file(tmp_path / "back.safetensors")
    assert sorted(back) == sorted(flat) and all(torch.equal(back[k], v) for k, v in flat.items())
    assert _run(capsys, "convert", "gan", tmp_path / "w", tmp_path / "back.pt")[0] == 0
    nested = torch.load(tmp_path / "back.pt", weights_only=True)
    assert list(nested) == ["G", "D"] and list(nested["G"]) == list(ts.G.state_dict())
    ts.G.load_state_dict(nested["G"])
    rc, out, err = _run(capsys, "parity", "gan", "--weights", tmp_path / "back.pt", "--json")
    assert rc == 0, out[-2000:] + err
    assert json.loads(out)["weights"].endswith("back.pt")


def test_init_state_from_torch_gives_the_torch_models_eval_outputs(tmp_path, torch_cnn_run):
    from flaxport.workloads.checkpoints import init_state_from_torch
    from flaxport.workloads import registry
    from flaxport.workloads.cnn import step

    ckpt, config, ts, data = torch_cnn_run
    plain, wrapped = tmp_path / "model.pt", tmp_path / "compiled.pt"
    torch.save(ts.model.state_dict(), plain)
    torch.save({f"_orig_mod.{k}": v for k, v in ts.model.state_dict().items()}, wrapped)  # torch.compile's keys
    images = data.test["image"][:16]
    ts.model.eval()
    with torch.no_grad():
        want = ts.model(torch.from_numpy(images).float().mul_(1 / 255).permute(0, 3, 1, 2)).numpy()
    ts.model.train()
    wl = registry.get("cnn")
    fresh = jax.eval_shape(lambda: wl.init_state(config, jax.random.key(1)))
    for path in (ckpt, plain, wrapped):  # the torch twin's checkpoint, a bare state_dict, a compiled module's
        state = init_state_from_torch("cnn", config, path, jax.random.key(1))
        # Same leaves (paths, shapes, dtypes) as a fresh init: tx and apply_fn are rebuilt per init.
        assert _leaves(state) == _leaves(fresh)
        assert int(state.step) == 0 and float(jax.tree.leaves(state.opt_state)[1].sum()) == 0  # fresh Adam
        got = np.asarray(state.apply_eval(step.to_float(images)))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _leaves(tree):
    return {jax.tree_util.keystr(p): (tuple(np.shape(v)), np.dtype(v.dtype))
            for p, v in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A few torch files for the error cases."""
    from flaxport.workloads.cnn import config as cnn_config
    from flaxport.workloads.cnn import model_torch

    d = tmp_path_factory.mktemp("files")
    sd = model_torch.CNN(cnn_config.get_config("default")).state_dict()
    torch.save(sd, d / "cnn.pt")
    torch.save({**sd, "head.weight": torch.zeros(3)}, d / "extra.pt")
    torch.save({k: v.double() if v.is_floating_point() else v for k, v in sd.items()}, d / "f64.pt")
    torch.save({"state": {"G": {}, "D": {}}, "meta": {"workload": "gan", "framework": "torch"}}, d / "gan-run.pt")
    (d / "junk.pt").write_bytes(b"not a checkpoint")
    from flaxport.workloads.ddim import config as ddim_config
    from flaxport.workloads.ddim import model_torch as ddim_torch

    unet = ddim_torch.UNet(ddim_config.get_config("smoke")).state_dict()
    torch.save({"model": unet, "ema_model": {k: v for k, v in unet.items() if k != "head.bias"}}, d / "ddim-bad-ema.pt")
    (d / "full").mkdir()
    (d / "full" / "x").write_text("mine")
    return d


@pytest.mark.parametrize("args,needles", [
    (["cnn", "gan-run.pt", "out"], ["is a 'gan' checkpoint, not 'cnn'"]),
    (["vae", "cnn.pt", "out"], ["lacks 'encoder.fc1.weight'"]),
    (["cnn", "cnn.pt", "out", "--set", "hidden=128"], ["'fc1.weight'", "(4096, 128)"]),
    (["cnn", "extra.pt", "out"], ["'head.weight'"]),
    (["cnn", "f64.pt", "out"], ["'conv1.weight'", "float64"]),
    (["cnn", "junk.pt", "out"], ["not a readable torch checkpoint"]),
    (["cnn", "missing.pt", "out"], ["no such file"]),
    (["cnn", "cnn.pt", "full"], ["not an empty directory"]),
    (["cnn", "cnn.pt", "out.safetensors"], ["writes a workdir"]),
    (["cnn", "full", "out.pt"], ["not a flaxport run directory"]),
    (["ddim", "ddim-bad-ema.pt", "out", "--config", "smoke"], ["ema_model (keys ema_model.*)", "lacks 'head.bias'"]),
])
def test_convert_errors_are_one_line_and_write_nothing(capsys, files, args, needles):
    args = [a if a.startswith("-") or "=" in a or a in ("cnn", "vae", "gan", "ddim", "smoke") else files / a
            for a in args]
    _one_line_error(*_run(capsys, "convert", *args)[::2], *needles)
    assert not (files / "out").exists() and (files / "full" / "x").read_text() == "mine"


def test_convert_error_from_a_real_process(cli, files, tmp_path):
    proc = cli("convert", "vae", files / "cnn.pt", tmp_path / "out")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "flaxport: error: torch state_dict lacks 'encoder.fc1.weight' (for Flax 'params/encoder/fc1/kernel')"]
    assert not (tmp_path / "out").exists()


def test_convert_ddim_carries_the_ema_network_both_ways(capsys, tmp_path):
    """A torch twin run's checkpoint after 2 steps (its ema_model differs from model) -> a Flax
    workdir whose EMA is the torch EMA's (the workload converter's arrays) -> .pt {"model",
    "ema_model"} and .safetensors (`ema_model.` keys), bit-exact, counters included. A bare
    state_dict has no EMA: the Flax EMA starts at the weights."""
    from safetensors.torch import load_file

    from flaxport.harness import torch_loop
    from flaxport.harness.workdir import claim
    from flaxport.workloads.checkpoints import init_state_from_torch
    from flaxport.workloads.checkpoints import read_torch_file, state_from_flat
    from flaxport.workloads.ddim import config as config_lib
    from flaxport.workloads.ddim import convert, step_torch

    config = config_lib.get_config("smoke")
    run = tmp_path / "torch-run"
    with claim(run, {"workload": "ddim", "framework": "torch"}, resume=False, has_checkpoint=lambda w: False) as held:
        held.commit({**dataclasses.asdict(config), "seed": 0})
    ts = step_torch.init_state(config, 0)
    g = torch.Generator().manual_seed(0)
    shape = (8, config.channels, config.image_size, config.image_size)
    for _ in range(2):
        step_torch.step(ts, torch.randn(shape, generator=g), torch.randn(shape, generator=g),
                        torch.rand((8, 1, 1, 1), generator=g))
    model_sd, ema_sd = ts.model.state_dict(), ts.ema_model.state_dict()
    assert not torch.equal(model_sd["head.weight"], ema_sd["head.weight"])
    meta = {"workload": "ddim", "framework": "torch", "variant": "smoke", "seed": 0, "epochs_done": 1}
    torch_loop.checkpoint_store(run).save(1, ts.state_dict(), meta)
    ckpt = run / "checkpoints" / "epoch_1.pt"

    state, counters = state_from_flat("ddim", config, read_torch_file(ckpt, "ddim")[0])
    for (p_field, s_field), sd in ((("params", "batch_stats"), model_sd), (("ema_params", "ema_batch_stats"), ema_sd)):
        want = convert.torch_to_flax(config, sd)
        for coll, field in (("params", p_field), ("batch_stats", s_field)):
            got = jax.tree_util.tree_leaves_with_path(getattr(state, field))
            assert len(got) == len(jax.tree.leaves(want[coll]))
            for path, leaf in got:
                np.testing.assert_array_equal(np.asarray(leaf), np.asarray(_at(want[coll], path)), err_msg=field)
    assert set(counters.values()) == {2} and len(counters) == 2 * 3  # model and EMA, 3 BatchNorms

    work = tmp_path / "flax"
    rc, out, err = _run(capsys, "convert", "ddim", ckpt, work)
    assert rc == 0, err
    assert json.loads(out)["ema"] == "ema_model from epoch_1.pt"
    for suffix in (".pt", ".safetensors"):
        rc, out, err = _run(capsys, "convert", "ddim", work, tmp_path / f"back{suffix}")
        assert rc == 0, err
    nested = torch.load(tmp_path / "back.pt", weights_only=True)
    flat = load_file(tmp_path / "back.safetensors")
    assert list(nested) == ["model", "ema_model"]
    assert sorted(flat) == sorted(list(model_sd) + [f"ema_model.{k}" for k in ema_sd])
    for name, sd in (("model", model_sd), ("ema_model", ema_sd)):
        assert list(nested[name]) == list(sd)
        for k, v in sd.items():  # num_batches_tracked (2) included
            flat_v = flat[k if name == "model" else f"{name}.{k}"]
            assert torch.equal(nested[name][k], v) and torch.equal(flat_v, v.contiguous()), (name, k)
    # parity of that file runs its trained network (the EMA copy is checked for keys and shapes);
    # the batch of the parity test above, so its compiled eval run serves this one too.
    rc, out, err = _run(capsys, "parity", "ddim", "--config", "smoke", "--set", "batch_size=16", "--weights",
                        tmp_path / "back.pt", "--json")
    assert rc == 0 and json.loads(out)["ok"], out[-2000:] + err

    plain = tmp_path / "model.pt"
    torch.save(model_sd, plain)
    state = init_state_from_torch("ddim", config, plain, jax.random.key(0))
    for a, b in ((state.params, state.ema_params), (state.batch_stats, state.ema_batch_stats)):
        assert jax.tree.all(jax.tree.map(lambda x, y: bool((np.asarray(x) == np.asarray(y)).all()), a, b))


def _at(tree, path):
    for k in path:
        tree = tree[getattr(k, "key", k)]
    return tree
