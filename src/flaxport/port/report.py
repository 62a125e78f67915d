"""The rows of a parity or train-step report, the verdict, the first divergence, and the text.

A row compares one tensor: max|torch - flax| against atol + rtol * max|torch|. After a
float32 check failed and was repeated in float64 (port/noise.py), each failing row carries
its cause: float32 rounding (it passes in float64) or a real divergence (it fails there too).
`ok` counts only real divergences; `strict_ok` every row at the report's own precision.
"""
from __future__ import annotations

import dataclasses
import json
import math

ROUNDING = "float32 rounding"  # Row.cause of a float32 failure that passes in float64
REAL = "real divergence"  # ... and of one that fails there too
# ... and of a float64 failure no larger than torch's own change when its inputs move by a rounding
SENSITIVE = "within torch's own sensitivity"


@dataclasses.dataclass
class Row:
    """One comparison. phase: 'forward' (a layer's output), 'output', 'running_stats', 'grad'
    (check_step adds 'loss', 'param', 'moment'); step: check_step's step number (1, 2, ...).
    cause: after a float64 recheck, 'float32 rounding (passes in float64 at X)' or
    'real divergence (fails in float64 too, X)' for a failing row."""

    phase: str
    torch_name: str
    flax_name: str
    shape: tuple | None  # Flax-side shape (gradients are compared in torch's layout)
    max_abs: float
    max_rel: float  # max_abs / max|torch|
    ok: bool
    note: str = ""
    cause: str = ""
    step: int | None = None
    not_finite: int = 0  # NaN/inf values both sides give at the same places (compared as equal)

    @property
    def rounding(self) -> bool:
        """A failure shown to be rounding: float32's (it passes in float64), or float64's in a model
        so ill-conditioned that torch itself moves as far when its inputs change in the 14th digit."""
        return not self.ok and self.cause.startswith((ROUNDING, SENSITIVE))

    @property
    def key(self) -> tuple:
        return (self.step, self.phase, self.torch_name, self.flax_name)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        for k in ("max_abs", "max_rel"):
            d[k] = d[k] if math.isfinite(d[k]) else str(d[k])
        d["shape"] = list(self.shape) if self.shape is not None else None
        return d


class _Report:
    """What ParityReport and check_step's StepReport share: rows, verdict, first divergence, text."""

    @property
    def ok(self) -> bool:
        """No real divergence: every row passes, or fails only by float32 rounding (it passes in float64)."""
        return all(r.ok or r.rounding for r in self.rows)

    @property
    def strict_ok(self) -> bool:
        """Every row passes at the report's own precision and tolerance."""
        return all(r.ok for r in self.rows)

    @property
    def first_divergence(self) -> Row | None:
        """The first failing row (in the report's order) that is not float32 rounding, or None."""
        return next((r for r in self.rows if not r.ok and not r.rounding), None)

    def _verdict(self) -> str:
        first = self.first_divergence
        if first is None:
            rounding = sum(r.rounding and r.cause.startswith(ROUNDING) for r in self.rows)
            sensitive = sum(r.rounding and r.cause.startswith(SENSITIVE) for r in self.rows)
            return "OK" + (f" ({rounding} row{'s' if rounding != 1 else ''} off by float32 rounding only: "
                           "each passes in float64)" if rounding else "") + (
                f" ({sensitive} row{'s' if sensitive != 1 else ''} off by no more than torch's own outputs move "
                "when its inputs change in the 14th digit)" if sensitive else "")
        at = f"step {first.step} " if first.step is not None else ""
        return f"FIRST DIVERGENCE at {at}torch {first.torch_name!r} / flax {first.flax_name!r} ({first.phase})"

    def _footer(self) -> list:
        lines = []
        if getattr(self, "dropout", ""):
            lines.append(f"dropout: {self.dropout}")
        if getattr(self, "recheck", ""):
            lines.append(f"float64 recheck: {self.recheck}")
        for w in getattr(self, "why", []):
            lines.append(f"why float32 differs here: {w}")
        return lines

    def table(self) -> list:
        first = self.first_divergence
        steps = any(r.step is not None for r in self.rows)
        table = [("#",) + (("step",) if steps else ()) + ("phase", "torch", "flax", "shape", "max_abs", "rel", "")]
        for i, r in enumerate(self.rows):
            status = "ok" if r.ok else ("FAIL <- first" if r is first else "FAIL")
            status += (f" ({r.note})" if r.note else "") + (f": {r.cause}" if r.cause else "")
            table.append((str(i),) + ((str(r.step or ""),) if steps else ()) + (
                r.phase, r.torch_name, r.flax_name, "x".join(map(str, r.shape or ())), f"{r.max_abs:.3g}",
                f"{r.max_rel:.3g}", status))
        widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
        return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]

    def to_json(self, indent=None) -> str:
        return json.dumps(self.to_dict(), indent=indent)


@dataclasses.dataclass
class ParityReport(_Report):
    rows: list
    train: bool
    atol: float
    rtol: float
    dropout: str = ""  # how dropout was handled in train mode
    recheck: str = ""  # what the float64 recheck found ("" when none ran)
    why: list = dataclasses.field(default_factory=list)  # docs/porting.md entries that explain rounding rows
    float64_report: "ParityReport | None" = None  # the float64 recheck's own report, when one ran
    flax_dtype: str = ""  # the dtype the Flax side's output came out in

    def to_dict(self) -> dict:
        first = self.first_divergence
        return {"ok": self.ok, "strict_ok": self.strict_ok, "train": self.train, "atol": self.atol,
                "rtol": self.rtol, "dropout": self.dropout, "recheck": self.recheck, "why": list(self.why),
                "first_divergence": first.to_dict() if first else None, "rows": [r.to_dict() for r in self.rows]}

    def __str__(self) -> str:
        mode = "train" if self.train else "eval"
        head = f"parity ({mode} mode, atol={self.atol:g}, rtol={self.rtol:g}): {self._verdict()}"
        return "\n".join([head] + self.table() + self._footer())
