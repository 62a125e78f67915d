"""Datasets: the embedded digits, CIFAR-10 in its canonical format, resumable downloads, `flaxport data`."""
import hashlib
import os
import pickle
import re
import socket
import subprocess
import sys
import tarfile

import numpy as np
import pytest

import runs

from flaxport.data import cifar10, digits, download
from flaxport.errors import UserError
from httpfixture import server  # noqa: F401 - a pytest fixture, used by name

DIGITS_SHA256 = "87ff0c9e40dc7e2c0e34e7257799c2e3f3aec1a016363bb11cad869ec428a826"
DIGITS_SPLIT_SHA256 = "cf60b3db32c3e7b835469dc64e059ba3191672a99190a06d791334af7c0b285f"
DIGITS_CLASS_COUNTS = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


# ---------------------------------------------------------------- digits

def test_embedded_digits_are_sklearn_load_digits():
    images, labels = digits.raw()
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8
    assert labels.shape == (1797,) and labels.dtype == np.int32
    assert images.min() == 0 and images.max() == 16
    assert np.bincount(labels).tolist() == DIGITS_CLASS_COUNTS
    assert hashlib.sha256(images.tobytes() + labels.astype(np.uint8).tobytes()).hexdigest() == DIGITS_SHA256


def test_digits_load_shapes_dtypes_meta():
    ds = digits.load()
    assert ds.name == "digits"
    for part, n in ((ds.train, 1438), (ds.test, 359)):
        assert part["image"].shape == (n, 32, 32, 3) and part["image"].dtype == np.uint8
        assert part["label"].shape == (n,) and part["label"].dtype == np.int32
        assert part["image"].flags.c_contiguous
    assert ds.meta["classes"] == [str(d) for d in range(10)]
    assert ds.meta["source"] == "scikit-learn 8x8 digits (embedded), bilinear to 32x32"
    assert (ds.meta["n_train"], ds.meta["n_test"]) == (1438, 359)
    img = ds.train["image"]
    assert (img[..., 0] == img[..., 1]).all() and (img[..., 0] == img[..., 2]).all()
    assert img.min() == 0 and img.max() == 255


def test_digits_other_sizes_and_channels():
    ds = digits.load(size=28, channels=1)
    assert ds.train["image"].shape == (1438, 28, 28, 1) and ds.test["image"].shape == (359, 28, 28, 1)
    assert ds.meta["source"].endswith("bilinear to 28x28")
    # At the native size nothing is resampled: exactly the 0..16 -> 0..255 scaling.
    native = digits.load(size=8, channels=1)
    images, _ = digits.raw()
    train_idx, _ = digits.stratified_split(digits.raw()[1])
    want = np.clip(np.rint(images[train_idx].astype(np.float64) * 255 / 16), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(native.train["image"][..., 0], want)


@pytest.mark.parametrize("bad", [dict(size=0), dict(size=2.5), dict(channels=0)])
def test_digits_bad_arguments_are_user_errors(bad):
    with pytest.raises(UserError, match="digits: "):
        digits.load(**bad)


def test_stratified_split_shares_and_determinism():
    _, labels = digits.raw()
    train, test = digits.stratified_split(labels, 0.2, seed=0)
    assert train.dtype == np.int64 and test.dtype == np.int64
    assert (np.diff(train) > 0).all() and (np.diff(test) > 0).all()
    assert len(np.intersect1d(train, test)) == 0 and len(train) + len(test) == len(labels)
    for c, count in enumerate(DIGITS_CLASS_COUNTS):
        assert abs(int((labels[test] == c).sum()) - 0.2 * count) <= 1
    # Pinned: a NumPy that changed default_rng's permutation would silently change the data.
    assert hashlib.sha256(train.tobytes() + test.tobytes()).hexdigest() == DIGITS_SPLIT_SHA256
    again = digits.stratified_split(labels, 0.2, seed=0)
    assert all((a == b).all() for a, b in zip((train, test), again))
    other = digits.stratified_split(labels, 0.2, seed=1)[1]
    assert len(other) == len(test) and not (other == test).all()
    np.testing.assert_array_equal(digits.load(seed=0).test["label"], digits.load(seed=0).test["label"])


@pytest.mark.parametrize("shape_in,size", [((8, 8), 32), ((8, 8), 28), ((5, 7), (13, 40)), ((8, 8), 8),
                                           ((16, 12), 5)])
def test_upscale_matches_jax_image_resize(shape_in, size):
    import jax
    import jax.numpy as jnp

    x = np.random.default_rng(1).uniform(0, 16, (3, *shape_in)).astype(np.float32)
    out_hw = (size, size) if np.isscalar(size) else size
    ours = digits.upscale(x, size)
    ref = np.asarray(jax.image.resize(jnp.asarray(x), (3, *out_hw), "linear"))
    assert ours.dtype == np.float32 and ours.shape == (3, *out_hw)
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=0)


