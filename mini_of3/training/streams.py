"""The named random streams of a run: every random choice of the loop is a function of (seed, stream, step, slot).

So every rank draws the same recycle count, a resumed run makes exactly the choices of the uninterrupted one, and
N processes x grad_accum g draw what 1 process x grad_accum N*g draws (the slot is the micro-batch's place in the
step's global batch, not the rank that runs it).
"""
from __future__ import annotations

from enum import IntEnum

import numpy as np
import torch


class Stream(IntEnum):
    """The purposes a run draws random numbers for; the value keys the stream."""
    TRAIN_NOISE = 0          # diffusion noise levels and augmentations of a training micro-batch
    VALIDATION_NOISE = 1     # the sampler's noise for a validation batch
    COMPILE_PROBE = 2        # the forward and backward that compile the blocks before the first step
    DROPOUT = 3              # torch's global generator (dropout), reseeded before each micro-batch
    RECYCLES = 0x5EC         # the recycle count of a training step


def derived_seed(*keys: int) -> int:
    """A 63-bit seed from integer keys (e.g. ``(seed, stream, step, slot)``), independent streams for different keys."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1, dtype=np.uint64)[0] >> 1)


def stream_seed(seed: int, stream: Stream, step: int, slot: int) -> int:
    """The seed of ``stream`` at training ``step`` for global batch ``slot``."""
    return derived_seed(seed, stream, step, slot)


def stream_generator(seed: int, stream: Stream, step: int, slot: int, device: torch.device) -> torch.Generator:
    """A generator on ``device`` seeded by :func:`stream_seed`."""
    return torch.Generator(device=device).manual_seed(stream_seed(seed, stream, step, slot))


def recycles_for_step(seed: int, step: int, max_recycles: int) -> int:
    """Recycles of training step ``step``: uniform on 0..max_recycles (AF3 SI 3.3), drawn from (seed, step) only."""
    return int(np.random.default_rng([seed, step, Stream.RECYCLES]).integers(0, max_recycles + 1))
