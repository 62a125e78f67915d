"""What `translate` tells a user when their model cannot be translated (one line each)."""
from __future__ import annotations

from flaxport.errors import UserError


class TranslateError(UserError):
    """The model cannot be captured or translated; the message says what to change."""


class ExportError(TranslateError):
    """torch.export could not capture the forward (data-dependent control flow, unsupported Python)."""


class UnsupportedOpsError(TranslateError):
    """ATen ops with no translation: one line per distinct (op, module path, source line)."""

    def __init__(self, items):
        self.items = list(dict.fromkeys(items))  # (op, module path, source) in first-seen order, no repeats
        lines = [f"{len(self.items)} op(s) with no translation:"]
        for op, path, source in self.items:
            where = f" in {path}" if path else " in the top module"
            lines.append(f"  {op}{where}" + (f" ({source})" if source else ""))
        super().__init__("\n".join(lines))