def test_data_modules_import_neither_jax_nor_torch():
    code = ("import sys, flaxport.data.digits, flaxport.data.cifar10, flaxport.data.download, flaxport.cli.data;"
            "bad = [m for m in ('jax', 'torch') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------- cifar10

def _batch(data, labels):
    return pickle.dumps({b"batch_label": b"test", b"labels": labels, b"data": data}, protocol=2)


def _tar_dir(folder, archive, skip=()):
    """Pack an extracted cifar-10-batches-py folder as the canonical archive."""
    with tarfile.open(archive, "w:gz") as tar:
        for f in sorted(folder.iterdir()):
            if f.name not in skip:
                tar.add(f, arcname=f"{cifar10.DIRNAME}/{f.name}")
    return archive


@pytest.mark.parametrize("archive", [False, True])
def test_cifar10_fixture_loads(tmp_path, archive):
    written = cifar10.write_fixture(tmp_path, n_per_batch=10, seed=3, archive=archive)
    assert written == tmp_path / (cifar10.ARCHIVE if archive else cifar10.DIRNAME)
    ds = cifar10.load(tmp_path)
    assert ds.name == "cifar10" and ds.meta["source"] == str(written)
    assert ds.meta["classes"] == ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                                  "ship", "truck"]
    assert ds.train["image"].shape == (50, 32, 32, 3) and ds.train["image"].dtype == np.uint8
    assert ds.test["image"].shape == (10, 32, 32, 3) and ds.test["label"].dtype == np.int32
    assert ds.train["label"].shape == (50,) and 0 <= ds.train["label"].min() and ds.train["label"].max() <= 9


def test_cifar10_decodes_channel_major_rows_to_nhwc(tmp_path):
    folder = cifar10.write_fixture(tmp_path, n_per_batch=4, seed=0, archive=False)
    data = np.zeros((2, 3072), np.uint8)
    r, c = 5, 7
    data[1, 0 * 1024 + r * 32 + c] = 10  # red plane
    data[1, 1 * 1024 + r * 32 + c] = 20  # green plane
    data[1, 2 * 1024 + r * 32 + c] = 30  # blue plane
    (folder / "data_batch_1").write_bytes(_batch(data, [4, 6]))
    for ds in (cifar10.load(tmp_path), cifar10.load_path(_tar_dir(folder, tmp_path / "x.tar.gz"))):
        img = ds.train["image"]
        assert img.shape == (2 + 4 * 4, 32, 32, 3)
        assert img[1, r, c].tolist() == [10, 20, 30]
        assert img[1].sum() == 60 and img[0].sum() == 0
        assert ds.train["label"][:2].tolist() == [4, 6]
    # Batches concatenate in order, and random fixture pixels land where the format says.
    raw = pickle.loads((folder / "data_batch_2").read_bytes(), encoding="bytes")[b"data"]
    img = cifar10.load(tmp_path).train["image"][2:6]
    for i, y, x, ch in [(0, 0, 0, 0), (1, 31, 0, 2), (3, 17, 29, 1), (2, 31, 31, 2)]:
        assert img[i, y, x, ch] == raw[i, ch * 1024 + y * 32 + x]


