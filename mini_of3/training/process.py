"""The process a trainer runs in, as the trainer's helpers see it: its rank, its device, its printing and the
collectives it takes part in (accelerate's, handed in by the trainer, so that no helper imports accelerate)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import torch
from tqdm import tqdm


class TrainingError(RuntimeError):
    """A run that cannot start or go on; the message is one clear line (train.py prints it, exit status 1)."""


@dataclass(frozen=True)
class Process:
    rank: int
    world: int
    main: bool
    device: torch.device
    reduce_sum: Callable[[torch.Tensor], torch.Tensor]   # a tensor summed over every rank (collective)
    gather: Callable[[list], list]                       # every rank's list, concatenated (collective)
    broadcast: Callable[[list], None]                    # the main process's list to every rank, in place

    def say(self, message: str) -> None:
        """A line on the main process's stdout (above the progress bar)."""
        if self.main:
            tqdm.write(message, file=sys.stdout)

    def slot(self, index: int) -> int:
        """The place, in the global batch, of this rank's micro-batch (or validation batch) ``index``: rank r's i-th
        example is example ``i * world + r`` of the sampler's stream, so a stream seeded by slot draws the same for
        N processes x grad_accum g as for 1 process x grad_accum N*g (tests/trainer/test_distributed.py)."""
        return index * self.world + self.rank

    def max_over_ranks(self, value: float) -> float:
        """The largest ``value`` of any rank (collective when there are several)."""
        if self.world == 1:
            return value
        tensor = torch.tensor(value, device=self.device)
        torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return tensor.item()
