"""The stream of training batches of one rank, and its position (sampler epoch, examples used in it).

The loader prefetches, so its own position runs ahead of what training used: the position saved in a checkpoint
is counted here, per batch handed out, and a resumed run starts the sampler there (``EpochSampler.set_epoch``).
"""
from __future__ import annotations

import torch

from ..config import Config
from ..data import build_dataloaders, prepare_data
from .process import Process, TrainingError


def build_loaders(proc: Process, cfg: Config):
    """Prepare ``data.root`` on the main process (the others wait for it), then this rank's loaders."""
    result: list = [None, None]                          # [prepared folder, error message]
    if proc.main:
        try:
            result[0] = str(prepare_data(cfg.data, progress=True))
        except (OSError, ValueError, RuntimeError) as err:
            result[1] = f"data.root={cfg.data.root}: {err}"
    if proc.world > 1:
        proc.broadcast(result)
    if result[1] is not None:
        raise TrainingError(result[1])
    try:
        return build_dataloaders(cfg.data, result[0], cfg.seed, rank=proc.rank, world_size=proc.world)
    except ValueError as err:
        raise TrainingError(str(err)) from None


class BatchStream:
    def __init__(self, loader, sampler, device: torch.device) -> None:
        self.loader, self.sampler, self.device = loader, sampler, device
        self.epoch, self.consumed = 0, 0
        self._iterator = None

    def seek(self, epoch: int, consumed: int) -> None:
        """Continue from ``consumed`` examples into ``epoch`` (drops any batch already prefetched)."""
        self.epoch, self.consumed, self._iterator = epoch, consumed, None
        self.sampler.set_epoch(epoch, consumed)

    def next(self) -> dict:
        """The next batch, on the device; a new epoch starts when the loader runs out."""
        while True:
            if self._iterator is None:                   # creating one draws from torch's generator: keep it out
                with torch.random.fork_rng(devices=[]):
                    self._iterator = iter(self.loader)
            try:
                batch = next(self._iterator)
                break
            except StopIteration:
                self.seek(self.epoch + 1, 0)
        self.consumed += len(batch["id"])
        return to_device(batch, self.device)

    def close(self) -> None:
        self._iterator = None


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
