"""Plain-torch models for the translate tests: each factory returns (module, example inputs).

Small widths and resolutions so a translation and its float64 proof take seconds.

  resnet18       torchvision-style ResNet-18 (BasicBlock, downsample, stem max-pool)  (2, 3, 32, 32)
  mobilenet      a MobileNetV3 inverted-residual block: depthwise conv, Hardswish,
                 squeeze-excite with AdaptiveAvgPool2d and Hardsigmoid                 (2, 16, 16, 16)
  transformer    pre-norm encoder: learned positions, nn.MultiheadAttention (key padding
                 mask off) and F.scaled_dot_product_attention (causal), LayerNorm, GELU,
                 Dropout                                                               tokens (2, 9)
  lstm, gru      classifiers: Embedding -> 2-layer bidirectional batch_first RNN -> Linear
  unet           GroupNorm, SiLU, nearest and bilinear F.interpolate, ConvTranspose2d,
                 torch.cat skips                                                        (2, 3, 16, 16)
"""
import collections
import functools
import math
import subprocess
import sys
import textwrap

import torch
import torch.nn.functional as F
from torch import nn


# --------------------------------------------------------------------------- ResNet-18
def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        out = self.relu(out)
        return out


class ResNet(nn.Module):
    def __init__(self, layers=(2, 2, 2, 2), num_classes=10, width=64):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(width, layers[0])
        self.layer2 = self._make_layer(width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)
        return x


def resnet18(width=8, num_classes=10):
    return ResNet((2, 2, 2, 2), num_classes=num_classes, width=width)


# --------------------------------------------------------------------------- MobileNetV3 block
class SqueezeExcitation(nn.Module):
    def __init__(self, channels, squeeze):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = nn.ReLU()
        self.scale_activation = nn.Hardsigmoid()

    def forward(self, x):
        scale = self.avgpool(x)
        scale = self.fc2(self.activation(self.fc1(scale)))
        return x * self.scale_activation(scale)


class InvertedResidual(nn.Module):
    def __init__(self, cin=16, expanded=48, cout=16, kernel=5, stride=1):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        self.block = nn.Sequential(
            nn.Conv2d(cin, expanded, 1, bias=False), nn.BatchNorm2d(expanded, eps=1e-3, momentum=0.01), nn.Hardswish(),
            nn.Conv2d(expanded, expanded, kernel, stride, kernel // 2, groups=expanded, bias=False),
            nn.BatchNorm2d(expanded, eps=1e-3, momentum=0.01), nn.Hardswish(),
            SqueezeExcitation(expanded, 16),
            nn.Conv2d(expanded, cout, 1, bias=False), nn.BatchNorm2d(cout, eps=1e-3, momentum=0.01))

    def forward(self, x):
        result = self.block(x)
        if self.use_res_connect:
            result = result + x
        return result


# --------------------------------------------------------------------------- transformer
class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, dropout):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class EncoderLayer(nn.Module):
    def __init__(self, dim, heads, dropout, causal):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = (CausalSelfAttention(dim, heads, dropout) if causal
                     else nn.MultiheadAttention(dim, heads, dropout=dropout, batch_first=True))
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))
        self.causal = causal

    def forward(self, x):
        h = self.norm1(x)
        if self.causal:
            x = x + self.attn(h)
        else:
            x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(self, vocab=50, dim=16, heads=2, layers=2, max_len=16, num_classes=5, dropout=0.1):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, max_len, dim) * 0.02)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList([EncoderLayer(dim, heads, dropout, causal=i % 2 == 1) for i in range(layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, tokens):
        x = self.drop(self.tok(tokens) + self.pos[:, :tokens.shape[1]])
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x).mean(dim=1))


