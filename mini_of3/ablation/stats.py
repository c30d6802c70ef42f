"""Paired comparisons between arms: per-entry differences over seeds and entries, with bootstrap 95 % intervals.

Arms a and b are paired by (seed, entry): both trained from the same initial weights on the same data order (the
seed) and scored on the same whole entry. The mean paired difference over seeds and entries estimates what a
replaces b with; its interval comes from a two-level bootstrap that resamples seeds and entries independently (each
with replacement), so that it covers both the run-to-run spread and the entry-to-entry spread.
"""
from __future__ import annotations

import numpy as np


def entry_values(rows: list[dict], impl: str, arm: str | None, split: str, metric: str, budget: str = "steps"
                 ) -> dict[tuple[int, str], float]:
    """``{(seed, entry): value}`` of ``metric`` over the entry rows of one arm (``arm``; None for a baseline, whose
    rows name no arm) or baseline (``impl``) on ``split`` at ``budget``; entries without a value are left out."""
    return {(r["seed"], r["entry"]): r[metric] for r in rows if r.get("entry") and r["impl"] == impl
            and r.get("arm") == arm and r["split"] == split and r.get("budget", "steps") == budget
            and r.get(metric) is not None}


def as_matrix(values: dict[tuple[int, str], float]) -> np.ndarray:
    """``[seeds, entries]`` of ``{(seed, entry): value}``, seeds and entries in order, NaN where missing."""
    seeds = sorted({s for s, _ in values})
    entries = sorted({e for _, e in values})
    matrix = np.full((len(seeds), len(entries)), np.nan)
    for (s, e), value in values.items():
        matrix[seeds.index(s), entries.index(e)] = value
    return matrix


def paired_differences(a: dict[tuple[int, str], float], b: dict[tuple[int, str], float]
                       ) -> tuple[np.ndarray, list[int], list[str]]:
    """``[seeds, entries]`` differences a - b over the (seed, entry) keys both have (NaN where either value is NaN
    or missing), with the seeds and entries in order."""
    differences = {key: a[key] - b[key] for key in set(a) & set(b)}
    return (as_matrix(differences), sorted({s for s, _ in differences}), sorted({e for _, e in differences}))


def bootstrap_interval(d: np.ndarray, reps: int = 10_000, level: float = 0.95, seed: int = 0
                       ) -> tuple[float, float, float]:
    """(mean, low, high) of the mean of ``d [seeds, entries]`` (NaN ignored), the interval from resampling seeds and
    entries with replacement ``reps`` times (percentiles); NaNs when ``d`` holds no number."""
    if not np.isfinite(d).any():
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    n_seeds, n_entries = d.shape
    seeds = rng.integers(0, n_seeds, size=(reps, n_seeds))
    entries = rng.integers(0, n_entries, size=(reps, n_entries))
    values = np.isfinite(d)
    filled = np.where(values, d, 0.0)
    picked = filled[seeds[:, :, None], entries[:, None, :]]                  # [reps, seeds, entries]
    counted = values[seeds[:, :, None], entries[:, None, :]]
    totals, counts = picked.sum((1, 2)), counted.sum((1, 2))
    means = totals[counts > 0] / counts[counts > 0]
    tail = (1 - level) / 2
    return float(np.nanmean(d)), float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def compare(a: dict[tuple[int, str], float], b: dict[tuple[int, str], float], **bootstrap) -> dict:
    """``{"mean", "lo", "hi", "seeds", "entries", "pairs"}`` of the paired difference a - b."""
    d, seeds, entries = paired_differences(a, b)
    mean, lo, hi = bootstrap_interval(d, **bootstrap)
    return {"mean": mean, "lo": lo, "hi": hi, "seeds": len(seeds), "entries": len(entries),
            "pairs": int(np.isfinite(d).sum())}
