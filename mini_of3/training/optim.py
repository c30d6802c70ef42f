"""AdamW with AF3's learning-rate schedule (AF3 SI 5.4), and the per-step random choices of the loop.

The recycle count and the seeds of a step are pure functions of ``(seed, step, ...)``, so that every rank draws the
same recycle count, and a run resumed at step N makes exactly the choices the uninterrupted run made.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from ..config import OptimConfig


def lr_factor(step: int, cfg: OptimConfig) -> float:
    """Multiplier of ``cfg.lr`` at optimizer step ``step`` (0-based): linear warm-up over ``warmup_steps``, then
    x ``decay_factor`` every ``decay_every`` steps (AF3 SI 5.4: 1000 steps to 1.8e-3, x 0.95 every 50k)."""
    warm = min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps > 0 else 1.0
    return warm * cfg.decay_factor ** (step // cfg.decay_every)


def build_optimizer(model: nn.Module, cfg: OptimConfig
                    ) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over every trainable parameter and its LambdaLR schedule (:func:`lr_factor`)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                                  weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
    return optimizer, scheduler


def derived_seed(*keys: int) -> int:
    """A 63-bit seed from integer keys (e.g. ``(seed, step, rank)``), independent streams for different keys."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1, dtype=np.uint64)[0] >> 1)


def recycles_for_step(seed: int, step: int, max_recycles: int) -> int:
    """Recycles of training step ``step``: uniform on 0..max_recycles (AF3 SI 3.3), drawn from (seed, step) only, so
    every rank, and a resumed run, draws the same count."""
    return int(np.random.default_rng([seed, step, 0x5EC]).integers(0, max_recycles + 1))
