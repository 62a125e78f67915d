"""The comparison report: the seed article's table, speed ratios, quality; md + json.

Timing rules: every epoch's wall time is kept (`epoch_seconds`, first included). The
first epoch of a JAX run includes its ahead-of-time compile, also reported apart as
`compile_seconds`; ratios use steady-state epochs (all but the first) so compile and
warm-up do not blur them. All runs of one report come from one process, one machine.
"""
from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict
from pathlib import Path

from flaxport.harness.workdir import write_json, write_text

BASELINE = "torch-eager"


def _steady(seconds: list) -> list:
    return seconds[1:] if len(seconds) > 1 else seconds


def build(workload, config, epochs: int, results: list) -> dict:
    """results: [(seed, RunResult)] -> report dict (the report.json schema)."""
    from flaxport.machine import facts

    step_flops = workload.train_flops(config) if workload.train_flops else None
    runs = []
    for seed, r in results:
        steady = _steady(r.epoch_seconds)
        steps = r.history[0]["steps"] if r.history else None
        runs.append({
            "name": r.name,
            "framework": r.framework,
            "seed": seed,
            "epoch_seconds": [round(s, 4) for s in r.epoch_seconds],
            "compile_seconds": round(r.compile_seconds, 4),
            "steady_epoch_seconds": round(statistics.fmean(steady), 4),
            "steps_per_epoch": steps,
            "members": r.settings.get("members", 1),  # K for a vectorised run: one epoch trains K members
            "quality": r.quality,
            "settings": r.settings,
        })
    by_name = defaultdict(list)
    for run in runs:
        by_name[run["name"]].append(run)
    rates = {name: _member_rates(rs) for name, rs in by_name.items()}
    base_rate = rates[BASELINE][0] if BASELINE in rates else None
    summary = []
    for name, rs in by_name.items():
        mean = statistics.fmean(r["steady_epoch_seconds"] for r in rs)
        all_epochs = [s for r in rs for s in _steady(r["epoch_seconds"])]
        entry = {
            "name": name,
            "seeds": len(rs),
            "first_epoch_seconds": round(statistics.fmean(r["epoch_seconds"][0] for r in rs), 4),
            "compile_seconds": round(statistics.fmean(r["compile_seconds"] for r in rs), 4),
            "min_epoch_seconds": round(min(all_epochs), 4),
            "max_epoch_seconds": round(max(all_epochs), 4),
            "total_seconds": round(statistics.fmean(sum(r["epoch_seconds"]) for r in rs), 4),
            "steady_epoch_seconds": round(mean, 4),
            "members": rs[0]["members"],
            "member_steps_per_second": rates[name][0],
            "member_steps_per_second_with_compile": rates[name][1],
            # Member-steps/s against torch-eager's: for a one-member run, its epoch-time ratio.
            "speedup_vs_torch_eager": round(rates[name][0] / base_rate, 2) if base_rate and rates[name][0] else None,
            # Same model FLOPs for every framework: a rate, not a claim about each one's kernels.
            "gflop_per_s": (round(step_flops * rs[0]["steps_per_epoch"] * rs[0]["members"] / mean / 1e9, 1)
                            if step_flops and rs[0]["steps_per_epoch"] else None),
            "quality": _quality_stats([r["quality"] for r in rs]),
        }
        summary.append(entry)
    return {
        "workload": workload.name,
        "config": dataclasses.asdict(config),
        "train_step_gflop": round(step_flops / 1e9, 4) if step_flops else None,
        "epochs": epochs,
        "machine": facts(),
        "runs": runs,
        "summary": summary,
        "member_steps_per_second": {name: rate for name, (rate, _) in rates.items()},
    }


def _member_rates(rs: list) -> tuple:
    """(steady member-steps/s, member-steps/s of the whole run with compile) of one run name.

    A vectorised run (members K) trains K members per epoch: K x steps / its epoch time.
    A sequential run trains one: steps / epoch time, averaged over the seeds it trained."""
    steps = rs[0]["steps_per_epoch"]
    if not steps:
        return None, None
    # Every member of a vectorised run carries the stack's seconds: count them once.
    group = rs[:1] if "members" in rs[0]["settings"] else rs
    k = rs[0]["members"]
    steady = statistics.fmean(r["steady_epoch_seconds"] for r in group)
    total = statistics.fmean(sum(r["epoch_seconds"]) / len(r["epoch_seconds"]) for r in group)
    return round(k * steps / steady, 1), round(k * steps / total, 1)


def _quality_stats(qs: list) -> dict:
    """{metric: {"mean", "std"}} over seeds; lists (mode shares) element-wise."""
    out = {}
    qs = [q for q in qs if q]  # a member dropped from a vectorised run (NaN) has no quality
    for key in (qs[0] if qs else {}):
        vals = [q[key] for q in qs]
        if isinstance(vals[0], list):
            cols = list(zip(*vals))
            out[key] = {"mean": [round(statistics.fmean(c), 4) for c in cols],
                        "std": [round(statistics.pstdev(c), 4) for c in cols]}
        else:
            out[key] = {"mean": round(statistics.fmean(vals), 5), "std": round(statistics.pstdev(vals), 5)}
    return out


def _fmt_q(stat) -> str:
    mean, std = stat["mean"], stat["std"]
    if isinstance(mean, list):
        return "/".join(f"{m:.2f}" for m in mean) + ("" if not any(std) else " ±" + "/".join(f"{s:.2f}" for s in std))
    if not std and float(mean).is_integer():  # a setting such as iwae_k, not a measurement
        return str(int(mean))
    return f"{mean:.4f}" + (f" ±{std:.4f}" if std else "")


