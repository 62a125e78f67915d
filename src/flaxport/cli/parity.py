"""flaxport parity WORKLOAD: does the Flax model compute what its PyTorch twin computes, layer by layer?

The torch twin is initialised (`step_torch.init_state(config, seed)`), or loaded from
`--weights FILE`; its weights are ported with flaxport.port.port_weights' key map; both
run on one deterministic batch (check_parity) in eval mode, and with --train also in
train mode: the gradient of the workload's own loss for every parameter, and the
BatchNorm running statistics after the forward pass.

  gan   G on z ~ N(0, 1) (batch_size, z_dim); its loss is the workload's MSE(D(G(z)), 1)
        through a train-mode D.  D on real mixture samples (batch_size, 1); loss MSE(D(x), 1).
  cnn   eval: embedded digits (batch_size, 3, 32, 32) as x * float32(1/255); train: uniform
        random pixels, random labels, NLL loss. Real digits have flat backgrounds, so
        max-pool windows hold exact ties, and each framework routes the gradient to another
        tied element (docs/porting.md): a gradient check on them fails without a bug.
  vae   binarized digits (batch_size, 784) and eps ~ N(0, 1); loss: the mean negative ELBO.
  ddim  the UNet (the trained network, not its EMA copy) on its two inputs, both in torch
        layout: noisy digits (batch_size, 3, s, s), normalised by their own mean/std and
        mixed with noise ~ N(0, 1) at times t ~ U(0, 1) by the workload's cosine schedule,
        and their noise variances (batch_size, 1, 1, 1); loss: the noise MAE it trains on.

A fresh twin's BatchNorm has weight 1, bias 0, mean 0, var 1, which would hide a swapped
or dropped statistic: without --weights they are drawn at random (from --seed) first. So
is every parameter that starts at zero (ddim: keras's zero biases and its zero-initialised
head, behind which every gradient would be zero).

Exit 0 when every row is within atol + rtol * max|torch|; 1 when one is not (the report
names the first such layer). --flax-set KEY=VALUE changes the Flax side's config only,
to see what a wrong port does (e.g. bn_momentum=0.9, Flax's convention for torch's 0.1).
"""
from __future__ import annotations

import copy
import importlib
import json

import numpy as np

from flaxport.cli import common
from flaxport.errors import UserError


