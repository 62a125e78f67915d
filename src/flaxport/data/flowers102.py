"""Oxford Flowers 102 (Nilsback & Zisserman 2008), the DDIM workload's real dataset.

Layout (https://www.robots.ox.ac.uk/~vgg/data/flowers/102/), all in one data directory:
`102flowers.tgz` holds jpg/image_00001.jpg .. jpg/image_08189.jpg (RGB JPEGs, shorter
side 500 px); `setid.mat` holds 1-based image-id arrays `trnid` (1020), `valid` (1020)
and `tstid` (6149); `imagelabels.mat` holds `labels`, the class 1..102 of every image.
An extracted `jpg/` folder (torchvision's flowers-102/ layout) is read instead of the
archive when present. Nothing here assumes the real counts, so `write_fixture`'s small
copies in the same format exercise the real code path.

Split, as the seed's reference (keras-io DDIM via TFDS) has it: training is
"train[:80%]+validation[:80%]+test[:80%]", the held-out set "train[80%:]+validation[80%:]
+test[80%:]" -- 6551 and 1638 images. TFDS slices in its own record order, which sorts a
split's examples by md5(split name + file name) (tensorflow_datasets/core/hashing.py);
`split_ids` sorts the same way, so the membership should match the reference's exactly
(not checked against a TFDS build here: no TFDS, no network).

Preprocessing, as keras-io: centre crop to the square of the shorter side, then an
antialiased bilinear resize (tf.image.resize(antialias=True); PIL's BILINEAR widens its
triangle kernel by the scale when shrinking, the same filter) to image_size, kept as
uint8. Decoding 8189 JPEGs takes a while, so it happens once: the pixels are cached
beside the data as `flowers102_<size>.npz` (written to a temporary name, then renamed),
and rebuilt when missing, unreadable or made from other source files.

Every problem is a UserError of one line naming the file (and, for an image, the member).
"""
from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import re
import sys
import tarfile
import warnings
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from flaxport.data import Dataset
from flaxport.data.download import checksums, default_data_dir, fetch, folder_url
from flaxport.errors import UserError

# Oxford Flowers 102 (https://www.robots.ox.ac.uk/~vgg/data/flowers/102/). The site lists
# no checksums (none found); these sha256 (and sizes) are TensorFlow Datasets' record of
# the same three URLs, tensorflow/datasets: tensorflow_datasets/url_checksums/
# oxford_txt (102flowers.tgz 344862509 bytes, imagelabels.mat 502, setid.mat
# 14989). The archive's digest also appears, independently, in a Julia DataDeps
# registration of that URL. Not checked against a fresh download here (no network).
BASE_URL = "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/"
SHA256 = {
    "setid.mat": "46b8678f91fd95d3c8f4feab80d271a6c834a1dd896fe29fd3e6ad9ce5c8dccd",
    "imagelabels.mat": "4903e94206bac23bf772aadf06451916df56b58fc483a62db32a97b82656651d",
    "102flowers.tgz": "2d01ecc807db462958cfe3d92f57a8c252b4abd240eb955770201e45f783b246",
}