def to_markdown(rep: dict) -> str:
    m = rep["machine"]
    lines = [
        f"# flaxport compare {rep['workload']} ({rep['config'].get('variant')} config, {rep['epochs']} epochs)",
        "",
        f"Machine: {m['platform']}, {m['cpu_count']} CPUs, jax {m['jax']} on {m['jax_backend']}, torch {m['torch']}.",
        "Epoch seconds: min/max/mean over steady epochs (2..N); the first epoch includes the JAX compile,",
        "shown apart. Speed-up = this run's member-steps/s over torch-eager's (for a one-member run, torch-eager's",
        "steady epoch / this run's), measured in this same process.",
        "",
    ]
    tuned = next((x.get("member_steps_per_second") for x in rep["summary"] if x["name"] == "torch-tuned"), None)
    vectorised = any(x.get("members", 1) > 1 for x in rep["summary"])
    flops = rep.get("train_step_gflop")
    head = "| run | first epoch (s) | compile (s) | min (s) | max (s) | total (s) | steady mean (s) | vs torch-eager |"
    head += " vs torch-tuned |" if tuned else ""
    head += " members | member-steps/s | with compile |" if vectorised else ""
    head += " GFLOP/s |" if flops else ""
    lines += [head, "|---|" + "---:|" * (head.count("|") - 2)]
    for s in rep["summary"]:
        speed = f"{s['speedup_vs_torch_eager']:.2f}x" if s["speedup_vs_torch_eager"] else "-"
        row = (f"| {s['name']} | {s['first_epoch_seconds']:.3f} | {s['compile_seconds']:.2f} | {s['min_epoch_seconds']:.3f} "
               f"| {s['max_epoch_seconds']:.3f} | {s['total_seconds']:.2f} | {s['steady_epoch_seconds']:.3f} | {speed} |")
        if tuned:
            rate = s.get("member_steps_per_second")
            row += f" {rate / tuned:.2f}x |" if rate else " - |"
        if vectorised:
            row += (f" {s['members']} | {s['member_steps_per_second']:.0f} | {s['member_steps_per_second_with_compile']:.0f} |"
                    if s.get("member_steps_per_second") else f" {s.get('members', 1)} | - | - |")
        if flops:
            row += f" {s['gflop_per_s']:.1f} |" if s.get("gflop_per_s") else " - |"
        lines.append(row)
    if flops:
        lines += ["", f"GFLOP/s = {flops:.3f} GFLOP of model arithmetic per train step (2 x multiply-adds of the",
                  "matmuls and convolutions, forward and backward) x steps / steady epoch seconds; one count for every run."]
    notes = {}
    for r in rep["runs"]:
        st = r.get("settings", {})
        if r["framework"] == "torch":
            notes[r["name"]] = (f"{st.get('threads')} torch thread(s)" + (", fused Adam" if st.get("fused") else "")
                                + (", channels_last" if st.get("channels_last") else "")
                                + (", .item() every step" if st.get("sync_each_step") else ", no per-step sync"))
        elif r["framework"] == "keras":
            notes[r["name"]] = (f"Keras {st.get('keras')} `fit` on its {st.get('keras_backend')} backend, "
                                f"jit_compile={st.get('jit_compile')}; its jit compile is inside the first epoch")
        elif st:
            notes[r["name"]] = f"{st.get('runner')} runner, XLA_FLAGS='{st.get('XLA_FLAGS', '')}'"
    if vectorised:
        lines += ["", "Member-steps/s: train steps of one member per second, over steady epochs (`with compile`: over",
                  "the whole run, the first epoch's compile included). A vectorised run's epoch trains all its members",
                  "at once; the other runs train one seed at a time."]
        sequential = sorted({x["seeds"] for x in rep["summary"] if x.get("members", 1) == 1})
        if sequential and max(sequential) < max(x.get("members", 1) for x in rep["summary"]):
            lines.append(f"The runs that train one seed at a time trained the first {max(sequential)} of the "
                         f"{max(x.get('members', 1) for x in rep['summary'])} seeds (`--sequential-seeds`; torch-eager "
                         "the first only): their rates are per member, so they do not depend on how many.")
    stacked = {r["name"]: r for r in rep["runs"] if "members" in r.get("settings", {})}
    for name, r in stacked.items():
        kind = "one vmapped lax.scan program" if r["framework"] == "jax" else "one torch.func.vmap program"
        notes[name] = f"{r['members']} members as {kind}; " + notes.get(name, "")
    if notes:
        lines += [""] + [f"- {name}: {text}" for name, text in notes.items()]
    qkeys = list(dict.fromkeys(k for x in rep["summary"] for k in x["quality"]))
    lines += ["", "Quality (mean ± std over seeds):", "",
              "| run | seeds | " + " | ".join(qkeys) + " |", "|---|---:|" + "---:|" * len(qkeys)]
    for s in rep["summary"]:
        lines.append(f"| {s['name']} | {s['seeds']} | "
                     + " | ".join(_fmt_q(s["quality"][k]) if k in s["quality"] else "-" for k in qkeys) + " |")
    return "\n".join(lines) + "\n"


def write(workdir, rep: dict) -> None:
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    write_json(workdir / "report.json", rep)
    md = to_markdown(rep)
    pics = sorted(p.relative_to(workdir) for p in workdir.glob("*/*.png"))
    if (workdir / "compare.png").exists():  # the comparison's own picture first
        pics.insert(0, Path("compare.png"))
    if pics:
        md += "\n" + "\n".join(f"![{p.parent if p.parent.name else p.stem}]({p})" for p in pics) + "\n"
    write_text(workdir / "report.md", md)
