"""The torch forward run once on the example inputs before it is captured, so that inputs
the model cannot take are named where torch refuses them (the module, its line), not as
a failed capture or an error deep inside the proof."""
from __future__ import annotations

import contextlib
import traceback
from pathlib import Path

from flaxport.translate.errors import TranslateError


class ForwardError(TranslateError):
    """The torch module's own forward fails on the example inputs."""


def check_forward(module, args, kwargs) -> None:
    """Run a copy of `module` on (args, kwargs) in its own mode, without gradients and
    without touching torch's random state; ForwardError (one line) naming the innermost
    submodule running and the user's source line when torch raises."""
    import torch

    from flaxport.translate.capture import _quiet
    from flaxport.translate.copies import WritesShared, on_copy

    def forward(m):
        running = []  # (path, module) of the calls entered and not yet returned, outermost first
        names = {id(sub): path for path, sub in m.named_modules()}

        def enter(sub, inputs):
            running.append(sub)

        def leave(sub, inputs, output):  # returns None: the output stays as it is
            running.pop()

        hooks = []
        for sub in m.modules():
            hooks += [sub.register_forward_pre_hook(enter), sub.register_forward_hook(leave)]
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad(), _quiet():
                m(*args, **kwargs)
        except (MemoryError, KeyboardInterrupt, WritesShared):
            raise
        except Exception as e:  # noqa: BLE001 - the user's forward: one line naming where it failed
            raise ForwardError(describe(e, [(names.get(id(s), "?"), s) for s in running])) from e
        finally:
            for h in hooks:
                h.remove()

    on_copy(module, forward, training=None)


def describe(e: Exception, running: list) -> str:
    """'the forward fails on the example inputs at FILE:LINE `code`, in PATH (Repr): Type: message'."""
    where = _user_line(e)
    inner = next(((p, s) for p, s in reversed(running) if p), None)
    module = f"in {inner[0]} ({_short_repr(inner[1])})" if inner else "in the top module"
    message = (str(e).strip().splitlines() or [""])[0][:240]
    return (f"the forward fails on the example inputs{' at ' + where if where else ''}, {module}: "
            f"{type(e).__name__}: {message}")


def _user_line(e: Exception) -> str:
    """'file.py:13 `code`' of the last frame outside torch and flaxport, or ''."""
    import torch

    skip = (str(Path(torch.__file__).parent), str(Path(__file__).parent.parent), contextlib.__file__)
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(skip)]
    if not frames:
        return ""
    f = frames[-1]
    return f"{Path(f.filename).name}:{f.lineno} `{(f.line or '').strip()}`"


def _short_repr(module) -> str:
    text = " ".join(line.strip() for line in repr(module).splitlines())
    return text if len(text) <= 80 else text[:77] + "..."