# --------------------------------------------------------------------------- recurrent
class RNNClassifier(nn.Module):
    def __init__(self, cell="lstm", vocab=40, dim=8, hidden=12, num_classes=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(dim, hidden, num_layers=2, batch_first=True, bidirectional=True, dropout=0.1)
        self.fc = nn.Linear(2 * hidden, num_classes)

    def forward(self, tokens):
        out, _ = self.rnn(self.embed(tokens))
        return self.fc(out[:, -1])


# --------------------------------------------------------------------------- UNet
class ResBlock(nn.Module):
    def __init__(self, cin, cout, groups=4):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return h + self.skip(x)


class UNet(nn.Module):
    def __init__(self, channels=3, widths=(8, 16, 32)):
        super().__init__()
        self.stem = nn.Conv2d(channels, widths[0], 3, padding=1)
        self.down1 = ResBlock(widths[0], widths[1])
        self.down2 = ResBlock(widths[1], widths[2])
        self.mid = ResBlock(widths[2], widths[2])
        self.up2 = nn.ConvTranspose2d(widths[2], widths[1], 2, stride=2)
        self.dec2 = ResBlock(widths[1] + widths[2], widths[1])
        self.dec1 = ResBlock(widths[1] + widths[0], widths[0])
        self.out = nn.Conv2d(widths[0], channels, 1)

    def forward(self, x):
        s0 = self.stem(x)
        s1 = self.down1(F.avg_pool2d(s0, 2))
        s2 = self.down2(F.max_pool2d(s1, 2))
        h = self.mid(s2)
        h = self.dec2(torch.cat([self.up2(h), F.interpolate(s2, scale_factor=2, mode="nearest")], dim=1))
        h = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)
        h = self.dec1(torch.cat([h, s0], dim=1))
        return self.out(h)


# --------------------------------------------------------------------------- odds and ends
class Audio(nn.Module):
    """Conv1d, InstanceNorm1d (affine), AvgPool1d, a dilated conv, and a dict output."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(1, 8, 5, stride=2, padding=2)
        self.n = nn.InstanceNorm1d(8, affine=True)
        self.c2 = nn.Conv1d(8, 8, 3, dilation=2)
        self.pool = nn.AvgPool1d(3, 2)

    def forward(self, x):
        feat = self.pool(F.elu(self.c2(F.gelu(self.n(self.c1(x))))))
        return {"feat": feat.mean(-1), "energy": x.pow(2).sum(-1)}


class Seq2Seq(nn.Module):
    """A GRU encoder whose final state starts the decoder (hx passed in), padding_idx embeddings."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 6, padding_idx=0)
        self.enc = nn.GRU(6, 8, batch_first=True)
        self.dec = nn.GRU(6, 8, batch_first=True)
        self.out = nn.Linear(8, 20)

    def forward(self, src, tgt):
        _, h = self.enc(self.emb(src))
        y, _ = self.dec(self.emb(tgt), h)
        return self.out(y).log_softmax(-1)


class Gated(nn.Module):
    """split into halves, torch.where, reflect padding, PixelShuffle, Dropout2d, max(...).values."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(4, affine=False)
        self.conv = nn.Conv2d(4, 16, 3, padding=1, padding_mode="reflect")
        self.drop = nn.Dropout2d(0.2)
        self.shuffle = nn.PixelShuffle(2)

    def forward(self, x):
        a, b = self.conv(self.bn(x)).split(8, 1)
        h = self.shuffle(self.drop(torch.where(a > 0, a * torch.sigmoid(b), torch.zeros_like(a))))
        return h.flatten(2).max(-1).values


class PatchAttention(nn.Module):
    """ViT-style: patches by a strided conv, a class token, nn.MultiheadAttention over a sequence
    whose length is a size expression of the image's ((H // 4) * (W // 4) + 1), tanh GELU."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(3, 16, 4, stride=4)
        self.cls = nn.Parameter(torch.randn(1, 1, 16) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, 17, 16) * 0.02)
        self.ln = nn.LayerNorm(16)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.GELU(approximate="tanh"), nn.Linear(32, 16))

    def forward(self, x):
        h = self.proj(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], 1)
        h = h + self.pos[:, : h.shape[1]]
        a, _ = self.attn(self.ln(h), self.ln(h), self.ln(h), need_weights=False)  # three arrays: the general path
        h = h + a
        return (h + self.mlp(self.ln(h)))[:, 0]


