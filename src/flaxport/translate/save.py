"""What `Translation.save(directory)` writes: model.py, weights.safetensors, parity.md.

The weights file holds torch's state_dict names, shapes and layouts (plus the buffers
and constants the forward reads that state_dict leaves out), so torch can read it back
with `safetensors.torch.load_file`; its metadata maps every name to the NNX variable it
fills (`nnx_paths`) and records the train/eval mode. Written here with NumPy alone, read
by the generated file with NumPy alone. `Translation.save` writes them as one set
(flaxport.fileset): the folder holds the old set or the new one, never a mix.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

_DTYPES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
           np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.int16): "I16", np.dtype(np.int8): "I8",
           np.dtype(np.uint8): "U8", np.dtype(np.bool_): "BOOL"}
_NUMPY = {v: k for k, v in _DTYPES.items()}
# What a translation's folder holds: an earlier one is replaced whole, other files are the user's.
FILES = ("model.py", "weights.safetensors", "train_step.py", "train.py", "parity.md")


def write_safetensors(path, arrays: dict, metadata: dict | None = None) -> None:
    """{name: NumPy array} (C order) -> a .safetensors file; metadata values must be strings."""
    header, offset, blobs = {}, 0, []
    for name, a in arrays.items():
        a = np.asarray(a)
        a = a if a.flags.c_contiguous else a.copy(order="C")  # (ascontiguousarray would make 0-d arrays 1-d)
        if a.dtype not in _DTYPES:
            raise ValueError(f"{name}: dtype {a.dtype} cannot be written to safetensors")
        blob = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _DTYPES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    _atomic_write(path, [len(text).to_bytes(8, "little"), text, *blobs])


def read_safetensors(path):
    """({name: NumPy array}, metadata) of a .safetensors file. A file that is not one is a
    ValueError saying what is wrong (a header running past the end of the file, a header
    that is not a JSON object of tensors, an entry with an unknown dtype or offsets that do
    not hold its shape), read no further than the file's size."""
    with open(path, "rb") as f:
        total = os.fstat(f.fileno()).st_size
        size = int.from_bytes(f.read(8), "little")
        if total < 8 or size > total - 8:
            raise ValueError(f"its header length ({size} bytes) runs past the end of the file ({total} bytes)")
        try:
            header = json.loads(f.read(size))
        except ValueError as e:
            raise ValueError(f"its header is not JSON ({e})") from None
        if not isinstance(header, dict):
            raise ValueError(f"its header is a JSON {type(header).__name__}, not an object of tensors")
        data = f.read()
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict):
        raise ValueError(f"its __metadata__ is a JSON {type(metadata).__name__}, not an object")
    return {name: _array(name, info, data) for name, info in header.items()}, metadata


def _array(name: str, info, data: bytes) -> np.ndarray:
    """The tensor a header entry describes, every field checked against the data."""
    if not isinstance(info, dict) or info.get("dtype") not in _NUMPY:
        raise ValueError(f"{name}: not a tensor entry (a dtype from {', '.join(_NUMPY)}, a shape, data_offsets), "
                         f"got {json.dumps(info)[:80]}")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"{name}: shape {shape!r} is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)
            and 0 <= offsets[0] <= offsets[1] <= len(data)):
        raise ValueError(f"{name}: data_offsets {offsets!r} are not a range inside the {len(data)} bytes of data")
    dtype = _NUMPY[info["dtype"]]
    start, end = offsets
    if end - start != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"{name}: {end - start} bytes of data for a {info['dtype']} tensor of shape {shape}")
    return np.frombuffer(data[start:end], dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def write_text(path, text: str) -> None:
    _atomic_write(path, [text.encode()])


def _atomic_write(path, chunks) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
