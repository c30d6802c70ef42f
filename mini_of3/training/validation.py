"""One validation pass of one rank: sample structures with the (EMA) model, score them, sum the scores.

Per entry, ``samples`` structures are sampled and the one with the highest mean pLDDT is scored (as AF3 ranks its
samples) with :func:`mini_of3.metrics.structure_metrics`: lDDT-Calpha, RMSD, TM-score, contact precision and
distogram accuracy. The losses of a training forward pass are summed too. The result is a tensor of sums and counts
that the trainer reduces across ranks, so uneven shards of the validation set average correctly, and each entry's
scores (a fit check reads them per entry: ``python -m mini_of3.bench fit``). Batches past
``real`` (padding that gives every rank the same number of batches, see ``data.validation_batches``) are run, for
the collectives of a sharded model, and not counted.
"""
from __future__ import annotations

import math
from contextlib import AbstractContextManager
from typing import Callable, Iterable

import torch
from torch import nn

from ..config import LossConfig
from ..losses import LOSS_PARTS, compute_losses
from ..metrics import structure_metrics

METRICS = ("lddt_ca", "rmsd", "tm_score", "tm_score_mirror", "contact_precision", "distogram_accuracy", "mean_plddt")
LOSSES = ("loss", *LOSS_PARTS)                   # the training loss and its parts
KEYS = METRICS + LOSSES


def score_batch(out: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> list[dict[str, float]]:
    """Metrics of the top-pLDDT sample of each structure of a batch.

    out: ``sample``'s coords [B, S, N, 3], plddt [B, S, N], distogram_logits [B, N, N, bins]; batch: features with
    token_mask, resolved [B, N], ca, cb [B, N, 3], asym_id, entity_id, sym_id [B, N]. Padding is cut away first.
    """
    rows = []
    for b in range(out["coords"].shape[0]):
        real = batch["token_mask"][b]
        plddt = out["plddt"][b][:, real].float().mean(-1)                       # [S]
        top = int(torch.argmax(plddt))
        metrics = structure_metrics(
            out["coords"][b, top][real].float(), batch["ca"][b][real].float(), batch["resolved"][b][real],
            batch["asym_id"][b][real], batch["entity_id"][b][real], batch["sym_id"][b][real],
            distogram_logits=out["distogram_logits"][b][real][:, real].float(), true_cb=batch["cb"][b][real].float())
        metrics["mean_plddt"] = float(plddt[top])
        rows.append(metrics)
    return rows


@torch.no_grad()
def validation_sums(model: nn.Module, batches: Iterable[dict], *, loss_cfg: LossConfig, n_recycles: int, steps: int,
                    samples: int, generator_for: Callable[[int], torch.Generator],
                    autocast: Callable[[], AbstractContextManager], beat: Callable[[str], None] = lambda _: None,
                    real: int | None = None) -> tuple[torch.Tensor, list[dict]]:
    """(sums, entries). sums: ``[2, len(KEYS)]`` float64, row 0 the sums of each key over the structures of the
    first ``real`` batches (all when None; the others are run, not counted), row 1 their counts (NaN values, e.g. no
    long-range contact, are left out). entries: one dict per structure counted, its ``id``, ``tokens`` (of its
    validation crop) and its METRICS.
    ``batches`` are already on the model's device; the model is the plain module, in eval mode, holding the weights
    to validate."""
    sums = torch.zeros(2, len(KEYS), dtype=torch.float64)
    entries = []
    for i, batch in enumerate(batches):
        beat(f"validating batch {i}")
        generator = generator_for(i)
        with autocast():
            out = model.sample(batch, n_recycles=n_recycles, steps=steps, samples=samples, generator=generator)
            forward = model(batch, n_recycles=n_recycles, generator=generator)
        if real is not None and i >= real:
            continue
        total, parts = compute_losses(forward, batch, loss_cfg)
        tokens = batch["token_mask"].sum(-1).tolist()                        # [B] real tokens of each crop
        for entry, n_tokens, row in zip(batch["id"], tokens, score_batch(out, batch)):
            entries.append({"id": entry, "tokens": n_tokens, **{key: row[key] for key in METRICS}})
            for j, key in enumerate(METRICS):
                if math.isfinite(row[key]):
                    sums[0, j] += row[key]
                    sums[1, j] += 1
        n = out["coords"].shape[0]
        losses = [float(total), *(float(parts[k]) for k in LOSSES[1:])]
        for j, value in enumerate(losses, start=len(METRICS)):
            if math.isfinite(value):                      # a batch's loss is the mean of its n structures
                sums[0, j] += value * n
                sums[1, j] += n
    return sums, entries


def means(sums: torch.Tensor) -> dict[str, float]:
    """Per-key means from (reduced) :func:`validation_sums`; NaN where nothing counted."""
    return {k: float(sums[0, j] / sums[1, j]) if sums[1, j] > 0 else float("nan") for j, k in enumerate(KEYS)}
