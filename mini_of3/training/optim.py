"""AdamW with AF3's learning-rate schedule (AF3 SI 5.4)."""
from __future__ import annotations

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


def follow_config(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR, cfg: OptimConfig,
                  step: int) -> None:
    """Make an optimizer and schedule restored from a checkpoint use ``cfg`` (learning rate, betas, eps, weight
    decay) from optimizer step ``step`` on; their saved states would keep the values they were written with."""
    for group in optimizer.param_groups:
        group.update(initial_lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay)
    scheduler.base_lrs = [cfg.lr] * len(optimizer.param_groups)
    lr = cfg.lr * lr_factor(step, cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr
    scheduler._last_lr = [lr] * len(optimizer.param_groups)
