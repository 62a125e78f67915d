"""Pictures of a CNN run: confusion matrix and learning curves."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write_pictures(workdir, data, artifacts, label: str) -> list:
    """confusion.png (test set, last evaluation) and learning_curve.png (from metrics.jsonl)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workdir, paths = Path(workdir), []
    cm = artifacts.get("confusion")
    if cm is not None:
        cm = np.asarray(cm)
        classes = data.meta.get("classes", [str(i) for i in range(len(cm))])
        fig, ax = plt.subplots(figsize=(6.4, 5.6))
        im = ax.imshow(cm, cmap="Blues")
        for (i, j), v in np.ndenumerate(cm):
            ax.text(j, i, str(v), ha="center", va="center", fontsize=7,
                    color="white" if v > cm.max() / 2 else "black")
        ax.set_xticks(range(len(classes)), classes, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(classes)), classes, fontsize=8)
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        acc = np.trace(cm) / max(cm.sum(), 1)
        ax.set_title(f"{label}\n{data.name} test accuracy {acc:.4f}", fontsize=9)
        fig.colorbar(im, ax=ax)
        fig.tight_layout()
        paths.append(workdir / "confusion.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
        (workdir / "confusion.json").write_text(json.dumps({"classes": classes, "matrix": cm.tolist()}))

    records = _records(workdir / "metrics.jsonl")
    if records:
        epochs = [r["epoch"] for r in records]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
        a1.plot(epochs, [r["train"]["loss"] for r in records], "o-", label="train loss")
        a1.plot(epochs, [r["quality"]["val_loss"] for r in records], "s-", label="val loss")
        a1.set_xlabel("epoch")
        a1.set_ylabel("NLL (nats)")
        a1.legend()
        a2.plot(epochs, [r["quality"]["accuracy"] for r in records], "o-", color="tab:green")
        a2.set_xlabel("epoch")
        a2.set_ylabel("val accuracy")
        fig.suptitle(label, fontsize=9)
        fig.tight_layout()
        paths.append(workdir / "learning_curve.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def _records(path: Path) -> list:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "loss" in rec.get("train", {}) and "val_loss" in rec.get("quality", {}):
            out.append(rec)
    return out
