"""One coverage case, run in a process of its own: `python -m flaxport.bench.coverage.case SOURCE NAME RESULT`.

The source module builds the case's samples; each sample goes through what a user of
`flaxport translate` gets, and each step is recorded:

1. a few train-mode forwards first where the model keeps running statistics (BatchNorm's
   would otherwise be the trivial 0 and 1), then eval mode;
2. plain `torch.export.export` (non-strict, eval mode), then translate: a failure is "export"
   when export could not capture the forward either, else "translate" (a refusal names its ops,
   anything else is a crash);
3. the float64 proof at every submodule boundary (eval mode) — "proof";
4. one train-mode forward against torch, outputs and running statistics (dropout off) — "train";
5. the written files (model.py, weights.safetensors) loaded as a user loads them, run in eval
   mode against torch's float32 outputs and once in train mode — "files".

A sample is proved when every step passed. RESULT is rewritten (atomically) as each step
starts, so a runner that stops the process still reads how far it got. With `--peer torchax`
torchax runs the same module on the same inputs beside it (see peer.py).
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from flaxport.bench.coverage import one_line

SETTLE_FORWARDS = 3
CHECKS = ("proof", "train", "files")  # what runs on a translation, in order (check_sample)


def module_name(source: str) -> str:
    """flaxport.bench.coverage.<source> for the sources here; a dotted name is a module of your own."""
    return source if "." in source else f"flaxport.bench.coverage.{source}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m flaxport.bench.coverage.case", description=__doc__.splitlines()[0])
    p.add_argument("source", help="a source of this package (hf, timm, ...) or a dotted module name of your own")
    p.add_argument("name")
    p.add_argument("result", help="where to write the case's JSON record")
    p.add_argument("--peer", choices=("torchax",), default=None)
    p.add_argument("--speed", action="store_true")
    args = p.parse_args(argv)
    record = {"source": args.source, "name": args.name, "step": "build", "samples": []}
    progress = _Progress(Path(args.result), record)
    start = time.perf_counter()
    progress("build")
    try:
        samples = importlib.import_module(module_name(args.source)).build(args.name)
    except Exception as e:  # noqa: BLE001 - the benchmark could not make the case: recorded, not raised
        record.update(step="build", reason=f"not built: {one_line(e)}")
    else:
        record.update(build_seconds=round(time.perf_counter() - start, 2), sample_count=len(samples))
        for module, example_args, example_kwargs in samples:
            sample = {}
            record["samples"].append(sample)
            # timed on the first sample only (an op's samples are small and alike)
            check_sample(module, example_args, example_kwargs, sample, progress,
                         speed=args.speed and len(record["samples"]) == 1)
        if args.peer:  # after all of flaxport's samples: what torchax patches in torch cannot touch their export
            from flaxport.bench.coverage import peer

            for (module, example_args, example_kwargs), sample in zip(samples, record["samples"]):
                if sample["step"] != "build":  # not a sample torch itself cannot run
                    progress("peer")
                    sample["peer"] = peer.run(args.peer, module, example_args, example_kwargs)
        record.update(summarize(record["samples"]))
    record.update(case_seconds=round(time.perf_counter() - start, 2), cpu_seconds=round(time.process_time(), 1))
    progress("done")
    return 0


def check_sample(module, args: tuple, kwargs: dict, out: dict, progress, speed: bool = False) -> dict:
    """Fill `out` with one sample's steps: model, parameters, export, translated, proof, float64,
    float32 (largest |torch - model.py| over the outputs), lines, seconds (per step), step (the first
    that failed, or "" when proved) and reason (its one line), failed (every check of CHECKS that
    failed, once translated: ["train"] alone is a model proved in eval mode); with `speed`, a proved sample's
    "speed" too (see _speed). -> out"""
    out.update(model=_label(module), parameters=int(sum(p.numel() for p in module.parameters())),
               export=None, translated=False, proof=False, float64=None, float32=None, lines=None, step="", reason="")
    settle(module, args, kwargs)
    try:  # a sample torch itself cannot run is the case's fault, not a translation's
        torch_output(module, args, kwargs)
    except Exception as e:  # noqa: BLE001
        out.update(step="build", reason=f"not built: torch's own forward fails on it: {one_line(e)}")
        return out
    seconds = out["seconds"] = {}  # per step
    from flaxport.translate import translate
    from flaxport.translate.proof import check_train, prove

    # plain export before translate: after a failed export inside translate, torch's leftover state fails it too
    progress("export")
    start = time.perf_counter()
    out["export"], why = exports(module, args, kwargs)
    seconds["export"] = round(time.perf_counter() - start, 2)
    progress("translate")
    start = time.perf_counter()
    try:
        t = translate(module, *args, example_kwargs=kwargs, check=False)
    except Exception as e:  # noqa: BLE001 - a refusal or a crash, told apart by its class in the reason
        seconds["translate"] = round(time.perf_counter() - start, 2)
        if out["export"]:
            out.update(step="translate", reason=one_line(e))
        else:
            out.update(step="export", reason=why)
        return out
    seconds["translate"] = round(time.perf_counter() - start, 2)
    out.update(translated=True, lines=len(t.source.splitlines()))
    checks = (("proof", lambda: _proof(prove(t, module), out)), ("train", lambda: _train(t, module, check_train)),
              ("files", lambda: _files(t, module, out)))
    failed = []
    for step, check in checks:
        progress(step)
        start = time.perf_counter()
        reason = _guarded(check)
        seconds[step] = round(time.perf_counter() - start, 2)
        if reason:
            failed.append((step, reason))
    out["proof"] = not failed
    out["failed"] = [step for step, _ in failed]  # every check that failed (a model proved in eval mode only)
    if failed:
        out["step"], out["reason"] = failed[0]
    elif speed:
        progress("speed")
        out["speed"] = _speed(t, module, args, kwargs)
    return out


def _speed(t, module, args, kwargs) -> dict:
    """{"forward": jax/torch median-time ratio, "step": the same for the generated train_step.py (None
    where the model's output is not a classifier's logits in both modes), or "error": why it could not be timed}: the
    translated model jitted against torch eager on the sample's own input, with the same threads."""
    import torch

    from flaxport.bench.convnets import time_translation

    if kwargs or len(args) != 1 or not torch.is_tensor(args[0]):
        return {"error": "timed only for a model of one tensor input"}

    def logits(training: bool) -> bool:  # a classifier's, which the step's cross-entropy takes
        out = torch_output(module, args, kwargs, training)
        return torch.is_tensor(out) and out.ndim == 2 and out.is_floating_point()

    # GoogLeNet and Inception v3 add auxiliary logits in train mode: their step needs the user's loss
    train = logits(False) and logits(True)
    try:
        figures = time_translation(module, args[0], rounds=5, train=train, translation=t)
    except Exception as e:  # noqa: BLE001 - a model the timing cannot run is a record, not a crash
        return {"error": one_line(e)}
    return {"forward": figures["forward"]["ratio"], "step": figures["step"]["ratio"] if train else None}


