"""Small torch models outside the workloads, each with a hand-written Flax twin, for the
flaxport.port tests. `wrong=` switches a twin to a classic porting mistake.

  resnet   stride-2 residual block with BatchNorm, max-pool (torch padding), avg-pool with
           ceil_mode, flatten -> Linear.  input (N, 3, 16, 16)
  mlp      LayerNorm -> Linear -> exact GELU -> Linear on (N, L, 16) sequences
  decoder  ConvTranspose2d x3 (flaxport.nn, and stock nn.ConvTranspose with and without
           transpose_kernel), BatchNorm.  input (N, 8, 2, 2) -> (N, 3, 8, 8)
  seq      Embedding -> Conv1d -> GroupNorm -> mean -> Linear on tokens (N, L); the Flax
           twin keeps Flax's auto names (Embed_0, ...) so layers pair by call order.
"""
import numpy as np
import torch
from flax import linen as nn
from torch import nn as tnn

from flaxport import nn as fpnn


# --------------------------------------------------------------------------- resnet
def Conv2d(*args, **kwargs):
    """flaxport.nn.Conv2d with XLA's conv op: compiles faster than im2col's slices (test time)."""
    return fpnn.Conv2d(*args, impl="xla", **kwargs)


class TorchBlock(tnn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv1 = tnn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False)
        self.bn1 = tnn.BatchNorm2d(cout)
        self.conv2 = tnn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = tnn.BatchNorm2d(cout)
        self.shortcut = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride=2, bias=False), tnn.BatchNorm2d(cout))

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class TorchResNet(tnn.Module):
    def __init__(self):
        super().__init__()
        self.stem = tnn.Conv2d(3, 8, 3, padding=1)
        self.bn0 = tnn.BatchNorm2d(8)
        self.pool = tnn.MaxPool2d(3, stride=2, padding=1)
        self.block = TorchBlock(8, 16)
        self.avg = tnn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)
        self.fc = tnn.Linear(16 * 3 * 3, 10)

    def forward(self, x):
        h = self.pool(torch.relu(self.bn0(self.stem(x))))
        return self.fc(self.avg(self.block(h)).flatten(1))


class FlaxBlock(nn.Module):
    cout: int
    same_pad: bool = False  # wrong: Flax 'SAME' on the stride-2 conv pads (0, 1), torch (1, 1)

    @nn.compact
    def __call__(self, x, train):
        if self.same_pad:
            conv1 = nn.Conv(self.cout, (3, 3), strides=2, padding="SAME", use_bias=False, name="conv1")
        else:
            conv1 = Conv2d(self.cout, 3, stride=2, padding=1, use_bias=False, name="conv1")
        h = nn.relu(fpnn.BatchNorm(name="bn1")(conv1(x), not train))
        h = fpnn.BatchNorm(name="bn2")(Conv2d(self.cout, 3, padding=1, use_bias=False, name="conv2")(h), not train)
        s = Conv2d(self.cout, 1, stride=2, use_bias=False, name="shortcut_0")(x)
        return nn.relu(h + fpnn.BatchNorm(name="shortcut_1")(s, not train))


class FlaxResNet(nn.Module):
    wrong: str = ""  # "same_pad"

    @nn.compact
    def __call__(self, x, train: bool):
        h = fpnn.BatchNorm(name="bn0")(Conv2d(8, 3, padding=1, name="stem")(x), not train)
        h = fpnn.MaxPool(3, 2, 1, name="pool")(nn.relu(h))
        h = FlaxBlock(16, self.wrong == "same_pad", name="block")(h, train)
        h = fpnn.avg_pool(h, 3, 2, 1, ceil_mode=True)
        return fpnn.Dense(10, name="fc")(h.reshape(h.shape[0], -1))


RESNET_FLATTEN = {"fc": (16, 3, 3)}


# --------------------------------------------------------------------------- mlp
class TorchMLP(tnn.Module):
    def __init__(self):
        super().__init__()
        self.norm = tnn.LayerNorm(16)
        self.fc1 = tnn.Linear(16, 32)
        self.act = tnn.GELU()
        self.fc2 = tnn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(self.norm(x))))


class FlaxMLP(nn.Module):
    wrong: str = ""  # "approx_gelu" | "ln_eps"

    @nn.compact
    def __call__(self, x):
        norm = nn.LayerNorm(name="norm") if self.wrong == "ln_eps" else fpnn.LayerNorm(name="norm")  # eps 1e-6
        h = fpnn.Dense(32, name="fc1")(norm(x))
        h = fpnn.GELU("tanh" if self.wrong == "approx_gelu" else "none", name="act")(h)
        return fpnn.Dense(8, name="fc2")(h)


