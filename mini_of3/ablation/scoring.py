"""Whole-entry scoring of a trained model: what a training crop limits is how far-apart parts of large entries sit,
so each arm is scored on whole entries, never on crops.

Splits (by the tokens of the whole entry): ``train_large``, the training entries above ``LARGE`` tokens (what a crop
limits: domains, chains and interfaces further apart than a small crop holds); ``train_small``, the training entries
of at most ``SMALL`` tokens (the control: every crop holds them whole); ``val``, the validation entries (never trained
on, none above the identity cut to a training chain). Per entry, ``samples`` structures are sampled and the one with
the highest mean pLDDT is scored (:func:`mini_of3.metrics.structure_metrics` and
:func:`mini_of3.metrics.interface_metrics`).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..config import DataConfig
from ..data import ProteinDataset, load_prepared, token_features
from ..metrics import interface_metrics, structure_metrics
from ..baselines import random_compact_chain

LARGE = 384                 # train_large: more tokens than this
SMALL = 256                 # train_small: at most this many tokens
METRICS = ("lddt_ca", "tm_score", "rmsd", "contact_precision", "interchain_contact_precision", "interface_lddt",
           "mean_plddt")


@dataclass(frozen=True)
class Entry:
    id: str
    split: str                          # train_large | train_small | val
    tokens: int
    features: dict                      # token_features of the whole entry, numpy [N] / [N, 3]


def scoring_entries(prepared: Path, cfg: DataConfig, seed: int = 0, large: int = LARGE, small: int = SMALL
                    ) -> list[Entry]:
    """The entries each arm is scored on, by split (module docstring; ``large`` and ``small`` the token bounds),
    in id order within a split."""
    train = ProteinDataset(prepared, cfg, "train", seed)
    val = ProteinDataset(prepared, cfg, "val", seed)
    picked = [("val", r) for r in val.rows]
    picked += [("train_large" if r.tokens > large else "train_small", r) for r in train.rows
               if r.tokens > large or r.tokens <= small]
    out = []
    for split, row in sorted(picked, key=lambda p: (("train_large", "train_small", "val").index(p[0]), p[1].id)):
        structure = load_prepared(prepared / row.npz)
        out.append(Entry(row.id, split, structure.n_tokens, token_features(structure, np.arange(structure.n_tokens))))
    return out


def entry_metrics(coords: torch.Tensor, entry: Entry, distogram_logits: torch.Tensor | None = None) -> dict:
    """Every metric of one predicted structure ``coords [N, 3]`` of a whole entry, computed where ``coords`` lie
    (on the GPU, an entry of 2,000 tokens takes milliseconds, not the CPU's tens of seconds)."""
    f = {k: torch.from_numpy(v).to(coords.device) for k, v in entry.features.items()}
    common = (coords.float(), f["ca"], f["resolved"], f["asym_id"], f["entity_id"], f["sym_id"])
    logits = distogram_logits.float() if distogram_logits is not None else None
    metrics = structure_metrics(*common, distogram_logits=logits, true_cb=f["cb"], cb_mask=f["cb_resolved"])
    metrics.update(interface_metrics(*common, distogram_logits=logits, true_cb=f["cb"], cb_mask=f["cb_resolved"]))
    return metrics


@torch.no_grad()
def score_model(model, entries: list[Entry], *, device: torch.device, samples: int, steps: int, seed: int,
                bf16: bool) -> list[dict]:
    """One row per entry: ``entry``, ``split``, ``tokens`` and :data:`METRICS` of the top-pLDDT of ``samples``
    structures of the model (eval mode, its own recycle count), sampled with ``steps`` EDM steps from ``seed``."""
    model.eval()
    rows = []
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 and device.type == "cuda" \
        else contextlib.nullcontext()
    for entry in entries:
        batch = {k: torch.from_numpy(np.ascontiguousarray(v))[None].to(device) for k, v in entry.features.items()}
        generator = torch.Generator(device=device).manual_seed(seed)
        with autocast:
            out = model.sample(batch, n_recycles=model.cfg.n_recycles, steps=steps, samples=samples,
                               generator=generator)
        plddt = out["plddt"][0].float().mean(-1)                                  # [S]
        top = int(torch.argmax(plddt))
        metrics = entry_metrics(out["coords"][0, top], entry, out["distogram_logits"][0])
        rows.append({"entry": entry.id, "split": entry.split, "tokens": entry.tokens, "mean_plddt": float(plddt[top]),
                     **{k: metrics[k] for k in METRICS if k in metrics}})
    return rows


def score_random_chains(entries: list[Entry], seed: int, device: torch.device = torch.device("cpu")) -> list[dict]:
    """The rows of :func:`score_model` for random compact chains (one per entry, drawn from ``seed`` and the
    entry's place), scored as a model's prediction is, without a distogram, on ``device``."""
    rows = []
    for i, entry in enumerate(entries):
        coords = random_compact_chain(entry.tokens, np.random.default_rng([seed, i]))
        metrics = entry_metrics(torch.from_numpy(coords).to(device), entry)
        rows.append({"entry": entry.id, "split": entry.split, "tokens": entry.tokens,
                     **{k: metrics[k] for k in METRICS if k in metrics and k != "mean_plddt"}})
    return rows
