"""Pictures of a DDIM run: samples.png, a grid of the samples from fixed noise."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

MIN_SIDE = 256  # small grids (16x16 images) are enlarged, pixel for pixel, to at least this


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


def write_pictures(workdir, data, artifacts, label: str) -> list:
    """samples.png from artifacts['samples'] (N, H, W, C); the label goes in the PNG's Title."""
    from PIL import Image, PngImagePlugin

    if "samples" not in artifacts:
        return []
    pixels = grid(artifacts["samples"])
    scale = max(1, -(-MIN_SIDE // pixels.shape[1]))
    pixels = pixels.repeat(scale, 0).repeat(scale, 1)
    meta = PngImagePlugin.PngInfo()
    meta.add_text("Title", f"{label}: {data.name}, {len(artifacts['samples'])} samples from fixed noise, EMA weights")
    path = Path(workdir) / "samples.png"
    Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).save(path, pnginfo=meta)
    return [path]
