"""Exponential moving average of the weights (AF3 SI 5.4: decay 0.999), used for validation and by ``predict``.

The shadow copies follow the parameters of the model the trainer updates (under FSDP2 these are sharded DTensors,
and so are the shadows); :meth:`EMA.state_dict` gathers full tensors, named as in the unwrapped model, so the file
is portable across process counts and readable by ``predict``.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly sharded) parameter, on the CPU (a collective for DTensors)."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach().cpu().contiguous()


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (which aliases it), else the tensor itself. The EMA's in-place updates run on
    the shards: a shadow is sharded like its parameter, and DTensor has no sharding rule for the foreach ops."""
    return t.to_local() if hasattr(t, "to_local") else t


def _like(value: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``value`` (a full tensor) laid out as ``target``: sharded the same way for a DTensor, else moved."""
    if hasattr(target, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor
        return distribute_tensor(value.to(target.dtype), target.device_mesh, target.placements)
    return value.to(device=target.device, dtype=target.dtype)


class EMA:
    """Shadow weights ``w_ema <- d w_ema + (1 - d) w`` after each optimizer step, with a warm-up of the decay:
    ``d = min(decay, (1 + n) / (10 + n))`` at update ``n`` (so a short run's EMA is not its initial weights).

    ``model`` is the unwrapped module (its names are the names of the checkpoint); pass the live module, whose
    parameters the optimizer updates in place.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.updates = 0
        self.params: dict[str, torch.Tensor] = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.shadow: dict[str, torch.Tensor] = {n: p.detach().clone() for n, p in self.params.items()}

    def _weights(self) -> list[torch.Tensor]:
        return [_local(p.detach()) for p in self.params.values()]

    def _shadows(self) -> list[torch.Tensor]:
        return [_local(s) for s in self.shadow.values()]

    def current_decay(self) -> float:
        return min(self.decay, (1 + self.updates) / (10 + self.updates))

    @torch.no_grad()
    def update(self) -> None:
        """Move the shadows towards the current weights (call after each optimizer step)."""
        weight = 1.0 - self.current_decay()
        torch._foreach_lerp_(self._shadows(), self._weights(), weight)
        self.updates += 1

    @contextmanager
    def swapped(self) -> Iterator[None]:
        """Inside the block the model holds the EMA weights; its own weights come back afterwards."""
        with torch.no_grad():
            backup = [w.clone() for w in self._weights()]
            torch._foreach_copy_(self._weights(), self._shadows())
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_(self._weights(), backup)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full CPU tensors by parameter name (a collective under FSDP: call it on every rank)."""
        return {name: full_tensor(t) for name, t in self.shadow.items()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor], updates: int) -> None:
        """Restore the shadows (full tensors by name, e.g. from ``ema.safetensors``) and the update count."""
        missing = sorted(set(self.shadow) - set(state))
        unexpected = sorted(set(state) - set(self.shadow))
        if missing or unexpected:
            raise ValueError(f"EMA state does not match the model: missing {missing[:3]}, unexpected "
                             f"{unexpected[:3]}")
        for name, shadow in self.shadow.items():
            value = state[name]
            if tuple(value.shape) != tuple(shadow.shape):
                raise ValueError(f"EMA state {name}: shape {tuple(value.shape)}, the model has "
                                 f"{tuple(shadow.shape)}")
            shadow.copy_(_like(value, shadow))
        self.updates = int(updates)
