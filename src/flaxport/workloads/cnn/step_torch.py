"""The PyTorch twin of step.py: the seed article's `step`, plus evaluation.

`TorchCNN` holds what the Flax TrainState holds (model with its BatchNorm buffers,
Adam). Batches arrive as the loop's NumPy-derived tensors: images uint8 NHWC, labels
int; the step converts like the seed (x / 255, then `x.permute(0, 3, 1, 2)`).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch
from torch import nn

from flaxport.workloads.cnn import model_torch, quality

criterion = nn.NLLLoss()


@dataclasses.dataclass
class TorchCNN:
    model: nn.Module
    opt: torch.optim.Optimizer
    set_to_none: bool = True
    channels_last: bool = False

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "opt": self.opt.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.model.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["opt"])


def init_state(config, seed: int, fused: bool = False, set_to_none: bool = True,
               channels_last: bool = False) -> TorchCNN:
    """CNN with torch's default init from `seed`; Adam (fused if asked)."""
    torch.manual_seed(seed)
    net = model_torch.CNN(config)
    if channels_last:
        # NHWC weights and activations: oneDNN's fast path on CPU.
        net = net.to(memory_format=torch.channels_last)
    net.train()
    opt = torch.optim.Adam(net.parameters(), lr=config.lr, betas=(config.b1, config.b2), eps=config.adam_eps,
                           fused=fused or None)
    return TorchCNN(net, opt, set_to_none, channels_last)


def to_input(ts: TorchCNN, images_u8: torch.Tensor) -> torch.Tensor:
    """uint8 (B, H, W, C) -> float (B, C, H, W) in [0, 1], as the seed's preprocessing + permute."""
    # The Flax twin's multiply (XLA's `/ 255`), bit for bit; torch's `/ 255` divides exactly.
    x = images_u8.float().mul_(1.0 / 255.0).permute(0, 3, 1, 2)
    return x.contiguous(memory_format=torch.channels_last) if ts.channels_last else x


def step(ts: TorchCNN, x: torch.Tensor, y: torch.Tensor, is_training: bool = True):
    """The seed's step: x (B, C, H, W) float, y (B,) int64 -> (loss, log-probabilities)."""
    y_pred = ts.model(x)
    loss = criterion(y_pred, y)
    if is_training:
        ts.opt.zero_grad(set_to_none=ts.set_to_none)
        loss.backward()
        ts.opt.step()
    return loss, y_pred


def train_step(config, ts: TorchCNN, batch: dict, generator: torch.Generator) -> dict:
    """batch {'image': (B,H,W,C) uint8, 'label': (B,)} -> {'loss'} (0-d tensor, not synced)."""
    del generator  # no randomness in this step
    loss, _ = step(ts, to_input(ts, batch["image"]), batch["label"].long())
    return {"loss": loss.detach()}


def compile_models(ts: TorchCNN) -> None:
    """torch.compile the model in place (the `torch-compiled` variant); state_dict keys stay."""
    ts.model.compile()


@torch.no_grad()
def predict(config, ts: TorchCNN, images_u8: np.ndarray, labels: np.ndarray):
    """(mean NLL, accuracy, predictions (N,)) in eval mode (running statistics)."""
    ts.model.eval()
    try:
        loss_sum, correct, preds = 0.0, 0, []
        for start in range(0, len(labels), config.eval_batch):
            x = to_input(ts, torch.from_numpy(np.ascontiguousarray(images_u8[start:start + config.eval_batch])))
            y = torch.from_numpy(np.asarray(labels[start:start + config.eval_batch], np.int64))
            logp = ts.model(x)
            loss_sum += float(nn.functional.nll_loss(logp, y, reduction="sum"))
            pred = logp.argmax(-1)
            correct += int((pred == y).sum())
            preds.append(pred.numpy())
        return loss_sum / len(labels), correct / len(labels), np.concatenate(preds)
    finally:
        ts.model.train()


def evaluate(config, ts: TorchCNN, data, seed: int):
    del seed  # evaluation is deterministic
    val_loss, accuracy, preds = predict(config, ts, data.test["image"], data.test["label"])
    return quality.summarize(config, val_loss, accuracy, data.test["label"], preds)
