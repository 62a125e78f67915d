"""`flaxport` command line: one module per subcommand.

Errors a user can cause print one line on stderr and exit non-zero; `--debug` shows
the traceback instead.
"""
from __future__ import annotations

import argparse
import contextlib
import os
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
    """Run `flaxport ARGV` (None: this process's command line, and this process is the command:
    after its last line on stderr nothing more is printed, whatever fails late in a background
    thread as the process ends). Returns the exit code."""
    process = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv
    with _interrupts_kept() as interrupted:
        code, last = _run(argv, debug)
        if interrupted and code == 0:  # a Ctrl-C that landed where Python could not raise it
            code, last = 130, "flaxport: interrupted"
    if last:
        if process and not debug:
            _last_line(last)
        else:
            print(last, file=sys.stderr)
    return code


def _run(argv: list, debug: bool) -> tuple:
    """(exit code, the error line to print or None)."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return 2, None
        return int(args.run(args) or 0), None
    except UserError as e:
        if debug:
            raise
        return e.exit_code, f"flaxport: error: {e}"
    except KeyboardInterrupt:
        return 130, "flaxport: interrupted"
    except Exception as e:  # noqa: BLE001 - the last line of defence: one line, not a traceback
        if debug:
            raise
        first = (str(e).strip().splitlines() or [""])[0][:300]
        if _out_of_memory(e):  # what the memory estimate let through (it refuses only certain failures)
            return UserError.exit_code, (f"flaxport: error: out of memory: {first}; "
                                         "lower the sizes (batch_size, --n, widths)")
        return 1, f"flaxport: internal error: {type(e).__name__}: {first} (rerun with --debug for the traceback)"


@contextlib.contextmanager
def _interrupts_kept():
    """A list that holds True once a Ctrl-C was swallowed: one landing in a garbage-collector
    callback (XLA has one) cannot be raised, and Python would only print "Exception ignored"
    and go on to exit 0."""
    seen, previous = [], sys.unraisablehook

    def hook(unraisable):
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            seen.append(True)
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield seen
    finally:
        sys.unraisablehook = previous


def _last_line(line: str) -> None:
    """Print `line` as stderr's last: stderr points at /dev/null first and the line goes to the
    terminal by a descriptor of its own, so what Orbax's or XLA's threads print as a failed process
    ends (a traceback of the write that already failed) cannot follow it, even at the same moment."""
    sys.stderr.flush()
    try:
        terminal = os.dup(2)
    except OSError:
        print(line, file=sys.stderr)
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except OSError:
        pass  # stderr stays as it was: the line still goes out
    os.write(terminal, (line + "\n").encode(errors="replace"))
    os.close(terminal)


def _out_of_memory(e: Exception) -> bool:
    """An allocation that failed: NumPy's MemoryError, torch's OutOfMemoryError, XLA's RESOURCE_EXHAUSTED."""
    text = str(e)
    return (isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"
            or ("RESOURCE_EXHAUSTED" in text or "Out of memory" in text) and "Error" in type(e).__name__)