class Peaks(nn.Module):
    """Ops with several outputs whose outputs are named: AdaptiveMaxPool2d (values of
    values-and-indices), max(dim) values and argmax; chunk, F.normalize, PReLU, clamp."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.prelu = nn.PReLU()
        self.pool = nn.AdaptiveMaxPool2d((2, 2))
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        h = self.prelu(self.conv(F.pad(x, (1, 1, 1, 1), mode="reflect")))
        h = self.pool(h)
        a, b = torch.chunk(h, 2, dim=1)
        h = torch.cat([F.elu(a), torch.clamp(b, -1, 1)], 1)
        flat = h.permute(0, 2, 3, 1).reshape(h.shape[0], -1, 8)
        top = flat.max(dim=1)
        return self.fc(F.normalize(torch.cat([top.values, flat.mean(1)], 1), dim=1)), flat.argmax(dim=1)


class TCN(nn.Module):
    """A temporal conv net: weight_norm'd dilated causal Conv1d (parametrizations.weight.original0/1),
    left padding cut off by slicing, BatchNorm1d, a Linear over time steps."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.utils.parametrizations.weight_norm(nn.Conv1d(2, 8, 3, dilation=2, padding=4))
        self.c2 = nn.utils.parametrizations.weight_norm(nn.Conv1d(8, 8, 3, dilation=4, padding=8), dim=None)
        self.bn = nn.BatchNorm1d(8)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        h = F.relu(self.c1(x))[..., :-4]
        h = F.relu(self.bn(self.c2(h)))[..., :-8]
        return self.fc(h.transpose(1, 2)).softmax(-1)


class ElmanRNN(nn.Module):
    """nn.RNN with relu, 2 layers, bidirectional, batch_first; its final state read too."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 6)
        self.rnn = nn.RNN(6, 8, num_layers=2, nonlinearity="relu", batch_first=True, bidirectional=True)
        self.fc = nn.Linear(16, 3)

    def forward(self, ids):
        out, h = self.rnn(self.emb(ids))
        return self.fc(out[:, -1]) + h.sum(0).sum(-1, keepdim=True)


class Classic(nn.Module):
    """AlexNet-era pieces: LocalResponseNorm and ChannelShuffle inside nn.Sequential, ZeroPad2d;
    a head of nn.Bilinear and F.cosine_similarity against learned prototypes."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
                                      nn.ZeroPad2d((0, 1, 0, 1)), nn.LocalResponseNorm(3), nn.ChannelShuffle(2))
        self.prototypes = nn.Parameter(torch.randn(4, 8))
        self.pair = nn.Bilinear(8, 8, 4)

    def forward(self, x):
        f = self.features(x).mean((2, 3))
        return self.pair(f, f) + F.cosine_similarity(f[:, None], self.prototypes[None], dim=-1)


class Modulated(nn.Module):
    """StyleGAN2's modulated convolution: per-sample weights from a style, demodulated, run as one
    grouped conv whose group count is the batch size (a size from the graph, not a constant)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 4, 3, 3))
        self.style = nn.Linear(5, 4)

    def forward(self, x, w):
        b, c, h, wd = x.shape
        weight = self.weight[None] * self.style(w)[:, None, :, None, None]
        weight = weight * torch.rsqrt(weight.pow(2).sum([2, 3, 4]) + 1e-8)[:, :, None, None, None]
        out = F.conv2d(x.reshape(1, b * c, h, wd), weight.reshape(b * 8, c, 3, 3), padding=1, groups=b)
        return out.view(b, 8, h, wd)


class AttentionDecoder(nn.Module):
    """A seq2seq decoder stepping nn.LSTMCell in a Python loop (unrolled by export) with additive
    attention over encoder states, and an nn.GRUCell / nn.RNNCell on top."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.cell = nn.LSTMCell(16, 8)
        self.gcell = nn.GRUCell(8, 8)
        self.rcell = nn.RNNCell(8, 8, nonlinearity="relu")
        self.attn = nn.Linear(16, 1)
        self.out = nn.Linear(8, 20)

    def forward(self, enc, tgt):
        h = enc.new_zeros(enc.shape[0], 8)
        c = enc.new_zeros(enc.shape[0], 8)
        outs = []
        for t in range(tgt.shape[1]):
            weights = self.attn(torch.cat([enc, h[:, None].expand(-1, enc.shape[1], -1)], -1)).softmax(1)
            h, c = self.cell(torch.cat([self.emb(tgt[:, t]), (weights * enc).sum(1)], -1), (h, c))
            outs.append(self.out(self.rcell(self.gcell(h, c))))
        return torch.stack(outs, 1)


