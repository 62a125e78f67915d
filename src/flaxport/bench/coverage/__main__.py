"""How much of a zoo translates: `python -m flaxport.bench.coverage --source opinfo|hf|timm|torchvision`.

Each case (an OpInfo op, a HuggingFace architecture, a timm family's smallest model, a
torchvision model) runs in its own process under --timeout and --memory: translated, proved in
float64, checked in train mode, its written files loaded and run (case.py). Prints a progress
line per case on stderr and the tables (markdown) on stdout; --json OUT keeps the records as
JSON lines (a first line describes the run), which --resume continues and --table re-prints.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import shlex
import sys
from pathlib import Path

from flaxport.bench.coverage import runner, table
from flaxport.machine import package_version

PACKAGES = {"opinfo": (), "hf": ("transformers",), "timm": ("timm", "torchvision"), "torchvision": ("torchvision",)}


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m flaxport.bench.coverage", description=__doc__.splitlines()[0])
    p.add_argument("--source", metavar="|".join(runner.SOURCES),
                   help="which cases: PyTorch's OpInfo ops, HuggingFace architectures, timm families, torchvision "
                        "models (or package.module: a module of your own with names(filter) and build(name))")
    p.add_argument("--filter", default=None, metavar="REGEX[,REGEX...]",
                   help="only the cases whose name one of these regular expressions finds (re.search), e.g. '^bert$,vit'")
    p.add_argument("--peer", choices=("torchax",), default=None, help="also run torchax on the same inputs")
    p.add_argument("--speed", action="store_true",
                   help="also time each proved case's translated forward and train step against torch eager "
                        "(its own inputs, the same threads; flaxport.bench.convnets.time_translation)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="cases run at once, each in its own process (default 1; timings with --speed want 1)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the records to OUT as JSON lines")
    p.add_argument("--resume", action="store_true", help="keep OUT's records and run only the cases it lacks")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="CPU seconds a case may take (default 300; wall time up to 4 times that)")
    p.add_argument("--memory", type=float, default=6.0, metavar="GB",
                   help="resident memory a case may take, in GB (default 6; 0: no limit)")
    p.add_argument("--table", default=None, metavar="OUT", help="print the tables of an earlier run's OUT and exit")
    args = p.parse_args(argv)
    if args.table is None and args.source is None:
        p.error("choose --source (or --table OUT to print an earlier run's tables)")
    if args.source and args.source not in runner.SOURCES and "." not in args.source:
        p.error(f"--source {args.source}: choose {', '.join(runner.SOURCES)}, or name a module (package.module)")
    if args.timeout <= 0 or args.memory < 0:
        p.error("--timeout must be positive and --memory at least 0")
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    if args.resume and not args.json:
        p.error("--resume continues the run in --json OUT: name it")
    return args


def main(argv=None) -> int:
    args = _args(argv)
    if args.table:
        if not Path(args.table).is_file():
            return _error(f"--table {args.table}: no such file")
        run, records = read(args.table)
        print(tables(run, records))
        return 0
    try:
        names = runner.source_module(args.source).names(args.filter)
    except runner.SourceMissing as e:
        return _error(str(e))
    if not names:
        return _error(f"--filter {args.filter!r} matches none of the {args.source} cases")
    run = describe(args, argv)
    kept, previous = [], []
    if args.resume and Path(args.json).is_file():
        run, kept = read(args.json)
        previous = [r for r in kept if r["name"] in set(names)]
    out = None
    if args.json:  # resumed, the file keeps every record it holds, the cases this --filter leaves out too
        out = open(args.json, "a" if args.resume and kept else "w")
        if not (args.resume and kept):
            out.write(json.dumps({"run": run}) + "\n")
    try:
        records = runner.run(args.source, names, timeout=args.timeout, memory_gb=args.memory, peer=args.peer,
                             speed=args.speed, jobs=args.jobs, out=out, done={r["name"] for r in previous}, log=sys.stderr)
    finally:
        if out is not None:
            out.close()
    print(tables(run, previous + records))
    return 0


def describe(args, argv) -> dict:
    """What the tables' header says about the run: command, date, versions, machine, limits."""
    from flaxport.bench.tables import cpu_model

    words = sys.argv[1:] if argv is None else list(argv)
    packages = ("torch", "jax", "flax", *PACKAGES.get(args.source, ())) + (("torchax",) if args.peer else ())
    return {"source": args.source, "command": "python -m flaxport.bench.coverage " + shlex.join(words),
            "date": datetime.date.today().isoformat(), "versions": {p: package_version(p) for p in packages},
            "machine": f"{_cpus()}-CPU {cpu_model()}, {platform.system()}", "timeout": args.timeout,
            "memory_gb": args.memory, "peer": args.peer, "speed": args.speed}


def tables(run: dict, records: list) -> str:
    """The run's header, its summary, one row per case and the list of failures, in markdown."""
    versions = ", ".join(f"{k} {v}" for k, v in run["versions"].items())
    header = (f"`{run['command']}`: {run['date']}, {run['machine']}; {versions}; at most {run['timeout']:g} CPU "
              f"seconds and {run['memory_gb']:g} GB a case.\n")
    parts = [header, table.summary({run["source"]: records}, run.get("peer"))]
    if run.get("speed"):
        parts += ["The translated model against torch eager, equal threads (medians of interleaved rounds):\n",
                  table.speeds(records)]
    parts += [table.markdown(records, run.get("peer"), run.get("speed")), "What does not pass:\n",
              table.failures(records)]
    return "\n".join(parts)


def read(path) -> tuple[dict, list]:
    """(the run's description, its records) from a JSON-lines file this command wrote."""
    lines = runner.read_records(path)
    if not lines or "run" not in lines[0]:
        raise SystemExit(_error(f"{path}: not a coverage run's JSON lines (its first line describes the run)"))
    return lines[0]["run"], lines[1:]


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _error(message: str) -> int:
    print(f"flaxport: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
