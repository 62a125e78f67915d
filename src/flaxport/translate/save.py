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
import os
from pathlib import Path

import numpy as np

from flaxport.runtime.loader import safetensors_dtypes

# NumPy dtype -> safetensors name: the reader's table (runtime/loader.py) turned round
_DTYPES = {dtype: name for name, dtype in safetensors_dtypes().items()}
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
