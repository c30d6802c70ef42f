"""Scoring the EMA weights during training: sample each evaluation entry, score it, reduce over ranks, log."""
from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Callable

import torch
from torch import nn

from ..config import Config
from . import reports
from .batches import to_device
from .ema import EMA
from .process import Process
from .runlog import RunLog, json_safe
from .streams import Stream, stream_generator
from .validation import means, validation_sums


def evaluate(proc: Process, cfg: Config, model: nn.Module, ema: EMA, loader, real: int, *, split: str, step: int,
             log: RunLog, autocast: Callable[[], AbstractContextManager], beat: Callable[[str], None]) -> dict:
    """Sample and score the EMA weights of ``model`` (the plain module) on one evaluation loader's entries (every
    rank runs the same number of batches: padded shards, the first ``real`` counted), log the reduced metrics and
    each entry's scores as a row of ``split``, print them; returns the metrics."""
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
