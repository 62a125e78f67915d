"""Pictures of a VAE run: reconstructions beside their inputs, and samples from the prior."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def _grid(images, cols: int) -> np.ndarray:
    n, h, w = images.shape
    rows = -(-n // cols)
    out = np.ones((rows * (h + 2), cols * (w + 2)))
    for i, im in enumerate(images):
        r, c = divmod(i, cols)
        out[r * (h + 2) + 1:r * (h + 2) + 1 + h, c * (w + 2) + 1:c * (w + 2) + 1 + w] = im
    return out


def write_pictures(workdir, data, artifacts, label: str) -> list:
    """reconstructions.png (input | output pairs) and samples.png (prior samples)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workdir, paths = Path(workdir), []
    if "inputs" in artifacts:
        pairs = np.stack([artifacts["inputs"], artifacts["reconstructions"]], axis=1)
        pairs = pairs.reshape(-1, *pairs.shape[2:])
        grids = (("reconstructions.png", pairs, 8, "input | reconstruction (posterior mean)"),
                 ("samples.png", artifacts["samples"], 8, "samples from the prior (Bernoulli means)"))
        for name, images, cols, title in grids:
            fig, ax = plt.subplots(figsize=(6, 6 * (-(-len(images) // cols)) / cols + 0.6))
            ax.imshow(_grid(np.asarray(images), cols), cmap="gray", vmin=0, vmax=1)
            ax.set_axis_off()
            ax.set_title(f"{label}\n{data.name}: {title}", fontsize=9)
            fig.tight_layout()
            paths.append(workdir / name)
            fig.savefig(paths[-1], dpi=100)
            plt.close(fig)
    return paths