class SpatialTransformer(nn.Module):
    """The PyTorch tutorial's spatial transformer: a localisation net regresses theta, then
    F.affine_grid and F.grid_sample (bilinear, zeros padding) warp the input."""

    def __init__(self):
        super().__init__()
        self.localization = nn.Sequential(nn.Conv2d(1, 4, 3), nn.MaxPool2d(2), nn.ReLU(True))
        self.fc_loc = nn.Sequential(nn.Linear(4 * 3 * 3, 8), nn.ReLU(True), nn.Linear(8, 6))
        self.fc_loc[2].weight.data.mul_(0.1)
        self.fc_loc[2].bias.data.copy_(torch.tensor([1.0, 0, 0, 0, 1, 0]))

    def forward(self, x):
        theta = self.fc_loc(self.localization(x).view(-1, 4 * 3 * 3)).view(-1, 2, 3)
        grid = F.affine_grid(theta, x.size(), align_corners=False)
        return F.grid_sample(x, grid, align_corners=False)


class Shared(nn.Module):
    """One nn.Sequential (children named by an OrderedDict) called twice, an nn.ModuleDict head
    picked by a keyword argument, an optional mask, a buffer counting calls, a namedtuple out."""

    Out = collections.namedtuple("Out", ["logits", "features"])

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(collections.OrderedDict([("fc", nn.Linear(6, 6)), ("act", nn.Tanh())]))
        self.heads = nn.ModuleDict({"a": nn.Linear(6, 2), "b": nn.Linear(6, 3)})
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x, mask=None, *, which="b"):
        h = self.body(self.body(x))
        if mask is not None:
            h = h.masked_fill(~mask, 0.0)
        self.calls += 1
        return self.Out(self.heads[which](h), h.detach())


class Involution(nn.Module):
    """Per-pixel weights over 3x3 neighbourhoods gathered by F.unfold, and an F.unfold/F.fold round trip."""

    def __init__(self):
        super().__init__()
        self.kernel = nn.Conv2d(4, 9, 1)

    def forward(self, x):
        n, c, h, w = x.shape
        neighbours = F.unfold(x, 3, padding=1).view(n, c, 9, h * w)
        weights = self.kernel(x).view(n, 1, 9, h * w).softmax(2)
        out = (neighbours * weights).sum(2).view(n, c, h, w)
        return F.fold(F.unfold(out, 2, stride=2) * 2, (h, w), 2, stride=2)


class SamplingVAE(nn.Module):
    """pytorch/examples' VAE: the reparameterisation trick draws torch.randn_like(std) in forward."""

    def __init__(self, pixels=64, hidden=32, latent=8):
        super().__init__()
        self.pixels = pixels
        self.fc1, self.fc21, self.fc22 = nn.Linear(pixels, hidden), nn.Linear(hidden, latent), nn.Linear(hidden, latent)
        self.fc3, self.fc4 = nn.Linear(latent, hidden), nn.Linear(hidden, pixels)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, self.pixels))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


