"""Scoring the EMA weights during training: sample each evaluation entry, score it, reduce over ranks, log."""
from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..baselines import random_compact_chain
from ..config import Config
from ..metrics import structure_metrics
from . import reports
from .batches import to_device
from .ema import EMA
from .process import Process
from .runlog import RunLog, json_safe
from .streams import Stream, stream_generator
from .validation import means, validation_sums

BASELINE_METRICS = ("lddt_ca", "tm_score", "rmsd", "contact_precision")


def evaluate(proc: Process, cfg: Config, model: nn.Module, ema: EMA, loader, real: int, *, split: str, step: int,
             log: RunLog, autocast: Callable[[], AbstractContextManager], beat: Callable[[str], None],
             with_baseline: bool = False) -> dict:
    """Sample and score the EMA weights of ``model`` (the plain module) on one evaluation loader's entries (every
    rank runs the same number of batches: padded shards, the first ``real`` counted), log the reduced metrics and
    each entry's scores as a row of ``split``, print them; returns the metrics. ``with_baseline`` (the run's first
    evaluation) scores a random compact chain on the same entries first (:func:`random_chain_baseline`)."""
    if with_baseline:
        random_chain_baseline(proc, loader, real, split=split, step=step, log=log, seed=cfg.seed)
    started = time.perf_counter()
    devices = [proc.device] if proc.device.type == "cuda" else []
    model.eval()
    with ema.swapped(), torch.random.fork_rng(devices=devices):
        sums, entries = validation_sums(
            model, (to_device(b, proc.device) for b in loader), loss_cfg=cfg.loss, n_recycles=cfg.model.n_recycles,
            steps=cfg.trainer.val_sampling_steps or cfg.model.sampling_steps, samples=cfg.trainer.val_samples,
            generator_for=lambda i: stream_generator(cfg.seed, Stream.VALIDATION_NOISE, 0, proc.slot(i), proc.device),
            autocast=autocast, beat=beat, real=real)
    model.train()
    if proc.device.type == "cuda":     # training rows report the peak of training, not of validation's crops
        torch.cuda.reset_peak_memory_stats(proc.device)
    metrics = {k: json_safe(v) for k, v in means(proc.reduce_sum(sums.to(proc.device)).cpu()).items()}
    entries = proc.gather(entries) if proc.world > 1 else entries
    entries = [{k: json_safe(v) for k, v in e.items()} for e in entries]
    seconds = time.perf_counter() - started
    log.write({"step": step, "split": split, **metrics, "val_s": seconds, "entries": entries})
    proc.say(reports.evaluation_line(step, split, metrics, seconds))
    return metrics


def random_chain_baseline(proc: Process, loader, real: int, *, split: str, step: int, log: RunLog, seed: int) -> dict:
    """Score a random compact chain (:func:`mini_of3.baselines.random_compact_chain`) on each entry of an evaluation
    loader, as a prediction is scored, and log the means as a row of split ``<split>_random_chain``: the level of
    generic chain geometry that a model's scores must clear."""
    sums = torch.zeros(2, len(BASELINE_METRICS), dtype=torch.float64)
    for i, batch in enumerate(loader):
        if i >= real:
            continue
        for b in range(batch["token_mask"].shape[0]):
            tokens = batch["token_mask"][b]
            rng = np.random.default_rng([seed, proc.slot(i), b])
            pred = torch.from_numpy(random_compact_chain(int(tokens.sum()), rng))
            metrics = structure_metrics(pred, batch["ca"][b][tokens].float(), batch["resolved"][b][tokens],
                                        batch["asym_id"][b][tokens], batch["entity_id"][b][tokens],
                                        batch["sym_id"][b][tokens])
            for j, key in enumerate(BASELINE_METRICS):
                if np.isfinite(metrics[key]):
                    sums[0, j] += metrics[key]
                    sums[1, j] += 1
    sums = proc.reduce_sum(sums.to(proc.device)).cpu()
    means = {k: json_safe(float(sums[0, j] / sums[1, j]) if sums[1, j] > 0 else float("nan"))
             for j, k in enumerate(BASELINE_METRICS)}
    log.write({"step": step, "split": f"{split}_random_chain", **means})
    return means
