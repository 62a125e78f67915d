"""flaxport data: fetch real datasets ahead of training, and say what is available where.

Imports of the data modules stay inside the handlers, so building the parser for any
subcommand costs nothing here.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from flaxport.cli.common import add_debug
from flaxport.errors import UserError

DOWNLOADABLE = ("cifar10", "binarized_mnist", "flowers102")
SHA256_CHECKED = ("binarized_mnist", "flowers102")  # checked with --sha256 FILE=HEX
EMBEDDED = ("digits",)


def add_parser(sub):
    p = sub.add_parser("data", help="download datasets, list the known sources")
    add_debug(p)
    p.set_defaults(run=lambda args: _usage(p))
    actions = p.add_subparsers(dest="data_command", metavar="ACTION")

    d = actions.add_parser("download", help="download a dataset (cifar10, binarized_mnist, flowers102) "
                                            "into the data directory")
    d.add_argument("dataset", help=", ".join(DOWNLOADABLE))
    _add_data_dir(d)
    d.add_argument("--base-url", default=None, metavar="URL",
                   help="mirror to fetch from instead of the official site (the file name is appended)")
    d.add_argument("--md5", default=None, metavar="HEX", help="cifar10: expected md5 instead of the published one")
    d.add_argument("--sha256", action="append", default=[], metavar="FILE=HEX",
                   help="binarized_mnist, flowers102: expected sha256 of one file instead of the published one; "
                        "FILE is the file name (binarized_mnist_train.amat, 102flowers.tgz) or a short name "
                        "(train, valid, test; images, setid, labels); repeat for each file")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_debug(d)
    d.set_defaults(run=run_download)

    ls = actions.add_parser("list", help="list the known datasets and whether they are here")
    _add_data_dir(ls)
    add_debug(ls)
    ls.set_defaults(run=run_list)


def _add_data_dir(p):
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="where real datasets live (default $FLAXPORT_DATA, else ~/.cache/flaxport)")


def _usage(parser) -> int:
    parser.print_help()
    return 2


def _data_dir(args) -> Path:
    from flaxport.data.download import default_data_dir

    return Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()


def run_download(args) -> int:
    name = args.dataset.lower()
    if name in EMBEDDED:
        print(f"{name} ships inside flaxport; nothing to download")
        return 0
    if name not in DOWNLOADABLE:
        raise UserError(f"data download: unknown dataset {args.dataset!r}; downloadable: {', '.join(DOWNLOADABLE)} "
                        f"(embedded, no download needed: {', '.join(EMBEDDED)})")
    if args.md5 is not None and name != "cifar10":
        raise UserError(f"--md5 is for cifar10; {name} is checked with --sha256 FILE=HEX")
    if args.sha256 and name not in SHA256_CHECKED:
        raise UserError(f"--sha256 is for {' and '.join(SHA256_CHECKED)}; {name} is checked with --md5 HEX")
    if args.md5 is not None and not _is_hex(args.md5, 32):
        raise UserError(f"--md5 expects 32 hex digits, got {args.md5!r}")
    sha256 = dict(_file_digest(item) for item in args.sha256)
    data_dir = _data_dir(args)
    if data_dir.exists() and not data_dir.is_dir():
        raise UserError(f"--data-dir {data_dir} exists and is not a directory")
    progress = not args.no_progress
    if name == "cifar10":
        from flaxport.data import cifar10

        path = cifar10.download(data_dir, base_url=args.base_url, md5=args.md5, progress=progress)
        print(f"cifar10: {path}")
        return 0
    if name == "flowers102":
        from flaxport.data import flowers102

        paths = flowers102.download(data_dir, base_url=args.base_url, sha256=sha256, progress=progress)
        for what, path in paths.items():
            print(f"flowers102 {what}: {path}")
        return 0
    from flaxport.data import binarized_mnist

    paths = binarized_mnist.download(data_dir, base_url=args.base_url, sha256=sha256, progress=progress)
    for split, path in paths.items():
        print(f"binarized_mnist {split}: {path}")
    return 0


def _is_hex(text: str, n: int) -> bool:
    return len(text) == n and all(c in "0123456789abcdefABCDEF" for c in text)


def _file_digest(item: str) -> tuple[str, str]:
    """'train=HEX' -> ('train', 'hex'); which FILE names exist is binarized_mnist.download's to check."""
    file, sep, digest = item.partition("=")
    if not sep or not file.strip() or not _is_hex(digest.strip(), 64):
        raise UserError(f"--sha256 expects FILE=HEX with 64 hex digits (e.g. train=ad69...), got {item!r}")
    return file.strip(), digest.strip().lower()


def run_list(args) -> int:
    from flaxport.data import binarized_mnist, cifar10, digits, flowers102

    data_dir = _data_dir(args)
    origin = "--data-dir" if args.data_dir else ("$FLAXPORT_DATA" if os.environ.get("FLAXPORT_DATA") else "default")
    print(f"data directory: {data_dir} ({origin})")
    print(f"{'digits':15s} embedded  {digits.NPZ} (1797 8x8 scikit-learn digits, resampled on load)")
    found = cifar10.find(data_dir)
    if found is not None:
        print(f"{'cifar10':15s} present   {found}")
    else:
        print(f"{'cifar10':15s} missing   looked for {data_dir / cifar10.DIRNAME}/ and {data_dir / cifar10.ARCHIVE} "
              f"(`flaxport data download cifar10 --data-dir {data_dir}` fetches it)")
    # Presence only: parsing the 78 MB train file is load()'s job, not a listing's.
    absent = binarized_mnist.missing(data_dir)
    if not absent:
        print(f"{'binarized_mnist':15s} present   {data_dir} ({', '.join(binarized_mnist.FILES.values())})")
    else:
        print(f"{'binarized_mnist':15s} missing   {', '.join(p.name for p in absent)} not in {data_dir} "
              f"(`flaxport data download binarized_mnist --data-dir {data_dir}` fetches it)")
    # Presence only, like the others; decoding (or reading the cache) is load()'s job.
    absent = flowers102.missing(data_dir)
    if not absent:
        extras = [flowers102.SETID]
        if (data_dir / flowers102.LABELS).is_file():
            extras.append(flowers102.LABELS)
        sizes = sorted(int(m[1]) for p in data_dir.glob("flowers102_*.npz")
                       if (m := re.fullmatch(r"flowers102_(\d+)\.npz", p.name)))
        note = f"; cached at {', '.join(map(str, sizes))} px" if sizes else ""
        print(f"{'flowers102':15s} present   {flowers102.find(data_dir)} (+ {', '.join(extras)}{note})")
    else:
        print(f"{'flowers102':15s} missing   {', '.join(absent)} not in {data_dir} "
              f"(`flaxport data download flowers102 --data-dir {data_dir}` fetches them)")
    return 0
