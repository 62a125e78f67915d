"""Pictures of a DDIM run: samples.png (samples from fixed noise) and diffusion.png (a few
of them along the reverse process). `compare` sets each twin's samples side by side in its
compare.png (flaxport.bench.figure)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

CELL_INCHES = 0.9  # one sample's cell: ~90 pixels at dpi 100, a 32x32 image shown ~3x
DPI = 100
PATH_COLUMNS = 11  # states of the reverse process shown in diffusion.png


def grid(images, cols: int | None = None, pad: int = 2) -> np.ndarray:
    """images float (N, H, W, C) in [0, 1] -> uint8 (rows * (H + pad) + pad, ..., C) on white."""
    images = np.asarray(images, np.float32)
    n, h, w, c = images.shape
    cols = cols or math.ceil(math.sqrt(n))
    rows = -(-n // cols)
    out = np.ones((rows * (h + pad) + pad, cols * (w + pad) + pad, c), np.float32)
    for i, im in enumerate(images):
        r, k = divmod(i, cols)
        out[pad + r * (h + pad):pad + r * (h + pad) + h, pad + k * (w + pad):pad + k * (w + pad) + w] = im
    return np.rint(np.clip(out, 0, 1) * 255).astype(np.uint8)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _show(ax, pixels):
    ax.imshow(pixels[..., 0] if pixels.shape[-1] == 1 else pixels, cmap="gray", vmin=0, vmax=255,
              interpolation="nearest")
    ax.set_axis_off()


def _heading(label: str, about: dict) -> str:
    """'ddim jax-step, epoch 50' (+ the framework where the label lacks it)."""
    framework = about.get("framework")
    return label if not framework or framework in label else f"{label} ({framework})"


def _side(images) -> str:
    h, w = np.shape(images)[1:3]
    return f"{h}x{w}"


def write_pictures(workdir, data, artifacts, label: str) -> list:
    """samples.png from artifacts['samples'] (N, H, W, C) and diffusion.png from
    artifacts['diffusion'] (n, steps + 1, H, W, C), titled with `label`, the data, the
    DDIM steps and the weights used (artifacts['about'])."""
    if "samples" not in artifacts:
        return []
    plt = _pyplot()
    workdir, about, paths = Path(workdir), artifacts.get("about", {}), []
    samples = np.asarray(artifacts["samples"])
    steps, weights = about.get("steps", "?"), about.get("weights", "EMA")
    cols = math.ceil(math.sqrt(len(samples)))
    rows = -(-len(samples) // cols)
    fig, ax = plt.subplots(figsize=(max(4.0, cols * CELL_INCHES), rows * CELL_INCHES + 0.8))
    _show(ax, grid(samples, cols))
    ax.set_title(f"{_heading(label, about)}\n{data.name} {_side(samples)}: {len(samples)} samples from fixed noise\n"
                 f"{steps} DDIM steps, {weights} weights", fontsize=9)
    fig.tight_layout()
    paths.append(workdir / "samples.png")
    fig.savefig(paths[-1], dpi=DPI)
    plt.close(fig)

    if "diffusion" in artifacts:
        path = np.asarray(artifacts["diffusion"])  # (n, steps + 1, H, W, C)
        n, states = path.shape[:2]
        shown = np.unique(np.rint(np.linspace(0, states - 1, min(states, PATH_COLUMNS))).astype(int))
        fig, axes = plt.subplots(n, len(shown), figsize=(max(4.0, len(shown) * CELL_INCHES), n * CELL_INCHES + 1.1),
                                 squeeze=False)
        for r in range(n):
            for c, k in enumerate(shown):
                _show(axes[r, c], np.rint(np.clip(path[r, k], 0, 1) * 255).astype(np.uint8))
                if r == 0:  # the diffusion time each step starts from (1 = pure noise)
                    axes[r, c].set_title("output" if k == states - 1 else f"t={1 - k / (states - 1):.2f}", fontsize=8)
        fig.suptitle(f"{_heading(label, about)}\n{data.name} {_side(samples)}: the reverse process of {n} samples\n"
                     f"{states - 1} DDIM steps, {weights} weights; t = 1 is pure noise", fontsize=9)
        fig.tight_layout()
        paths.append(workdir / "diffusion.png")
        fig.savefig(paths[-1], dpi=DPI)
        plt.close(fig)
    return paths