def test_cifar10_reads_a_python2_pickle_as_in_the_real_archive(tmp_path):
    # The real batches are Python 2 cPickle protocol-0 files: str keys and data as 8-bit
    # strings, numpy referenced as numpy.core.multiarray. Hand-written in that form.
    data = np.random.default_rng(0).integers(0, 256, (2, 3072), dtype=np.uint8)
    escaped = "".join(f"\\x{b:02x}" for b in data.tobytes())
    text = ("(dp0\nS'data'\np1\ncnumpy.core.multiarray\n_reconstruct\np2\n(cnumpy\nndarray\np3\n(I0\ntp4\nS'b'\n"
            "p5\ntp6\nRp7\n(I1\n(I2\nI3072\ntp8\ncnumpy\ndtype\np9\n(S'u1'\np10\nI0\nI1\ntp11\nRp12\n(I3\nS'|'\n"
            "p13\nNNNI-1\nI-1\nI0\ntp14\nbI00\nS'" + escaped + "'\np15\ntp16\nbsS'labels'\np17\n(lp18\nI3\naI7\nas.")
    folder = cifar10.write_fixture(tmp_path, n_per_batch=1, archive=False)
    (folder / "test_batch").write_bytes(text.encode("latin1"))
    ds = cifar10.load(tmp_path)
    assert ds.test["label"].tolist() == [3, 7]
    np.testing.assert_array_equal(ds.test["image"], data.reshape(2, 3, 32, 32).transpose(0, 2, 3, 1))


def test_cifar10_prefers_the_folder_over_the_archive(tmp_path):
    cifar10.write_fixture(tmp_path, n_per_batch=2, seed=0, archive=True)
    folder = cifar10.write_fixture(tmp_path, n_per_batch=3, seed=1, archive=False)
    ds = cifar10.load(tmp_path)
    assert ds.meta["source"] == str(folder) and len(ds.test["label"]) == 3


def test_cifar10_nothing_there(tmp_path):
    with pytest.raises(UserError) as e:
        cifar10.load(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path) in msg
    assert "cifar-10-batches-py/ or cifar-10-python.tar.gz" in msg
    assert f"flaxport data download cifar10 --data-dir {tmp_path}" in msg


def test_cifar10_default_dir_is_flaxport_data(tmp_path, monkeypatch):
    cifar10.write_fixture(tmp_path, n_per_batch=1, archive=True)
    monkeypatch.setenv("FLAXPORT_DATA", str(tmp_path))
    assert download.default_data_dir() == tmp_path
    assert cifar10.load().meta["source"] == str(tmp_path / cifar10.ARCHIVE)


def _bad_batch_cases():
    rows = np.zeros((10, 3072), np.uint8)
    evil = pickle.dumps(_Evil(), protocol=2)
    return [
        ("shape", _batch(np.zeros((10, 3000), np.uint8), [0] * 10), "b'data' has shape (10, 3000), expected (N, 3072)"),
        ("1-d", _batch(np.zeros(3072, np.uint8), [0]), "b'data' has shape (3072,), expected (N, 3072)"),
        ("dtype", _batch(rows.astype(np.int64), [0] * 10), "b'data' has dtype int64, expected uint8"),
        ("list", _batch(rows.tolist(), [0] * 10), "b'data' is a list, expected a uint8 array"),
        ("count", _batch(rows, [0] * 9), "10 images in b'data' but 9 b'labels'"),
        ("range", _batch(rows, [0] * 9 + [10]), "b'labels' outside 0..9 (e.g. 10)"),
        ("negative", _batch(rows, [-1] + [0] * 9), "b'labels' outside 0..9 (e.g. -1)"),
        ("float labels", _batch(rows, [0.5] * 10), "b'labels' is not a list of integers"),
        ("no data", pickle.dumps({b"labels": [0]}, protocol=2), "has no b'data' entry"),
        ("not a dict", pickle.dumps([1, 2], protocol=2), "not a CIFAR-10 batch (a pickled list"),
        ("truncated", _batch(rows, [0] * 10)[:5000], "is truncated or corrupt"),
        ("garbage", b"\x00 this is not a pickle", "is truncated or corrupt"),
        ("evil", evil, "refusing to load"),
    ]


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > evil_marker",))


