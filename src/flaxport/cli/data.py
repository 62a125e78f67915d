"""flaxport data: fetch real datasets ahead of training, and say what is available where.

Imports of the data modules stay inside the handlers, so building the parser for any
subcommand costs nothing here.
"""
from __future__ import annotations

import os
from pathlib import Path

from flaxport.cli.common import add_debug
from flaxport.errors import UserError

DOWNLOADABLE = ("cifar10",)
EMBEDDED = ("digits",)


def add_parser(sub):
    p = sub.add_parser("data", help="download datasets, list the known sources")
    add_debug(p)
    p.set_defaults(run=lambda args: _usage(p))
    actions = p.add_subparsers(dest="data_command", metavar="ACTION")

    d = actions.add_parser("download", help="download a dataset (cifar10) into the data directory")
    d.add_argument("dataset", help=", ".join(DOWNLOADABLE))
    _add_data_dir(d)
    d.add_argument("--base-url", default=None, metavar="URL",
                   help="mirror to fetch from instead of the official site (the file name is appended)")
    d.add_argument("--md5", default=None, metavar="HEX", help="expected md5 instead of the published one")
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
    if args.md5 is not None and not _is_md5(args.md5):
        raise UserError(f"--md5 expects 32 hex digits, got {args.md5!r}")
    from flaxport.data.download import download_cifar10

    data_dir = _data_dir(args)
    if data_dir.exists() and not data_dir.is_dir():
        raise UserError(f"--data-dir {data_dir} exists and is not a directory")
    path = download_cifar10(data_dir, base_url=args.base_url, md5=args.md5, progress=not args.no_progress)
    print(f"cifar10: {path}")
    return 0


def _is_md5(text: str) -> bool:
    return len(text) == 32 and all(c in "0123456789abcdefABCDEF" for c in text)


def run_list(args) -> int:
    from flaxport.data import cifar10, digits

    data_dir = _data_dir(args)
    origin = "--data-dir" if args.data_dir else ("$FLAXPORT_DATA" if os.environ.get("FLAXPORT_DATA") else "default")
    print(f"data directory: {data_dir} ({origin})")
    print(f"{'digits':9s} embedded  {digits.NPZ} (1797 8x8 scikit-learn digits, resampled on load)")
    found = cifar10.find(data_dir)
    if found is not None:
        print(f"{'cifar10':9s} present   {found}")
    else:
        print(f"{'cifar10':9s} missing   looked for {data_dir / cifar10.DIRNAME}/ and {data_dir / cifar10.ARCHIVE} "
              f"(`flaxport data download cifar10 --data-dir {data_dir}` fetches it)")
    return 0