ARCHIVE = "102flowers.tgz"
SETID = "setid.mat"
LABELS = "imagelabels.mat"
JPG_DIR = "jpg"
N_IMAGES = 8189
# Class names for labels 0..101 (imagelabels.mat's 1..102), as TensorFlow Datasets lists
# them (tensorflow_datasets/image_classification/oxford_flowers102.py); the VGG site
# publishes the names only as a web page.
CLASSES = [
    "pink primrose", "hard-leaved pocket orchid", "canterbury bells", "sweet pea", "english marigold",
    "tiger lily", "moon orchid", "bird of paradise", "monkshood", "globe thistle", "snapdragon", "colt's foot",
    "king protea", "spear thistle", "yellow iris", "globe-flower", "purple coneflower", "peruvian lily",
    "balloon flower", "giant white arum lily", "fire lily", "pincushion flower", "fritillary", "red ginger",
    "grape hyacinth", "corn poppy", "prince of wales feathers", "stemless gentian", "artichoke", "sweet william",
    "carnation", "garden phlox", "love in the mist", "mexican aster", "alpine sea holly", "ruby-lipped cattleya",
    "cape flower", "great masterwort", "siam tulip", "lenten rose", "barbeton daisy", "daffodil", "sword lily",
    "poinsettia", "bolero deep blue", "wallflower", "marigold", "buttercup", "oxeye daisy", "common dandelion",
    "petunia", "wild pansy", "primula", "sunflower", "pelargonium", "bishop of llandaff", "gaura", "geranium",
    "orange dahlia", "pink-yellow dahlia?", "cautleya spicata", "japanese anemone", "black-eyed susan",
    "silverbush", "californian poppy", "osteospermum", "spring crocus", "bearded iris", "windflower",
    "tree poppy", "gazania", "azalea", "water lily", "rose", "thorn apple", "morning glory", "passion flower",
    "lotus", "toad lily", "anthurium", "frangipani", "clematis", "hibiscus", "columbine", "desert-rose",
    "tree mallow", "magnolia", "cyclamen", "watercress", "canna lily", "hippeastrum", "bee balm", "ball moss",
    "foxglove", "bougainvillea", "camellia", "mallow", "mexican petunia", "bromelia", "blanket flower",
    "trumpet creeper", "blackberry lily",
]
N_CLASSES = len(CLASSES)
# TFDS split name (its hash salt) -> the setid.mat array holding that split's ids.
SETID_KEYS = {"train": "trnid", "validation": "valid", "test": "tstid"}
TRAIN_PERCENT = 80
# Bump when the preprocessing changes: old caches then no longer match and are rebuilt.
CACHE_FORMAT = "flaxport-flowers102-v1 centre-crop pil-bilinear-antialias uint8"
_MEMBER = re.compile(r"(?:\./)?jpg/image_(\d{5})\.jpg")


def member_name(image_id: int) -> str:
    """1-based image id -> its path inside the archive, e.g. 'jpg/image_00042.jpg'."""
    return f"{JPG_DIR}/image_{int(image_id):05d}.jpg"


def find(data_dir) -> Path | None:
    """The image source `load(data_dir)` reads (an extracted jpg/ folder wins over the archive), or None."""
    data_dir = Path(data_dir).expanduser()
    if (data_dir / JPG_DIR).is_dir():
        return data_dir / JPG_DIR
    if (data_dir / ARCHIVE).is_file():
        return data_dir / ARCHIVE
    return None


def missing(data_dir) -> list:
    """Names of the required files absent from `data_dir` (the archive, setid.mat); empty when all are there."""
    data_dir = Path(data_dir).expanduser()
    out = [] if find(data_dir) is not None else [ARCHIVE]
    return out + ([] if (data_dir / SETID).is_file() else [SETID])


def cache_path(data_dir, image_size: int = 64) -> Path:
    return Path(data_dir).expanduser() / f"flowers102_{int(image_size)}.npz"


def _cause(e: BaseException) -> str:
    text = " ".join(str(e).split()) or "no details"
    return f"{type(e).__name__}: {text[:200]}"


# ---------------------------------------------------------------- the .mat files

def _loadmat(path: Path) -> dict:
    from scipy.io import loadmat

    try:
        return loadmat(path)
    except Exception as e:  # noqa: BLE001 - scipy raises many types for a damaged file
        raise UserError(f"flowers102: {path} cannot be read as a MATLAB file ({_cause(e)}); "
                        f"delete it and download again") from e