@pytest.mark.parametrize("case,blob,needle", _bad_batch_cases(), ids=[c[0] for c in _bad_batch_cases()])
@pytest.mark.parametrize("archive", [False, True], ids=["dir", "tar"])
def test_cifar10_bad_batches_name_the_file(tmp_path, monkeypatch, case, blob, needle, archive):
    monkeypatch.chdir(tmp_path)
    folder = cifar10.write_fixture(tmp_path / "d", n_per_batch=10, archive=False)
    (folder / "data_batch_1").write_bytes(blob)
    where = str(folder / "data_batch_1")
    if archive:
        (tmp_path / "a").mkdir()
        archive_path = _tar_dir(folder, tmp_path / "a" / cifar10.ARCHIVE)
        where = f"{archive_path}:{cifar10.DIRNAME}/data_batch_1"
    with pytest.raises(UserError) as e:
        cifar10.load(tmp_path / ("a" if archive else "d"))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"cifar10: {where}"), msg
    assert needle in msg, msg
    assert not (tmp_path / "evil_marker").exists()


def test_cifar10_missing_batch_file(tmp_path):
    folder = cifar10.write_fixture(tmp_path, n_per_batch=2, archive=False)
    (folder / "data_batch_3").unlink()
    with pytest.raises(UserError, match=re.escape(f"cifar10: {folder / 'data_batch_3'} missing")):
        cifar10.load(tmp_path)


def test_cifar10_archive_missing_member(tmp_path):
    folder = cifar10.write_fixture(tmp_path / "d", n_per_batch=2, archive=False)
    archive = _tar_dir(folder, tmp_path / cifar10.ARCHIVE, skip=("data_batch_3",))
    with pytest.raises(UserError) as e:
        cifar10.load(tmp_path)
    assert str(e.value) == (f"cifar10: {archive}:cifar-10-batches-py/data_batch_3 missing from the archive "
                            f"(not the CIFAR-10 python version?)")


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "flip"])
def test_cifar10_corrupt_archive(tmp_path, damage):
    archive = cifar10.write_fixture(tmp_path, n_per_batch=10, archive=True)
    blob = archive.read_bytes()
    damaged = {"truncate": blob[: len(blob) // 2], "garbage": b"<html>404 not found</html>", "empty": b"",
               "flip": blob[:100] + bytes(b ^ 0xFF for b in blob[100:300]) + blob[300:]}[damage]
    archive.write_bytes(damaged)
    with pytest.raises(UserError) as e:
        cifar10.load(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"cifar10: {archive}"), msg
    assert "truncated or corrupt" in msg or "missing from the archive" in msg, msg


# ---------------------------------------------------------------- downloads

@pytest.fixture
def payload(tmp_path_factory):
    """(bytes, md5) of a fixture CIFAR-10 archive (~190 kB)."""
    blob = cifar10.write_fixture(tmp_path_factory.mktemp("payload"), n_per_batch=10, seed=7).read_bytes()
    return blob, hashlib.md5(blob).hexdigest()


def test_fetch_downloads_and_verifies(server, payload, tmp_path):
    blob, md5 = payload
    server.files["f.bin"] = blob
    dest = download.fetch(server.url + "f.bin", tmp_path / "sub" / "f.bin", md5=md5,
                          sha256=hashlib.sha256(blob).hexdigest(), progress=False, chunk=8192)
    assert dest == tmp_path / "sub" / "f.bin" and dest.read_bytes() == blob
    assert not (tmp_path / "sub" / "f.bin.part").exists()
    assert [r["range"] for r in server.requests] == [None]


def test_fetch_progress_bar_goes_to_stderr(server, payload, tmp_path, capsys):
    blob, md5 = payload
    server.files["f.bin"] = blob
    download.fetch(server.url + "f.bin", tmp_path / "f.bin", md5=md5, progress=True, chunk=8192)
    out, err = capsys.readouterr()
    assert out == "" and "f.bin" in err


@pytest.mark.parametrize("mode", ["eof", "reset"])
def test_fetch_resumes_after_a_dropped_connection(server, payload, tmp_path, mode):
    blob, md5 = payload
    server.files["f.bin"] = blob
    server.cut_after, server.cut_mode = 50_000, mode
    url, dest = server.url + "f.bin", tmp_path / "f.bin"
    part = tmp_path / "f.bin.part"
    with pytest.raises(UserError) as e:
        download.fetch(url, dest, md5=md5, progress=False, chunk=8192)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"download: {url} ") and "run again to resume" in msg, msg
    assert not dest.exists() and part.exists()
    kept = part.stat().st_size
    if mode == "eof":
        assert kept == 50_000 and "connection closed after 50000 of" in msg
    else:  # a reset may discard bytes the client had not read yet
        assert kept <= 50_000

    download.fetch(url, dest, md5=md5, progress=False, chunk=8192)
    assert dest.read_bytes() == blob and not part.exists()
    if kept:
        assert server.requests[-1]["range"] == f"bytes={kept}-" and server.requests[-1]["status"] == 206


