"""`flaxport` command line: one module per subcommand.

Errors a user can cause print one line on stderr and exit non-zero; `--debug` shows
the traceback instead.
"""
from __future__ import annotations

import argparse
import sys

from flaxport.errors import UserError

SUBCOMMANDS = ("train", "compare", "evaluate", "sample", "parity", "convert", "data", "export", "env", "translate")


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line instead of usage + message."""

    def error(self, message):
        raise UserError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> Parser:
    import importlib

    parser = Parser(prog="flaxport", description="PyTorch -> JAX/Flax workloads, parity and benchmarks.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in SUBCOMMANDS:
        importlib.import_module(f"flaxport.cli.{name}").add_parser(sub)
    return parser


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2
        return int(args.run(args) or 0)
    except UserError as e:
        if debug:
            raise
        print(f"flaxport: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("flaxport: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, not a traceback
        if debug:
            raise
        first = (str(e).strip().splitlines() or [""])[0][:300]
        if _out_of_memory(e):  # what the memory estimate let through (it refuses only certain failures)
            print(f"flaxport: error: out of memory: {first}; lower the sizes (batch_size, --n, widths)",
                  file=sys.stderr)
            return UserError.exit_code
        print(f"flaxport: internal error: {type(e).__name__}: {first} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1


def _out_of_memory(e: Exception) -> bool:
    """An allocation that failed: NumPy's MemoryError, torch's OutOfMemoryError, XLA's RESOURCE_EXHAUSTED."""
    text = str(e)
    return (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or ("RESOURCE_EXHAUSTED" in text or "Out of memory" in text) and "Error" in type(e).__name__)
