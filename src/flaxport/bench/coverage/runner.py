"""Runs a source's cases, each in its own process under a time and memory limit, into JSON-line records.

A source is a module of this package (or, named with dots, one of your own) with
`names(filter=None) -> [name]` (cheap: nothing is built; `filter` is comma-separated regular
expressions, a name kept when one of them matches it: `select`) and `build(name) -> [(module,
args, kwargs)]`. Each case runs as `python -m flaxport.bench.coverage.case` (case.py says what
is checked); the runner stops it when its CPU time passes the time limit or its resident memory
the memory limit, and records how far it got.
"""
from __future__ import annotations

import concurrent.futures
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from flaxport.bench.coverage.case import module_name, summarize

SOURCES = ("opinfo", "hf", "timm", "torchvision")
POLL_SECONDS = 0.5
WALL_FACTOR = 4  # a case's wall time may be this many times its CPU-time limit


def select(names, filter: str | None) -> list:  # noqa: A002 - the sources' interface names it so
    """The names one of `filter`'s comma-separated regular expressions finds (re.search); all without one."""
    patterns = [re.compile(p.strip()) for p in (filter or "").split(",") if p.strip()]
    return [n for n in names if not patterns or any(p.search(n) for p in patterns)]


class SourceMissing(Exception):
    """The source's module is not in this flaxport."""


def source_module(source: str):
    """The module of `source` (see module_name)."""
    try:
        return importlib.import_module(module_name(source))
    except ModuleNotFoundError as e:
        if e.name != module_name(source):
            raise
        where = f"flaxport/bench/coverage/{source}.py" if "." not in source else source
        raise SourceMissing(f"--source {source}: this flaxport has no {where}") from None


def run(source: str, names: list, *, timeout: float, memory_gb: float, peer: str | None = None, speed: bool = False,
        out=None, done=None, log=None, jobs: int = 1) -> list:
    """Each case of `names` (those in `done`, a set of names, skipped), `jobs` child processes at a time
    -> [record] in the order the cases finished; every record is also written to `out` (a text file, one
    JSON line each, flushed) and a progress line to `log` as its case finishes."""
    todo = [n for n in names if n not in (done or ())]
    records = []
    interrupted = threading.Event()  # set when the caller is interrupted: the running children are stopped
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        # each thread only waits on its own child process, so the threads share nothing else
        pending = [pool.submit(run_case, source, name, timeout=timeout, memory_gb=memory_gb, peer=peer, speed=speed,
                               interrupted=interrupted) for name in todo]
        try:
            for i, future in enumerate(concurrent.futures.as_completed(pending), 1):
                record = future.result()
                records.append(record)
                if out is not None:
                    out.write(json.dumps(record) + "\n")
                    out.flush()
                if log is not None:
                    print(f"[{i}/{len(todo)}] {progress_line(record)}", file=log, flush=True)
        except BaseException:
            interrupted.set()
            for future in pending:
                future.cancel()
            raise
    return records