class NoisyBlock(nn.Module):
    """Stochastic depth: a whole residual branch dropped per sample (torch.rand < p), in training only."""

    def __init__(self, channels, survival=0.8):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.survival = survival

    def forward(self, x):
        h = F.relu(self.conv(x))
        if self.training:
            keep = torch.rand(x.shape[0], 1, 1, 1) < self.survival
            h = h * keep / self.survival
        return x + h


class NoisyNet(nn.Module):
    """Noise drawn in forward every way torch offers: Gaussian input noise (torch.randn(shape)),
    an empty_like(...).uniform_ jitter, normal_ with a mean and std, a bernoulli mask from
    probabilities, per-sample exponential scales and a randint index into a table."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.block = NoisyBlock(4)
        self.gate = nn.Conv2d(4, 4, 1)
        self.table = nn.Parameter(torch.randn(5, 4))

    def forward(self, x):
        x = x + 0.1 * torch.randn(x.shape)
        h = self.block(self.stem(x))
        h = h + torch.empty_like(h).uniform_(-0.05, 0.05) + torch.empty_like(h).normal_(0.5, 0.1)
        h = h * torch.bernoulli(torch.sigmoid(self.gate(h)))
        h = h * torch.empty(h.shape[0], 1, 1, 1).exponential_(2.0)
        pick = torch.randint(0, 5, (h.shape[0],))
        return h.mean((2, 3)) + self.table[pick], pick


class GraphNet(nn.Module):
    """Message passing on an edge list, as GNN libraries write it: a GCN layer summing neighbours
    with index_add_ and degree normalisation, a max-aggregating layer (scatter_reduce amax,
    include_self=False), a mean readout per graph (scatter_reduce mean) and one-hot node types (scatter_)."""

    def __init__(self, features=6, hidden=8, types=3, graphs=2):
        super().__init__()
        self.types, self.graphs = types, graphs
        self.embed = nn.Linear(features + types, hidden)
        self.gcn = nn.Linear(hidden, hidden)
        self.message = nn.Linear(2 * hidden, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x, node_type, edge_index, graph_of_node):
        one_hot = x.new_zeros(x.shape[0], self.types).scatter_(1, node_type.unsqueeze(1), 1.0)
        h = F.relu(self.embed(torch.cat([x, one_hot], 1)))
        src, dst = edge_index[0], edge_index[1]
        degree = x.new_zeros(x.shape[0]).index_add_(0, dst, x.new_ones(dst.shape[0])).clamp(min=1)
        summed = torch.zeros_like(h).index_add_(0, dst, h[src])
        h = F.relu(self.gcn(summed / degree.unsqueeze(1))) + h
        messages = self.message(torch.cat([h[dst], h[src] - h[dst]], 1))
        index = dst.unsqueeze(1).expand_as(messages)
        h = torch.zeros_like(h).scatter_reduce(0, index, messages, reduce="amax", include_self=False)
        readout = h.new_zeros(self.graphs, h.shape[1]).scatter_reduce(
            0, graph_of_node.unsqueeze(1).expand_as(h), h, reduce="mean", include_self=False)
        return self.head(readout).squeeze(1)


def drop_path(x, drop_prob: float = 0.0, training: bool = False, scale_by_keep: bool = True):
    """timm's stochastic depth: whole samples dropped, the rest scaled by 1 / keep_prob."""
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1 - drop_prob
    shape = (x.shape[0],) + (1,) * (x.ndim - 1)
    random_tensor = x.new_empty(shape).bernoulli_(keep_prob)
    if keep_prob > 0.0 and scale_by_keep:
        random_tensor.div_(keep_prob)
    return x * random_tensor


class DropPath(nn.Module):
    def __init__(self, drop_prob=0.0):
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x):
        return drop_path(x, self.drop_prob, self.training)


