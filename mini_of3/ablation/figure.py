"""The ablation's figure: whole-entry quality against the arm, per split, with bootstrap intervals over seeds and
entries, the random chain and the untrained model beside; the per-entry gain of the largest arm over the first
against the entry's size; then the mean step time (each crop's step timed alone, :mod:`.cost`) and peak memory
against the arm."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .stats import as_matrix, bootstrap_interval, entry_values, paired_differences

SPLITS = ("train_large", "train_small", "val")


def step_seconds_alone(summary: dict) -> float | None:
    """An arm's mean step time at each crop's cost alone (its ``gpu_minutes_alone`` over its steps)."""
    minutes = summary.get("gpu_minutes_alone")
    return minutes * 60 / summary["step"] if minutes else None


def gain_by_size(ax, result: dict, metric: str) -> None:
    """Per entry, the mean over seeds of (last arm of the first arm's kind) - (first arm), against its tokens, one
    colour per split: where in entry size a larger crop (or the second activation) changes the result."""
    rows, arms = result["rows"], result["arms"]
    first = arms[0]
    last = [a for a in arms if a["impl"] == first["impl"]][-1]
    tokens = {r["entry"]: r["tokens"] for r in rows if r.get("entry") and r.get("tokens")}
    for i, split in enumerate(SPLITS):
        d, _, entries = paired_differences(entry_values(rows, last["impl"], last["name"], split, metric),
                                           entry_values(rows, first["impl"], first["name"], split, metric))
        if not entries:
            continue
        with np.errstate(invalid="ignore"):
            means = np.nanmean(d, axis=0)
        ax.plot([tokens[e] for e in entries], means, "o", color=f"C{i}", label=split, alpha=0.8)
    ax.axhline(0, color="grey", lw=1)
    ax.set(xscale="log", xlabel="entry tokens", ylabel=f"{metric}: {last['name']} - {first['name']}",
           title="gain per entry (mean of seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot(result: dict, path: Path, metric: str = "lddt_ca") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows, arms = result["rows"], result["arms"]
    names = [a["name"] for a in arms]
    fig, axes = plt.subplots(1, len(SPLITS) + 3, figsize=(4.2 * (len(SPLITS) + 3), 4.2))
    x = np.arange(len(names))
    for ax, split in zip(axes, SPLITS):
        for budget, offset, color in (("steps", -0.1, "C0"), ("time", 0.1, "C1")):
            stats = [bootstrap_interval(as_matrix(entry_values(rows, a["impl"], a["name"], split, metric, budget)))
                     for a in arms]
            means = np.array([s[0] for s in stats])
            if not np.isfinite(means).any():
                continue
            errors = np.abs(np.array([[s[0] - s[1], s[2] - s[0]] for s in stats]).T)
            ax.errorbar(x + offset, means, yerr=errors, fmt="o", color=color, capsize=3,
                        label=f"equal {'steps' if budget == 'steps' else 'GPU time'}")
        for impl, style in (("random_chain", ":"), ("untrained", "--")):
            base = bootstrap_interval(as_matrix(entry_values(rows, impl, None, split, metric)))[0]
            if np.isfinite(base):
                ax.axhline(base, color="grey", ls=style, lw=1, label=impl.replace("_", " "))
        ax.set(title=f"{split} ({metric})", xticks=x)
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    gain_by_size(axes[len(SPLITS)], result, metric)
    summaries = [r for r in rows if not r.get("entry") and r["impl"] in ("crop", "finetune", "activation")]
    for ax, value, label in ((axes[-2], step_seconds_alone, "mean step (s), each crop timed alone"),
                             (axes[-1], lambda r: r.get("peak_mib"), "peak memory (MiB)")):
        for i, name in enumerate(names):
            values = [value(r) for r in summaries if r["arm"] == name and value(r) is not None]
            if values:
                ax.plot([i] * len(values), values, "o", color="C2")
        ax.set(ylabel=label, xticks=x)
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result.get('kind', 'crops')} ablation: {result.get('steps')} steps per arm, "
                 f"{len(result.get('seeds', []))} seeds; whole entries, 95 % intervals over seeds and entries")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