def add_parser(sub):
    p = sub.add_parser("parity", help="layer-by-layer parity of a workload's Flax model and its PyTorch twin")
    p.add_argument("workload", help="gan, cnn, vae or ddim")
    p.add_argument("--train", action="store_true", help="also train mode: gradients of the loss, BatchNorm stats")
    p.add_argument("--seed", type=int, default=0, help="torch init, the batch and the BatchNorm draw")
    p.add_argument("--json", action="store_true", help="print the reports as one JSON object")
    p.add_argument("--atol", type=float, default=1e-5, help="a row passes when max|diff| <= atol + rtol * max|torch|")
    p.add_argument("--rtol", type=float, default=1e-5, help="relative tolerance")
    p.add_argument("--config", default="default", help="config variant (default: default)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    p.add_argument("--flax-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field on the Flax side only (a deliberately wrong port)")
    p.add_argument("--weights", default=None, metavar="FILE", help="torch weights (.pt/.safetensors) to check")
    common.add_debug(p)
    p.set_defaults(run=run)


def run(args) -> int:
    for flag, value in (("--atol", args.atol), ("--rtol", args.rtol)):
        if not 0 <= value < float("inf"):  # NaN fails this too: no row would ever pass or fail
            raise UserError(f"{flag} must be a finite number >= 0, got {value}")
    common.check_seed(args.seed)
    common.setup_jax(args.workload)  # before JAX starts
    import jax

    from flaxport.port import check_parity
    from flaxport.workloads.twins import part_names, parts
    from flaxport.workloads import registry

    jax.config.update("jax_default_matmul_precision", "highest")  # no TF32/bf16 passes on accelerators
    workload = registry.get(args.workload)
    part_names(workload.name)  # a workload that declares no twin parts: one line, before any work
    if args.config not in workload.variants:
        raise UserError(f"unknown config {args.config!r} for {workload.name}; choose one of: "
                        f"{', '.join(workload.variants)}")
    config = common.apply_overrides(workload.get_config(args.config), args.set)
    flax_config = common.apply_overrides(config, args.flax_set)
    common.check_memory(workload.name, config)
    twin = importlib.import_module(workload.torch_twin)
    ts = twin.init_state(config, args.seed)
    torch_parts = parts(workload.name, config, ts)
    flax_parts = parts(workload.name, flax_config)
    key_maps = [p.key_map(f.flax_module) for p, f in zip(torch_parts, flax_parts)]
    if args.weights:
        _load_weights(workload.name, config, args.weights, torch_parts, key_maps)
    else:
        _randomize(torch_parts, args.seed)
    variables = [km.to_flax(p.torch_module.state_dict()) for p, km in zip(torch_parts, key_maps)]
    cases = CASES[workload.name](config, torch_parts, flax_parts, variables, args.seed)

    results = []
    for i, (tp, fp, km) in enumerate(zip(torch_parts, flax_parts, key_maps)):
        for mode in ("eval", "train") if args.train else ("eval",):
            inputs, loss, what = cases(i, mode)
            report = check_parity(tp.torch_module, fp.flax_module, variables[i], inputs, train=mode == "train",
                                  loss_fn=loss, atol=args.atol, rtol=args.rtol, key_map=km)
            results.append((tp.name, mode, what, report))
    ok = all(r.ok for *_, r in results)
    if args.json:
        print(json.dumps({"workload": workload.name, "ok": ok, "atol": args.atol, "rtol": args.rtol,
                          "weights": args.weights or f"torch init, seed {args.seed}, BatchNorm and zero "
                                                     "parameters drawn at random",
                          "reports": [{"model": m, "mode": mode, "inputs": what, **r.to_dict()}
                                      for m, mode, what, r in results]}))
    else:
        for model, mode, what, report in results:
            print(f"== {workload.name} {model}, {mode} mode; inputs: {what}")
            print(report)
            print()
        print(_summary(workload.name, results))
    return 0 if ok else 1


def _summary(name, results) -> str:
    failing = [(m, mode, r) for m, mode, _, r in results if not r.ok]
    if not failing:
        n = len(results)
        return f"parity {name}: OK ({n} report{'s' * (n != 1)}, {sum(len(r.rows) for *_, r in results)} rows)"
    m, mode, r = failing[0]
    first = r.first_divergence
    return (f"parity {name}: FAIL: first divergence in {m} ({mode} mode) at torch {first.torch_name!r} / flax "
            f"{first.flax_name!r} ({first.phase}, max_abs {first.max_abs:.3g}); "
            f"{sum(not row.ok for *_, r in results for row in r.rows)} failing rows")


def _load_weights(name, config, path, torch_parts, key_maps) -> None:
    """Load a torch file into the twin's modules, checked by the key maps first (one-line errors).

    A file with an EMA copy (ddim's `ema_model`): the trained network is what runs; the
    copy is checked against the same key map (every key, every shape) and not run."""
    import torch

    from flaxport.workloads.checkpoints import read_torch_file, split, split_ema
    from flaxport.workloads.twins import ema_name
    from flaxport.port.weights import PortError

    flat, _ = read_torch_file(path, name)
    main, ema = split_ema(flat, name)
    for (part, sd), km in zip(split(main, name, config), key_maps):
        km.to_flax(sd)  # strict: names the missing/unexpected key or the shape
        part.torch_module.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in sd.items()})
    if ema:
        for (part, sd), km in zip(split(ema, name, config), key_maps):
            try:
                km.to_flax(sd)
            except PortError as e:
                raise type(e)(f"{ema_name(name)} (keys {ema_name(name)}.*): {e}") from None


