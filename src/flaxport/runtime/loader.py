"""Reading a weights file: the reader a generated file's `load()` calls, and flaxport's own.

One copy: `flaxport translate`'s own checks of a .safetensors file (save.py, the CLI) and the
generated files use this, so a damaged file reads the same way everywhere: one ValueError line
saying what is wrong, reading no further than the file's size.
"""
import json
import math
import os

import jax.numpy as jnp
import numpy as np


def safetensors_dtypes():
    """safetensors' dtype names -> NumPy dtypes (bfloat16 as JAX's; NumPy has none)."""
    return {"F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
            "I64": np.dtype(np.int64), "I32": np.dtype(np.int32), "I16": np.dtype(np.int16), "I8": np.dtype(np.int8),
            "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_), "BF16": np.dtype(jnp.bfloat16)}


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
    dtypes = safetensors_dtypes()
    return {name: _array(name, info, data, dtypes) for name, info in header.items()}, metadata


def _array(name, info, data, dtypes):
    """The tensor a header entry describes, every field checked against the data."""
    if not isinstance(info, dict) or info.get("dtype") not in dtypes:
        raise ValueError(f"{name}: not a tensor entry (a dtype from {', '.join(dtypes)}, a shape, data_offsets), "
                         f"got {json.dumps(info)[:80]}")
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise ValueError(f"{name}: shape {shape!r} is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)
            and 0 <= offsets[0] <= offsets[1] <= len(data)):
        raise ValueError(f"{name}: data_offsets {offsets!r} are not a range inside the {len(data)} bytes of data")
    dtype = dtypes[info["dtype"]]
    start, end = offsets
    if end - start != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"{name}: {end - start} bytes of data for a {info['dtype']} tensor of shape {shape}")
    return np.frombuffer(data[start:end], dtype.newbyteorder("<")).astype(dtype).reshape(shape)
