"""The PyTorch twin of step.py: keras-io DDIM's train_step and reverse diffusion.

`TorchDDIM` holds what the Flax DDIMState holds: the network (with its BN buffers), the
EMA network (a copy, updated after every step, buffers included), AdamW and the update
count (for the learning-rate schedule). Batches arrive as uint8 NHWC tensors; the step
converts to float NCHW (x / 255, permute), normalises with the config's data statistics.
`step` takes the noise and times as arguments, so parity tests can feed both twins the
same draws; `train_step` draws them from the loop's generator.
"""
from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from flaxport.workloads.ddim import model_torch
from flaxport.workloads.ddim.schedule import (check_schedule, diffusion_schedule, ema_decay, learning_rate,
                                             sampling_times)

NORM_EPS = 1e-7  # keras Normalization: divide by max(std, epsilon())


@dataclasses.dataclass
class TorchDDIM:
    model: nn.Module
    ema_model: nn.Module
    opt: torch.optim.Optimizer
    config: object
    steps_done: int = 0
    set_to_none: bool = True
    channels_last: bool = False

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "ema_model": self.ema_model.state_dict(),
                "opt": self.opt.state_dict(), "steps_done": self.steps_done}

    def load_state_dict(self, sd: dict) -> None:
        self.model.load_state_dict(sd["model"])
        self.ema_model.load_state_dict(sd["ema_model"])
        self.opt.load_state_dict(sd["opt"])
        self.steps_done = int(sd["steps_done"])


def init_state(config, seed: int, fused: bool = False, set_to_none: bool = True,
               channels_last: bool = False) -> TorchDDIM:
    """UNet with keras's init from `seed`, its EMA copy, AdamW with keras's settings."""
    check_schedule(config)
    torch.manual_seed(seed)
    net = model_torch.UNet(config)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    net.train()
    ema = copy.deepcopy(net).eval()
    ema.requires_grad_(False)
    # weight_decay explicitly: torch's AdamW default is 1e-2, keras's example uses 1e-4.
    opt = torch.optim.AdamW(net.parameters(), lr=learning_rate(config, 0), betas=(config.b1, config.b2),
                            eps=config.adam_eps, weight_decay=config.weight_decay, fused=fused or None)
    return TorchDDIM(net, ema, opt, config, 0, set_to_none, channels_last)


def _norm(config, like: torch.Tensor):
    if len(config.norm_mean) != config.channels or len(config.norm_std) != config.channels:
        raise ValueError("the ddim config needs norm_mean and norm_std from the training data (step.data_stats)")
    shape = (1, config.channels, 1, 1)
    mean = torch.tensor(config.norm_mean, dtype=like.dtype).reshape(shape)
    std = torch.tensor(config.norm_std, dtype=like.dtype).clamp_min(NORM_EPS).reshape(shape)
    return mean, std


def normalize(config, images_nchw: torch.Tensor) -> torch.Tensor:
    mean, std = _norm(config, images_nchw)
    return (images_nchw - mean) / std


def denormalize(config, images_nchw: torch.Tensor) -> torch.Tensor:
    mean, std = _norm(config, images_nchw)
    return torch.clamp(mean + images_nchw * std, 0.0, 1.0)


def to_input(ts: TorchDDIM, images_u8: torch.Tensor) -> torch.Tensor:
    """uint8 (B, H, W, C) -> normalised float (B, C, H, W)."""
    x = images_u8.float().mul_(1.0 / 255.0).permute(0, 3, 1, 2)
    x = normalize(ts.config, x)
    return x.contiguous(memory_format=torch.channels_last) if ts.channels_last else x


def losses(config, net: nn.Module, images, noises, diffusion_times):
    """(noise MAE, image MAE) for normalised images, noise (B, C, H, W), times (B, 1, 1, 1)."""
    noise_rates, signal_rates = diffusion_schedule(diffusion_times, config.min_signal_rate, config.max_signal_rate)
    noisy = signal_rates * images + noise_rates * noises
    pred_noises = net(noisy, noise_rates ** 2)
    pred_images = (noisy - noise_rates * pred_noises) / signal_rates
    return (pred_noises - noises).abs().mean(), (pred_images - images).abs().mean()


@torch.no_grad()
def ema_update(ts: TorchDDIM) -> None:
    """ema = decay * ema + (1 - decay) * new for every parameter and BN statistic (keras
    averages all network weights, moving mean/variance included), the decay warmed up as
    schedule.ema_decay says; counters are copied. Call after the step's update count."""
    d = ema_decay(ts.config, ts.steps_done - 1)  # the update just made, counted from 0
    for e, p in zip(ts.ema_model.parameters(), ts.model.parameters()):
        e.copy_(d * e + (1.0 - d) * p)
    for (name, e), b in zip(ts.ema_model.named_buffers(), ts.model.buffers()):
        if name.endswith(("running_mean", "running_var")):
            e.copy_(d * e + (1.0 - d) * b)
        elif name.endswith("num_batches_tracked"):
            e.copy_(b)


def step(ts: TorchDDIM, images, noises, diffusion_times):
    """One AdamW step (gradients of the noise MAE stay in .grad) and the EMA update.

    images, noises (B, C, H, W) normalised / N(0, 1); times (B, 1, 1, 1) -> (noise MAE, image MAE)."""
    for group in ts.opt.param_groups:
        group["lr"] = learning_rate(ts.config, ts.steps_done)
    noise_loss, image_loss = losses(ts.config, ts.model, images, noises, diffusion_times)
    ts.opt.zero_grad(set_to_none=ts.set_to_none)
    noise_loss.backward()
    ts.opt.step()
    ts.steps_done += 1
    ema_update(ts)
    return noise_loss, image_loss


