"""A run folder belongs to one run: what defines a run, whether a folder can take the run's files, and which
checkpoint a run resumes from.

What defines a run is what its checkpoints cannot be reused under without mixing two experiments: the seed, the
model's shape and function, the data it trains and validates on and how it is cropped, the losses, the optimiser
and the precision. How a run is executed is not part of it: backends, activation checkpointing, compiling,
workers, folders, the step budget and the logging and checkpoint cadence may change on resume.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch

from torch import nn

from ..config import OptimConfig
from . import checkpoint as ckpt
from .ema import EMA
from .optim import follow_config
from .process import Process, TrainingError

# section -> the keys of that section that define a run (None: every key)
DEFINING: dict[str, tuple[str, ...] | None] = {
    "seed": None,
    "model": ("n_blocks", "c_s", "c_z", "n_heads_tri", "c_hidden_tri", "n_heads_single", "c_hidden_mul",
              "transition_factor", "pair_dropout", "n_recycles", "tri_attn_activation", "distogram_bins",
              "distogram_min", "distogram_max", "plddt_bins", "diffusion_blocks", "diffusion_heads", "c_token",
              "sigma_data", "noise_p_mean", "noise_p_std", "diffusion_samples", "sampling_steps",
              "plddt_rollout_steps"),
    "data": ("val_ids", "train_ids", "val_after", "train_eval_ids", "val_identity_cut", "crop_size", "val_crop_size",
             "crop_weights", "interface_distance", "min_tokens", "max_tokens", "max_resolution",
             "min_resolved_fraction", "methods", "sample_weighting", "samples_per_epoch", "pad_to_crop"),
    "loss": None,
    "optim": None,
    "trainer": ("mixed_precision",),
}
GLOBAL_BATCH = "global batch (processes x data.batch_size x trainer.grad_accum)"   # defines a run; its factors not


def definition(config: dict, processes: int) -> dict[str, Any]:
    """The defining values of a config dict (``config_to_dict``) of a run on ``processes`` processes, by key."""
    values = {GLOBAL_BATCH: processes * (config.get("data") or {}).get("batch_size", 1)
              * (config.get("trainer") or {}).get("grad_accum", 1)}
    for section, keys in DEFINING.items():
        if keys is None and not isinstance(config.get(section), dict):
            values[section] = config.get(section)
            continue
        node = config.get(section) or {}
        for key in keys if keys is not None else sorted(node):
            values[f"{section}.{key}"] = node.get(key)
    return values


def differences(saved: dict, current: dict, saved_processes: int = 1, processes: int = 1) -> list[str]:
    """``key: saved -> current`` for every defining key whose value differs between two config dicts (of runs on
    ``saved_processes`` and ``processes`` processes)."""
    old, new = definition(saved, saved_processes), definition(current, processes)
    return [f"{key}: {old.get(key)!r} -> {new[key]!r}" for key in new if old.get(key) != new[key]]


def check_writable(folder: str | Path, key: str) -> None:
    """Raise ValueError (one line naming ``key``) unless ``folder`` exists as a folder, or can be made, and a file can
    be written in it. Creates the folder."""
    folder = Path(folder)
    for parent in (folder, *folder.parents):
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{key}={folder}: {parent} is a file, not a folder")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write_test_"):
            pass
    except OSError as err:
        raise ValueError(f"{key}={folder}: cannot write there ({err.strerror or type(err).__name__})") from None


def resume_candidates(out: Path, resume: str) -> list[ckpt.CheckpointInfo]:
    """The checkpoints to try, in order, for ``trainer.resume``: auto and force: the run folder's, newest first;
    never: none (ValueError if the folder holds some); a PATH: that checkpoint, or that run's, newest first."""
    found = ckpt.list_checkpoints(out)
    if resume == "never":
        if found:
            raise ValueError(f"trainer.resume=never but {out} already holds checkpoints (latest "
                             f"{found[-1].path.name}); choose another trainer.out_dir, or trainer.resume=auto")
        return []
    if resume in ("auto", "force"):
        return found[::-1]
    try:
        return ckpt.candidate_checkpoints(resume, prefer="latest")
    except FileNotFoundError as err:
        raise ValueError(f"trainer.resume={resume}: {err}") from None


def saved_definition_changes(candidates: list[ckpt.CheckpointInfo], current: dict, processes: int) -> list[str]:
    """:func:`differences` between the run of the newest readable candidate and ``current`` on ``processes``
    processes (none readable: [])."""
    for info in candidates:
        try:
            saved_processes = ckpt.read_state(info.path).get("world_size", 1)
            return differences(ckpt.read_config(info.path), current, saved_processes, processes)
        except ckpt.CheckpointError:
            continue
    return []


def open_run(proc: Process, out: Path, resume: str, config: dict) -> tuple[list[ckpt.CheckpointInfo], list[str]]:
    """Check that the run folder can be written, clear what a killed run left half-written, and find the checkpoints
    to resume from (:func:`resume_candidates`) and the defining keys that changed since they were written.

    A run folder belongs to one run: under ``trainer.resume=auto``, checkpoints of a run with another definition
    stop the run with the keys that differ; under force or an explicit PATH the new values are used (and said)."""
    if proc.main:
        try:
            check_writable(out, "trainer.out_dir")
        except ValueError as err:
            raise TrainingError(str(err)) from None
        for path in ckpt.clean_partial(out):
            proc.say(f"removed {path} (a run stopped while writing or deleting it)")
    try:
        candidates = resume_candidates(out, resume)
    except ValueError as err:
        raise TrainingError(str(err)) from None
    changed = saved_definition_changes(candidates, config, proc.world)
    if changed and resume == "auto":
        raise TrainingError(f"{out} holds checkpoints of another run ({'; '.join(changed)}): choose another "
                            f"trainer.out_dir, or trainer.resume=force to go on with these values")
    return candidates, changed


def restore(proc: Process, candidates: list[ckpt.CheckpointInfo], *, model: nn.Module,
            optimizer: torch.optim.Optimizer, scheduler: Any, ema: EMA, changed: list[str],
            optim_cfg: OptimConfig) -> tuple[dict, Path]:
    """Restore the first readable checkpoint of ``candidates``, saying which were skipped and why; with ``changed``
    defining keys, the optimiser then follows ``optim_cfg``. Returns (its trainer state, its folder)."""
    for info in candidates:
        try:
            if info.damage:
                raise ckpt.CheckpointError(info.damage)
            saved = ckpt.load_training_state(info.path, model=model, optimizer=optimizer, scheduler=scheduler,
                                             ema=ema, rank=proc.rank)
            break
        except ckpt.CheckpointError as err:
            proc.say(f"skipped checkpoint {info.path.name}: {err}")
        except ValueError as err:                                # it does not fit the model: neither would the others
            raise TrainingError(str(err)) from None
    else:
        raise TrainingError(f"no readable checkpoint to resume from ({', '.join(c.path.name for c in candidates)} "
                            f"skipped, see above); trainer.resume=never starts afresh in another trainer.out_dir")
    if changed:
        follow_config(optimizer, getattr(scheduler, "scheduler", scheduler), optim_cfg, saved["step"])
    return saved, info.path
