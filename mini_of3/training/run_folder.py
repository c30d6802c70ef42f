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
             "min_resolved_fraction", "methods", "sample_weighting", "samples_per_epoch", "batch_size", "pad_to_crop"),
    "loss": None,
    "optim": None,
    "trainer": ("grad_accum", "mixed_precision"),
}


def definition(config: dict) -> dict[str, Any]:
    """The defining values of a config dict (``config_to_dict``), by dotted key."""
    values = {}
    for section, keys in DEFINING.items():
        if keys is None and not isinstance(config.get(section), dict):
            values[section] = config.get(section)
            continue
        node = config.get(section) or {}
        for key in keys if keys is not None else sorted(node):
            values[f"{section}.{key}"] = node.get(key)
    return values


def differences(saved: dict, current: dict) -> list[str]:
    """``key: saved -> current`` for every defining key whose value differs between two config dicts."""
    old, new = definition(saved), definition(current)
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

