"""compare.png: one picture of a comparison (quality over epochs, epoch time, each twin's samples).

Drawn from what the runs already hold: each run's per-epoch records (metrics.jsonl's
`history`), the report's steady epoch seconds, and each run's final artifacts (the GAN's
samples, the VAE's and DDIM's sample images).
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

# workload -> (quality key, axis label, log scale?) of its curve over epochs.
CURVES = {
    "gan": ("w1", "Wasserstein-1 to the true mixture (lower is better)", True),
    "cnn": ("accuracy", "test accuracy", False),
    "vae": ("nelbo_nats", "test negative ELBO, nats (lower is better)", False),
    "ddim": ("kid", "KID on digit-classifier features (lower is better)", True),
}
FRAMEWORK_COLOURS = {"torch": ("#c0392b", "#e67e22", "#f1948a"), "jax": ("#1f5fa8", "#5dade2", "#85c1e9"),
                     "keras": ("#1e8449", "#58d68d")}


def baseline_name(names: list) -> str:
    """The run speed-ups are measured against: torch-eager, else the first torch run, else the first."""
    if "torch-eager" in names:
        return "torch-eager"
    return next((n for n in names if n.startswith("torch")), names[0])


def colours(rep: dict) -> dict:
    """run name -> colour: torch in reds, jax in blues, keras in greens, in report order."""
    used, out = defaultdict(int), {}
    for s in rep["summary"]:
        fw = s["name"].split("-", 1)[0]
        palette = FRAMEWORK_COLOURS.get(fw, ("#7f7f7f",))
        out[s["name"]] = palette[used[fw] % len(palette)]
        used[fw] += 1
    return out


def write(path, workload, config, rep: dict, results: list) -> Path:
    """Draw compare.png at `path`.

    rep: the report dict (report.build); results: [(seed, RunResult)] of the same comparison.
    Top left: the workload's quality metric of every run over epochs; top right: steady
    seconds per epoch of each run (mean over seeds), speed-up written on the bars; below,
    where the workload has samples, one panel per framework (its last run, first seed).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colour = colours(rep)
    pictures = _pictures(workload.name, results)
    fig = plt.figure(figsize=(12, 8.2 if pictures else 4.4), dpi=100, layout="constrained")
    fig.get_layout_engine().set(w_pad=0.15, h_pad=0.15, wspace=0.08, hspace=0.08)
    grid = fig.add_gridspec(2 if pictures else 1, max(2, len(pictures)) * 2,
                            height_ratios=(1, 1.05) if pictures else None)
    half = max(2, len(pictures))
    _curves(fig.add_subplot(grid[0, :half]), workload.name, results, colour)
    _bars(fig.add_subplot(grid[0, half:]), rep, colour)
    axes = []
    for i, (label, artifact) in enumerate(pictures):
        axes.append(fig.add_subplot(grid[1, 2 * i:2 * i + 2]))
        _picture(axes[-1], workload.name, config, artifact, colour.get(label.split(" ", 1)[0], "#7f8c8d"))
        axes[-1].set_title(label, fontsize=10)
    if workload.name == "gan" and axes:  # one density scale, so the twins' histograms compare by eye
        top = max(ax.get_ylim()[1] for ax in axes)
        for ax in axes:
            ax.set_ylim(0, top)
    m = rep["machine"]
    fig.suptitle(f"flaxport compare {rep['workload']}: {rep['config'].get('variant')} config, {rep['epochs']} epochs "
                 f"({m['cpu_count']} CPUs, jax {m['jax']}, torch {m['torch']})", fontsize=12)
    path = Path(path)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def _curves(ax, name, results, colour):
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    key, label, log = CURVES.get(name, (None, None, False))
    labelled, values = set(), []
    for seed, r in results:
        records = [h for h in r.history if key in h.get("quality", {}) or key is None]
        if key is None and records:  # an unknown workload: its first scalar quality
            key = next(k for k, v in records[0]["quality"].items() if isinstance(v, (int, float)))
            label = key
        xs = [h["epoch"] for h in records]
        ys = [h["quality"][key] for h in records]
        if not xs:
            continue
        ax.plot(xs, ys, "o-" if len(xs) < 12 else "-", ms=3, lw=1.6, color=colour.get(r.name, "grey"),
                label=None if r.name in labelled else r.name, alpha=0.9)
        labelled.add(r.name)
        values += [y for y in ys if y > 0 and math.isfinite(y)]
    # A log axis only where the curves span a factor of 5 or more; a narrower band reads better linear.
    log = log and bool(values) and max(values) >= 5 * min(values)
    if log:
        ax.set_yscale("log")
        # 0.02, not 2x10^-2; minor ticks labelled at 2 and 5 only, so labels never crowd.
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(
            lambda v, _: f"{v:g}" if v > 0 and round(v / 10 ** math.floor(math.log10(v)), 6) in (2, 5) else ""))
        ax.tick_params(axis="y", which="minor", labelsize=8)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(label, fontsize=9)
    ax.set_title("quality over epochs", fontsize=10)
    ax.grid(alpha=0.3, which="both" if log else "major")
    ax.legend(fontsize=8)


