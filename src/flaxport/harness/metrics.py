"""metrics.jsonl (one JSON record per epoch), console lines, optional TensorBoard."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path


class MetricsWriter:
    """Append-only JSONL of epoch records; on resume, records past the checkpoint are cut."""

    def __init__(self, workdir, resume_from_epoch: int | None = None, tensorboard: bool = True):
        self.path = Path(workdir) / "metrics.jsonl"
        if resume_from_epoch is None:
            self.path.write_text("")
        else:
            self._truncate(resume_from_epoch)
        self._tb = None
        if tensorboard:
            try:
                from tensorboardX import SummaryWriter

                self._tb = SummaryWriter(str(Path(workdir) / "tb"))
            except ImportError:
                pass

    def _truncate(self, epochs_done: int):
        kept = []
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by a crash mid-write
                if rec.get("epoch", 0) <= epochs_done:
                    kept.append(line)
        self.path.write_text("".join(l + "\n" for l in kept))

    def write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record, default=_plain) + "\n")
        if self._tb is not None:
            for k, v in _flat(record):
                self._tb.add_scalar(k, v, record["epoch"])
            self._tb.flush()

    def close(self):
        if self._tb is not None:
            self._tb.close()


def _plain(o):
    return o.tolist() if hasattr(o, "tolist") else str(o)


def _flat(record, prefix=""):
    for k, v in record.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}/")
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and k != "epoch":
            yield f"{prefix}{k}", v


def console_line(record: dict) -> str:
    """'epoch 3 | g_loss 0.2600 d_loss 0.2500 | w1 0.0710 | 1.02 s' style summary."""
    parts = [f"epoch {record['epoch']}"]
    for group in ("train", "quality"):
        vals = record.get(group, {})
        items = [f"{k} {_fmt(v)}" for k, v in vals.items()]
        if items:
            parts.append(" ".join(items))
    parts.append(f"{record['epoch_seconds']:.2f} s")
    return " | ".join(parts)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, list):
        return "/".join(_fmt(x) for x in v)
    return str(v)


def info(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