def mlp_input(seed=0):
    """(4, 5, 16): half the rows with spread ~3e-3, where LayerNorm's eps matters."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(4, 5, 16))
    x[:, ::2] = 0.3 + 3e-3 * x[:, ::2]
    return torch.from_numpy(x.astype(np.float32))


# --------------------------------------------------------------------------- decoder
class TorchDecoder(tnn.Module):
    def __init__(self):
        super().__init__()
        self.up1 = tnn.ConvTranspose2d(8, 16, 4, stride=2, padding=1)
        self.bn = tnn.BatchNorm2d(16)
        self.up2 = tnn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)
        self.up3 = tnn.ConvTranspose2d(8, 3, 3, stride=1, padding=1)

    def forward(self, z):
        h = torch.relu(self.up2(torch.relu(self.bn(self.up1(z)))))
        return torch.tanh(self.up3(h))


class FlaxDecoder(nn.Module):
    wrong: str = ""  # "flax_bn_momentum": torch's 0.1 given to stock Flax BatchNorm (which keeps 0.1 of the old)

    @nn.compact
    def __call__(self, z, train: bool):
        h = fpnn.ConvTranspose2d(16, 4, 2, 1, name="up1")(z)
        if self.wrong == "flax_bn_momentum":
            h = nn.BatchNorm(use_running_average=not train, momentum=0.1, epsilon=1e-5, name="bn")(h)
        else:
            h = fpnn.BatchNorm(name="bn")(h, not train)
        h = nn.relu(h)
        # stock Flax with lax padding: per side d*(k-1) - p, output_padding on the high side
        h = nn.relu(nn.ConvTranspose(8, (3, 3), (2, 2), padding=((1, 2), (1, 2)), transpose_kernel=True,
                                     name="up2")(h))
        return jnp_tanh(nn.ConvTranspose(3, (3, 3), (1, 1), padding=((1, 1), (1, 1)), name="up3")(h))


def jnp_tanh(x):
    import jax.numpy as jnp

    return jnp.tanh(x)


# --------------------------------------------------------------------------- seq
class TorchSeq(tnn.Module):
    def __init__(self):
        super().__init__()
        self.embed = tnn.Embedding(20, 8)
        self.conv = tnn.Conv1d(8, 12, 3, padding=1)
        self.norm = tnn.GroupNorm(4, 12)
        self.head = tnn.Linear(12, 5)

    def forward(self, tokens):
        h = self.embed(tokens).transpose(1, 2)  # (N, 8, L)
        h = torch.relu(self.norm(self.conv(h)))
        return self.head(h.mean(-1))


class FlaxSeq(nn.Module):
    @nn.compact
    def __call__(self, tokens):
        h = nn.Embed(20, 8)(tokens)  # (N, L, 8): already channels-last
        h = nn.relu(fpnn.GroupNorm(4)(fpnn.Conv1d(12, 3, padding=1)(h)))
        return fpnn.Dense(5)(h.mean(axis=1))


def seq_input(seed=0):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 20, size=(3, 8)))


# --------------------------------------------------------------------------- registry
def image(shape, seed=0):
    return torch.from_numpy(np.random.default_rng(seed).normal(size=shape).astype(np.float32))


def zoo():
    """{name: (torch module (seeded init), Flax twin, example input, flatten_shapes)}."""
    torch.manual_seed(0)
    return {
        "resnet": (TorchResNet(), FlaxResNet(), image((2, 3, 16, 16)), RESNET_FLATTEN),
        "mlp": (TorchMLP(), FlaxMLP(), mlp_input(), None),
        "decoder": (TorchDecoder(), FlaxDecoder(), image((2, 8, 2, 2)), None),
        "seq": (TorchSeq(), FlaxSeq(), seq_input(), None),
    }


def randomize_norms(module, seed=1):
    """Non-trivial BatchNorm/LayerNorm/GroupNorm affine params and running stats (torch inits them to 1/0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (tnn.modules.batchnorm._BatchNorm, tnn.LayerNorm, tnn.GroupNorm)):
                m.weight.copy_(1 + 0.2 * torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=g))
            if isinstance(m, tnn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(1 + 0.5 * torch.rand(m.running_var.shape, generator=g))
                m.num_batches_tracked.fill_(7)
    return module


# --------------------------------------------------------------------------- tiny resnet (1x1 maps)
class TorchTinyResNet(tnn.Module):
    """A stem and `blocks` stride-2 residual blocks on 8x8 inputs: the maps reach 1x1 after three
    blocks and stay there, so at batch 4 every later BatchNorm normalises over 4 values per
    channel, which amplifies float32 rounding (docs/porting.md, entry 28)."""

    def __init__(self, blocks=6, width=16, classes=5):
        super().__init__()
        self.stem = tnn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn0 = tnn.BatchNorm2d(width)
        self.blocks = tnn.Sequential(*[TorchBlock(width, width) for _ in range(blocks)])
        self.fc = tnn.Linear(width, classes)

    def forward(self, x):
        return self.fc(self.blocks(torch.relu(self.bn0(self.stem(x)))).flatten(1))


class FlaxTinyResNet(nn.Module):
    blocks: int = 6
    width: int = 16
    classes: int = 5

    @nn.compact
    def __call__(self, x, train: bool):
        h = nn.relu(fpnn.BatchNorm(name="bn0")(Conv2d(self.width, 3, padding=1, use_bias=False, name="stem")(x),
                                               not train))
        for i in range(self.blocks):
            h = FlaxBlock(self.width, name=f"blocks_{i}")(h, train)
        return fpnn.Dense(self.classes, name="fc")(h.reshape(h.shape[0], -1))