def speeds(rep: dict) -> tuple[str, list]:
    """(baseline, [(run name, steady s/epoch of one member, speed-up vs baseline)]) in report order.

    A vectorised run's epoch trains K members, so its seconds are divided by K (and its name says so).
    """
    summary = rep["summary"]
    names = [s["name"] for s in summary]
    base = baseline_name(names)
    member_s = [s["steady_epoch_seconds"] / s.get("members", 1) for s in summary]
    base_s = member_s[names.index(base)]
    return base, [(s["name"] + (f" (per member of {s['members']})" if s.get("members", 1) > 1 else ""), sec,
                   base_s / sec) for s, sec in zip(summary, member_s)]


def _bars(ax, rep, colour):
    base, rows = speeds(rep)
    names = [n for n, _, _ in rows]
    seconds = [s for _, s, _ in rows]
    y = np.arange(len(rows))[::-1]
    ax.barh(y, seconds, color=[colour[s["name"]] for s in rep["summary"]], height=0.6)
    ax.set_yticks(y, names, fontsize=9)
    ax.set_xlim(0, max(seconds) * 1.55)
    for yi, (name, s, ratio) in zip(y, rows):
        ax.text(s + max(seconds) * 0.02, yi, f"{s:.3g} s   {ratio:.1f}x", va="center", fontsize=9,
                fontweight="bold" if ratio > 1 else "normal")
    ax.set_xlabel("steady seconds per epoch (epochs 2..N)", fontsize=9)
    ax.set_title(f"speed-up vs {base}, measured in the same process", fontsize=10)
    ax.grid(axis="x", alpha=0.3)


def _pictures(name, results) -> list:
    """[(panel title, artifact)]: each framework's last run (its most tuned one), first seed."""
    if name not in ("gan", "vae", "ddim"):
        return []
    first_seed = results[0][0] if results else None
    last = {}
    for seed, r in results:
        if seed == first_seed and "samples" in (r.artifacts or {}):
            last[r.framework] = (seed, r)
    out = []
    for seed, r in last.values():
        key, _, _ = CURVES[name]
        value = r.quality.get(key)
        score = f", {key} {value:.4g}" if isinstance(value, (int, float)) else ""
        if "digit_confident_share" in r.quality:  # ddim on digits: the share a reader would call a digit
            score += f", digits {r.quality['digit_confident_share']:.2f}"
        if "mode_share" in r.quality:
            score += ", modes " + "/".join(f"{v:.2f}" for v in r.quality["mode_share"])
        out.append((f"{r.name} (seed {seed}){score}", np.asarray(r.artifacts["samples"])))
    return out


def _picture(ax, name, config, samples, colour):
    if name == "gan":
        lo, hi = min(config.modes) - 4 * config.mode_std, max(config.modes) + 4 * config.mode_std
        finite = samples[np.isfinite(samples)]
        ax.hist(np.clip(finite, lo, hi), bins=80, range=(lo, hi), density=True, color=colour, alpha=0.7,
                label="generated")
        xs = np.linspace(lo, hi, 400)
        pdf = sum(np.exp(-0.5 * ((xs - m) / config.mode_std) ** 2) for m in config.modes)
        pdf /= len(config.modes) * config.mode_std * math.sqrt(2 * math.pi)
        ax.plot(xs, pdf, color="black", lw=1.5, label="true mixture")
        ax.set_xlim(lo, hi)
        ax.set_xlabel("x", fontsize=9)
        ax.legend(fontsize=8, loc="upper right")
        return
    from flaxport.workloads.ddim.plots import grid

    images = samples if samples.ndim == 4 else samples[..., None]
    n = min(len(images), 64)
    pixels = grid(images[:n], cols=math.ceil(math.sqrt(n)))
    ax.imshow(pixels[..., 0] if pixels.shape[-1] == 1 else pixels, cmap="gray", interpolation="nearest")
    ax.set_axis_off()
