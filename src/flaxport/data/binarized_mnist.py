"""Binarized MNIST with the fixed binarization of Larochelle & Murray (2011), the VAE benchmark.

Layout (http://www.cs.toronto.edu/~larocheh/public/datasets/binarized_mnist/): three text
files `binarized_mnist_{train,valid,test}.amat` of 50000 / 10000 / 10000 lines; a line is
one 28x28 image, row major, as 784 space-separated 0/1 values. The pixels were sampled
once from the grey levels and published, so every paper's likelihoods refer to the same
bits (resampling each epoch, "dynamic binarization", gives different numbers). No labels.

Nothing here assumes the real line counts, so small fixtures in the same format
(`write_fixture`) exercise the real code path. Every problem is a UserError of one line
naming the file (and, for a bad line, its 1-based number): the usual causes (an
interrupted download, a wrong mirror) are the user's to fix.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from flaxport.data import Dataset
from flaxport.data.download import checksums, default_data_dir, fetch, folder_url
from flaxport.errors import UserError

# Larochelle's canonical location (plain http, as every reference uses; the checksums,
# not the transport, vouch for the bytes).
BASE_URL = "http://www.cs.toronto.edu/~larocheh/public/datasets/binarized_mnist/"
# sha256 (and sizes) of those three URLs as recorded by TensorFlow Datasets, in
# tensorflow/datasets: tensorflow_datasets/url_checksums/txt
# (train 78400000 bytes, valid and test 15680000: 1568 bytes a line, 50000/10000/10000 lines).
SHA256 = {
    "binarized_mnist_train.amat": "ad693b29f94c14277b095f5238ddefbbdaaae0939789dd2f4f0205278cee3e4d",
    "binarized_mnist_valid.amat": "1de3d397c40fe8eeb33dafd4099a1f665ec01e96d9be234aaeeac8a34930e2e2",
    "binarized_mnist_test.amat": "e6687bfea3f820c174f33b7865140b2a2dd2930ef786f35d45795fc193b5ab2c",
}

SPLITS = ("train", "valid", "test")
FILES = {split: f"binarized_mnist_{split}.amat" for split in SPLITS}
SIDE = 28
PIXELS = SIDE * SIDE
# The published files are exactly "v v ... v\n": each value one character, one separator.
_LINE_BYTES = 2 * PIXELS
_ZERO, _ONE, _SPACE, _NEWLINE = b"0"[0], b"1"[0], b" "[0], b"\n"[0]


def paths(data_dir) -> dict:
    """{split: Path} of the three files `load(data_dir)` reads, present or not."""
    data_dir = Path(data_dir).expanduser()
    return {split: data_dir / name for split, name in FILES.items()}


def missing(data_dir) -> list:
    """The files of `paths(data_dir)` that are not there (empty when all are)."""
    return [p for p in paths(data_dir).values() if not p.is_file()]


def load(data_dir=None) -> Dataset:
    """Binarized MNIST found in `data_dir` (default `download.default_data_dir()`).

    train/valid/test: {"image": uint8 (N, 28, 28, 1), values 0 or 1} (N = 50000 / 10000 /
    10000 for the real files); the validation split is `Dataset.valid`. meta: source (the
    folder), files ({split: path}), n_train, n_valid, n_test.
    """
    data_dir = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    absent = missing(data_dir)
    if absent:
        parts = [p.name for p in absent]
        resume = any(p.with_name(p.name + ".part").is_file() for p in absent)
        hint = "resumes the interrupted download" if resume else "fetches them"
        raise UserError(f"binarized_mnist: {', '.join(parts)} missing in {data_dir} "
                        f"(`flaxport data download binarized_mnist --data-dir {data_dir}` {hint})")
    images = {split: read_amat(path) for split, path in paths(data_dir).items()}
    return Dataset(
        name="binarized_mnist",
        train={"image": images["train"]},
        test={"image": images["test"]},
        valid={"image": images["valid"]},
        meta={
            "source": str(data_dir),
            "files": {split: str(p) for split, p in paths(data_dir).items()},
            **{f"n_{split}": int(len(images[split])) for split in SPLITS},
        },
    )


def read_amat(path) -> np.ndarray:
    """One .amat file -> uint8 (N, 28, 28, 1) of 0/1, validated line by line.

    The published layout is checked and decoded with whole-array NumPy operations
    (np.loadtxt takes tens of seconds on the 50000-line file; this takes well under one).
    Anything else -- other whitespace, CRLF line ends, or a damaged file -- goes through
    a per-line parser that accepts any whitespace and stops at the first bad line.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"binarized_mnist: cannot read {path} ({type(e).__name__}: {e.strerror or e})") from e
    bits = _decode_canonical(data)
    if bits is None:
        bits = _decode_lines(data, path)
    if len(bits) == 0:
        raise UserError(f"binarized_mnist: {path} is empty (no images); delete it and download again")
    return bits.reshape(-1, SIDE, SIDE, 1)