def _int_array(m: dict, key: str, path: Path, lo: int, hi: int, one: str, many: str) -> np.ndarray:
    """m[key] flattened to int64, every value an integer in lo..hi, else a UserError naming key and file."""
    if key not in m:
        keys = ", ".join(k for k in m if not k.startswith("__")) or "none"
        raise UserError(f"flowers102: {path} has no '{key}' array (it has: {keys}); not the Flowers 102 file?")
    a = np.asarray(m[key])
    if a.dtype.kind not in "iuf" or a.size == 0:
        raise UserError(f"flowers102: {path}: '{key}' is not a list of {many} (dtype {a.dtype}, shape {a.shape})")
    flat = a.ravel()
    if a.dtype.kind == "f" and not (np.isfinite(flat).all() and (flat == np.round(flat)).all()):
        raise UserError(f"flowers102: {path}: '{key}' holds non-integer {many}")
    ints = flat.astype(np.int64)
    bad = ints[(ints < lo) | (ints > hi)]
    if bad.size:
        raise UserError(f"flowers102: {path}: '{key}' holds {one} {int(bad[0])} outside {lo}..{hi}")
    return ints


def read_setid(path) -> dict:
    """setid.mat -> {'trnid' | 'valid' | 'tstid': int64 (n,) ids in 1..8189, file order}, validated.

    The three arrays must be disjoint and free of repeats (the published file partitions
    the 8189 images), so no image is both trained on and held out.
    """
    path = Path(path)
    m = _loadmat(path)
    out = {key: _int_array(m, key, path, 1, N_IMAGES, "image id", "image ids") for key in SETID_KEYS.values()}
    seen = {}
    for key, ids in out.items():
        for i in ids.tolist():
            if i in seen:
                where = "twice in" if seen[i] == key else f"in both '{seen[i]}' and"
                raise UserError(f"flowers102: {path}: image id {i} appears {where} '{key}'")
            seen[i] = key
    return out


def read_labels(path, n: int) -> np.ndarray:
    """imagelabels.mat -> int32 (n,) classes 0..101 of images 1..n (the file stores 1..102)."""
    path = Path(path)
    labels = _int_array(_loadmat(path), "labels", path, 1, N_CLASSES, "class", "classes")
    if len(labels) < n:
        raise UserError(f"flowers102: {path}: 'labels' has {len(labels)} entries, setid.mat names image {n}")
    return (labels[:n] - 1).astype(np.int32)


def _tfds_rank(split: str, image_id: int) -> int:
    # TFDS Hasher(salt=split).hash_key(file_name): md5 over salt then key, as a 128-bit int.
    return int(hashlib.md5(f"{split}image_{image_id:05d}.jpg".encode()).hexdigest(), 16)


def split_ids(setid: dict) -> tuple[np.ndarray, np.ndarray]:
    """(train_ids, held_out_ids), int64 1-based image ids: the first / last 20% of each split in TFDS order.

    Per split, ids are sorted by `_tfds_rank` and cut at round(80% of n) as TFDS's
    "closest" rounding does (Python round); the parts are concatenated train, validation,
    test, as the reference's split string lists them. Deterministic: no RNG involved.
    """
    train, held = [], []
    for split, key in SETID_KEYS.items():
        order = sorted(setid[key].tolist(), key=lambda i: _tfds_rank(split, i))
        cut = int(round(TRAIN_PERCENT * len(order) / 100.0))
        train += order[:cut]
        held += order[cut:]
    return np.array(train, np.int64), np.array(held, np.int64)


# ---------------------------------------------------------------- images

