"""TrainState that carries BatchNorm statistics (and EMA weights where a workload uses them).

The seed article's CustomTrainState, done with today's Flax: the statistics are a field
of the state, so a pure step takes one state and returns one state.
"""
from __future__ import annotations

from typing import Any

from flax.training import train_state


class TrainState(train_state.TrainState):
    """Fields: step, params, opt_state, batch_stats, ema_params (static: apply_fn, tx)."""

    batch_stats: Any = None
    ema_params: Any = None

    def variables(self, params=None, batch_stats=None) -> dict:
        """The variables dict for `apply_fn`, with params/batch_stats optionally swapped in."""
        out = {"params": self.params if params is None else params}
        stats = self.batch_stats if batch_stats is None else batch_stats
        if stats is not None:
            out["batch_stats"] = stats
        return out

    def apply_train(self, params, x, **kwargs):
        """Train-mode forward: (output, new batch_stats). Gradients flow through `params`."""
        out, updates = self.apply_fn(self.variables(params), x, train=True, mutable=["batch_stats"], **kwargs)
        return out, updates.get("batch_stats", {})

    def apply_eval(self, x, params=None, **kwargs):
        """Eval-mode forward with the running statistics."""
        return self.apply_fn(self.variables(params), x, train=False, **kwargs)
