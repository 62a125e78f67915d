"""The seed article's picture: histogram of generated samples over the data's."""
from __future__ import annotations

from pathlib import Path


def write_pictures(workdir, data, artifacts, label: str) -> list:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(workdir) / "histogram.png"
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.hist(artifacts["samples"], 100, alpha=0.5, label="generated", density=True)
    ax.hist(data.train["x"][:, 0], 100, alpha=0.5, label="data", density=True)
    ax.set_title(label)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return [path]
