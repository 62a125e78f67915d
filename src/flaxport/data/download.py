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


def checksums(dataset: str, published: dict, names: dict, overrides: dict | None) -> dict:
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


def folder_url(base: str) -> str:
    return base if base.endswith("/") else base + "/"