def test_fetch_restarts_when_the_server_ignores_range(server, payload, tmp_path):
    blob, md5 = payload
    server.files["f.bin"] = blob
    server.cut_after = 30_000
    url, dest = server.url + "f.bin", tmp_path / "f.bin"
    with pytest.raises(UserError):
        download.fetch(url, dest, md5=md5, progress=False)
    server.range_support = False
    download.fetch(url, dest, md5=md5, progress=False)
    assert dest.read_bytes() == blob and not (tmp_path / "f.bin.part").exists()
    assert server.requests[-1]["range"] == "bytes=30000-" and server.requests[-1]["status"] == 200


def test_fetch_wrong_md5_leaves_nothing(server, payload, tmp_path):
    blob, md5 = payload
    server.files["f.bin"] = blob
    url, dest = server.url + "f.bin", tmp_path / "f.bin"
    with pytest.raises(UserError) as e:
        download.fetch(url, dest, md5="0" * 32, progress=False)
    assert str(e.value) == f"download: {url} checksum mismatch: md5 {md5}, expected {'0' * 32}"
    assert list(tmp_path.iterdir()) == []


def test_fetch_does_not_redownload_a_complete_file(server, payload, tmp_path):
    blob, md5 = payload
    server.files["f.bin"] = blob
    url, dest = server.url + "f.bin", tmp_path / "f.bin"
    download.fetch(url, dest, md5=md5, progress=False)
    mtime = dest.stat().st_mtime_ns
    download.fetch(url, dest, md5=md5.upper(), progress=False)
    download.fetch(url, dest, progress=False)
    assert len(server.requests) == 1 and dest.stat().st_mtime_ns == mtime
    # A final file that does not verify is replaced.
    dest.write_bytes(b"stale")
    download.fetch(url, dest, md5=md5, progress=False)
    assert dest.read_bytes() == blob and len(server.requests) == 2


def test_fetch_finishes_a_complete_part_on_416_and_restarts_a_bad_one(server, payload, tmp_path):
    blob, md5 = payload
    server.files["f.bin"] = blob
    url, dest, part = server.url + "f.bin", tmp_path / "f.bin", tmp_path / "f.bin.part"
    part.write_bytes(blob)  # e.g. interrupted between the last byte and the rename
    download.fetch(url, dest, md5=md5, progress=False)
    assert dest.read_bytes() == blob and [r["status"] for r in server.requests] == [416]
    dest.unlink()
    part.write_bytes(blob + b"junk")  # longer than the file: only a fresh start helps
    download.fetch(url, dest, md5=md5, progress=False)
    assert dest.read_bytes() == blob and [r["status"] for r in server.requests][1:] == [416, 200]


def test_fetch_network_errors_are_one_line_and_keep_the_part(server, tmp_path):
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    part = tmp_path / "f.bin.part"
    part.write_bytes(b"x" * 100)
    url = f"http://127.0.0.1:{port}/f.bin"
    with pytest.raises(UserError) as e:
        download.fetch(url, tmp_path / "f.bin", progress=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"download: {url} failed (") and "Connection refused" in msg, msg
    assert "kept, run again to resume" in msg and part.read_bytes() == b"x" * 100
    with pytest.raises(UserError, match=re.escape(f"download: {server.url}nothing failed (HTTP 404")):
        download.fetch(server.url + "nothing", tmp_path / "g.bin", progress=False)
    with pytest.raises(UserError, match="not a URL urllib can fetch"):
        download.fetch("nonsense", tmp_path / "h.bin", progress=False)