def _randomize(torch_parts, seed: int) -> None:
    """BatchNorm weight ~ 1 + 0.2 N, bias ~ 0.2 N (when affine), running mean ~ 0.1 N, running
    var ~ 1 + 0.5 U; then every parameter that is all zeros ~ 0.1 N."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    modules = [p.torch_module for p in torch_parts]
    with torch.no_grad():
        for m in (m for net in modules for m in net.modules()):
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                if m.affine:
                    m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=g))
                    m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=g))
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(1 + 0.5 * torch.rand(m.running_var.shape, generator=g))
        for net in modules:  # after the BatchNorm draws, which stay what they were before this pass
            for p in net.parameters():
                if not p.any():
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))


# --------------------------------------------------------------------------- per workload
# CASES[name](config, torch_parts, flax_parts, variables, seed) -> case(part index, mode)
#   -> (inputs in torch layout, loss_fn (torch, flax) pair or None, description)

def _gan(config, torch_parts, flax_parts, variables, seed):
    import torch

    from flaxport.data import mixture
    from flaxport.workloads.gan import step

    rng = np.random.default_rng(seed)
    b = config.batch_size
    z = rng.standard_normal((b, config.z_dim)).astype(np.float32)
    data = mixture.load(config.modes, config.mode_std, config.n_per_mode, config.data_seed).train["x"]
    real = np.asarray(data[rng.choice(len(data), b, replace=False)], np.float32)
    t_d, f_d, d_vars = torch_parts[1].torch_module, flax_parts[1].flax_module, variables[1]
    ones = torch.ones((b, 1))

    def g_loss_torch(out):  # the workload's G loss, through a train-mode copy of D (its stats discarded)
        return torch.nn.functional.mse_loss(copy.deepcopy(t_d).train()(out), ones)

    def g_loss_flax(out):
        validity, _ = f_d.apply(d_vars, out, train=True, mutable=["batch_stats"])
        return step.mse(validity, 1.0)

    def case(i, mode):
        if i == 0:
            loss = (g_loss_torch, g_loss_flax) if mode == "train" else None
            return z, loss, f"z {z.shape} ~ N(0, 1)" + ("; loss MSE(D(G(z)), 1), D in train mode" if loss else "")
        loss = (lambda out: torch.nn.functional.mse_loss(out, ones), lambda out: step.mse(out, 1.0))
        return real, loss if mode == "train" else None, f"{b} mixture samples {real.shape}" + (
            "; loss MSE(D(x), 1)" if mode == "train" else "")

    return case


def _cnn(config, torch_parts, flax_parts, variables, seed):
    import torch

    from flaxport.data import digits
    from flaxport.workloads.cnn import step

    rng = np.random.default_rng(seed)
    b = config.batch_size
    data = digits.load(size=config.image_size, channels=config.channels).train
    real = data["image"][rng.choice(len(data["image"]), b, replace=False)]
    noise = rng.integers(0, 256, size=real.shape, dtype=np.uint8)
    labels = rng.integers(0, config.num_classes, size=b)

    def nchw(images_u8):  # x * float32(1/255): the bits torch's x / 255 gives on CPU
        return np.ascontiguousarray((images_u8.astype(np.float32) * np.float32(1 / 255)).transpose(0, 3, 1, 2))

    loss = (lambda out: torch.nn.functional.nll_loss(out, torch.from_numpy(labels)),
            lambda out: step.nll(out, labels))

    def case(i, mode):
        if mode == "eval":
            return nchw(real), None, f"{b} embedded digits {real.shape} NHWC uint8 / 255"
        return nchw(noise), loss, f"{b} uniform random images {real.shape} / 255 (no max-pool ties), NLL loss"

    return case


def _vae(config, torch_parts, flax_parts, variables, seed):
    import jax.numpy as jnp
    import torch

    from flaxport.data import digits
    from flaxport.workloads.vae import step, step_torch

    rng = np.random.default_rng(seed)
    b = config.batch_size
    images = digits.binarized(size=config.image_size).train["image"]
    x = images[rng.choice(len(images), b, replace=False)].reshape(b, -1).astype(np.float32)
    eps = rng.standard_normal((b, config.latents)).astype(np.float32)
    xt = torch.from_numpy(x)
    loss = (lambda out: step_torch.final_loss(out[0], xt, out[1], out[2])[0],
            lambda out: jnp.mean(step.bce_with_logits(out[0], x) + step.kl_divergence(out[1], out[2])))

    def case(i, mode):
        return (x, eps), loss if mode == "train" else None, f"{b} binarized digits {x.shape}, eps {eps.shape}" + (
            "; loss: mean negative ELBO" if mode == "train" else "")

    return case


def _ddim(config, torch_parts, flax_parts, variables, seed):
    import jax.numpy as jnp
    import torch

    from flaxport.data import digits
    from flaxport.workloads.ddim import step
    from flaxport.workloads.ddim.schedule import diffusion_schedule

    rng = np.random.default_rng(seed)
    b, s = config.batch_size, config.image_size
    data = digits.load(size=s, channels=config.channels).train["image"]
    stats = step.data_stats(data)  # keras's Normalization.adapt
    mean, std = (np.asarray(stats[k], np.float32) for k in ("norm_mean", "norm_std"))
    images = (data[rng.choice(len(data), b, replace=False)].astype(np.float32) * np.float32(1 / 255) - mean) / std
    noises = rng.standard_normal(images.shape).astype(np.float32)
    times = rng.uniform(size=(b, 1, 1, 1)).astype(np.float32)
    noise_rates, signal_rates = diffusion_schedule(times, config.min_signal_rate, config.max_signal_rate)
    noisy = np.ascontiguousarray((signal_rates * images + noise_rates * noises).transpose(0, 3, 1, 2))
    variances = np.ascontiguousarray(noise_rates ** 2)  # (b, 1, 1, 1) in either layout
    noises_nchw = torch.from_numpy(np.ascontiguousarray(noises.transpose(0, 3, 1, 2)))
    loss = (lambda out: (out - noises_nchw).abs().mean(), lambda out: jnp.mean(jnp.abs(out - noises)))

    def case(i, mode):
        return (noisy, variances), loss if mode == "train" else None, (
            f"{b} noisy digits {noisy.shape} (normalised, t ~ U(0, 1), noise ~ N(0, 1)), noise variances "
            f"{variances.shape}" + ("; loss: noise MAE" if mode == "train" else ""))

    return case


CASES = {"gan": _gan, "cnn": _cnn, "vae": _vae, "ddim": _ddim}