def settle(module, args, kwargs) -> None:
    """A few train-mode forwards (no gradients) where the model keeps running statistics, so they are
    not the trivial 0 and 1; then eval mode."""
    import torch

    if any(name.endswith(("running_mean", "running_var")) for name, _ in module.named_buffers()):
        torch.manual_seed(0)
        module.train()
        with torch.no_grad():
            for _ in range(SETTLE_FORWARDS):
                module(*args, **kwargs)
    module.eval()


def exports(module, args, kwargs) -> tuple[bool, str]:
    """(captured, reason): whether plain torch.export.export (non-strict, eval mode) captures the forward."""
    import torch

    from flaxport.port.weights import set_torch_mode
    from flaxport.translate.copies import BUFFERS, PARAMETERS, copy_as

    try:  # export traces with fake tensors: the copy can share the weights
        torch.export.export(set_torch_mode(copy_as(module, share=(PARAMETERS, BUFFERS)), False), tuple(args),
                            dict(kwargs), strict=False)
    except Exception as e:  # noqa: BLE001
        return False, f"torch.export: {one_line(e)}"
    return True, ""


def _guarded(check) -> str:
    """The reason `check()` returns, or the one line of what it raised."""
    try:
        return check()
    except Exception as e:  # noqa: BLE001 - a crash inside a check is that check's failure
        return f"crashed: {one_line(e)}"


