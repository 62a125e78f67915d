"""What this machine runs: package versions, devices and thread settings (flaxport env, compare reports)."""
from __future__ import annotations

import importlib.metadata as md
import os
import platform


def package_version(name: str) -> str:
    """The installed version of a distribution, or "not installed"."""
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"


def facts() -> dict:
    """Versions and devices as a dict (also embedded in compare reports)."""
    import jax

    out = {
        "flaxport": package_version("flaxport"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    for pkg in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "torch", "keras"):
        out[pkg] = package_version(pkg)
    out["jax_backend"] = jax.default_backend()
    out["jax_devices"] = [str(d) for d in jax.devices()]
    out["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")
    if out["jax_backend"] == "cpu":
        from flaxport import kernels

        out["native_convs"] = (f"built ({kernels.library_path().name})" if kernels.available()
                               else f"off: {kernels.unavailable_reason()}")
    if out["torch"] != "not installed":
        import torch

        out["torch_threads"] = torch.get_num_threads()
        out["torch_cuda"] = torch.cuda.is_available()
    return out