def preprocess(blob: bytes, where: str, image_size: int) -> np.ndarray:
    """JPEG bytes -> uint8 (image_size, image_size, 3): centre square crop, antialiased bilinear resize."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(blob)) as img:
            rgb = img if img.mode == "RGB" else img.convert("RGB")
            w, h = rgb.size
            side = min(w, h)
            left, top = (w - side) // 2, (h - side) // 2  # tf.image.crop_to_bounding_box offsets
            # resize(box=...) crops and resamples in one pass; it decodes the whole image,
            # so a truncated file fails here rather than giving a half-grey picture.
            small = rgb.resize((image_size, image_size), Image.Resampling.BILINEAR,
                               box=(left, top, left + side, top + side))
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise UserError(f"flowers102: {where} is not a readable image ({_cause(e)}); "
                        f"the download is damaged: delete it and download again") from e
    return np.asarray(small, np.uint8)


def _blobs_from_archive(archive: Path, wanted: set):
    """Yield (image id, JPEG bytes, 'archive:member') for the wanted ids, in archive order, one pass."""
    found = set()
    try:
        fh = open(archive, "rb")
    except OSError as e:
        raise UserError(f"flowers102: cannot read {archive} ({_cause(e)})") from e
    try:
        # Stream mode inflates once; "r|*" also reads an uncompressed tar under the .tgz name.
        with fh, tarfile.open(fileobj=fh, mode="r|*") as tar:
            for member in tar:
                m = _MEMBER.fullmatch(member.name)
                if m is None or not member.isfile() or int(m[1]) not in wanted or int(m[1]) in found:
                    continue
                i = int(m[1])
                found.add(i)
                yield i, tar.extractfile(member).read(), f"{archive}:{member_name(i)}"
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise UserError(f"flowers102: {archive} is truncated or corrupt ({_cause(e)}); "
                        f"delete it and download again") from e
    absent = sorted(wanted - found)
    if absent:
        raise UserError(f"flowers102: {archive}:{member_name(absent[0])} missing from the archive "
                        f"({len(absent)} of the {len(wanted)} images named in {SETID} are missing)")


def _blobs_from_folder(folder: Path, wanted: set):
    for i in sorted(wanted):
        f = folder.parent / member_name(i)
        try:
            blob = f.read_bytes()
        except FileNotFoundError:
            raise UserError(f"flowers102: {f} missing (named in {SETID}; an incomplete extraction? "
                            f"delete {folder} and extract {ARCHIVE} again)") from None
        except OSError as e:
            raise UserError(f"flowers102: cannot read {f} ({_cause(e)})") from e
        yield i, blob, str(f)


def _decode_all(source: Path, ids: np.ndarray, image_size: int, progress: bool = False) -> np.ndarray:
    """uint8 (len(ids), s, s, 3): the images of sorted `ids`, row k from ids[k].

    Reading is sequential (one pass over the archive); decoding runs on a thread pool
    (PIL releases the GIL), with a bounded backlog so the compressed bytes waiting for a
    worker never add up to the whole archive.
    """
    from tqdm import tqdm

    row = {int(i): k for k, i in enumerate(ids)}
    out = np.empty((len(ids), image_size, image_size, 3), np.uint8)
    blobs = _blobs_from_folder(source, set(row)) if source.is_dir() else _blobs_from_archive(source, set(row))
    workers = max(1, min(8, os.cpu_count() or 1))
    pending = collections.deque()

    def work(k, blob, where):
        out[k] = preprocess(blob, where, image_size)

    with ThreadPoolExecutor(workers) as pool, tqdm(total=len(ids), desc=f"flowers102 {image_size}px", unit="img",
                                                    disable=not progress, file=sys.stderr, leave=False) as bar:
        try:
            for i, blob, where in blobs:
                pending.append(pool.submit(work, row[i], blob, where))
                while len(pending) > 4 * workers:
                    pending.popleft().result()
                    bar.update()
            while pending:
                pending.popleft().result()
                bar.update()
        finally:
            for f in pending:
                f.cancel()
            blobs.close()  # on an error, stop reading and close the archive now, not at garbage collection
    return out


# ---------------------------------------------------------------- cache

def _fingerprint(source: Path, ids: np.ndarray) -> str:
    """Identifies the source bytes cheaply: name, size and mtime of the archive, or of each image file."""
    if not source.is_dir():
        st = source.stat()
        return f"archive {source.name} {st.st_size} {st.st_mtime_ns}"
    h = hashlib.sha256()
    for i in ids.tolist():
        f = source.parent / member_name(i)
        try:
            st = f.stat()
            h.update(f"{i} {st.st_size} {st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{i} missing\n".encode())  # decoding will name the file
    return f"folder {h.hexdigest()}"


def _read_cache(path: Path, key: str, ids: np.ndarray, image_size: int):
    """(images, cached ids) if `path` is a whole cache made with `key` covering `ids`, else None."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) != key:
                return None
            cached, images = z["ids"], z["images"]  # reading checks each member's CRC
    except Exception:  # noqa: BLE001 - a damaged cache is rebuilt whatever the damage
        return None
    if (images.dtype != np.uint8 or images.shape != (len(cached), image_size, image_size, 3)
            or cached.ndim != 1 or (np.diff(cached) <= 0).any() or not np.isin(ids, cached).all()):
        return None
    return images, cached