class ConvNeXtBlock(nn.Module):
    """ConvNeXt's block: depthwise 7x7, channels-last LayerNorm and MLP, layer scale, timm's DropPath."""

    def __init__(self, dim, drop_prob):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1, self.act, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(0.1 * torch.ones(dim))
        self.drop_path = DropPath(drop_prob) if drop_prob > 0 else nn.Identity()

    def forward(self, x):
        shortcut = x
        x = self.dwconv(x).permute(0, 2, 3, 1)
        x = self.pwconv2(self.act(self.pwconv1(self.norm(x))))
        x = (self.gamma * x).permute(0, 3, 1, 2)
        return shortcut + self.drop_path(x)


class ConvNeXtStage(nn.Module):
    """Three blocks with drop-path rates rising 0, 0.1, 0.2 (two DropPath instances, one class)."""

    def __init__(self, dim=8):
        super().__init__()
        self.blocks = nn.Sequential(*[ConvNeXtBlock(dim, p) for p in (0.0, 0.1, 0.2)])

    def forward(self, x):
        return self.blocks(x).mean((2, 3))


# --------------------------------------------------------------------------- factories
def randomize_batchnorm(module, seed=0):
    """Non-trivial running statistics, so eval-mode BatchNorm is checked for real."""
    g = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
            if m.affine:
                m.weight.data.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.data.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
            m.num_batches_tracked.fill_(7)
    return module


def make(name, seed=0):
    """(module in eval mode, example inputs tuple) for a zoo, workload or HF name."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 1)
    if name in WORKLOADS:
        return _workload(name, g)
    if name in HF:
        return _hf(name, g)
    if name == "resnet18":
        return randomize_batchnorm(resnet18()).eval(), (torch.randn(2, 3, 32, 32, generator=g),)
    if name == "mobilenet":
        return randomize_batchnorm(InvertedResidual()).eval(), (torch.randn(2, 16, 16, 16, generator=g),)
    if name == "transformer":
        return Transformer().eval(), (torch.randint(0, 50, (2, 9), generator=g),)
    if name in ("lstm", "gru"):
        return RNNClassifier(name).eval(), (torch.randint(0, 40, (2, 7), generator=g),)
    if name == "unet":
        return UNet().eval(), (torch.randn(2, 3, 16, 16, generator=g),)
    if name == "audio":
        return Audio().eval(), (torch.randn(2, 1, 64, generator=g),)
    if name == "seq2seq":
        return Seq2Seq().eval(), (torch.randint(0, 20, (2, 5), generator=g), torch.randint(0, 20, (2, 4), generator=g))
    if name == "gated":
        return randomize_batchnorm(Gated()).eval(), (torch.randn(2, 4, 5, 5, generator=g),)
    if name == "rnn":
        return ElmanRNN().eval(), (torch.randint(0, 20, (2, 7), generator=g),)
    if name == "classic":
        return Classic().eval(), (torch.randn(2, 3, 8, 8, generator=g),)
    if name == "modulated":
        return Modulated().eval(), (torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 5, generator=g))
    if name == "decoder":
        return AttentionDecoder().eval(), (torch.randn(2, 5, 8, generator=g), torch.randint(1, 20, (2, 3), generator=g))
    if name == "stn":
        return SpatialTransformer().eval(), (torch.randn(2, 1, 8, 8, generator=g),)
    if name == "shared":
        return Shared().eval(), (torch.randn(3, 6, generator=g), torch.rand(3, 6, generator=g) > 0.3)
    if name == "sampling_vae":
        return SamplingVAE().eval(), (torch.rand(2, 1, 8, 8, generator=g),)
    if name == "noisy":
        return NoisyNet().eval(), (torch.randn(2, 3, 6, 6, generator=g),)
    if name == "graph":
        nodes, edges = 7, 16
        edge_index = torch.randint(0, nodes, (2, edges), generator=g)
        return GraphNet().eval(), (torch.randn(nodes, 6, generator=g), torch.randint(0, 3, (nodes,), generator=g),
                                   edge_index, torch.tensor([0, 0, 0, 1, 1, 1, 1]))
    if name == "convnext":
        return ConvNeXtStage().eval(), (torch.randn(2, 8, 8, 8, generator=g),)
    if name == "involution":
        return Involution().eval(), (torch.randn(2, 4, 6, 8, generator=g),)
    if name == "tcn":
        return randomize_batchnorm(TCN()).eval(), (torch.randn(2, 2, 20, generator=g),)
    if name == "patches":
        return PatchAttention().eval(), (torch.randn(2, 3, 16, 16, generator=g),)
    if name == "peaks":
        return Peaks().eval(), (torch.randn(2, 3, 8, 8, generator=g),)
    raise KeyError(name)


def _workload(name, g):
    """The workloads' own torch twins (gan G and D, cnn, vae, ddim UNet at its smoke size)."""
    if name in ("gan_g", "gan_d"):
        from flaxport.workloads.gan import config, model_torch

        c = config.get_config("default")
        m = model_torch.generator(c) if name == "gan_g" else model_torch.discriminator(c)
        return randomize_batchnorm(m).eval(), (torch.randn(8, c.z_dim if name == "gan_g" else 1, generator=g),)
    if name == "cnn":
        from flaxport.workloads.cnn import config, model_torch

        c = config.get_config("default")
        return randomize_batchnorm(model_torch.CNN(c)).eval(), (torch.rand(4, 3, 32, 32, generator=g),)
    if name == "vae":
        from flaxport.workloads.vae import config, model_torch

        c = config.get_config("default")
        return model_torch.VAE(c).eval(), (torch.rand(4, c.image_size ** 2, generator=g),
                                           torch.randn(4, c.latents, generator=g))
    from flaxport.workloads.ddim import config, model_torch

    c = config.get_config("smoke")
    m = model_torch.UNet(c)
    torch.nn.init.normal_(m.head.weight, generator=g)  # keras zero-initialises the head
    return randomize_batchnorm(m).eval(), (torch.randn(2, 3, 16, 16, generator=g), torch.rand(2, 1, 1, 1, generator=g))


