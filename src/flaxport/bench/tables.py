"""The benchmarks page's tables, from the runs `make bench` leaves: `python -m flaxport.bench.tables runs/bench`.

Each table is printed in docs/benchmarks.md's layout, under the command that produced it and
with the machine, the versions and the date, so a new measurement is pasted in as it is.
Reads only what the runs wrote: each comparison's report.json, each train run's
metrics.jsonl, `flaxport env --gemm`'s output and the DDIM sampling benchmark's JSON.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from pathlib import Path

# (subdirectory of the bench folder, the command that made it); the Makefile's bench target runs these.
COMPARES = {
    "gan": "flaxport compare gan --epochs 10",
    "gan-quick": "flaxport compare gan --config quick --epochs 20 --runs torch-tuned,jax-scan",
    "gan-tuned": "flaxport compare gan --config tuned --epochs 40 --runs torch-tuned,jax-scan",
    "cnn": "flaxport compare cnn --epochs 5 --seeds 3",
    "vae": "flaxport compare vae --epochs 10",
    "vae-mnist-shaped": "flaxport compare vae --data binarized_mnist --data-dir DIR --epochs 3 --set iwae_k=5",
    "ddim": "flaxport compare ddim --config bench --epochs 2 --runs torch-eager,torch-tuned,jax-step",
}
# vectorised seeds (docs/vmap.md): member-steps per second, every run in one process
VMAP = {
    "gan-vmap": "flaxport compare gan --config bench --seeds 32 --epochs 3 --sequential-seeds 4 "
                "--runs jax-scan,jax-vmap,torch-tuned,torch-vmap",
    "vae-vmap": "flaxport compare vae --config bench --seeds 8 --epochs 5 --sequential-seeds 4 "
                "--runs jax-scan,jax-vmap,torch-tuned,torch-vmap",
}
TORCH_VARIANTS = ("tuned", "compiled")  # gan-torch-VARIANT: flaxport train gan --framework torch --epochs 3
SCALE = [(d, r) for d in (1, 4) for r in ("scan", "step")]  # gan-DEVICESdev-RUNNER


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def machine_line(facts: dict | None) -> str:
    facts = facts or {}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    versions = ", ".join(f"{k} {facts[k]}" for k in ("jax", "flax", "torch", "keras") if facts.get(k))
    return (f"*{facts.get('cpu_count', os.cpu_count())}-CPU {cpu_model()}; {versions or 'versions unknown'}; "
            f"{datetime.date.today().isoformat()} (1-minute load average {load:.1f} when tabulated).*")


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def compare_table(rep: dict, command: str) -> list:
    """One row per run: steady s/epoch, ms/step, GFLOP/s, speed-ups, first epoch, compile, the quality key."""
    summary = {s["name"]: s for s in rep["summary"]}
    eager = summary.get("torch-eager", {}).get("steady_epoch_seconds")
    tuned = summary.get("torch-tuned", {}).get("steady_epoch_seconds")
    steps = {r["name"]: r["steps_per_epoch"] for r in rep["runs"]}
    from flaxport.bench.figure import CURVES

    qkey = CURVES.get(rep["workload"], (next(iter(rep["summary"][0]["quality"]), None),))[0]
    seeds = rep["summary"][0]["seeds"]
    head = ["run", "steady s/epoch", "ms/step", "GFLOP/s", "vs torch-eager", "vs torch-tuned", "first epoch (s)",
            "compile (s)", f"{qkey} (mean ± std)" if seeds > 1 else qkey]
    rows = []
    for name, s in summary.items():
        # a vectorised run's epoch trains K members: its figures are per member, as a single run's
        members = s.get("members", 1)
        sec = s["steady_epoch_seconds"] / members
        name = f"{name} ({members} members; s/epoch and ms/step per member)" if members > 1 else name
        q = s["quality"].get(qkey, {})
        qtext = (f"{q['mean']:.4g}" + (f" ± {q['std']:.2g}" if seeds > 1 else "")
                 if isinstance(q.get("mean"), (int, float)) else "-")
        rows.append([name, f"{sec:.3f}", f"{sec / steps[s['name']] * 1e3:.2f}" if steps.get(s["name"]) else "-",
                     f"{s['gflop_per_s']:.1f}" if s.get("gflop_per_s") else "-", _ratio(eager, sec),
                     _ratio(tuned, sec), f"{s['first_epoch_seconds']:.2f}",
                     f"{s['compile_seconds']:.2f}" if s["compile_seconds"] else "-", qtext])
    return [f"`{command}`: steady epochs 2..{rep['epochs']}, "
            + (f"mean over {seeds} seeds, " if seeds > 1 else "") + "every run in one process.", ""] + _md(head, rows)


def _md(head, rows) -> list:
    return ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)] + \
           ["| " + " | ".join(r) + " |" for r in rows]


def _steady(workdir: Path):
    recs = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    secs = [r["epoch_seconds"] for r in recs]
    return statistics.fmean(secs[1:] or secs), recs[0]["epoch_seconds"], recs[0].get("steps")


def vmap_table(rep: dict, command: str) -> list:
    """One row per run: members, steady s/epoch, member-steps/s (steady and over the whole run), ratios."""
    summary = {s["name"]: s for s in rep["summary"]}
    scan = summary.get("jax-scan", {}).get("member_steps_per_second")
    tuned = summary.get("torch-tuned", {}).get("member_steps_per_second")
    rows = [[name, str(s.get("members", 1)), f"{s['steady_epoch_seconds']:.3f}",
             f"{s['member_steps_per_second']:.0f}", f"{s['member_steps_per_second_with_compile']:.0f}",
             _ratio(s["member_steps_per_second"], scan), _ratio(s["member_steps_per_second"], tuned)]
            for name, s in summary.items()]
    head = ["run", "members", "steady s/epoch", "member-steps/s", "with compile", "vs jax-scan", "vs torch-tuned"]
    return [f"`{command}`: steady epochs 2..{rep['epochs']}, every run in one process.", ""] + _md(head, rows)


def torch_variants_table(bench: Path) -> list:
    rows = []
    for v in TORCH_VARIANTS:
        d = bench / f"gan-torch-{v}"
        if (d / "metrics.jsonl").exists():
            steady, first, _ = _steady(d)
            rows.append([f"torch-{v}", f"{steady:.3f}", f"{first:.1f}"])
    if not rows:
        return []
    return ["`flaxport train gan --framework torch --torch-variant tuned|compiled --epochs 3`: "
            "steady epochs 2..3.", ""] + _md(["run", "steady s/epoch", "first epoch (s)"], rows)


def scale_table(bench: Path) -> list:
    ms = {}
    for d, r in SCALE:
        w = bench / f"gan-{d}dev-{r}"
        if (w / "metrics.jsonl").exists():
            steady, _, steps = _steady(w)
            ms[d, r] = steady / steps * 1e3
    rows = [[r, f"{ms[1, r]:.2f}", f"{ms[4, r]:.2f}", f"{ms[4, r] / ms[1, r]:.1f}x slower"]
            for r in ("scan", "step") if (1, r) in ms and (4, r) in ms]
    if not rows:
        return []
    return ["`XLA_FLAGS=--xla_force_host_platform_device_count=4 flaxport train gan --config bench "
            "--set batch_size=20 --epochs 4 --devices 1|4 --runner scan|step`: steady epochs 2..4.", ""] + \
        _md(["runner", "1 device (ms/step)", "4 devices (ms/step)", "4 vs 1"], rows)


def gemm_table(bench: Path) -> list:
    path = bench / "gemm.txt"
    if not path.exists():
        return []
    rows = [line.split(None, 2) for line in path.read_text().splitlines() if line.startswith("gemm_")]
    return ["`flaxport env --gemm 128,784,500`: one bare float32 matmul, best of 5 windows.", ""] + \
        _md(["framework", "GFLOP/s", "shape"], [[k[5:], v, rest.split("float32 ", 1)[-1]] for k, v, rest in rows])


def sampling_table(bench: Path) -> list:
    path = bench / "ddim-sampling.json"
    if not path.exists():
        return []
    res = json.loads(path.read_text())
    rows = [[name, f"{res['median_seconds'][name]:.3f}", f"{min(v):.3f}", f"{max(v):.3f}"]
            for name, v in res["seconds"].items()]
    return [f"`python -m flaxport.bench.ddim_sampling --rounds {res['rounds']}`: {res['n']} images in "
            f"{res['steps']} steps, the twins alternating.", ""] + \
        _md(["run", "median (s)", "min (s)", "max (s)"], rows) + \
        ["", f"JAX vs torch eager: {res['jax_speedup_vs_torch_eager']:.2f}x (medians); JAX compile "
             f"{res['jax_compile_seconds']} s, apart; images agree to {res['max_abs_image_difference']:.1e}."]


def tables(bench: Path) -> str:
    out, facts = [], None
    sections = {"GAN": ["gan", "gan-quick", "gan-tuned", torch_variants_table, scale_table], "CNN": ["cnn"],
                "VAE": ["vae", "vae-mnist-shaped", gemm_table], "DDIM": ["ddim", sampling_table],
                "Vectorised seeds": list(VMAP)}
    for title, parts in sections.items():
        out += [f"## {title}", ""]
        for part in parts:
            if callable(part):
                lines = part(bench)
            elif (bench / part / "report.json").exists():
                rep = json.loads((bench / part / "report.json").read_text())
                facts = facts or rep["machine"]
                lines = vmap_table(rep, VMAP[part]) if part in VMAP else compare_table(rep, COMPARES[part])
            else:
                lines = []
            name = part if isinstance(part, str) else part.__name__.replace("_table", "")
            out += (lines + [""]) if lines else [f"(no {name} results in {bench})", ""]
    return "\n".join([machine_line(facts), ""] + out).rstrip() + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flaxport.bench.tables", description=__doc__.splitlines()[0])
    ap.add_argument("bench", nargs="?", default="runs/bench", help="the folder `make bench` wrote (default runs/bench)")
    args = ap.parse_args(argv)
    sys.stdout.write(tables(Path(args.bench)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