def train_step(config, ts: TorchDDIM, batch: dict, generator: torch.Generator) -> dict:
    """batch {'image': (B, H, W, C) uint8} -> {'loss', 'image_loss'} (0-d tensors, not synced)."""
    images = to_input(ts, batch["image"])
    noises = torch.randn(images.shape, generator=generator, dtype=images.dtype)
    if ts.channels_last:
        noises = noises.contiguous(memory_format=torch.channels_last)
    times = torch.rand((len(images), 1, 1, 1), generator=generator, dtype=images.dtype)
    noise_loss, image_loss = step(ts, images, noises, times)
    return {"loss": noise_loss.detach(), "image_loss": image_loss.detach()}


def compile_models(ts: TorchDDIM) -> None:
    """torch.compile both networks in place; state_dict keys stay."""
    ts.model.compile()
    ts.ema_model.compile()


@torch.no_grad()
def reverse_diffusion(config, net: nn.Module, initial_noise, diffusion_steps: int, keep_path: bool = False):
    """keras's DDIM sampler: initial noise (N, C, H, W) -> normalised images (N, C, H, W),
    or with keep_path (steps + 1, N, C, H, W): the noisy images each step starts from (the
    initial noise first), then the final images.

    `net` must be in eval mode (running BN statistics): pass TorchDDIM.ema_model."""
    assert not net.training, "sample with the network in eval mode"
    times, next_times = sampling_times(diffusion_steps)
    n, dtype = len(initial_noise), initial_noise.dtype
    schedule = lambda t: diffusion_schedule(torch.full((n, 1, 1, 1), float(t), dtype=dtype),  # noqa: E731
                                            config.min_signal_rate, config.max_signal_rate)
    noisy, pred_images, path = initial_noise, None, []
    for t, t_next in zip(times, next_times):
        path.append(noisy)
        noise_rates, signal_rates = schedule(t)
        pred_noises = net(noisy, noise_rates ** 2)
        pred_images = (noisy - noise_rates * pred_noises) / signal_rates
        next_noise_rates, next_signal_rates = schedule(t_next)
        noisy = next_signal_rates * pred_images + next_noise_rates * pred_noises
    return torch.stack(path + [pred_images]) if keep_path else pred_images


def generate(config, ts: TorchDDIM, initial_noise, diffusion_steps: int, keep_path: bool = False,
             net: nn.Module | None = None):
    """Samples (N, C, H, W) in [0, 1] from noise (N, C, H, W), with the EMA network (or
    `net`, in eval mode); with keep_path the reverse process (steps + 1, N, C, H, W) in
    [0, 1], its last entry the samples."""
    net = ts.ema_model if net is None else net
    return denormalize(config, reverse_diffusion(config, net, initial_noise, diffusion_steps, keep_path))


def _nchw(x_nhwc) -> torch.Tensor:
    return torch.from_numpy(x_nhwc).permute(0, 3, 1, 2)


@torch.no_grad()
def val_losses(config, net: nn.Module, images_u8, noises, diffusion_times):
    """Per-example (noise MAE, image MAE) as NumPy (N,), network in eval mode; NumPy inputs
    uint8 images and noise (N, H, W, C), times (N, 1, 1, 1): step.val_losses's twin."""
    images = normalize(config, _nchw(images_u8).float().mul_(1.0 / 255.0))
    noises, times = _nchw(noises), torch.from_numpy(diffusion_times)
    noise_rates, signal_rates = diffusion_schedule(times, config.min_signal_rate, config.max_signal_rate)
    noisy = signal_rates * images + noise_rates * noises
    pred_noises = net(noisy, noise_rates ** 2)
    pred_images = (noisy - noise_rates * pred_noises) / signal_rates
    return (pred_noises - noises).abs().mean((1, 2, 3)).numpy(), (pred_images - images).abs().mean((1, 2, 3)).numpy()


def evaluate(config, ts: TorchDDIM, data, seed: int):
    """(quality, artifacts) as the Flax evaluate: KID and the digit scores, validation
    losses, timed pictures and their reverse process, from the same fixed NumPy draws
    (quality.py), with the EMA network (or the trained one: config.sample_weights). `seed`
    is unused."""
    from flaxport.workloads.ddim import quality

    del seed
    ema = config.sample_weights == "ema"
    net, was_training = (ts.ema_model if ema else ts.model), ts.model.training
    net.eval()  # the trained network samples with its running statistics too
    try:
        chunk = config.batch_size

        def sampler(steps, keep_path=False):  # (n, H, W, C), or the path (steps + 1, n, H, W, C)
            return lambda x: generate(config, ts, _nchw(x), steps, keep_path, net).movedim(-3, -1).numpy()

        samples, = quality.in_chunks(sampler(config.kid_diffusion_steps), [quality.kid_noise(config)], chunk)
        test = data.test["image"]
        noise, times = quality.val_draws(config, len(test))
        val, val_image = quality.in_chunks(lambda *a: val_losses(config, net, *a), [test, noise, times], chunk)
        draw = quality.path_sampler(sampler(config.plot_diffusion_steps, keep_path=True))
        (pictures, path), seconds = quality.timed(quality.in_chunks, draw, [quality.picture_noise(config)], chunk)
    finally:
        ts.model.train(was_training)
    about = {"framework": "torch", "steps": config.plot_diffusion_steps, "weights": "EMA" if ema else "online"}
    scores = quality.sample_scores(config, samples, data)
    return quality.summarize(scores, val, val_image, seconds, pictures, path, about)
