"""An arm's GPU time, from each kind of step's time measured alone: the equal-time comparison's clock.

Arms train side by side on one GPU, or in separate GPU sessions beside other arms; the time their steps take there
measures what they shared the GPU with as much as their crop. So before any arm trains, each kind of step (a crop
and an activation) trains a few steps with the GPU to itself (the real trainer, the same seed, hence the same
entries for every kind); its mean step time after the first ``WARMUP`` steps, steps longer than ``SPIKE`` times
the median left out (a kernel compiled or autotuned for a size first met mid-run), is that kind's cost. An arm's
GPU time is its steps times its kind's cost (the schedule arm: each part at its own), and the equal-time
comparison scores every arm at its last checkpoint within the first arm's GPU time.
"""
from __future__ import annotations

import statistics

from mini_of3.ablation.plan import Arm, finetune_start

WARMUP = 5                          # first steps of a calibration run left out of its mean (compiling, autotuning)
SPIKE = 3.0                         # later steps above this multiple of the median compiled or autotuned for a new size


def kind(crop: int, activation: str) -> str:
    """The name of one kind of training step: ``crop384_softmax``."""
    return f"crop{crop}_{activation}"


def step_kinds(arms: list[Arm]) -> list[tuple[int, str]]:
    """Every (crop, activation) a step of these arms trains with, each once, in the arms' order."""
    kinds = []
    for arm in arms:
        for crop in ((arm.start_crop, arm.crop) if arm.impl == "finetune" else (arm.crop,)):
            if (crop, arm.activation) not in kinds:
                kinds.append((crop, arm.activation))
    return kinds


def mean_step_seconds(step_times: list[float], warmup: int = WARMUP, spike: float = SPIKE) -> float:
    """A calibration run's cost per step: the mean after ``warmup`` steps (all of them when that leaves none) of
    the steps at most ``spike`` times their median. On a fresh machine the first kind timed compiles and autotunes
    the kernels for every size its entries bring, in whichever step meets it first: 40 steps at crop 256 averaged
    1.35 s a step against 0.16 s for the kinds after it (H100)."""
    if not step_times:
        raise ValueError("a calibration run logged no training step")
    timed = step_times[warmup:] or step_times
    limit = spike * statistics.median(timed)
    return statistics.fmean(t for t in timed if t <= limit)


def arm_seconds(arm: Arm, step: int, steps: int, costs: dict[str, float]) -> float:
    """GPU seconds of an arm's first ``step`` steps, at each kind's cost alone (``steps``: the arm's budget, which
    places the schedule arm's switch)."""
    if arm.impl == "finetune":
        first = min(step, finetune_start(steps))
        start, end = costs[kind(arm.start_crop, arm.activation)], costs[kind(arm.crop, arm.activation)]
        return first * start + (step - first) * end
    return step * costs[kind(arm.crop, arm.activation)]


def equal_time_step(arm: Arm, checkpoint_steps: list[int], steps: int, costs: dict[str, float],
                    budget_s: float) -> int:
    """The last of an arm's checkpoints whose steps cost at most ``budget_s`` (its first when none does)."""
    if not checkpoint_steps:
        raise ValueError(f"{arm.name}: no checkpoint to score")
    within = [s for s in sorted(checkpoint_steps) if arm_seconds(arm, s, steps, costs) <= budget_s * (1 + 1e-9)]
    return within[-1] if within else min(checkpoint_steps)
