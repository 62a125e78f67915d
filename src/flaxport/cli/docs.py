"""docs/cli.md, generated from the argparse definitions so the reference cannot drift.

    python -m flaxport.cli.docs            # rewrite docs/cli.md
    python -m flaxport.cli.docs --check    # exit 1 if docs/cli.md differs from the parser
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_PATH = Path("docs/cli.md")
WIDTH = 96  # usage lines wrap here whatever the terminal is, so the file is the same everywhere

HEADER = """\
# Command-line reference

Every `flaxport` command and flag, generated from the parser by `python -m flaxport.cli.docs`
(do not edit by hand: a test fails when this page and the parser disagree). `python -m flaxport`
is the same program.

Errors you can cause (a bad flag, missing data, a checkpoint from another run) print one line on
stderr and exit with 2; a run whose loss turns NaN or inf exits with 3, its last good checkpoint
kept; `--debug` shows the traceback instead. `--set KEY=VALUE` takes any field of the workload's
config (`src/flaxport/workloads/WORKLOAD/config.py`), parsed as that field's type.
"""


def _subparsers(parser) -> list:
    """[(name, help, subparser)] in the order they were added."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            out += [(name, helps.get(name, ""), p) for name, p in action.choices.items()]
    return out


def _usage(parser) -> str:
    fmt = argparse.HelpFormatter(prog=parser.prog, width=WIDTH)
    fmt.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return fmt.format_help().strip()


def _flag(action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    name = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{name}`"
    if action.choices:
        return f"`{name} {{{','.join(map(str, action.choices))}}}`"
    return f"`{name} {action.metavar or action.dest.upper()}`"


def _default(action) -> str:
    if action.nargs == 0 or action.default in (None, [], argparse.SUPPRESS) or not action.option_strings:
        return ""
    return f"`{action.default}`"


def _cell(text: str) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def _section(name: str, help_text: str, parser, level: int) -> list:
    lines = [f"{'#' * level} `{parser.prog}`", ""]
    if help_text:
        lines += [help_text[0].upper() + help_text[1:] + ".", ""]
    lines += ["```", _usage(parser), "```", ""]
    rows = [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and a.help != argparse.SUPPRESS]
    if rows:
        lines += ["| argument | default | what it does |", "|---|---|---|"]
        lines += [f"| {_flag(a)} | {_default(a)} | {_cell(a.help)} |" for a in rows]
        lines.append("")
    for sub_name, sub_help, sub in _subparsers(parser):
        lines += _section(sub_name, sub_help, sub, level + 1)
    return lines


def render(parser=None) -> str:
    """The whole of docs/cli.md for `parser` (default: flaxport's)."""
    from flaxport.cli import build_parser

    parser = parser or build_parser()
    commands = _subparsers(parser)
    lines = [HEADER, "| command | what it does |", "|---|---|"]
    lines += [f"| [`{name}`](#flaxport-{name}) | {_cell(h)} |" for name, h, _ in commands]
    lines.append("")
    for name, help_text, sub in commands:
        lines += _section(name, help_text, sub, 2)
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flaxport.cli.docs", description=__doc__.splitlines()[0])
    ap.add_argument("path", nargs="?", default=str(DEFAULT_PATH))
    ap.add_argument("--check", action="store_true", help="exit 1 if the file is stale, write nothing")
    args = ap.parse_args(argv)
    path, text = Path(args.path), render()
    if args.check:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is stale: run `python -m flaxport.cli.docs` to regenerate it", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
