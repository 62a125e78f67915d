"""Oxford Flowers 102: canonical-format fixture, TFDS-order split, preprocessing, cache, errors, download, CLI."""
import hashlib
import io
import re
import tarfile

import numpy as np
import pytest
from PIL import Image
from scipy.io import savemat

import runs

from flaxport.data import digits
from flaxport.data import flowers102 as fl
from flaxport.errors import UserError
from httpfixture import server  # noqa: F401 - a pytest fixture, used by name

N = 24  # fixture images: setid splits 6 / 6 / 12 -> train 5 + 5 + 10, held out 1 + 1 + 2


@pytest.fixture(scope="module")
def fixture_dir(tmp_path_factory):
    """A pristine fixture to copy from (written once: JPEG encoding is the slow part)."""
    return fl.write_fixture(tmp_path_factory.mktemp("flowers"), n_images=N, seed=0, archive=False)


def _copy(src, dst, archive=True, skip=(), replace=None):
    """The fixture at `src` as a data dir `dst`: jpg/ packed as 102flowers.tgz (or copied), .mat files as they are."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in (fl.SETID, fl.LABELS):
        (dst / name).write_bytes((src / name).read_bytes())
    members = {fl.member_name(i): (src / fl.member_name(i)).read_bytes() for i in range(1, N + 1)}
    members.update(replace or {})
    if archive:
        with tarfile.open(dst / fl.ARCHIVE, "w:gz") as tar:
            for name, blob in members.items():
                if name not in skip:
                    info = tarfile.TarInfo(name)
                    info.size = len(blob)
                    tar.addfile(info, io.BytesIO(blob))
    else:
        (dst / "jpg").mkdir(exist_ok=True)
        for name, blob in members.items():
            if name not in skip:
                (dst / name).write_bytes(blob)
    return dst


def _setid(path, **arrays):
    base = {"trnid": [1, 2], "valid": [3], "tstid": [4, 5]}
    savemat(path, {k: np.asarray(v) for k, v in {**base, **arrays}.items()})


# ---------------------------------------------------------------- loading

def test_fixture_loads_shapes_split_labels(fixture_dir, tmp_path):
    data = _copy(fixture_dir, tmp_path / "d")
    ds = fl.load(data)
    assert ds.name == "flowers102" and ds.valid is None
    for part, n in ((ds.train, 20), (ds.test, 4)):
        assert set(part) == {"image", "label"}
        assert part["image"].shape == (n, 64, 64, 3) and part["image"].dtype == np.uint8
        assert part["image"].flags.c_contiguous and part["label"].dtype == np.int32
    m = ds.meta
    assert (m["n_train"], m["n_test"], m["image_size"], len(m["classes"])) == (20, 4, 64, 102)
    assert m["classes"][0] == "pink primrose" and m["classes"][-1] == "blackberry lily"
    assert m["source"] == str(data / fl.ARCHIVE) and m["cache"] == str(data / "flowers102_64.npz")
    # Labels are imagelabels.mat's 1..102 minus one, for the same ids as the images.
    labels = fl.read_labels(data / fl.LABELS, N)
    train_ids, test_ids = fl.split_ids(fl.read_setid(data / fl.SETID))
    np.testing.assert_array_equal(ds.train["label"], labels[train_ids - 1])
    np.testing.assert_array_equal(ds.test["label"], labels[test_ids - 1])
    # The extracted jpg/ folder gives the same pixels (and wins over an archive beside it).
    folder = fl.load(fixture_dir)
    assert folder.meta["source"] == str(fixture_dir / "jpg")
    np.testing.assert_array_equal(folder.train["image"], ds.train["image"])
    # Without imagelabels.mat there is simply no "label"; image_size 32 has its own cache.
    (data / fl.LABELS).unlink()
    small = fl.load(data, image_size=32)
    assert set(small.train) == {"image"} and small.train["image"].shape == (20, 32, 32, 3)
    assert (data / "flowers102_32.npz").is_file() and not small.meta["cache_hit"]


def test_split_is_tfds_80_20_in_md5_order(fixture_dir):
    setid = fl.read_setid(fixture_dir / fl.SETID)
    train, held = fl.split_ids(setid)
    want_train, want_held = [], []
    for split, key in (("train", "trnid"), ("validation", "valid"), ("test", "tstid")):
        # TFDS: records sorted by md5(split name + key), key = file name; "closest" rounding.
        order = sorted(setid[key].tolist(),
                       key=lambda i: hashlib.md5(f"{split}image_{i:05d}.jpg".encode()).hexdigest())
        cut = round(0.8 * len(order))
        want_train += order[:cut]
        want_held += order[cut:]
    assert train.tolist() == want_train and held.tolist() == want_held
    assert sorted(train.tolist() + held.tolist()) == list(range(1, N + 1))
    # The real sizes (1020 / 1020 / 6149) give keras-io's 6551 training and 1638 held-out images.
    ids = np.random.default_rng(0).permutation(np.arange(1, fl.N_IMAGES + 1))
    real = {"trnid": ids[:1020], "valid": ids[1020:2040], "tstid": ids[2040:]}
    train, held = fl.split_ids(real)
    assert (len(train), len(held)) == (6551, 1638) and len(np.intersect1d(train, held)) == 0
    again = fl.split_ids({k: v[::-1] for k, v in real.items()})  # file order does not matter
    assert (again[0] == train).all() and (again[1] == held).all()


def test_pixels_are_centre_crop_then_antialiased_bilinear(fixture_dir):
    ds = fl.load(fixture_dir, image_size=16)
    train_ids, _ = fl.split_ids(fl.read_setid(fixture_dir / fl.SETID))
    checked_wide = checked_tall = False
    for row, i in enumerate(train_ids[:8]):
        img = np.asarray(Image.open(fixture_dir / fl.member_name(i)).convert("RGB"), np.float64)
        h, w = img.shape[:2]
        checked_wide |= w > h
        checked_tall |= h > w
        s = min(h, w)

        def resized(top, left):
            # digits.upscale is jax.image.resize's 'linear' in float64: a triangle kernel
            # widened by the scale when shrinking, i.e. tf.image.resize(antialias=True).
            crop = img[top:top + s, left:left + s]
            return np.stack([digits.upscale(crop[None, ..., c], 16)[0] for c in range(3)], -1)

        err = np.abs(ds.train["image"][row] - resized((h - s) // 2, (w - s) // 2))
        # PIL resamples in two passes and rounds to uint8 after each: at most ~2 levels off.
        assert err.max() <= 2.5 and err.mean() < 0.4, (i, err.max(), err.mean())
        # Control: the same comparison against a corner crop is far off, so it can tell.
        assert np.abs(ds.train["image"][row] - resized(0, 0)).mean() > 1.0, i
    assert checked_wide and checked_tall


def test_cache_is_used_then_rebuilt_when_corrupt_or_stale(fixture_dir, tmp_path, monkeypatch):
    data = _copy(fixture_dir, tmp_path / "d")
    first = fl.load(data)
    cache = data / "flowers102_64.npz"
    assert not first.meta["cache_hit"] and cache.is_file()
    assert sorted(p.name for p in data.iterdir()) == sorted([fl.ARCHIVE, fl.SETID, fl.LABELS, cache.name])

    decode = fl._decode_all
    monkeypatch.setattr(fl, "_decode_all", lambda *a, **k: pytest.fail("decoded despite a good cache"))
    second = fl.load(data)
    assert second.meta["cache_hit"]
    np.testing.assert_array_equal(second.train["image"], first.train["image"])
    np.testing.assert_array_equal(second.test["image"], first.test["image"])
    monkeypatch.setattr(fl, "_decode_all", decode)

    blob = cache.read_bytes()
    for damaged in (blob[: len(blob) // 2], b"not a zip", blob[:2000] + bytes(b ^ 0xFF for b in blob[2000:2100])
                    + blob[2100:]):
        cache.write_bytes(damaged)
        again = fl.load(data)
        assert not again.meta["cache_hit"], "a damaged cache was trusted"
        np.testing.assert_array_equal(again.train["image"], first.train["image"])
        assert fl.load(data).meta["cache_hit"]  # and it was written back whole
    # New source bytes (another archive under the same name) -> new pixels, not the old cache.
    other = fl.write_fixture(tmp_path / "other", n_images=N, seed=5)
    (data / fl.ARCHIVE).write_bytes((other / fl.ARCHIVE).read_bytes())
    fresh = fl.load(data)
    assert not fresh.meta["cache_hit"] and not np.array_equal(fresh.train["image"], first.train["image"])


# ---------------------------------------------------------------- errors

def _error(data, **kw):
    with pytest.raises(UserError) as e:
        fl.load(data, **kw)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("flowers102: "), msg
    return msg


def test_missing_files_say_how_to_download(fixture_dir, tmp_path):
    msg = _error(tmp_path)
    assert msg == (f"flowers102: 102flowers.tgz, setid.mat missing in {tmp_path} "
                   f"(`flaxport data download flowers102 --data-dir {tmp_path}` fetches them)")
    data = _copy(fixture_dir, tmp_path / "d")
    (data / fl.SETID).unlink()
    (data / "setid.mat.part").write_bytes(b"x")
    assert "setid.mat missing in" in _error(data) and "resumes the interrupted download" in _error(data)
    assert "image size must be a positive integer" in _error(data, image_size=0)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_archive(fixture_dir, tmp_path, damage):
    data = _copy(fixture_dir, tmp_path / "d")
    blob = (data / fl.ARCHIVE).read_bytes()
    (data / fl.ARCHIVE).write_bytes({"truncate": blob[: len(blob) // 2], "garbage": b"<html>moved</html>",
                                     "empty": b""}[damage])
    msg = _error(data)
    assert msg.startswith(f"flowers102: {data / fl.ARCHIVE}"), msg
    assert "truncated or corrupt" in msg or "missing from the archive" in msg, msg
    assert not (data / "flowers102_64.npz").exists()


@pytest.mark.parametrize("archive", [True, False], ids=["tgz", "folder"])
@pytest.mark.parametrize("bad", ["garbage", "truncated"])
def test_bad_jpeg_names_the_member(fixture_dir, tmp_path, archive, bad):
    good = (fixture_dir / fl.member_name(7)).read_bytes()
    blob = {"garbage": b"\xff\xd8 not really a jpeg", "truncated": good[: len(good) // 3]}[bad]
    data = _copy(fixture_dir, tmp_path / "d", archive=archive, replace={fl.member_name(7): blob})
    where = f"{data / fl.ARCHIVE}:jpg/image_00007.jpg" if archive else str(data / "jpg" / "image_00007.jpg")
    msg = _error(data)
    assert msg.startswith(f"flowers102: {where} is not a readable image ("), msg
    assert not (data / "flowers102_64.npz").exists()


def test_missing_member_or_file(fixture_dir, tmp_path):
    data = _copy(fixture_dir, tmp_path / "a", skip=(fl.member_name(3), fl.member_name(9)))
    assert _error(data) == (f"flowers102: {data / fl.ARCHIVE}:jpg/image_00003.jpg missing from the archive "
                            f"(2 of the 24 images named in setid.mat are missing)")
    data = _copy(fixture_dir, tmp_path / "f", archive=False, skip=(fl.member_name(3),))
    assert _error(data).startswith(f"flowers102: {data / 'jpg' / 'image_00003.jpg'} missing (named in setid.mat")


@pytest.mark.parametrize("arrays,needle", [
    (dict(valid=None), "has no 'valid' array (it has: trnid, tstid)"),
    (dict(tstid=[4, 8190]), "'tstid' holds image id 8190 outside 1..8189"),
    (dict(trnid=[0, 2]), "'trnid' holds image id 0 outside 1..8189"),
    (dict(valid=[1.5]), "'valid' holds non-integer image ids"),
    (dict(valid=np.zeros((1, 0))), "'valid' is not a list of image ids"),
    (dict(valid=["abc"]), "'valid' is not a list of image ids"),
    (dict(tstid=[2, 5]), "image id 2 appears in both 'trnid' and 'tstid'"),
    (dict(tstid=[4, 4]), "image id 4 appears twice in 'tstid'"),
])
def test_bad_setid(fixture_dir, tmp_path, arrays, needle):
    data = _copy(fixture_dir, tmp_path / "d")
    if arrays.get("valid", 0) is None:
        savemat(data / fl.SETID, {"trnid": [1, 2], "tstid": [4]})
    else:
        _setid(data / fl.SETID, **arrays)
    msg = _error(data)
    assert msg.startswith(f"flowers102: {data / fl.SETID}") and needle in msg, msg


def test_unreadable_mat_files(fixture_dir, tmp_path):
    data = _copy(fixture_dir, tmp_path / "d")
    (data / fl.SETID).write_bytes(b"<html>404</html>" * 20)
    assert _error(data).startswith(f"flowers102: {data / fl.SETID} cannot be read as a MATLAB file (")
    _copy(fixture_dir, data)
    savemat(data / fl.LABELS, {"labels": np.full(N, 103.0)})
    assert _error(data) == f"flowers102: {data / fl.LABELS}: 'labels' holds class 103 outside 1..102"
    savemat(data / fl.LABELS, {"labels": np.ones(5)})
    assert "'labels' has 5 entries, setid.mat names image 24" in _error(data)


# ---------------------------------------------------------------- download

@pytest.fixture
def mirror(server, fixture_dir, tmp_path_factory):
    """(server, {file name: bytes}, {file name: sha256}) serving a fixture in the canonical layout."""
    src = _copy(fixture_dir, tmp_path_factory.mktemp("mirror"))
    blobs = {name: (src / name).read_bytes() for name in (fl.ARCHIVE, fl.SETID, fl.LABELS)}
    server.files.update(blobs)
    return server, blobs, {k: hashlib.sha256(v).hexdigest() for k, v in blobs.items()}


def test_download_from_a_mirror_then_load(mirror, tmp_path):
    server, blobs, sha = mirror
    data = tmp_path / "new"
    paths = fl.download(data, base_url=server.url.rstrip("/"), progress=False,
                                         sha256={"images": sha[fl.ARCHIVE], "setid.mat": sha[fl.SETID],
                                                 "labels": sha[fl.LABELS]})
    assert paths == {"setid": data / fl.SETID, "labels": data / fl.LABELS, "images": data / fl.ARCHIVE,
                     "cache": data / "flowers102_64.npz"}
    assert [r["path"] for r in server.requests] == ["/setid.mat", "/imagelabels.mat", "/102flowers.tgz"]
    assert all((data / name).read_bytes() == blob for name, blob in blobs.items())
    assert fl.load(data).meta["cache_hit"]  # the download left the cache ready


def test_download_checks_checksums_and_the_archive(mirror, tmp_path):
    server, blobs, sha = mirror
    with pytest.raises(UserError) as e:  # the published digests do not match the fixture's setid.mat
        fl.download(tmp_path, base_url=server.url, progress=False)
    assert str(e.value) == (f"download: {server.url}setid.mat checksum mismatch: sha256 {sha[fl.SETID]}, "
                            f"expected {fl.SHA256['setid.mat']}")
    assert list(tmp_path.iterdir()) == []
    junk = blobs[fl.ARCHIVE][:3000]
    server.files[fl.ARCHIVE] = junk
    digests = {"setid": sha[fl.SETID], "labels": sha[fl.LABELS], "images": hashlib.sha256(junk).hexdigest()}
    with pytest.raises(UserError, match=re.escape(f"flowers102: {tmp_path / fl.ARCHIVE} is truncated or corrupt")):
        fl.download(tmp_path, base_url=server.url, sha256=digests, progress=False)
    with pytest.raises(UserError, match="no flowers102 file 'nosuch'"):
        fl.download(tmp_path, sha256={"nosuch": "a" * 64})


def test_download_defaults_to_the_official_urls_and_tfds_digests(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(fl, "fetch", lambda url, dest, sha256, **kw: seen.append((url, dest, sha256)))
    monkeypatch.setattr(fl, "load", lambda *a, **k: None)
    fl.download(tmp_path)
    base = "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/"
    assert seen == [
        (base + "setid.mat", tmp_path / "setid.mat",
         "46b8678f91fd95d3c8f4feab80d271a6c834a1dd896fe29fd3e6ad9ce5c8dccd"),
        (base + "imagelabels.mat", tmp_path / "imagelabels.mat",
         "4903e94206bac23bf772aadf06451916df56b58fc483a62db32a97b82656651d"),
        (base + "102flowers.tgz", tmp_path / "102flowers.tgz",
         "2d01ecc807db462958cfe3d92f57a8c252b4abd240eb955770201e45f783b246"),
    ]


# ---------------------------------------------------------------- CLI

def test_cli_download_then_list(cli, mirror, tmp_path):
    server, blobs, sha = mirror
    data = tmp_path / "new" / "data"
    proc = cli("data", "list", "--data-dir", data)
    assert re.search(r"flowers102\s+missing\s+102flowers.tgz, setid.mat not in", proc.stdout), proc.stdout
    assert f"flaxport data download flowers102 --data-dir {data}" in proc.stdout
    proc = cli("data", "download", "flowers102", "--base-url", server.url, "--data-dir", data, "--no-progress",
               "--sha256", f"images={sha[fl.ARCHIVE]}", "--sha256", f"setid.mat={sha[fl.SETID].upper()}",
               "--sha256", f"labels={sha[fl.LABELS]}")
    assert proc.returncode == 0, proc.stderr
    assert f"flowers102 images: {data / fl.ARCHIVE}" in proc.stdout
    assert f"flowers102 cache: {data / 'flowers102_64.npz'}" in proc.stdout
    assert all((data / name).read_bytes() == blob for name, blob in blobs.items())
    proc = cli("data", "list", "--data-dir", data)
    assert re.search(r"flowers102\s+present\s+" + re.escape(f"{data / fl.ARCHIVE} (+ setid.mat, imagelabels.mat; "
                                                            f"cached at 64 px)"), proc.stdout), proc.stdout


def test_cli_errors_are_one_line(cli, mirror, tmp_path):
    server, _, sha = mirror
    runs.one_line_error(cli("data", "download", "flowers102", "--base-url", server.url, "--data-dir", tmp_path,
                            "--no-progress", "--sha256", f"setid={'f' * 64}"),
                        f"{server.url}setid.mat checksum mismatch: sha256 {sha[fl.SETID]}, expected {'f' * 64}")
    runs.one_line_error(cli("data", "download", "flowers102", "--md5", "a" * 32, "--data-dir", tmp_path),
                        "--md5 is for cifar10; flowers102 is checked with --sha256 FILE=HEX")
    assert list(tmp_path.iterdir()) == []
