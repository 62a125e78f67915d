"""CIFAR-10 from its canonical "python version": the extracted folder or the .tar.gz itself.

Layout (https://www.cs.toronto.edu/~kriz/cifar.html): `cifar-10-batches-py/` holds
pickled `data_batch_1`..`data_batch_5` and `test_batch`, each a dict with b'data' uint8
(N, 3072) -- per row the 1024 red, then green, then blue pixels of a 32x32 image, row
major -- and b'labels', N ints in 0..9. Nothing here assumes N = 10000, so small fixtures
in the same format (`write_fixture`) exercise the real code path.

Every problem is a UserError of one line naming the file, since the usual causes (an
interrupted download, a wrong mirror, a half-extracted folder) are the user's to fix.
"""
from __future__ import annotations

import io
import pickle
import tarfile
import zlib
from pathlib import Path

import numpy as np

from flaxport.data import Dataset
from flaxport.data.download import default_data_dir, fetch
from flaxport.errors import UserError

BASE_URL = "https://www.cs.toronto.edu/~kriz/"
MD5 = "c58f30108f718f92721af3b95e74349a"  # published on https://www.cs.toronto.edu/~kriz/cifar.html

DIRNAME = "cifar-10-batches-py"
ARCHIVE = "cifar-10-python.tar.gz"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
BATCHES = TRAIN_BATCHES + (TEST_BATCH,)
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
ROW = 3 * 32 * 32

# A batch is a pickle, and unpickling arbitrary classes runs arbitrary code; an archive
# from a mirror should not be able to do that. These are all a CIFAR batch needs
# (numpy arrays, and bytes as protocol-2 pickles from Python 3 write them).
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
}


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} (not part of a CIFAR-10 batch)")
        return super().find_class(module, name)


def _cause(e: BaseException) -> str:
    text = " ".join(str(e).split()) or "no details"
    return f"{type(e).__name__}: {text[:200]}"


def find(data_dir) -> Path | None:
    """The source `load(data_dir)` would read (the folder wins over the archive), or None."""
    data_dir = Path(data_dir).expanduser()
    if (data_dir / DIRNAME).is_dir():
        return data_dir / DIRNAME
    if (data_dir / ARCHIVE).is_file():
        return data_dir / ARCHIVE
    return None


def load(data_dir=None) -> Dataset:
    """CIFAR-10 found in `data_dir` (default `download.default_data_dir()`).

    train: {"image": uint8 (N, 32, 32, 3) NHWC, "label": int32 (N,)} from data_batch_1..5;
    test: the same from test_batch (50000 and 10000 images for the real data).
    meta: {"classes": 10 names, "source": the folder or archive read}.
    """
    data_dir = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    source = find(data_dir)
    if source is None:
        raise UserError(f"cifar10: no {DIRNAME}/ or {ARCHIVE} in {data_dir} "
                        f"(run `flaxport data download cifar10 --data-dir {data_dir}`)")
    return load_path(source)


def load_path(path) -> Dataset:
    """Like `load`, from an explicit `cifar-10-batches-py` folder or `.tar.gz` archive path."""
    path = Path(path)
    raw = _read_dir(path) if path.is_dir() else _read_archive(path)
    batches = {name: _decode(blob, where) for name, (blob, where) in raw.items()}
    train = [batches[n] for n in TRAIN_BATCHES]
    return Dataset(
        name="cifar10",
        train={"image": np.concatenate([x for x, _ in train]), "label": np.concatenate([y for _, y in train])},
        test={"image": batches[TEST_BATCH][0], "label": batches[TEST_BATCH][1]},
        meta={"classes": list(CLASSES), "source": str(path)},
    )


def _read_dir(folder: Path) -> dict:
    """{batch name: (pickled bytes, the file's name for messages)}."""
    out = {}
    for name in BATCHES:
        f = folder / name
        try:
            out[name] = (f.read_bytes(), str(f))
        except FileNotFoundError:
            raise UserError(f"cifar10: {f} missing (an incomplete extraction? delete {folder} "
                            f"and extract {ARCHIVE} again)") from None
        except OSError as e:
            raise UserError(f"cifar10: cannot read {f} ({_cause(e)})") from e
    return out


def _read_archive(archive: Path) -> dict:
    """{batch name: (bytes, "archive:member")}, read in one streaming pass (no extraction).

    Stream mode decompresses the archive once; random access into a .tar.gz would
    re-inflate from the start for every member read.
    """
    wanted = {f"{DIRNAME}/{name}": name for name in BATCHES}
    out = {}
    try:
        fh = open(archive, "rb")
    except OSError as e:
        raise UserError(f"cifar10: cannot read {archive} ({_cause(e)})") from e
    try:
        with fh, tarfile.open(fileobj=fh, mode="r|gz") as tar:
            for member in tar:
                name = wanted.get(member.name.removeprefix("./"))
                if name is None or not member.isfile():
                    continue
                out[name] = (tar.extractfile(member).read(), f"{archive}:{member.name}")
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise UserError(f"cifar10: {archive} is truncated or corrupt ({_cause(e)}); "
                        f"delete it and download again") from e
    for member, name in wanted.items():
        if name not in out:
            raise UserError(f"cifar10: {archive}:{member} missing from the archive (not the CIFAR-10 python version?)")
    return out