def _write_cache(path: Path, key: str, images: np.ndarray, ids: np.ndarray) -> bool:
    """Write atomically (temporary file, then rename); False, with a warning, if the folder is not writable."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:  # a file object keeps np.savez from appending ".npz"
            np.savez(f, images=images, ids=ids.astype(np.int32), key=np.array(key))
        os.replace(tmp, path)
        return True
    except OSError as e:
        tmp.unlink(missing_ok=True)
        warnings.warn(f"flowers102: cannot write the cache {path} ({_cause(e)}); images will be decoded again "
                      f"next time", stacklevel=3)
        return False


# ---------------------------------------------------------------- load

def load(data_dir=None, image_size: int = 64, progress: bool = False) -> Dataset:
    """Oxford Flowers 102 found in `data_dir` (default `download.default_data_dir()`).

    train: {"image": uint8 (N, s, s, 3) NHWC, "label": int32 (N,) in 0..101}, the 80% part
    (6551 images for the real data); test: the same for the held-out 20% (1638), which is
    the reference's validation split (the set it measures KID on). s = image_size. "label"
    is present only when imagelabels.mat is (DDIM needs no labels; a classifier for KID
    features does). meta: source, image_size, n_train, n_test, split, cache, cache_hit,
    classes (the 102 names, label order).
    """
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)) or image_size < 1:
        raise UserError(f"flowers102: image size must be a positive integer, got {image_size!r}")
    image_size = int(image_size)
    data_dir = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    absent = missing(data_dir)
    if absent:
        resume = any((data_dir / f"{name}.part").is_file() for name in absent)
        hint = "resumes the interrupted download" if resume else "fetches them"
        raise UserError(f"flowers102: {', '.join(absent)} missing in {data_dir} "
                        f"(`flaxport data download flowers102 --data-dir {data_dir}` {hint})")
    source = find(data_dir)
    setid = read_setid(data_dir / SETID)
    train_ids, test_ids = split_ids(setid)
    ids = np.unique(np.concatenate([train_ids, test_ids]))
    key = json.dumps({"format": CACHE_FORMAT, "size": image_size, "source": _fingerprint(source, ids)})
    cache = cache_path(data_dir, image_size)
    hit = _read_cache(cache, key, ids, image_size)
    if hit is None:
        images, cached = _decode_all(source, ids, image_size, progress), ids
        _write_cache(cache, key, images, ids)
    else:
        images, cached = hit
    rows = {name: np.searchsorted(cached, part) for name, part in (("train", train_ids), ("test", test_ids))}
    train, test = {"image": images[rows["train"]]}, {"image": images[rows["test"]]}
    if (data_dir / LABELS).is_file():
        labels = read_labels(data_dir / LABELS, int(ids.max()))
        train["label"], test["label"] = labels[train_ids - 1], labels[test_ids - 1]
    return Dataset(
        name="flowers102",
        train=train,
        test=test,
        meta={
            "source": str(source),
            "image_size": image_size,
            "n_train": int(len(train_ids)),
            "n_test": int(len(test_ids)),
            "split": "train: train[:80%]+validation[:80%]+test[:80%]; test: train[80%:]+validation[80%:]+test[80%:]",
            "cache": str(cache),
            "cache_hit": hit is not None,
            "classes": list(CLASSES),
        },
    )


# ---------------------------------------------------------------- fixture

def write_fixture(directory, n_images: int = 24, seed: int = 0, labels: bool = True, archive: bool = True) -> Path:
    """Write a tiny Flowers 102 in the canonical format into `directory`; returns `directory`.

    n_images random JPEGs (smooth colour gradients plus noise, sides 24..80 px so aspect
    ratios vary both ways) as jpg/image_00001.jpg.., packed as 102flowers.tgz (archive=True)
    or left as an extracted jpg/ folder; setid.mat splitting the ids about 1:1:2 like the
    real trnid/valid/tstid (each split at least one image; needs n_images >= 3);
    imagelabels.mat with classes 1..102 when `labels`. Everything from default_rng(seed).
    """
    from PIL import Image
    from scipy.io import savemat

    if n_images < 3:
        raise ValueError("write_fixture needs n_images >= 3 (one per split)")
    rng = np.random.default_rng(seed)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    jpegs = {}
    for i in range(1, n_images + 1):
        h, w = (int(v) for v in rng.integers(24, 81, 2))
        yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
        base = rng.uniform(0, 255, 3) * (0.5 + 0.5 * np.stack([yy, xx, 1 - yy], -1))
        pixels = np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(buf, format="JPEG", quality=90)
        jpegs[member_name(i)] = buf.getvalue()
    if archive:
        with tarfile.open(directory / ARCHIVE, "w:gz") as tar:
            for name, blob in jpegs.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.mtime = len(blob), 0o644, 0
                tar.addfile(info, io.BytesIO(blob))
    else:
        (directory / JPG_DIR).mkdir(exist_ok=True)
        for name, blob in jpegs.items():
            (directory / name).write_bytes(blob)
    perm = rng.permutation(np.arange(1, n_images + 1))
    n_trn = n_val = max(1, n_images // 4)
    # The real file stores (1, n) double arrays; savemat writes 1-D arrays as (1, n) too.
    savemat(directory / SETID, {"trnid": perm[:n_trn].astype(np.float64),
                                "valid": perm[n_trn:n_trn + n_val].astype(np.float64),
                                "tstid": perm[n_trn + n_val:].astype(np.float64)})
    if labels:
        savemat(directory / LABELS, {"labels": rng.integers(1, N_CLASSES + 1, n_images).astype(np.float64)})
    return directory


def download(data_dir=None, base_url: str | None = None, sha256: dict | None = None,
             progress: bool = True, image_size: int = 64) -> dict:
    """Fetch setid.mat, imagelabels.mat and 102flowers.tgz into `data_dir`; returns {name: Path}.

    Names: "setid", "labels", "images" (the three files) and "cache", the preprocessed
    pixels. `base_url` replaces BASE_URL (mirrors, tests); `sha256` maps a name
    ("images") or a file name ("102flowers.tgz") to the expected hex digest, replacing the
    published one for that file only. Then `load(data_dir, image_size)` decodes
    every image once, so a damaged archive is reported now, naming the member, and the
    first training run finds the cache ready.
    """
    data_dir = default_data_dir() if data_dir is None else Path(data_dir).expanduser()
    files = {"setid": SETID, "labels": LABELS, "images": ARCHIVE}
    expected = checksums("flowers102", SHA256, files, sha256)
    base = folder_url(base_url or BASE_URL)
    out = {}
    # Smallest first: a wrong mirror or checksum shows up before the 345 MB archive is fetched.
    for key, name in files.items():
        out[key] = fetch(base + name, data_dir / name, sha256=expected[name], progress=progress)
    load(data_dir, image_size=image_size, progress=progress)
    out["cache"] = cache_path(data_dir, image_size)
    return out
