"""A hand-made stand-in for a flaxport.translate Translation, for check_step's tests.

It offers what check_step uses of a translation: `model` (an nnx.Module in torch's
layout and numerics), `load_state_dict(torch_state_dict)` (torch names and layouts in,
cast to the model's dtypes) and `state_dict(tree=None)` (the model's variables, or a
params-shaped tree such as gradients, out under torch's names and layouts, as NumPy).

  TorchNet   Linear(6, 16) -> BatchNorm1d(16) -> ReLU -> Dropout(0.25) -> Linear(16, 3)
  FakeTranslation(TorchNet)  the NNX twin, with a torch-faithful BatchNorm1d
"""
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from torch import nn as tnn


class TorchNet(tnn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = tnn.Linear(6, 16)
        self.bn = tnn.BatchNorm1d(16)
        self.drop = tnn.Dropout(0.25)
        self.fc2 = tnn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.bn(self.fc1(x)))))


class BatchNorm1d(nnx.Module):
    """torch.nn.BatchNorm1d: momentum weighs the new batch, the running variance is unbiased."""

    def __init__(self, n, momentum=0.1, eps=1e-5):
        self.weight, self.bias = nnx.Param(jnp.ones(n)), nnx.Param(jnp.zeros(n))
        self.running_mean, self.running_var = nnx.BatchStat(jnp.zeros(n)), nnx.BatchStat(jnp.ones(n))
        self.num_batches_tracked = nnx.BatchStat(jnp.zeros((), jnp.int32))
        self.momentum, self.eps, self.use_running_average = momentum, eps, False

    def __call__(self, x):
        if self.use_running_average:
            mean, var = self.running_mean.value, self.running_var.value
        else:
            mean = x.mean(0)
            var = jnp.square(x - mean).mean(0)
            n, m = x.shape[0], self.momentum
            self.running_mean.value = (1 - m) * self.running_mean.value + m * mean
            self.running_var.value = (1 - m) * self.running_var.value + m * var * (n / (n - 1))
            self.num_batches_tracked.value = self.num_batches_tracked.value + 1
        return (x - mean) / jnp.sqrt(var + self.eps) * self.weight.value + self.bias.value


class Net(nnx.Module):
    def __init__(self, rngs):
        self.fc1 = nnx.Linear(6, 16, rngs=rngs)
        self.bn = BatchNorm1d(16)
        self.drop = nnx.Dropout(0.25, rngs=rngs)
        self.fc2 = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.fc2(self.drop(nnx.relu(self.bn(self.fc1(x)))))


# torch key -> (path in the model, transpose?)
KEYS = {"fc1.weight": (("fc1", "kernel"), True), "fc1.bias": (("fc1", "bias"), False),
        "bn.weight": (("bn", "weight"), False), "bn.bias": (("bn", "bias"), False),
        "bn.running_mean": (("bn", "running_mean"), False), "bn.running_var": (("bn", "running_var"), False),
        "bn.num_batches_tracked": (("bn", "num_batches_tracked"), False),
        "fc2.weight": (("fc2", "kernel"), True), "fc2.bias": (("fc2", "bias"), False)}


class FakeTranslation:
    def __init__(self, torch_module):
        self.model = Net(nnx.Rngs(0))
        self.model.train() if torch_module.training else self.model.eval()
        self.load_state_dict(torch_module.state_dict())

    def load_state_dict(self, state_dict):
        for key, (path, transpose) in KEYS.items():
            var = getattr(getattr(self.model, path[0]), path[1])
            a = np.asarray(state_dict[key].detach().cpu().numpy() if hasattr(state_dict[key], "detach")
                           else state_dict[key])
            var.value = jnp.asarray(a.T if transpose else a, var.value.dtype)

    def state_dict(self, tree=None):
        out = {}
        for key, (path, transpose) in KEYS.items():
            if tree is None:
                value = getattr(getattr(self.model, path[0]), path[1]).value
            elif path in (("bn", "running_mean"), ("bn", "running_var"), ("bn", "num_batches_tracked")):
                continue
            else:
                value = tree[path[0]][path[1]]
                value = getattr(value, "value", value)
            a = np.asarray(value)
            out[key] = a.T.copy() if transpose else a.copy()
        return out
