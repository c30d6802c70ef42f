"""Guards on the training loss: a streak of non-finite steps, and a loss far above its recent median."""
from __future__ import annotations

import math
import statistics
from collections import deque
from pathlib import Path

from . import checkpoint as ckpt


class SpikeWatch:
    """Warns once per episode when a step's loss exceeds ``factor`` x the median of the last ``window`` finite
    losses (after ``min_steps`` of them); the episode ends when the loss comes back under that level."""

    def __init__(self, factor: float | None, window: int = 50, min_steps: int = 10) -> None:
        self.factor, self.min_steps = factor, min_steps
        self.recent: deque[float] = deque(maxlen=window)
        self.in_episode = False

    def observe(self, step: int, loss: float) -> str | None:
        """The warning to print for this step's loss, if it starts an episode; else None."""
        if self.factor is None or not math.isfinite(loss):
            return None
        message = None
        if len(self.recent) >= self.min_steps:
            median = statistics.median(self.recent)
            spiking = median > 0 and loss > self.factor * median
            if spiking and not self.in_episode:
                message = (f"step {step}: loss {loss:.4g} is {loss / median:.0f}x the median of the last "
                           f"{len(self.recent)} steps ({median:.4g}); the run may be diverging: a lower optim.lr or "
                           f"optim.grad_clip helps (trainer.loss_spike_factor={self.factor:g})")
            self.in_episode = spiking
        self.recent.append(loss)
        return message


def nonfinite_stop_message(step: int, in_row: int, limit: int, out: Path) -> str:
    """Why a run stops after ``in_row`` non-finite losses, and the checkpoint to go back to (none is written during
    such a streak, so the last one is from before it)."""
    last = ckpt.list_checkpoints(out)
    return (f"stopped at step {step}: {in_row} non-finite losses in a row (trainer.max_nonfinite={limit}); last "
            f"checkpoint, from before them: {last[-1].path if last else 'none'}; try a lower optim.lr or "
            f"trainer.mixed_precision=no")