def _decode_canonical(data: bytes):
    """uint8 (N, 784) if `data` is exactly the published layout, else None (nothing raised)."""
    if not data.endswith(b"\n"):
        data += b"\n"  # a missing final newline is the only slack allowed here
    if len(data) % _LINE_BYTES:
        return None
    rows = np.frombuffer(data, np.uint8).reshape(-1, _LINE_BYTES)
    values, seps = rows[:, 0::2], rows[:, 1::2]
    if not ((seps[:, :-1] == _SPACE).all() and (seps[:, -1] == _NEWLINE).all()):
        return None
    # '0' and '1' are adjacent byte values, so one unsigned subtraction checks and decodes.
    bits = values - np.uint8(_ZERO)
    if (bits > 1).any():
        return None
    return np.ascontiguousarray(bits)


def _decode_lines(data: bytes, path: Path) -> np.ndarray:
    """uint8 (N, 784) from any whitespace-separated layout; UserError at the first bad line."""
    lines = data.split(b"\n")
    if lines and lines[-1].strip() == b"":
        lines.pop()  # the text after the final newline (or a last line of stray spaces)
    out = np.empty((len(lines), PIXELS), np.uint8)
    for i, line in enumerate(lines):
        tokens = line.split()
        if len(tokens) != PIXELS:
            raise UserError(f"binarized_mnist: {path} line {i + 1}: {len(tokens)} values, expected {PIXELS}")
        joined = b"".join(tokens)
        if len(joined) != PIXELS:  # some token is longer than one character ("10", "0.0", "1e0")
            j = next(j for j, t in enumerate(tokens) if len(t) != 1)
            raise UserError(f"binarized_mnist: {path} line {i + 1}: value {_show(tokens[j])} "
                            f"(value {j + 1} of {PIXELS}) is not 0 or 1")
        row = np.frombuffer(joined, np.uint8) - np.uint8(_ZERO)
        bad = np.flatnonzero(row > 1)
        if bad.size:
            j = int(bad[0])
            raise UserError(f"binarized_mnist: {path} line {i + 1}: value {_show(tokens[j])} "
                            f"(value {j + 1} of {PIXELS}) is not 0 or 1")
        out[i] = row
    return out


def _show(token: bytes) -> str:
    """A token as message text: control and non-ASCII bytes escaped, long ones cut."""
    text = "".join(chr(b) if 32 < b < 127 else f"\\x{b:02x}" for b in token[:20])
    return text + ("..." if len(token) > 20 else "")


def write_fixture(directory, n_train: int = 20, n_valid: int = 10, n_test: int = 10, seed: int = 0) -> Path:
    """Write a tiny binarized MNIST in the published format into `directory`; returns it.

    Each file holds that many lines of 784 space-separated 0/1 values drawn by
    np.random.default_rng(seed) (splits in the order train, valid, test), so
    `load(directory)` returns exactly those bits.
    """
    rng = np.random.default_rng(seed)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in zip(SPLITS, (n_train, n_valid, n_test)):
        bits = (rng.random((n, PIXELS)) < 0.3).astype(np.uint8)
        (directory / FILES[split]).write_bytes(to_amat(bits))
    return directory


def to_amat(bits) -> bytes:
    """uint8/bool (N, 784) or (N, 28, 28[, 1]) of 0/1 -> the published text layout."""
    bits = np.asarray(bits, np.uint8).reshape(len(bits), PIXELS)
    text = np.full((len(bits), _LINE_BYTES), _SPACE, np.uint8)
    text[:, 0::2] = bits + np.uint8(_ZERO)
    text[:, -1] = _NEWLINE
    return text.tobytes()


def download(data_dir=None, base_url: str | None = None, sha256: dict | None = None,
             progress: bool = True) -> dict:
    """Fetch binarized_mnist_{train,valid,test}.amat into `data_dir`; returns {split: Path}.

    `base_url` replaces BASE_URL (mirrors, tests). `sha256` maps a split
    ("train") or a file name ("binarized_mnist_train.amat") to the expected hex digest,
    replacing the published one for that file only. The files are then parsed once with
    `load`, so a damaged or foreign file is reported now, naming its line.
    """
    data_dir = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    expected = checksums("binarized_mnist", SHA256, FILES, sha256)
    base = folder_url(base_url or BASE_URL)
    # Smallest first: a wrong mirror or checksum shows up before the 78 MB file is fetched.
    order = sorted(SPLITS, key=lambda s: s == "train")
    dests = paths(data_dir)
    for split in order:
        name = FILES[split]
        fetch(base + name, dests[split], sha256=expected[name], progress=progress)
    load(data_dir)
    return dests
