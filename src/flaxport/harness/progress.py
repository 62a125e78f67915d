"""A progress bar per epoch (tqdm on stderr) with the loss and steps/s."""
from __future__ import annotations

import sys


class EpochProgress:
    def __init__(self, steps: int, enabled: bool = True):
        self.steps = steps
        self.enabled = enabled and sys.stderr.isatty()
        self._bar = None

    def start(self, epoch: int, epochs: int):
        if not self.enabled:
            return
        from tqdm import tqdm

        self._bar = tqdm(total=self.steps, desc=f"epoch {epoch}/{epochs}", unit="step", leave=True,
                         dynamic_ncols=True, file=sys.stderr)

    def advance(self, n: int):
        if self._bar is not None:
            self._bar.update(n)

    def finish(self, means: dict, steps_per_second: float, quality: dict | None = None):
        """Final postfix: train means, the epoch's scalar quality (val loss, accuracy, ...), steps/s."""
        if self._bar is not None:
            scalars = {k: v for k, v in (quality or {}).items() if isinstance(v, (int, float))}
            self._bar.set_postfix({**{k: f"{v:.4f}" for k, v in {**means, **scalars}.items()},
                                   "steps/s": f"{steps_per_second:.0f}"})
            self.close()  # the bar stays on screen with its final numbers; the epoch line follows

    def close(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None