def _hf(name, g):
    """HuggingFace models from tiny configs with random weights."""
    from flaxport.bench.zoos import import_torchvision

    import_torchvision()  # transformers imports it where it is installed (a CUDA build here: see bench.zoos)
    import transformers

    if name == "bert":
        cfg = transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=32, max_position_embeddings=32)
        return transformers.BertModel(cfg).eval(), (torch.randint(0, 50, (2, 7), generator=g),)
    if name == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=50, n_embd=16, n_layer=2, n_head=2, n_positions=32, use_cache=False,
                                      bos_token_id=0, eos_token_id=0)
        return transformers.GPT2Model(cfg).eval(), (torch.randint(0, 50, (2, 7), generator=g),)
    cfg = transformers.ViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
                                 image_size=16, patch_size=4, num_channels=3)
    return transformers.ViTModel(cfg).eval(), (torch.randn(2, 3, 16, 16, generator=g),)


NAMES = ("resnet18", "mobilenet", "transformer", "lstm", "gru", "unet")
MORE = ("audio", "seq2seq", "gated", "patches", "peaks", "tcn", "rnn", "classic", "modulated", "decoder", "stn", "shared",
        "involution", "graph")
WORKLOADS = ("gan_g", "gan_d", "cnn", "vae", "ddim")
HF = ("bert", "gpt2", "vit")
SAMPLING = ("sampling_vae", "noisy", "convnext")  # forwards that draw random numbers


@functools.lru_cache(maxsize=None)
def translated(name):
    """(module, inputs, Translation) for a name, translated once per test process."""
    from flaxport.translate import translate

    module, inputs = make(name)
    return module, inputs, translate(module, *inputs)


_REFUSE = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("flaxport", "torch"):
            raise ImportError(name + " is not installed here")
sys.meta_path.insert(0, Refuse())
"""


def run_without_flaxport_or_torch(code: str) -> None:
    """Run Python `code` in a subprocess where importing flaxport or torch fails (raises if it fails)."""
    subprocess.run([sys.executable, "-c", _REFUSE + textwrap.dedent(code)], check=True, timeout=300)
