"""metrics.jsonl (one JSON record per epoch), console lines, optional TensorBoard."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np


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
        kept, text = [], ""
        if self.path.exists():
            text = self.path.read_text()
            for line in text.splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by a crash mid-write
                if isinstance(rec, dict) and isinstance(rec.get("epoch"), int) and rec["epoch"] <= epochs_done:
                    kept.append(line)
        new = "".join(l + "\n" for l in kept)
        if new != text:  # atomically: a crash here must not lose the records kept
            from flaxport.harness.workdir import write_text

            write_text(self.path, new)

    def write(self, record: dict) -> None:
        try:
            with self.path.open("a") as f:
                f.write(json.dumps(record, default=plain) + "\n")
        except OSError as e:  # a full disk or a workdir gone read-only: one line, not a traceback
            from flaxport.errors import UserError

            raise UserError(f"cannot write {self.path}: {e.strerror or e}") from e
        if self._tb is not None:
            for k, v in _flat(record):
                self._tb.add_scalar(k, v, record["epoch"])
            self._tb.flush()

    def close(self):
        if self._tb is not None:
            self._tb.close()


def plain(o):
    """A NumPy value as JSON takes it (a list or number), else its text."""
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


def steps_per_epoch(data, batch_size: int) -> int:
    """Full batches in `data.train` (the partial last batch is dropped); at least one."""
    n = len(next(iter(data.train.values())))
    if n < batch_size:
        from flaxport.errors import UserError

        raise UserError(f"{data.name} has {n} samples, fewer than one batch of {batch_size}")
    return n // batch_size


def first_nonfinite(metrics: dict) -> int | None:
    """Index of the first step whose metrics {name: (steps, ...)} hold a NaN or inf, or None."""
    rows = np.concatenate([np.asarray(v).reshape(len(v), -1) for v in metrics.values()], axis=1)
    bad = np.flatnonzero(~np.isfinite(rows).all(axis=1))
    return int(bad[0]) if bad.size else None


class EpochLog:
    """What both loops (Flax and PyTorch) do around an epoch: progress bar, NaN check,
    metrics.jsonl record, console line. Keeps `history` and `epoch_seconds`."""

    def __init__(self, workdir, steps: int, start: int, progress: bool = True, quiet: bool = False,
                 write: bool = True):
        """write: False in every process but the first of a multi-process run (one metrics.jsonl)."""
        from flaxport.harness.progress import EpochProgress

        self.workdir, self.steps, self.quiet = Path(workdir), steps, quiet
        self.writer = MetricsWriter(workdir, resume_from_epoch=start or None) if write else None
        self.bar = EpochProgress(steps, enabled=progress and not quiet)
        self.history, self.epoch_seconds = [], []

    def start(self, epoch: int, epochs: int) -> None:
        self.bar.start(epoch + 1, epochs)

    def advance(self, n: int) -> None:
        self.bar.advance(n)

    def end(self, epoch: int, step_metrics: dict, seconds: float, run_seconds: float, evaluate, **extra):
        """Check, record and print epoch `epoch` (0-based); returns evaluate()'s (quality, artifacts).

        seconds: the epoch's wall time as reported (compile included on a first JAX epoch);
        run_seconds: the training part alone, for steps/s. Raises TrainingDiverged on NaN/inf.
        """
        from flaxport.errors import TrainingDiverged

        bad = first_nonfinite(step_metrics)
        if bad is not None:
            self.bar.close()
            raise TrainingDiverged(
                f"loss became NaN/inf at step {epoch * self.steps + bad + 1} (epoch {epoch + 1}); training stopped, "
                f"last good checkpoint: {f'epoch {epoch}' if epoch else 'none'} in {self.workdir / 'checkpoints'}"
            )
        means = {k: float(np.mean(v)) for k, v in step_metrics.items()}
        quality, artifacts = evaluate()
        self.bar.finish(means, self.steps / run_seconds, quality)
        record = {"epoch": epoch + 1, "train": means, "quality": quality, "epoch_seconds": seconds,
                  "steps": self.steps, **extra}
        if self.writer is not None:
            self.writer.write(record)
        self.history.append(record)
        self.epoch_seconds.append(seconds)
        if not self.quiet:
            info(console_line(record))
        return quality, artifacts

    def close(self) -> None:
        self.bar.close()
        if self.writer is not None:
            self.writer.close()
