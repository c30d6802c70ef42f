"""PNG plots of a run from its log rows: ``losses.png`` (total and parts, train and validation),
``validation.png`` (lDDT-Calpha, TM-score, contact precision, distogram accuracy, RMSD) and ``gradients.png``
(gradient norm per module, diffusion loss per noise-level bin: where a part of the model stalls)."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..losses import LOSS_PARTS  # noqa: E402

SCORES = ("lddt_ca", "tm_score", "contact_precision", "distogram_accuracy")


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [p[0] for p in points], [p[1] for p in points]


def _smooth(values: list[float], span: int) -> list[float]:
    """Exponential moving average with the given span (a readable trend through noisy per-step losses)."""
    alpha, out, level = 2.0 / (span + 1), [], None
    for v in values:
        level = v if level is None else alpha * v + (1 - alpha) * level
        out.append(level)
    return out


def plot_losses(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Total loss (per step and smoothed, validation points) and each (unweighted) loss part, against step."""
    train = [r for r in rows if r.get("split", "train") == "train"]
    val = [r for r in rows if r.get("split") == "val"]
    fig, (ax_total, ax_parts) = plt.subplots(1, 2, figsize=(11, 4))
    steps, loss = _series(train, "loss")
    span = max(5, len(loss) // 20)
    if loss:
        ax_total.plot(steps, loss, color="tab:blue", alpha=0.25, lw=0.8, label="train (per step)")
        ax_total.plot(steps, _smooth(loss, span), color="tab:blue", lw=1.8, label=f"train (EMA, span {span})")
    vsteps, vloss = _series(val, "loss")
    if vloss:
        ax_total.plot(vsteps, vloss, "o-", color="tab:red", label="validation")
    ax_total.set(xlabel="step", ylabel="total loss", title=title or "loss")
    for i, part in enumerate(LOSS_PARTS):
        s, v = _series(train, part)
        if v:
            ax_parts.plot(s, _smooth(v, span), color=f"C{i}", lw=1.5, label=part)
        s, v = _series(val, part)
        if v:
            ax_parts.plot(s, v, "o--", color=f"C{i}", ms=4, lw=0.8)
    ax_parts.set(xlabel="step", ylabel="loss part (smoothed; o = validation)", title="loss parts")
    ax_parts.set_yscale("log")
    return _save(fig, path)


def plot_validation(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Validation scores in [0, 1] (left) and Calpha RMSD in A (right), against step."""
    val = [r for r in rows if r.get("split") == "val"]
    fig, (ax_scores, ax_rmsd) = plt.subplots(1, 2, figsize=(11, 4))
    for i, key in enumerate(SCORES):
        s, v = _series(val, key)
        if v:
            ax_scores.plot(s, v, "o-", color=f"C{i}", label=key)
    s, v = _series([r for r in rows if r.get("split") == "train_eval"], "lddt_ca")    # data.train_eval_ids
    if v:
        ax_scores.plot(s, v, "s--", color="C0", alpha=0.6, label="lddt_ca, training entries")
    for split, label in (("val", "validation"), ("train_eval", "training entries")):
        baseline = [r for r in rows if r.get("split") == f"{split}_random_chain" and r.get("lddt_ca") is not None]
        if baseline:
            ax_scores.axhline(baseline[0]["lddt_ca"], color="grey", ls=":" if split == "val" else "-.", lw=1.2,
                              label=f"lddt_ca of a random compact chain, {label}")
    ax_scores.set(xlabel="step", ylabel="score", ylim=(0, 1), title=title or "validation (EMA weights)")

    s, v = _series(val, "rmsd")
    if v:
        ax_rmsd.plot(s, v, "o-", color="tab:purple")
    ax_rmsd.set(xlabel="step", ylabel="Calpha RMSD (A)", title="validation RMSD")
    return _save(fig, path)


def plot_gradients(rows: list[dict], path: str | Path, title: str = "") -> Path:
    """Per-module gradient norms before clipping (``grad_norm/<module>``, left) and the diffusion loss per bin of
    sigma / sigma_data (``diffusion/sigma<bin>``, right), smoothed, against step."""
    train = [r for r in rows if r.get("split", "train") == "train"]
    fig, (ax_norms, ax_bins) = plt.subplots(1, 2, figsize=(11, 4))
    keys = list(dict.fromkeys(k for r in train for k in r if k.startswith(("grad_norm/", "diffusion/sigma"))))
    for ax, prefix in ((ax_norms, "grad_norm/"), (ax_bins, "diffusion/sigma")):
        for i, key in enumerate(k for k in keys if k.startswith(prefix)):
            steps, values = _series(train, key)
            if values:
                ax.plot(steps, _smooth(values, max(5, len(values) // 20)), color=f"C{i}", lw=1.5,
                        label=key[len(prefix):] if prefix == "grad_norm/" else f"sigma/sigma_data {key[len(prefix):]}")
        ax.set_yscale("log")
    ax_norms.set(xlabel="step", ylabel="gradient norm before clipping (smoothed)", title=title or "gradients")
    ax_bins.set(xlabel="step", ylabel="weighted aligned MSE (smoothed)", title="diffusion loss per noise level")
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    """A legend on every axis that has labels; the figure written to ``path`` and closed."""
    for ax in fig.axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_run(rows: list[dict], out_dir: str | Path, title: str = "") -> list[Path]:
    """The plots into ``out_dir``: losses.png, validation.png, gradients.png (each written to a temporary name, then
    renamed)."""
    out_dir = Path(out_dir)
    written = []
    for name, plot in (("losses.png", plot_losses), ("validation.png", plot_validation),
                       ("gradients.png", plot_gradients)):
        tmp = out_dir / f".{name}.tmp.png"
        plot(rows, tmp, title)
        tmp.replace(out_dir / name)
        written.append(out_dir / name)
    return written
