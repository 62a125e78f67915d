"""A stack's summary: final quality per setting, mean ± std over seeds (sweep.json, sweep.md, sweep.png)."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from flaxport.harness.workdir import write_json


def _steady(seconds: list) -> list:
    return seconds[1:] if len(seconds) > 1 else seconds


def build(workload, config, epochs: int, members: list, results: list) -> dict:
    """members (harness.vmap.Member) and their RunResults -> the sweep.json dict."""
    live = [r for r in results if r.quality]
    scalars = [k for k, v in (live[0].quality if live else {}).items() if isinstance(v, (int, float))]
    metric = scalars[0] if scalars else None
    swept: dict = {}
    for m in members:
        for k, v in m.settings.items():
            swept.setdefault(k, [])
            if v not in swept[k]:
                swept[k].append(v)
    groups: dict = {}
    for m, r in zip(members, results):
        groups.setdefault(tuple(m.settings.items()), []).append((m, r))
    rows = []
    for settings, pairs in groups.items():
        got = [r.quality for _, r in pairs if r.quality]
        rows.append({
            "settings": dict(settings),
            "seeds": [m.seed for m, _ in pairs],
            "members": [m.name for m, _ in pairs],
            "dropped": [m.name for m, r in pairs if not r.quality],
            "quality": {k: _stat([q[k] for q in got]) for k in scalars} if got else {},
        })
    seconds = results[0].epoch_seconds if results else []
    steps = next((r.history[0]["steps"] for r in results if r.history), None)
    steady = statistics.fmean(_steady(seconds)) if seconds else None
    return {
        "workload": workload.name,
        "variant": config.variant,
        "epochs": epochs,
        "metric": metric,
        "swept": swept,
        "seeds": sorted({m.seed for m in members}),
        "settings": rows,
        "members": [{"name": m.name, "seed": m.seed, "settings": m.settings, "quality": r.quality,
                     "dropped": r.settings.get("dropped")} for m, r in zip(members, results)],
        "epoch_seconds": [round(s, 4) for s in seconds],
        "compile_seconds": round(results[0].compile_seconds, 4) if results else None,
        "member_steps_per_second": (round(len(members) * steps / steady, 1) if steps and steady else None),
    }


def _stat(vals: list) -> dict:
    vals = [float(v) for v in vals]
    return {"mean": round(statistics.fmean(vals), 6), "std": round(statistics.pstdev(vals), 6), "n": len(vals)}


def _label(settings: dict) -> str:
    return " ".join(f"{k}={v:g}" for k, v in settings.items()) or "(base config)"


def to_markdown(rep: dict) -> str:
    keys = [k for r in rep["settings"] for k, v in r["quality"].items()]
    qkeys = list(dict.fromkeys(keys))
    swept = ", ".join(f"{k} in {{{', '.join(f'{v:g}' for v in vals)}}}" for k, vals in rep["swept"].items())
    lines = [f"# {rep['workload']} stack ({rep['variant']} config, {rep['epochs']} epochs)", "",
             f"Swept: {swept or 'nothing (seeds only)'}; seeds {', '.join(map(str, rep['seeds']))}. "
             f"Quality after the last epoch, mean ± std over seeds.", ""]
    if rep.get("member_steps_per_second"):
        lines += [f"Speed: {rep['member_steps_per_second']:.0f} member-steps/s over steady epochs "
                  f"(compile {rep['compile_seconds']:.1f} s, once for every member).", ""]
    head = "| setting | seeds | " + " | ".join(qkeys) + " | dropped |"
    lines += [head, "|---|---:|" + "---:|" * len(qkeys) + "---|"]
    for r in rep["settings"]:
        cells = [_fmt(r["quality"][k]) if k in r["quality"] else "-" for k in qkeys]
        lines.append(f"| {_label(r['settings'])} | {len(r['seeds']) - len(r['dropped'])} | " + " | ".join(cells)
                     + f" | {', '.join(r['dropped']) or '-'} |")
    lines += ["", "Members: " + ", ".join(f"`{m['name']}/`" for m in rep["members"]) + " (each a run directory: "
              "`flaxport evaluate`, `sample` and `train --resume` work on it)."]
    return "\n".join(lines) + "\n"


def _fmt(s: dict) -> str:
    return f"{s['mean']:.4f}" + (f" ± {s['std']:.4f}" if s["n"] > 1 else "")


def plot(rep: dict, path: Path) -> Path | None:
    """sweep.png: a heat map for two swept settings, metric against the value for one, a
    bar per setting otherwise (per seed when only seeds vary)."""
    metric = rep["metric"]
    rows = [r for r in rep["settings"] if metric in r["quality"]]
    if metric is None or not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(rep["swept"])
    title = f"{rep['workload']} ({rep['variant']}, {rep['epochs']} epochs): final {metric}, mean ± std over seeds"
    if len(keys) == 2:
        a, b = keys
        va, vb = rep["swept"][a], rep["swept"][b]
        grid = [[math.nan] * len(vb) for _ in va]
        text = [[""] * len(vb) for _ in va]
        for r in rows:
            i, j = va.index(r["settings"][a]), vb.index(r["settings"][b])
            grid[i][j] = r["quality"][metric]["mean"]
            text[i][j] = _fmt(r["quality"][metric]).replace(" ± ", "\n±")
        fig, ax = plt.subplots(figsize=(1.6 * len(vb) + 2.5, 1.0 * len(va) + 1.8), dpi=100)
        im = ax.imshow(grid, cmap="viridis_r", aspect="auto")
        for i in range(len(va)):
            for j in range(len(vb)):
                ax.text(j, i, text[i][j] or "dropped", ha="center", va="center", fontsize=8, color="w",
                        path_effects=_outline())
        ax.set_xticks(range(len(vb)), [f"{v:g}" for v in vb])
        ax.set_yticks(range(len(va)), [f"{v:g}" for v in va])
        ax.set_xlabel(b)
        ax.set_ylabel(a)
        fig.colorbar(im, ax=ax, label=metric)
    elif len(keys) == 1:
        (a,) = keys
        xs = [r["settings"][a] for r in rows]
        fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
        ax.errorbar(xs, [r["quality"][metric]["mean"] for r in rows], yerr=[r["quality"][metric]["std"] for r in rows],
                    marker="o", capsize=3, label="mean ± std")
        seeds = [(m["settings"][a], m["quality"][metric]) for m in rep["members"] if m["quality"]]
        ax.scatter(*zip(*seeds), s=12, color="tab:gray", alpha=0.6, label="each seed", zorder=3)
        ax.legend(fontsize=8)
        if min(xs) > 0 and max(xs) / min(xs) >= 10:
            ax.set_xscale("log")
        ax.set_xlabel(a)
        ax.set_ylabel(metric)
    else:
        members = [m for m in rep["members"] if m["quality"]] if not keys else None
        labels = [m["name"] for m in members] if members else [_label(r["settings"]) for r in rows]
        vals = [m["quality"][metric] for m in members] if members else [r["quality"][metric]["mean"] for r in rows]
        errs = None if members else [r["quality"][metric]["std"] for r in rows]
        fig, ax = plt.subplots(figsize=(6, 0.35 * len(labels) + 1.5), dpi=100)
        ax.barh(range(len(labels)), vals, xerr=errs, color="tab:blue", alpha=0.8)
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(metric)
        if members:
            title = f"{rep['workload']} ({rep['variant']}, {rep['epochs']} epochs): final {metric} per seed"
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _outline():
    from matplotlib import patheffects

    return [patheffects.withStroke(linewidth=2, foreground="black")]


def write(workdir, rep: dict) -> list:
    """sweep.json, sweep.md and sweep.png in the stack's workdir; returns their paths."""
    workdir = Path(workdir)
    write_json(workdir / "sweep.json", rep)
    (workdir / "sweep.md").write_text(to_markdown(rep))
    png = plot(rep, workdir / "sweep.png")
    return [workdir / "sweep.json", workdir / "sweep.md"] + ([png] if png else [])