def run_case(source: str, name: str, *, timeout: float, memory_gb: float, peer: str | None = None,
             speed: bool = False, interrupted=None) -> dict:
    """One case in a child process -> its record (see case.py), with `seconds` and `cpu_seconds` (the
    child's wall and CPU time, imports included); a child stopped or dead says so in `step` and `reason` (in the peer's record
    when only the peer was left to run)."""
    with tempfile.TemporaryDirectory(prefix="flaxport-coverage-") as tmp:
        result, stderr_path = Path(tmp) / "result.json", Path(tmp) / "stderr.txt"
        command = [sys.executable, "-m", "flaxport.bench.coverage.case", source, name, str(result)]
        command += (["--peer", peer] if peer else []) + (["--speed"] if speed else [])
        start = time.perf_counter()
        with open(stderr_path, "wb") as stderr:
            child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
            stopped, cpu = _watch(child, timeout, memory_gb, interrupted)
        seconds = round(time.perf_counter() - start, 1)
        record = _read(result) or {"source": source, "name": name, "samples": []}
        running = record.pop("running", "build")
        record.update(seconds=seconds, cpu_seconds=round(max(cpu, record.get("cpu_seconds", 0.0)), 1))
        why = ""
        if stopped:
            why = f"stopped: {stopped} while in {running}"
        elif child.returncode != 0 or running != "done":
            why = f"the case process died in {running} (exit {child.returncode}: {_last_line(stderr_path)})"
        samples = record.get("samples", [])
        if why and running == "peer" and len(samples) == record.get("sample_count"):
            # flaxport's steps all ran: the peer alone did not finish (the samples it had not reached)
            for sample in samples:
                sample.setdefault("peer", {"name": peer, "ok": False, "float64": None, "float32": None,
                                           "seconds": None, "reason": why})
            record.update(summarize(samples))
        elif why and running == "speed" and len(samples) == record.get("sample_count") == 1:
            samples[0]["speed"] = {"error": why}  # proved; only its timing did not finish
            record.update(summarize(samples))
        elif why:
            record.update(step=running, reason=why)
        return _complete(record)


def _watch(child, timeout: float, memory_gb: float, interrupted=None) -> tuple[str, float]:
    """Wait for `child`; stop its process group at the limits (and when the wait itself is
    interrupted, e.g. by Ctrl-C, or the event `interrupted` is set). -> ("" or what stopped it, the
    CPU seconds last seen).

    The time limit counts the child's CPU seconds (user + system, all its threads): on a shared
    machine its wall time would count its neighbours' work too. A child that stops using the CPU
    (hung) is stopped after WALL_FACTOR times the limit of wall time."""
    deadline, cpu = time.monotonic() + WALL_FACTOR * timeout, 0.0
    try:
        while child.poll() is None:
            if interrupted is not None and interrupted.is_set():
                return _stop(child, "interrupted"), cpu
            cpu = max(cpu, _cpu_seconds(child.pid))
            if cpu > timeout:
                return _stop(child, f"over the time limit ({timeout:g} CPU s)"), cpu
            if time.monotonic() > deadline:
                return _stop(child, f"over the wall-time limit ({WALL_FACTOR * timeout:g} s)"), cpu
            if memory_gb and _resident_gb(child.pid) > memory_gb:
                return _stop(child, f"over the memory limit ({memory_gb:g} GB)"), cpu
            time.sleep(POLL_SECONDS)
    except BaseException:
        _stop(child, "interrupted")
        raise
    return "", cpu


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid` and of its children it has waited for (0 where
    /proc cannot tell)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _stop(child, why: str) -> str:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait()
    return why


def _resident_gb(pid: int) -> float:
    """Resident memory of process `pid` in GB (0 where /proc cannot tell)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no output"
    return lines[-1][:300] if lines else "no output"


def _complete(record: dict) -> dict:
    """Every key a record has, also for a case stopped before its samples were summed up."""
    samples = [s for s in record.get("samples", []) if "step" in s]
    base = summarize(samples) if samples else {
        "model": None, "parameters": None, "export": None, "translated": False, "proof": False,
        "float32": None, "lines": None}
    for key, value in base.items():
        record.setdefault(key, value)
    if record.get("reason"):
        record["proof"] = False
    record.setdefault("step", "")
    record.setdefault("reason", "")
    return record


def progress_line(record: dict) -> str:
    """'bert: proved (float32 4.8e-07, 210 lines, 14 s)' / 'swin: translate: <reason>'."""
    head = f"{record['name']}: "
    if record.get("proof"):
        f32 = record.get("float32")
        return head + (f"proved (float32 {f32:.2g}, " if f32 is not None else "proved (") + \
            f"{record.get('lines')} lines, {record['seconds']:g} s)"
    return head + f"{record.get('step') or '?'}: {record.get('reason')} ({record['seconds']:g} s)"


def read_records(path) -> list:
    """The records of a JSON-lines file the runner wrote (a line cut short by a stop is skipped)."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records