def _field(batch: dict, key: str):
    # Python-2 pickles read with encoding='bytes' have bytes keys; a re-pickled batch may have str.
    for k in (key.encode(), key):
        if k in batch:
            return batch[k]
    raise KeyError(key)


def _decode(blob: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Pickled batch -> (images uint8 (N, 32, 32, 3), labels int32 (N,)), validated."""
    try:
        batch = _BatchUnpickler(io.BytesIO(blob), encoding="bytes").load()
    except Exception as e:  # noqa: BLE001 - unpickling a damaged file can raise almost anything
        raise UserError(f"cifar10: {where} is truncated or corrupt ({_cause(e)})") from e
    if not isinstance(batch, dict):
        raise UserError(f"cifar10: {where} is not a CIFAR-10 batch (a pickled {type(batch).__name__}, expected a dict)")
    try:
        data, labels = _field(batch, "data"), _field(batch, "labels")
    except KeyError as e:
        raise UserError(f"cifar10: {where} has no b'{e.args[0]}' entry (not a CIFAR-10 batch)") from None
    if not isinstance(data, np.ndarray):
        raise UserError(f"cifar10: {where}: b'data' is a {type(data).__name__}, expected a uint8 array")
    if data.dtype != np.uint8:
        raise UserError(f"cifar10: {where}: b'data' has dtype {data.dtype}, expected uint8")
    if data.ndim != 2 or data.shape[1] != ROW:
        raise UserError(f"cifar10: {where}: b'data' has shape {data.shape}, expected (N, {ROW})")
    try:
        labels = np.asarray(labels)
    except (ValueError, TypeError) as e:
        raise UserError(f"cifar10: {where}: b'labels' is not a list of integers ({_cause(e)})") from e
    if labels.ndim != 1 or not (np.issubdtype(labels.dtype, np.integer) or labels.size == 0):
        raise UserError(f"cifar10: {where}: b'labels' is not a list of integers "
                        f"(dtype {labels.dtype}, shape {labels.shape})")
    if len(labels) != len(data):
        raise UserError(f"cifar10: {where}: {len(data)} images in b'data' but {len(labels)} b'labels'")
    bad = labels[(labels < 0) | (labels > 9)]
    if bad.size:
        raise UserError(f"cifar10: {where}: b'labels' outside 0..9 (e.g. {int(bad[0])})")
    # Channel-major planes -> NHWC, copied once so batches concatenate contiguously.
    images = np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    return images, labels.astype(np.int32)


def _pickle_batch(data: np.ndarray, labels: list, label: str) -> bytes:
    batch = {b"batch_label": label.encode(), b"labels": labels, b"data": data,
             b"filenames": [f"fixture_{i:05d}.png".encode() for i in range(len(labels))]}
    return pickle.dumps(batch, protocol=2)


def write_fixture(directory, n_per_batch: int = 10, seed: int = 0, archive: bool = True) -> Path:
    """Write a tiny CIFAR-10 in the canonical format into `directory`; returns what was written.

    archive=True: `directory/cifar-10-python.tar.gz` (members under cifar-10-batches-py/,
    as the real one); archive=False: the extracted `directory/cifar-10-batches-py/`. Each of
    the six batches holds n_per_batch random uint8 images and labels (np.random.default_rng(seed)).
    """
    rng = np.random.default_rng(seed)
    members = {}
    for name in BATCHES:
        data = rng.integers(0, 256, (n_per_batch, ROW), dtype=np.uint8)
        labels = rng.integers(0, 10, n_per_batch).tolist()
        members[name] = _pickle_batch(data, labels, f"fixture {name}")
    members["batches.meta"] = pickle.dumps({b"label_names": [c.encode() for c in CLASSES],
                                            b"num_cases_per_batch": n_per_batch, b"num_vis": ROW}, protocol=2)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if not archive:
        folder = directory / DIRNAME
        folder.mkdir(exist_ok=True)
        for name, blob in members.items():
            (folder / name).write_bytes(blob)
        return folder
    path = directory / ARCHIVE
    with tarfile.open(path, "w:gz") as tar:
        for name, blob in members.items():
            info = tarfile.TarInfo(f"{DIRNAME}/{name}")
            info.size, info.mode, info.mtime = len(blob), 0o644, 0
            tar.addfile(info, io.BytesIO(blob))
    return path


def download(data_dir=None, base_url: str | None = None, md5: str | None = None,
             progress: bool = True) -> Path:
    """Fetch cifar-10-python.tar.gz into `data_dir` (default `default_data_dir()`); returns its path.

    `base_url` replaces https://www.cs.toronto.edu/~kriz/ (mirrors, tests) and `md5` the
    published checksum. The archive is then read once with `load_path`, so a
    mirror serving a damaged or foreign archive is reported now rather than at training.
    """
    data_dir = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    base = base_url or BASE_URL
    url = base + ("" if base.endswith("/") else "/") + ARCHIVE
    path = fetch(url, data_dir / ARCHIVE, md5=md5 or MD5, progress=progress)
    load_path(path)
    return path