def _proof(report, out) -> str:
    out["float64"] = _finite(report.max_abs)
    if report.ok:
        return ""
    first = report.first_divergence
    return (f"float64 proof fails first at {first.torch_name!r} (max |diff| {first.max_abs:.3g}"
            + (f", {first.note}" if first.note else "") + ")")


def _train(t, module, check_train) -> str:
    if "train" not in t.plan.captures:
        return next((n for n in t.notes if "train mode could not be" in n), "train mode not captured")
    report = check_train(t, module)
    if report.ok:
        return ""
    first = report.first_divergence
    return (f"train mode differs first at {first.torch_name!r} ({first.phase}, max |diff| {first.max_abs:.3g}"
            + (f", {first.note}" if first.note else "") + ")")


def _files(t, module, out) -> str:
    """model.py and weights.safetensors written and run as a user runs them (translate.written)."""
    from flaxport.translate.written import check_written

    with tempfile.TemporaryDirectory(prefix="flaxport-coverage-") as directory:
        t.save(directory)
        check = check_written(t, module, directory)
    if check.float32 is not None:
        out["float32"] = _finite(check.float32)
    return check.problem


def torch_output(module, args, kwargs, training: bool = False):
    """The module's output on the example, in eval mode (the structure the JAX output is read in)
    or in train mode, without gradients; the module is left as it was."""
    import torch

    from flaxport.translate.copies import on_copy

    def forward(m):
        with torch.no_grad():
            return m(*args, **kwargs)

    return on_copy(module, forward, training=training)


def summarize(samples: list) -> dict:
    """The case's figures over its samples: every step must hold for every sample; the reason is the
    first failing sample's."""
    if not samples:
        return {"step": "build", "reason": "not built: the source gave no sample"}
    # a sample torch itself cannot run (an OpInfo view of a larger storage, cloned) does not count
    samples = [s for s in samples if s.get("step") != "build"] or samples
    first = next((s for s in samples if s["step"]), None)
    figures = [s["float32"] for s in samples if s["float32"] is not None]
    reason = ""
    if first is not None:
        reason = first["reason"] if len(samples) == 1 else f"sample {samples.index(first)}: {first['reason']}"
    out = {"model": samples[0]["model"], "parameters": samples[0]["parameters"],
           "export": all(s["export"] for s in samples), "translated": all(s["translated"] for s in samples),
           "proof": all(s["proof"] for s in samples), "float32": max(figures) if figures else None,
           "lines": max((s["lines"] for s in samples if s["lines"]), default=None),
           "step": first["step"] if first else "", "reason": reason}
    if out["translated"] and all("failed" in s for s in samples):
        out["failed"] = [step for step in CHECKS if any(step in s["failed"] for s in samples)]
    peers = [s.get("peer") for s in samples if s.get("peer")]
    if peers:
        out["peer"] = {"name": peers[0]["name"], "ok": all(p["ok"] for p in peers),
                       "float32": max((p["float32"] for p in peers if p["float32"] is not None), default=None),
                       "reason": next((p["reason"] for p in peers if p["reason"]), "")}
    speeds = [s["speed"] for s in samples if s.get("speed")]
    if speeds:  # the first sample's: a zoo case has one, and an op's samples differ in size
        out["speed"] = speeds[0]
    return out


def _label(module) -> str:
    """The module's class; timm's models also say which architecture they are."""
    architecture = (getattr(module, "pretrained_cfg", None) or {}).get("architecture")
    return f"{architecture} ({type(module).__name__})" if architecture else type(module).__name__


def _finite(x):
    return float(x) if x is not None and math.isfinite(x) else None


class _Progress:
    """Writes the record to `path` (atomically) with the step now running."""

    def __init__(self, path: Path, record: dict):
        self.path, self.record = path, record

    def __call__(self, step: str) -> None:
        self.record["running"] = step
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.record))
        os.replace(tmp, self.path)


if __name__ == "__main__":
    sys.exit(main())
