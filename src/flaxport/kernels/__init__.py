"""Native CPU kernels reached through the XLA FFI (`jax.ffi`), built on first use.

`conv_cpu.cc` holds a direct NHWC convolution (forward and weight gradient; any stride,
dilation, kernel size and group count; `pack_cpu.cc` lays its weights out) and
`depthwise_cpu.cc` a depthwise one, both faster than XLA:CPU's own (docs/cpu.md). They are compiled once per machine, into one library,
with the system C++ compiler against the FFI headers jaxlib ships, cached under
`$FLAXPORT_CACHE` (default ~/.cache/flaxport/kernels), and registered with JAX for the CPU
platform. Where no compiler is found or the build
fails, `available()` says why and callers fall back to pure JAX.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_SOURCES = tuple(Path(__file__).with_name(name) for name in ("conv_cpu.cc", "pack_cpu.cc", "depthwise_cpu.cc"))
_HEADERS = tuple(Path(__file__).with_name(name) for name in ("simd.h", "weights.h"))
_TARGETS = {"flaxport_conv_fwd": "FlaxportConvFwd", "flaxport_conv_dw": "FlaxportConvDw",
            "flaxport_conv_pack": "FlaxportConvPack",
            "flaxport_depthwise_fwd": "FlaxportDepthwiseFwd", "flaxport_depthwise_dw": "FlaxportDepthwiseDw"}
_state: dict = {}


def cache_dir() -> Path:
    root = os.environ.get("FLAXPORT_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "flaxport")
    return Path(root) / "kernels"


def _cpu_signature() -> str:
    """The CPU's feature flags: -march=native code built on one CPU may not run on another."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _compile_command() -> list:
    """The compiler and flags, without the output file (they are part of the cache key)."""
    import jax

    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++") or shutil.which("c++")
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++, clang++ or $CXX) on PATH")
    return [cxx, "-O3", "-march=native", "-ffp-contract=fast", "-std=c++17", "-shared", "-fPIC",
            f"-I{jax.ffi.include_dir()}", *map(str, _SOURCES)]


def library_path() -> Path:
    """Build the kernel library if this machine has no current build; return its path."""
    import jaxlib

    command = _compile_command()
    texts = [p.read_text() for p in _SOURCES + _HEADERS]
    key = hashlib.sha256("\0".join([*texts, jaxlib.__version__, _cpu_signature(),
                                    " ".join(command[1:])]).encode()).hexdigest()[:16]
    path = cache_dir() / f"conv_cpu-{key}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the final name and rename: concurrent first uses never load half a file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        done = subprocess.run(command + ["-o", tmp], capture_output=True, text=True)
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or ["(no output)"]
            first_error = next((line for line in lines if "error" in line), lines[-1]).strip()
            raise RuntimeError(f"building {', '.join(p.name for p in _SOURCES)} failed: {first_error}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def available() -> bool:
    """Whether the FFI conv kernels are built and registered (building them if needed).

    FLAXPORT_NATIVE=0 turns them off. The reason for a False is in `unavailable_reason()`.
    """
    if "ok" in _state:
        return _state["ok"]
    if os.environ.get("FLAXPORT_NATIVE", "1") == "0":
        _state.update(ok=False, reason="FLAXPORT_NATIVE=0")
        return False
    try:
        import jax

        lib = ctypes.cdll.LoadLibrary(str(library_path()))
        for target, symbol in _TARGETS.items():
            jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu")
        _state.update(ok=True, reason="", lib=lib)
    except (OSError, RuntimeError, AttributeError) as e:
        _state.update(ok=False, reason=str(e))
        print(f"flaxport: native CPU conv kernels unavailable ({e}); using pure JAX", file=sys.stderr)
    return _state["ok"]


def unavailable_reason() -> str:
    available()
    return _state.get("reason", "")
