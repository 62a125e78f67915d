"""The models the speed benchmarks translate: torchvision's and timm's CNNs, ViT-B/16 and a small GPT.

A name is torchvision's (`resnet18`), timm's with a `timm/` prefix (`timm/efficientnet_b0`)
or `gpt-small`; `build(name)` returns the torch module in eval mode, randomly initialised
(weights=None: nothing is downloaded), and `example(name, batch, size)` its input.
"""
from __future__ import annotations

# One or two members of every torchvision classifier family that is a CNN.
TORCHVISION_CNNS = ("alexnet", "vgg11_bn", "resnet18", "resnet50", "resnext50_32x4d", "wide_resnet50_2",
                    "densenet121", "squeezenet1_1", "googlenet", "inception_v3", "shufflenet_v2_x1_0",
                    "mobilenet_v2", "mobilenet_v3_small", "mobilenet_v3_large", "mnasnet1_0", "efficientnet_b0",
                    "efficientnet_v2_s", "regnet_x_400mf", "regnet_y_400mf", "convnext_tiny")
# A small member of each of the 43 timm CNN families the coverage benchmark sweeps (ResNet's
# family has three, EfficientNet's MixNet too): between them timm's BatchNormAct2d, DLA's
# nested trees, HRNet's fuse layers, reparameterisable blocks, split attention, selective
# kernels, weight-standardised convolutions, NAS cells and token mixers.
TIMM_CNNS = ("timm/resnet26d", "timm/resnet50d", "timm/seresnext26d_32x4d", "timm/res2net50_26w_4s",
             "timm/resnest14d", "timm/selecsls42b", "timm/convnext_atto", "timm/vgg11",
             "timm/efficientnet_b0", "timm/mobilenetv3_large_100", "timm/regnety_008", "timm/rexnet_100",
             "timm/ghostnet_100", "timm/mixnet_s", "timm/densenet121", "timm/dla34", "timm/hrnet_w18_small",
             "timm/repvgg_a0", "timm/convmixer_1024_20_ks9_p14", "timm/cs3darknet_s", "timm/dpn48b",
             "timm/fasternet_t0", "timm/hardcorenas_a", "timm/hgnetv2_b0", "timm/inception_next_atto",
             "timm/inception_v3", "timm/inception_resnet_v2", "timm/inception_v4", "timm/lcnetv2_small",
             "timm/mambaout_femto", "timm/poolformer_s12", "timm/nasnetalarge", "timm/eca_nfnet_l0",
             "timm/pnasnet5large", "timm/rdnet_tiny", "timm/repghostnet_100", "timm/repvit_m1",
             "timm/resnetv2_50", "timm/legacy_seresnet18", "timm/skresnet18", "timm/starnet_s1",
             "timm/tresnet_m", "timm/ese_vovnet19b_dw", "timm/legacy_xception", "timm/xception41",
             "timm/fastvit_t8")
CNNS = TORCHVISION_CNNS + TIMM_CNNS
# torchvision's classifiers that are not CNNs, by name prefix.
TRANSFORMERS = ("vit_", "swin_", "maxvit_")
# What the GPU table runs: a CNN, a vision transformer and a language model.
GPU_MODELS = ("resnet50", "vit_b_16", "gpt-small")
# Models whose input must be at least this many pixels a side.
MIN_SIZE = {"inception_v3": 75, "timm/inception_v3": 75, "timm/inception_resnet_v2": 75, "timm/inception_v4": 75,
            "vit_b_16": 224}
GPT_SIZES = {"vocab": 8192, "context": 256, "layers": 6, "heads": 8, "width": 512}


def torchvision_cnns() -> list[str]:
    """Every torchvision classifier that is a CNN (its list less ViT, Swin and MaxViT), sorted."""
    from flaxport.bench.zoos import import_torchvision

    models = import_torchvision().models
    return [n for n in sorted(models.list_models(module=models)) if not n.startswith(TRANSFORMERS)]


def build(name: str):
    """The torch module `name`, in eval mode, randomly initialised from torch's seed 0."""
    import torch

    torch.manual_seed(0)
    if name == "gpt-small":
        return _gpt().eval()
    if name.startswith("timm/"):
        from flaxport.bench.zoos import import_timm

        return import_timm().create_model(name[len("timm/"):], pretrained=False).eval()
    from flaxport.bench.zoos import import_torchvision

    models = import_torchvision().models
    kwargs = {"aux_logits": False, "init_weights": True} if name in ("inception_v3", "googlenet") else {}
    return getattr(models, name)(weights=None, **kwargs).eval()


def example(name: str, batch: int, size: int):
    """The model's input: images (batch, 3, size, size), or token ids (batch, size) for gpt-small."""
    import torch

    g = torch.Generator().manual_seed(1)
    if name == "gpt-small":
        return torch.randint(0, GPT_SIZES["vocab"], (batch, size), generator=g)
    return torch.randn(batch, 3, size, size, generator=g)


def fits(name: str, size: int) -> bool:
    """Whether `name` takes inputs of `size` (ViT-B/16 only 224; gpt-small a context up to 256)."""
    if name == "gpt-small":
        return size <= GPT_SIZES["context"]
    if name == "vit_b_16":
        return size == 224
    return size >= MIN_SIZE.get(name, 0)


def _gpt():
    """A GPT-2-style decoder: token and position embeddings, pre-norm blocks with causal attention
    (F.scaled_dot_product_attention) and a GELU MLP, a tied language-model head."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self, width, heads):
            super().__init__()
            self.heads = heads
            self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
            q, k, v = (a.view(b, t, self.heads, c // self.heads).transpose(1, 2) for a in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self, vocab, context, layers, heads, width):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
            self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            return (self.ln_f(x) @ self.wte.weight.t()).flatten(0, 1)  # (batch * tokens, vocab)

    return GPT(**GPT_SIZES)
