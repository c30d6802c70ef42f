"""The arms of an ablation, their seeds, their step budget and their run folders.

Every arm trains the same model from the same initial weights (one per seed) on the same data order for the same
number of steps; only the factor differs: the training crop (``crop<N>``), the AF3 schedule (``finetune``: trained
at one crop, then fine-tuned at a larger one for the last quarter of the same steps, AF3 SI 5.2), or the triangle
attention's activation (``activation_<name>``). The schedule arm trains its first three quarters itself, in its
folder's ``start`` run (the smaller crop's arm, same seed, same steps), so that every arm trains on its own: one
process, GPU or device call per arm.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FINETUNE_FROM = 0.75                # the AF3 schedule fine-tunes over the last quarter of the steps


@dataclass(frozen=True)
class Arm:
    impl: str                       # crop | finetune | activation
    crop: int                       # the training crop (for finetune: the crop of its last quarter)
    activation: str
    start_crop: int | None = None   # finetune: the crop of its first three quarters

    @property
    def name(self) -> str:
        if self.impl == "crop":
            return f"crop{self.crop}"
        if self.impl == "finetune":
            return f"finetune{self.start_crop}to{self.crop}"
        return f"activation_{self.activation}"


def plan_arms(crops: list[int], schedule: tuple[int, int] | None, activations: list[str] | None,
              config_activation: str) -> list[Arm]:
    """The crop arms (smallest first) and the schedule arm, or with ``activations`` the activation arms at the first
    crop."""
    if activations is not None:
        return [Arm("activation", crops[0], a) for a in activations]
    arms = [Arm("crop", c, config_activation) for c in sorted(crops)]
    if schedule is not None:
        start, end = schedule
        if start not in crops:
            raise ValueError(f"--schedule {start}:{end}: {start} must be one of --crops (its arm is the first part)")
        arms.append(Arm("finetune", end, config_activation, start_crop=start))
    return arms


def checkpoint_every(steps: int) -> int:
    """Checkpoints at twenty points of a run: the equal-time comparison scores the one closest under the time."""
    return max(1, steps // 20)


def finetune_start(steps: int) -> int:
    """The step the schedule arm starts fine-tuning from: three quarters of ``steps``, on a checkpoint."""
    every = checkpoint_every(steps)
    return max(every, every * round(FINETUNE_FROM * steps / every))


def arm_folder(folder: Path, seed: int, arm: Arm) -> Path:
    return folder / f"seed{seed}" / arm.name


def start_folder(folder: Path, seed: int, arm: Arm) -> Path:
    """The run of a schedule arm's first three quarters (at its start crop)."""
    return arm_folder(folder, seed, arm) / "start"


def arm_overrides(arm: Arm, folder: Path, seed: int, steps: int, started: bool, first_part: bool = False
                  ) -> list[str]:
    """The keys of one arm's run (the config and the ablation's own keys come first): its crop (its activation),
    seed, steps and folder. A schedule arm's ``first_part`` is a run at its start crop in :func:`start_folder`; its
    second, unless ``started`` (it has checkpoints of its own), starts from that run's checkpoint at
    :func:`finetune_start` (``trainer.resume=PATH``)."""
    crop, out_dir = arm.crop, arm_folder(folder, seed, arm)
    if first_part:
        crop, out_dir = arm.start_crop, start_folder(folder, seed, arm)
    keys: dict[str, object] = {"seed": seed, "data.crop_size": crop, "trainer.max_steps": steps,
                               "trainer.out_dir": out_dir}
    if arm.impl == "activation":
        keys["model.tri_attn_activation"] = arm.activation
    if arm.impl == "finetune" and not started and not first_part:
        keys["trainer.resume"] = start_folder(folder, seed, arm) / "checkpoints" / f"step_{finetune_start(steps)}"
    return [f"{k}={v}" for k, v in keys.items()]