def test_download_cifar10_from_a_mirror_then_load(server, payload, tmp_path):
    blob, md5 = payload
    server.files[cifar10.ARCHIVE] = blob
    path = cifar10.download(tmp_path / "data", base_url=server.url.rstrip("/"), md5=md5, progress=False)
    assert path == tmp_path / "data" / cifar10.ARCHIVE and path.read_bytes() == blob
    assert server.requests[0]["path"] == "/" + cifar10.ARCHIVE
    assert cifar10.load(tmp_path / "data").train["image"].shape == (50, 32, 32, 3)


def test_download_cifar10_catches_a_corrupt_mirror(server, tmp_path):
    junk = b"<html>mirror maintenance</html>"
    server.files[cifar10.ARCHIVE] = junk
    with pytest.raises(UserError, match=re.escape(f"cifar10: {tmp_path / cifar10.ARCHIVE} is truncated or corrupt")):
        cifar10.download(tmp_path, base_url=server.url, md5=hashlib.md5(junk).hexdigest(), progress=False)


def test_download_cifar10_defaults_to_the_official_url(monkeypatch, tmp_path):
    seen = {}

    def fake_fetch(url, dest, **kw):
        seen.update(url=url, dest=dest, **kw)
        raise UserError("stop")

    monkeypatch.setattr(cifar10, "fetch", fake_fetch)
    with pytest.raises(UserError):
        cifar10.download(tmp_path)
    assert seen["url"] == "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    assert seen["md5"] == "c58f30108f718f92721af3b95e74349a" and seen["dest"] == tmp_path / cifar10.ARCHIVE


# ---------------------------------------------------------------- CLI

_one_line_error = runs.one_line_error


def test_cli_data_download_cifar10(cli, server, payload, tmp_path):
    blob, md5 = payload
    server.files[cifar10.ARCHIVE] = blob
    data_dir = tmp_path / "new" / "data"
    proc = cli("data", "download", "cifar10", "--base-url", server.url, "--md5", md5, "--data-dir", data_dir,
               "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert (data_dir / cifar10.ARCHIVE).read_bytes() == blob
    assert str(data_dir / cifar10.ARCHIVE) in proc.stdout

    proc = cli("data", "list", "--data-dir", data_dir)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"cifar10\s+present\s+" + re.escape(str(data_dir / cifar10.ARCHIVE)), proc.stdout)
    assert re.search(r"digits\s+embedded", proc.stdout)


def test_cli_data_download_bad_md5(cli, server, payload, tmp_path):
    server.files[cifar10.ARCHIVE] = payload[0]
    proc = cli("data", "download", "cifar10", "--base-url", server.url, "--md5", "f" * 32, "--data-dir", tmp_path,
               "--no-progress")
    _one_line_error(proc, f"{server.url}{cifar10.ARCHIVE} checksum mismatch: md5 {payload[1]}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,needles", [
    (["data", "download", "nosuch"], ["unknown dataset 'nosuch'", "cifar10"]),
    (["data", "download", "cifar10", "--md5", "xyz"], ["--md5 expects 32 hex digits"]),
    (["data", "frobnicate"], ["invalid choice: 'frobnicate'"]),
])
def test_cli_data_user_errors_are_one_line(cli, args, needles, tmp_path):
    _one_line_error(cli(*args, env={"FLAXPORT_DATA": str(tmp_path)}), *needles)


def test_cli_data_list_uses_flaxport_data(cli, tmp_path):
    proc = cli("data", "list", env={"FLAXPORT_DATA": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert f"data directory: {tmp_path} ($FLAXPORT_DATA)" in proc.stdout
    assert re.search(r"cifar10\s+missing", proc.stdout) and "flaxport data download cifar10" in proc.stdout
    proc = cli("data", "download", "digits")
    assert proc.returncode == 0 and "nothing to download" in proc.stdout
