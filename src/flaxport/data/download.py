"""Resumable, checksum-verified downloads, and where real datasets live.

A download goes to `NAME.part` beside its destination and becomes `NAME` (os.replace,
atomic) only once its checksum matches, so a file under the final name is always whole.
An interrupted download keeps its `.part` and the next call continues it with an HTTP
Range request; servers that ignore Range are handled by starting over.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tqdm import tqdm

from flaxport.errors import UserError

CIFAR10_BASE_URL = "https://www.cs.toronto.edu/~kriz/"
CIFAR10_MD5 = "c58f30108f718f92721af3b95e74349a"  # published on https://www.cs.toronto.edu/~kriz/cifar.html
# Larochelle's canonical location (plain http, as every reference uses; the checksums,
# not the transport, vouch for the bytes).
BINARIZED_MNIST_BASE_URL = "http://www.cs.toronto.edu/~larocheh/public/datasets/binarized_mnist/"
# sha256 (and sizes) of those three URLs as recorded by TensorFlow Datasets, in
# tensorflow/datasets: tensorflow_datasets/url_checksums/binarized_mnist.txt
# (train 78400000 bytes, valid and test 15680000: 1568 bytes a line, 50000/10000/10000 lines).
BINARIZED_MNIST_SHA256 = {
    "binarized_mnist_train.amat": "ad693b29f94c14277b095f5238ddefbbdaaae0939789dd2f4f0205278cee3e4d",
    "binarized_mnist_valid.amat": "1de3d397c40fe8eeb33dafd4099a1f665ec01e96d9be234aaeeac8a34930e2e2",
    "binarized_mnist_test.amat": "e6687bfea3f820c174f33b7865140b2a2dd2930ef786f35d45795fc193b5ab2c",
}
# Oxford Flowers 102 (https://www.robots.ox.ac.uk/~vgg/data/flowers/102/). The site lists
# no checksums (none found); these sha256 (and sizes) are TensorFlow Datasets' record of
# the same three URLs, tensorflow/datasets: tensorflow_datasets/url_checksums/
# oxford_flowers102.txt (102flowers.tgz 344862509 bytes, imagelabels.mat 502, setid.mat
# 14989). The archive's digest also appears, independently, in a Julia DataDeps
# registration of that URL. Not checked against a fresh download here (no network).
FLOWERS102_BASE_URL = "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/"
FLOWERS102_SHA256 = {
    "setid.mat": "46b8678f91fd95d3c8f4feab80d271a6c834a1dd896fe29fd3e6ad9ce5c8dccd",
    "imagelabels.mat": "4903e94206bac23bf772aadf06451916df56b58fc483a62db32a97b82656651d",
    "102flowers.tgz": "2d01ecc807db462958cfe3d92f57a8c252b4abd240eb955770201e45f783b246",
}
USER_AGENT = "flaxport-data (python urllib)"

# URLError, timeouts and connection resets are all OSError; http.client adds its own.
_NETWORK_ERRORS = (OSError, http.client.HTTPException)


def default_data_dir() -> Path:
    """$FLAXPORT_DATA, else ~/.cache/flaxport: where real datasets live unless told otherwise."""
    path = Path(os.environ.get("FLAXPORT_DATA") or Path.home() / ".cache" / "flaxport").expanduser()
    if path.exists() and not path.is_dir():
        origin = "$FLAXPORT_DATA" if os.environ.get("FLAXPORT_DATA") else "the data directory"
        raise UserError(f"{origin} {path} is not a directory; point it at a folder for datasets")
    return path


def file_digests(path, algorithms=("md5", "sha256"), chunk: int = 1 << 20) -> dict:
    """{algorithm: lowercase hex digest} of the file at `path`, read once."""
    hashes = {a: hashlib.new(a) for a in algorithms}
    with open(path, "rb") as f:
        while buf := f.read(chunk):
            for h in hashes.values():
                h.update(buf)
    return {a: h.hexdigest() for a, h in hashes.items()}


def _mismatch(path: Path, expected: dict):
    """None if `path` has every expected digest, else (algorithm, got, want) of the first that differs."""
    if not expected:
        return None
    got = file_digests(path, tuple(expected))
    for algo, want in expected.items():
        if got[algo] != want:
            return algo, got[algo], want
    return None


def _cause(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(e, urllib.error.URLError):
        if not isinstance(e.reason, BaseException):
            return " ".join(str(e.reason).split())
        e = e.reason
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _content_range(value):
    """'bytes START-END/TOTAL' or 'bytes */TOTAL' -> (START or None, TOTAL or None)."""
    m = re.fullmatch(r"\s*bytes\s+(?:(\d+)-\d+|\*)/(\d+|\*)\s*", value or "")
    if not m:
        return None, None
    start, total = m.groups()
    return (int(start) if start else None), (int(total) if total != "*" else None)


def fetch(url: str, dest, *, md5: str | None = None, sha256: str | None = None, progress: bool = True,
          chunk: int = 1 << 20, timeout: float = 60.0) -> Path:
    """Download `url` to `dest` (a file path), resuming and verifying; returns `dest` as a Path.

    Does nothing if `dest` exists and matches the given checksums (or none are given).
    Raises UserError (one line naming the url) on network errors, keeping `dest.part`
    for the next call to resume, and on a checksum mismatch, deleting `dest.part`.
    """
    dest = Path(dest).expanduser()
    expected = {a: v.strip().lower() for a, v in (("md5", md5), ("sha256", sha256)) if v}
    if dest.is_file() and _mismatch(dest, expected) is None:
        return dest
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"download: cannot create {dest.parent} ({_cause(e)})") from e
    part = dest.with_name(dest.name + ".part")
    # A resume can fail in ways only a fresh start fixes (a stale or overlong part, a
    # server answering another range); one such restart is enough, a second means a loop.
    for _ in range(2):
        if _transfer(url, part, expected, progress=progress, chunk=chunk, timeout=timeout, label=dest.name):
            break
        part.unlink(missing_ok=True)
    else:
        raise UserError(f"download: {url} could not be resumed or restarted (the server's answers "
                        f"to Range requests do not add up)")
    bad = _mismatch(part, expected)
    if bad:
        part.unlink(missing_ok=True)
        raise UserError(f"download: {url} checksum mismatch: {bad[0]} {bad[1]}, expected {bad[2]}")
    try:
        os.replace(part, dest)
    except OSError as e:
        raise UserError(f"download: cannot move {part} to {dest} ({_cause(e)})") from e
    return dest


def _transfer(url, part: Path, expected: dict, *, progress, chunk, timeout, label) -> bool:
    """Bring `part` up to the whole file; False when it must be discarded and started afresh."""
    offset = part.stat().st_size if part.is_file() else 0
    headers = {"User-Agent": USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    kept = f"; {part} kept, run again to resume" if offset else ""
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 416 and offset:
            # Nothing left after `offset`: the part is already whole, or it is junk.
            _, total = _content_range(e.headers.get("Content-Range"))
            return _mismatch(part, expected) is None if expected else total == offset
        raise UserError(f"download: {url} failed ({_cause(e)}){kept}") from e
    except ValueError as e:  # urllib's "unknown url type"
        raise UserError(f"download: {url} is not a URL urllib can fetch ({e})") from e
    except _NETWORK_ERRORS as e:
        raise UserError(f"download: {url} failed ({_cause(e)}){kept}") from e

    with resp:
        status = resp.status or 200  # file: URLs have no status
        length = resp.headers.get("Content-Length")
        length = int(length) if length and length.isdigit() else None
        if status == 206:
            start, total = _content_range(resp.headers.get("Content-Range"))
            if start != offset:
                return False
            if total is None and length is not None:
                total = offset + length
            mode = "ab"
        elif 200 <= status < 300:
            # The server ignored Range (or none was sent): the body is the whole file.
            offset, total, mode = 0, length, "wb"
        else:
            raise UserError(f"download: {url} failed (unexpected HTTP {status}){kept}")

        received = offset
        with open(part, mode) as f, tqdm(total=total, initial=offset, unit="B", unit_scale=True,
                                          unit_divisor=1024, desc=label, disable=not progress,
                                          file=sys.stderr, leave=False) as bar:
            while True:
                try:
                    buf = resp.read(chunk)
                except _NETWORK_ERRORS as e:
                    raise UserError(f"download: {url} interrupted after {received} bytes ({_cause(e)}); "
                                    f"{part} kept, run again to resume") from e
                if not buf:
                    break
                try:
                    f.write(buf)
                except OSError as e:
                    raise UserError(f"download: cannot write {part} ({_cause(e)})") from e
                received += len(buf)
                bar.update(len(buf))
    # http.client returns b"" rather than raising when the peer closes early, so a
    # dropped connection shows only as too few bytes.
    if total is not None and received < total:
        raise UserError(f"download: {url} interrupted: connection closed after {received} of {total} bytes; "
                        f"{part} kept, run again to resume")
    return True


def download_cifar10(data_dir=None, base_url: str | None = None, md5: str | None = None,
                     progress: bool = True) -> Path:
    """Fetch cifar-10-python.tar.gz into `data_dir` (default `default_data_dir()`); returns its path.

    `base_url` replaces https://www.cs.toronto.edu/~kriz/ (mirrors, tests) and `md5` the
    published checksum. The archive is then read once with `cifar10.load_path`, so a
    mirror serving a damaged or foreign archive is reported now rather than at training.
    """
    from flaxport.data import cifar10  # cifar10 imports this module

    data_dir = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    base = base_url or CIFAR10_BASE_URL
    url = base + ("" if base.endswith("/") else "/") + cifar10.ARCHIVE
    path = fetch(url, data_dir / cifar10.ARCHIVE, md5=md5 or CIFAR10_MD5, progress=progress)
    cifar10.load_path(path)
    return path


def _checksums(dataset: str, published: dict, names: dict, overrides: dict | None) -> dict:
    """{file name: sha256}: the published digests, with `overrides` (keyed by a short name
    from `names` or by the file name) replacing single entries."""
    expected = dict(published)
    for key, digest in (overrides or {}).items():
        name = names.get(key, key)
        if name not in expected:
            raise UserError(f"download: no {dataset} file {key!r} to give a checksum for "
                            f"(one of {', '.join(names)} or {', '.join(expected)})")
        expected[name] = digest
    return expected


def _folder_url(base: str) -> str:
    return base if base.endswith("/") else base + "/"


def download_binarized_mnist(data_dir=None, base_url: str | None = None, sha256: dict | None = None,
                             progress: bool = True) -> dict:
    """Fetch binarized_mnist_{train,valid,test}.amat into `data_dir`; returns {split: Path}.

    `base_url` replaces BINARIZED_MNIST_BASE_URL (mirrors, tests). `sha256` maps a split
    ("train") or a file name ("binarized_mnist_train.amat") to the expected hex digest,
    replacing the published one for that file only. The files are then parsed once with
    `binarized_mnist.load`, so a damaged or foreign file is reported now, naming its line.
    """
    from flaxport.data import binarized_mnist  # binarized_mnist imports this module

    data_dir = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    expected = _checksums("binarized_mnist", BINARIZED_MNIST_SHA256, binarized_mnist.FILES, sha256)
    base = _folder_url(base_url or BINARIZED_MNIST_BASE_URL)
    # Smallest first: a wrong mirror or checksum shows up before the 78 MB file is fetched.
    order = sorted(binarized_mnist.SPLITS, key=lambda s: s == "train")
    dests = binarized_mnist.paths(data_dir)
    for split in order:
        name = binarized_mnist.FILES[split]
        fetch(base + name, dests[split], sha256=expected[name], progress=progress)
    binarized_mnist.load(data_dir)
    return dests


def download_flowers102(data_dir=None, base_url: str | None = None, sha256: dict | None = None,
                        progress: bool = True, image_size: int = 64) -> dict:
    """Fetch setid.mat, imagelabels.mat and 102flowers.tgz into `data_dir`; returns {name: Path}.

    Names: "setid", "labels", "images" (the three files) and "cache", the preprocessed
    pixels. `base_url` replaces FLOWERS102_BASE_URL (mirrors, tests); `sha256` maps a name
    ("images") or a file name ("102flowers.tgz") to the expected hex digest, replacing the
    published one for that file only. Then `flowers102.load(data_dir, image_size)` decodes
    every image once, so a damaged archive is reported now, naming the member, and the
    first training run finds the cache ready.
    """
    from flaxport.data import flowers102  # flowers102 imports this module

    data_dir = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    files = {"setid": flowers102.SETID, "labels": flowers102.LABELS, "images": flowers102.ARCHIVE}
    expected = _checksums("flowers102", FLOWERS102_SHA256, files, sha256)
    base = _folder_url(base_url or FLOWERS102_BASE_URL)
    out = {}
    # Smallest first: a wrong mirror or checksum shows up before the 345 MB archive is fetched.
    for key, name in files.items():
        out[key] = fetch(base + name, data_dir / name, sha256=expected[name], progress=progress)
    flowers102.load(data_dir, image_size=image_size, progress=progress)
    out["cache"] = flowers102.cache_path(data_dir, image_size)
    return out
