"""Binarized data for the VAE: Larochelle's binarized MNIST (.amat files, download) and binarized digits."""
import hashlib
import re
import subprocess
import sys

import numpy as np
import pytest

import runs

from flaxport.data import binarized_mnist as bm
from flaxport.data import digits
from flaxport.errors import UserError
from httpfixture import server  # noqa: F401 - a pytest fixture, used by name

# sha256 of digits.binarized().train["image"].tobytes() (1438 x 28 x 28 x 1, defaults).
DIGITS_BINARIZED_TRAIN_SHA256 = "46b058ce65d93a19d6f5af9099ff2c32e97a2cd71c719c38f934388f6447cafc"


def _bits(n, seed):
    return (np.random.default_rng(seed).random((n, 784)) < 0.5).astype(np.uint8)


def _write(directory, **splits):
    """Write the three files from {split: (N, 784) bits or raw bytes}; the rest get one random image."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, split in enumerate(bm.SPLITS):
        content = splits.get(split, _bits(1, 100 + i))
        (directory / bm.FILES[split]).write_bytes(content if isinstance(content, bytes) else bm.to_amat(content))
    return directory


def _sha(blob):
    return hashlib.sha256(blob).hexdigest()


# ---------------------------------------------------------------- loader

def test_fixture_loads_exactly_the_bits_written(tmp_path):
    assert bm.write_fixture(tmp_path, n_train=7, n_valid=5, n_test=3, seed=4) == tmp_path
    ds = bm.load(tmp_path)
    assert ds.name == "binarized_mnist"
    rng = np.random.default_rng(4)
    for part, n in ((ds.train, 7), (ds.valid, 5), (ds.test, 3)):
        img = part["image"]
        assert set(part) == {"image"}
        assert img.shape == (n, 28, 28, 1) and img.dtype == np.uint8 and img.flags.c_contiguous
        np.testing.assert_array_equal(img.reshape(n, 784), (rng.random((n, 784)) < 0.3).astype(np.uint8))
    assert ds.meta["source"] == str(tmp_path)
    assert (ds.meta["n_train"], ds.meta["n_valid"], ds.meta["n_test"]) == (7, 5, 3)
    assert ds.meta["files"] == {s: str(tmp_path / f"binarized_mnist_{s}.amat") for s in ("train", "valid", "test")}
    # The published layout: 784 one-character values, single spaces, "\n"; 1568 bytes a line.
    text = (tmp_path / "binarized_mnist_train.amat").read_bytes()
    assert len(text) == 7 * 1568 and text.count(b"\n") == 7 and text[:4] in (b"0 0 ", b"0 1 ", b"1 0 ", b"1 1 ")


def test_pixels_are_row_major(tmp_path):
    bits = np.zeros((2, 784), np.uint8)
    bits[1, 5 * 28 + 17] = 1  # row 5, column 17
    ds = bm.load(_write(tmp_path, test=bits))
    img = ds.test["image"]
    assert img[1, 5, 17, 0] == 1 and img.sum() == 1


@pytest.mark.parametrize("layout", ["crlf", "tabs", "wide", "no final newline", "trailing space"])
def test_other_whitespace_layouts_parse_the_same(tmp_path, layout):
    bits = _bits(4, 1)
    lines = [" ".join(map(str, row)) for row in bits]
    text = {"crlf": "\r\n".join(lines) + "\r\n", "tabs": "\n".join("\t".join(ln.split()) for ln in lines) + "\n",
            "wide": "\n".join("  " + ln.replace(" ", "   ") for ln in lines) + "\n",
            "no final newline": "\n".join(lines), "trailing space": "\n".join(ln + " " for ln in lines) + "\n"}[layout]
    ds = bm.load(_write(tmp_path, train=text.encode()))
    np.testing.assert_array_equal(ds.train["image"].reshape(4, 784), bits)


def _line(values):
    return " ".join(values).encode() + b"\n"


def _bad_line_cases():
    ok = ["0"] * 784
    return [
        ("short", _line(ok[:783]), "783 values, expected 784"),
        ("long", _line(ok + ["1"]), "785 values, expected 784"),
        ("blank", b"\n", "0 values, expected 784"),
        ("two", _line(ok[:16] + ["2"] + ok[17:]), "value 2 (value 17 of 784) is not 0 or 1"),
        ("float", _line(["0.0"] + ok[1:]), "value 0.0 (value 1 of 784) is not 0 or 1"),
        ("ten", _line(ok[:783] + ["10"]), "value 10 (value 784 of 784) is not 0 or 1"),
        ("minus", _line(ok[:99] + ["-1"] + ok[100:]), "value -1 (value 100 of 784) is not 0 or 1"),
        ("binary", _line(ok[:3] + ["\x00"] + ok[4:]), "value \\x00 (value 4 of 784) is not 0 or 1"),
        ("html", b"<html><body>" + b"x" * 100 + b"</body></html>\n", "1 values, expected 784"),
    ]


@pytest.mark.parametrize("case,line,needle", _bad_line_cases(), ids=[c[0] for c in _bad_line_cases()])
@pytest.mark.parametrize("split", ["train", "test"])
def test_a_bad_line_names_the_file_and_line(tmp_path, case, line, needle, split):
    good = bm.to_amat(_bits(2, 0))
    _write(tmp_path, **{split: good + line + good})  # the bad line is line 3
    path = tmp_path / f"binarized_mnist_{split}.amat"
    with pytest.raises(UserError) as e:
        bm.load(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"binarized_mnist: {path} line 3: "), msg
    assert msg == f"binarized_mnist: {path} line 3: {needle}", msg


def test_a_truncated_download_is_reported_at_its_last_line(tmp_path):
    blob = bm.to_amat(_bits(3, 0))
    _write(tmp_path, valid=blob[: 2 * 1568 + 1000])  # cut mid-line, as an interrupted copy
    with pytest.raises(UserError, match=re.escape(f"{tmp_path / 'binarized_mnist_valid.amat'} line 3: "
                                                  f"500 values, expected 784")):
        bm.load(tmp_path)


def test_an_empty_file(tmp_path):
    _write(tmp_path, test=b"")
    with pytest.raises(UserError) as e:
        bm.load(tmp_path)
    assert str(e.value) == (f"binarized_mnist: {tmp_path / 'binarized_mnist_test.amat'} is empty (no images); "
                            f"delete it and download again")


def test_missing_files_name_what_is_missing(tmp_path):
    with pytest.raises(UserError) as e:
        bm.load(tmp_path)
    msg = str(e.value)
    assert msg == (f"binarized_mnist: binarized_mnist_train.amat, binarized_mnist_valid.amat, "
                   f"binarized_mnist_test.amat missing in {tmp_path} "
                   f"(`flaxport data download binarized_mnist --data-dir {tmp_path}` fetches them)")
    _write(tmp_path)
    (tmp_path / "binarized_mnist_valid.amat").rename(tmp_path / "binarized_mnist_valid.amat.part")
    with pytest.raises(UserError) as e:
        bm.load(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"binarized_mnist: binarized_mnist_valid.amat missing in {tmp_path} ")
    assert "resumes the interrupted download" in msg
    assert bm.missing(tmp_path) == [tmp_path / "binarized_mnist_valid.amat"]


def test_default_dir_is_flaxport_data(tmp_path, monkeypatch):
    bm.write_fixture(tmp_path, 2, 1, 1)
    monkeypatch.setenv("FLAXPORT_DATA", str(tmp_path))
    assert bm.load().meta["source"] == str(tmp_path)


def test_modules_import_neither_jax_nor_torch():
    code = ("import sys, flaxport.data.binarized_mnist, flaxport.data.download, flaxport.cli.data;"
            "bad = [m for m in ('jax', 'torch') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# ---------------------------------------------------------------- download

@pytest.fixture
def mirror(server, tmp_path_factory):
    """The server holding a fixture binarized MNIST; returns (server, {file name: bytes}, {split: sha256})."""
    src = bm.write_fixture(tmp_path_factory.mktemp("src"), n_train=12, n_valid=6, n_test=6, seed=2)
    blobs = {name: (src / name).read_bytes() for name in bm.FILES.values()}
    server.files.update(blobs)
    return server, blobs, {split: _sha(blobs[name]) for split, name in bm.FILES.items()}


def test_download_from_a_mirror_then_load(mirror, tmp_path):
    server, blobs, sha = mirror
    paths = bm.download(tmp_path / "d", base_url=server.url.rstrip("/"),
                                              sha256={"train": sha["train"], "valid": sha["valid"],
                                                      "binarized_mnist_test.amat": sha["test"]}, progress=False)
    assert paths == {s: tmp_path / "d" / f"binarized_mnist_{s}.amat" for s in ("train", "valid", "test")}
    for path in paths.values():
        assert path.read_bytes() == blobs[path.name]
    # The small files first, so a wrong mirror is found before the big one is fetched.
    assert [r["path"] for r in server.requests] == ["/binarized_mnist_valid.amat", "/binarized_mnist_test.amat",
                                                    "/binarized_mnist_train.amat"]
    assert bm.load(tmp_path / "d").meta["n_train"] == 12
    # Complete and verified: a second call fetches nothing.
    bm.download(tmp_path / "d", base_url=server.url, sha256=sha, progress=False)
    assert len(server.requests) == 3


def test_download_resumes_after_a_dropped_connection(mirror, tmp_path):
    server, blobs, sha = mirror
    server.cut_after = 5000  # the first response (valid) stops after 5000 bytes
    with pytest.raises(UserError) as e:
        bm.download(tmp_path, base_url=server.url, sha256=sha, progress=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"download: {server.url}binarized_mnist_valid.amat interrupted")
    assert "run again to resume" in msg
    assert (tmp_path / "binarized_mnist_valid.amat.part").stat().st_size == 5000
    bm.download(tmp_path, base_url=server.url, sha256=sha, progress=False)
    assert server.requests[1]["range"] == "bytes=5000-" and server.requests[1]["status"] == 206
    assert (tmp_path / "binarized_mnist_valid.amat").read_bytes() == blobs["binarized_mnist_valid.amat"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(bm.FILES.values())


def test_download_rejects_a_wrong_checksum(mirror, tmp_path):
    server, blobs, sha = mirror
    with pytest.raises(UserError) as e:
        bm.download(tmp_path, base_url=server.url, sha256={**sha, "test": "0" * 64},
                                          progress=False)
    url = f"{server.url}binarized_mnist_test.amat"
    assert str(e.value) == f"download: {url} checksum mismatch: sha256 {sha['test']}, expected {'0' * 64}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["binarized_mnist_valid.amat"]
    # Without overrides the published checksums apply, which a fixture cannot match (and
    # the valid file already here no longer verifies, so it is fetched again first).
    with pytest.raises(UserError, match=re.escape(f"checksum mismatch: sha256 {sha['valid']}, expected "
                                                  f"{bm.SHA256['binarized_mnist_valid.amat']}")):
        bm.download(tmp_path, base_url=server.url, progress=False)


def test_download_checks_that_the_files_parse(server, tmp_path):
    bad = bm.to_amat(_bits(2, 0)) + b"0 1\n"
    server.files.update({name: bad for name in bm.FILES.values()})
    with pytest.raises(UserError, match=re.escape(f"binarized_mnist: {tmp_path / 'binarized_mnist_train.amat'} "
                                                  f"line 3: 2 values, expected 784")):
        bm.download(tmp_path, base_url=server.url, sha256=dict.fromkeys(bm.SPLITS, _sha(bad)),
                                          progress=False)


def test_download_unknown_checksum_key(tmp_path):
    with pytest.raises(UserError, match="no binarized_mnist file 'training' to give a checksum for"):
        bm.download(tmp_path, sha256={"training": "0" * 64})


def test_download_defaults_to_the_published_urls_and_checksums(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(bm, "fetch", lambda url, dest, **kw: seen.append((url, dest, kw["sha256"])))
    monkeypatch.setattr(bm, "load", lambda data_dir: None)
    bm.download(tmp_path)
    base = "http://www.cs.toronto.edu/~larocheh/public/datasets/binarized_mnist/"
    assert seen == [
        (base + "binarized_mnist_valid.amat", tmp_path / "binarized_mnist_valid.amat",
         "1de3d397c40fe8eeb33dafd4099a1f665ec01e96d9be234aaeeac8a34930e2e2"),
        (base + "binarized_mnist_test.amat", tmp_path / "binarized_mnist_test.amat",
         "e6687bfea3f820c174f33b7865140b2a2dd2930ef786f35d45795fc193b5ab2c"),
        (base + "binarized_mnist_train.amat", tmp_path / "binarized_mnist_train.amat",
         "ad693b29f94c14277b095f5238ddefbbdaaae0939789dd2f4f0205278cee3e4d"),
    ]


# ---------------------------------------------------------------- CLI

_one_line_error = runs.one_line_error


def test_cli_download_then_list(cli, mirror, tmp_path):
    server, blobs, sha = mirror
    data_dir = tmp_path / "new" / "data"
    proc = cli("data", "list", "--data-dir", data_dir)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"binarized_mnist\s+missing\s+binarized_mnist_train.amat, binarized_mnist_valid.amat, "
                     r"binarized_mnist_test.amat not in", proc.stdout), proc.stdout
    assert f"flaxport data download binarized_mnist --data-dir {data_dir}" in proc.stdout

    proc = cli("data", "download", "binarized_mnist", "--base-url", server.url, "--data-dir", data_dir,
               "--sha256", f"train={sha['train']}", "--sha256", f"binarized_mnist_valid.amat={sha['valid'].upper()}",
               "--sha256", f"test={sha['test']}", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    for split in bm.SPLITS:
        path = data_dir / f"binarized_mnist_{split}.amat"
        assert path.read_bytes() == blobs[path.name] and f"binarized_mnist {split}: {path}" in proc.stdout

    proc = cli("data", "list", "--data-dir", data_dir)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"binarized_mnist\s+present\s+" + re.escape(str(data_dir)), proc.stdout), proc.stdout


def test_cli_download_wrong_checksum_is_one_line(cli, mirror, tmp_path):
    server, _, sha = mirror
    proc = cli("data", "download", "binarized_mnist", "--base-url", server.url, "--data-dir", tmp_path,
               "--sha256", f"valid={'f' * 64}", "--no-progress")
    _one_line_error(proc, f"{server.url}binarized_mnist_valid.amat checksum mismatch: sha256 {sha['valid']}, "
                          f"expected {'f' * 64}")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,needles", [
    (["--sha256", "train"], ["--sha256 expects FILE=HEX with 64 hex digits", "'train'"]),
    (["--sha256", "train=abc"], ["--sha256 expects FILE=HEX"]),
    (["--sha256", f"nosuch={'a' * 64}"], ["no binarized_mnist file 'nosuch'"]),
    (["--md5", "a" * 32], ["--md5 is for cifar10; binarized_mnist is checked with --sha256 FILE=HEX"]),
])
def test_cli_download_bad_flags_are_one_line(cli, args, needles, tmp_path):
    _one_line_error(cli("data", "download", "binarized_mnist", *args, "--data-dir", tmp_path), *needles)
    assert list(tmp_path.iterdir()) == []


def test_cli_sha256_is_not_for_cifar10(cli, tmp_path):
    _one_line_error(cli("data", "download", "cifar10", "--sha256", f"train={'a' * 64}", "--data-dir", tmp_path),
                    "--sha256 is for binarized_mnist")


# ---------------------------------------------------------------- binarized digits

def test_binarized_digits_shapes_values_split():
    ds = digits.binarized()
    ref = digits.load()
    assert ds.name == "digits" and ds.valid is None
    for part, ref_part in ((ds.train, ref.train), (ds.test, ref.test)):
        img = part["image"]
        assert img.shape == (len(ref_part["label"]), 28, 28, 1) and img.dtype == np.uint8 and img.flags.c_contiguous
        assert set(np.unique(img).tolist()) == {0, 1}
        np.testing.assert_array_equal(part["label"], ref_part["label"])  # the same split as load()
    assert (ds.meta["n_train"], ds.meta["n_test"]) == (1438, 359) == (ref.meta["n_train"], ref.meta["n_test"])
    assert ds.meta["source"] == "scikit-learn 8x8 digits (embedded), bilinear to 28x28, binarized at 0.5"
    assert hashlib.sha256(ds.train["image"].tobytes()).hexdigest() == DIGITS_BINARIZED_TRAIN_SHA256
    again = digits.binarized()
    np.testing.assert_array_equal(again.train["image"], ds.train["image"])
    np.testing.assert_array_equal(again.test["image"], ds.test["image"])


def test_binarized_digits_are_the_thresholded_greyscale():
    images, labels = digits.raw()
    train_idx, _ = digits.stratified_split(labels)
    grey = digits.upscale(images[train_idx], 28).astype(np.float64) / 16
    for t in (0.25, 0.5):
        np.testing.assert_array_equal(digits.binarized(threshold=t).train["image"][..., 0], grey > t)
    low, high = digits.binarized(threshold=0.2).train["image"], digits.binarized(threshold=0.8).train["image"]
    assert low.sum() > high.sum() and (low >= high).all()
    assert digits.binarized(size=8).train["image"].shape == (1438, 8, 8, 1)


@pytest.mark.parametrize("bad", [dict(threshold=1.0), dict(threshold=-0.1), dict(threshold="0.5"), dict(size=0)])
def test_binarized_digits_bad_arguments(bad):
    with pytest.raises(UserError, match="digits: "):
        digits.binarized(**bad)
