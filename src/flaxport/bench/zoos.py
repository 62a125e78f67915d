"""Imports torchvision and timm for the zoo benchmarks, also where torchvision's compiled ops do not load.

PyPI's torchvision wheel is a CUDA build: beside the CPU torch its C++ ops (nms, roi_align, ...)
are missing, and `import torchvision` fails while registering their fake (meta) kernels. Its
models are pure Python, so when, and only when, that registration fails, it is retried with the
torchvision registrations allowed to fail. With the CPU wheel from PyTorch's own index the plain
import works and nothing is patched.
"""
from __future__ import annotations

import sys


def import_torchvision():
    """torchvision, imported plainly where it can be, else with its fake-op registrations tolerated."""
    try:
        import torchvision
        return torchvision
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    import torch.library

    real = torch.library.register_fake

    def tolerant(op, func=None, /, **kwargs):
        if func is None:
            return lambda f: tolerant(op, f, **kwargs)
        try:
            return real(op, func, **kwargs)
        except RuntimeError:
            if isinstance(op, str) and op.startswith("torchvision::"):
                return func  # an op this torchvision build does not carry: its models never call it
            raise

    torch.library.register_fake = tolerant
    try:
        import torchvision
    finally:
        torch.library.register_fake = real
    return torchvision


def import_timm():
    """timm (which imports torchvision when it is installed)."""
    import_torchvision()
    import timm
    return timm
