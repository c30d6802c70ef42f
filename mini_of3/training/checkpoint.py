"""Checkpoint folders: ``<run>/checkpoints/step_<N>/``, written under a temporary name and renamed when complete.

A checkpoint holds::

    model.safetensors     the weights, full tensors named as in the unwrapped model (any process count reads them)
    ema.safetensors       the EMA weights, same names (``predict`` uses these)
    optimizer.pt          AdamW state keyed by parameter name (torch.distributed.checkpoint's full state dict)
    scheduler.pt          the learning-rate schedule's state
    rng_<rank>.pt         python, numpy, torch CPU and CUDA generator states of each rank
    config.yaml           the resolved config of the run
    trainer_state.json    step, data position, EMA update count, non-finite counters, validation metrics, wandb id

``trainer_state.json`` is written last, then the folder is renamed from ``.tmp_step_<N>`` to ``step_<N>``; a rename
is atomic, so a folder named ``step_<N>`` is complete, and a process killed while writing leaves only a ``.tmp_``
folder, which the next run removes. Weights and optimizer state go through torch.distributed.checkpoint's full
state dicts, which gather FSDP shards, drop DDP and torch.compile wrappers, and key everything by parameter name,
so a checkpoint resumes on any number of processes.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import torch
import yaml
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from ..config import Config, save_config
from .ema import EMA

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"
_NAME = re.compile(r"^step_(\d+)$")
_TEMP = ".tmp_"          # being written
_TRASH = ".del_"         # being deleted (renamed first, so a half-deleted folder never looks complete)
FAULT_ENV = "MINI_OF3_FAULT"
STALL_ENV = "MINI_OF3_STALL"


class CheckpointError(ValueError):
    """A checkpoint file that is missing or cannot be read (truncated, corrupt); the message names the file."""


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    val_lddt: float | None      # validation lDDT-Calpha measured at this step, if any
    damage: str | None = None   # why its trainer_state.json cannot be read; None when it can


def checkpoints_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / f"step_{step}"


def temp_path(run_dir: str | Path, step: int) -> Path:
    return checkpoints_dir(run_dir) / f"{_TEMP}step_{step}"


def is_checkpoint(folder: Path) -> bool:
    """A complete checkpoint folder: named ``step_<N>`` and holding its ``trainer_state.json``."""
    return bool(_NAME.match(folder.name)) and (folder / STATE_FILE).is_file()


def read_file(path: Path, reader: Callable[[Path], Any]) -> Any:
    """``reader(path)``; any failure to read becomes a CheckpointError naming the file and the reason."""
    try:
        return reader(path)
    except Exception as err:                 # noqa: BLE001 - truncated, corrupt or missing: all are damage here
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        reason = "missing" if isinstance(err, FileNotFoundError) else f"unreadable ({type(err).__name__}: {first})"
        raise CheckpointError(f"{path} is {reason}") from None


def torch_file(path: Path) -> Any:
    return torch.load(path, weights_only=True)


def read_state(folder: str | Path) -> dict:
    return read_file(Path(folder) / STATE_FILE, lambda p: json.loads(p.read_text()))


def read_config(folder: str | Path) -> dict:
    """The resolved config a checkpoint was written under, as a dict."""
    return read_file(Path(folder) / "config.yaml", lambda p: _mapping(yaml.safe_load(p.read_text())))


def _mapping(value: Any) -> dict:
    if not isinstance(value, dict):
        raise ValueError("not a mapping of keys")
    return value


def _info(folder: Path) -> CheckpointInfo:
    step = int(_NAME.match(folder.name).group(1))
    try:
        val = read_state(folder).get("val") or {}
    except CheckpointError as err:
        return CheckpointInfo(folder, step, None, damage=str(err))
    lddt = val.get("lddt_ca")
    return CheckpointInfo(folder, step, float(lddt) if lddt is not None and math.isfinite(lddt) else None)


def list_checkpoints(run_dir: str | Path) -> list[CheckpointInfo]:
    """The complete checkpoints of a run folder, by step."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    return sorted((_info(p) for p in root.iterdir() if p.is_dir() and is_checkpoint(p)), key=lambda c: c.step)


def best_checkpoint(infos: list[CheckpointInfo]) -> CheckpointInfo | None:
    """The checkpoint with the highest validation lDDT (the later one on a tie), or None when none has one."""
    scored = [c for c in infos if c.val_lddt is not None]
    return max(scored, key=lambda c: (c.val_lddt, c.step)) if scored else None


def candidate_checkpoints(path: str | Path, prefer: Literal["latest", "best"] = "latest") -> list[CheckpointInfo]:
    """The checkpoints ``path`` names, in the order to try them: a checkpoint folder alone; for a run folder (or its
    ``checkpoints/``) its complete checkpoints newest first, with ``prefer="best"`` the best by validation lDDT
    first. Damaged ones are included (``damage`` says why), so that a caller can say what it skipped.

    Raises FileNotFoundError naming the path and what was found there.
    """
    path = Path(path)
    if is_checkpoint(path):
        return [_info(path)]
    if _NAME.match(path.name) or path.name.startswith(_TEMP):
        raise FileNotFoundError(f"{path}: an incomplete checkpoint (no {STATE_FILE}); a run stopped while writing it")
    run_dir = path.parent if path.name == CHECKPOINTS else path
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{path}: no such run or checkpoint folder")
    infos = list_checkpoints(run_dir)[::-1]
    if not infos:
        raise FileNotFoundError(f"{path}: no complete checkpoint in {checkpoints_dir(run_dir)}")
    best = best_checkpoint(infos) if prefer == "best" else None
    return [best, *(c for c in infos if c != best)] if best is not None else infos


def resolve_checkpoint(path: str | Path, prefer: Literal["latest", "best"] = "latest") -> Path:
    """The first of :func:`candidate_checkpoints`."""
    return candidate_checkpoints(path, prefer)[0].path


# ----------------------------------------------------------------------------------------------------------------
# writing


def fault_point(name: str, step: int, rank: int = 0) -> None:
    """Test hooks: with ``MINI_OF3_FAULT=<name>@<step>`` in the environment, SIGKILL this process here (used to show
    that a kill at any point leaves a usable run folder); with ``MINI_OF3_STALL=<name>@<step>/<rank>``, that rank
    hangs here (used to show that the others end with a clear message, not a hang)."""
    if os.environ.get(FAULT_ENV) == f"{name}@{step}":
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(STALL_ENV) == f"{name}@{step}/{rank}":
        time.sleep(24 * 3600)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_torch(obj: Any, path: Path) -> None:
    """``torch.save`` flushed to disk."""
    with open(path, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """A safetensors file flushed to disk (shared storage between tensors is broken up: safetensors refuses it)."""
    save_file({k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


def save_json(obj: dict, path: Path) -> None:
    with open(path, "w") as handle:
        json.dump(obj, handle, indent=1, allow_nan=False)
        handle.flush()
        os.fsync(handle.fileno())


def begin_checkpoint(run_dir: str | Path, step: int) -> Path:
    """An empty temporary folder for the checkpoint of ``step`` (main process only)."""
    tmp = temp_path(run_dir, step)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def commit_checkpoint(tmp: Path, state: dict) -> Path:
    """Write ``trainer_state.json`` into ``tmp``, then rename it to ``step_<N>`` (replacing an older folder of that
    step); returns the final path (main process only)."""
    save_json(state, tmp / STATE_FILE)
    final = tmp.with_name(tmp.name[len(_TEMP):])
    old = final.with_name(_TRASH + final.name)
    if final.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    if old.exists():
        shutil.rmtree(old)
    return final


def _remove(folder: Path) -> None:
    trash = folder.with_name(_TRASH + folder.name)
    os.replace(folder, trash)
    shutil.rmtree(trash)


def prune_checkpoints(run_dir: str | Path, keep_last: int) -> list[Path]:
    """Delete all complete checkpoints but the last ``keep_last`` and the best; returns the deleted folders."""
    infos = list_checkpoints(run_dir)
    keep = {c.path for c in infos[-keep_last:]}
    best = best_checkpoint(infos)
    if best is not None:
        keep.add(best.path)
    removed = [c.path for c in infos if c.path not in keep]
    for path in removed:
        _remove(path)
    return removed


def clean_partial(run_dir: str | Path) -> list[Path]:
    """Remove what a killed run left half-written or half-deleted; returns the removed folders."""
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    stale = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith((_TEMP, _TRASH)))
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return stale


# ----------------------------------------------------------------------------------------------------------------
# random number generator states (tensors and plain values only, so torch.load(weights_only=True) reads them)


def rng_state() -> dict:
    """This process's python, numpy, torch CPU and (when present) CUDA generator states."""
    version, py_state, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": (version, torch.tensor(py_state, dtype=torch.int64), gauss),
             "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned (CUDA states only when the device count matches)."""
    version, py_state, gauss = state["python"]
    random.setstate((version, tuple(int(v) for v in py_state.tolist()), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


# ----------------------------------------------------------------------------------------------------------------
# a whole training state


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def save_training_state(run_dir: str | Path, state: dict, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                        scheduler: Any, ema: EMA, config: Config, rank: int, is_main: bool,
                        barrier: Callable[[], None]) -> Path:
    """Write the checkpoint of ``state["step"]`` (see the module docstring) and return its folder.

    Collective: every rank calls it (gathering full weights is a collective under FSDP); the main process writes
    the shared files and ``state`` (trainer_state.json), each rank its RNG states. ``model`` is the unwrapped module,
    ``optimizer`` the torch optimizer; ``barrier`` waits for all ranks.
    """
    step = int(state["step"])
    model_state = get_model_state_dict(model, options=_FULL)
    optim_state = get_optimizer_state_dict(model, optimizer, options=_FULL)
    ema_state = ema.state_dict()
    tmp = temp_path(run_dir, step)
    if is_main:
        begin_checkpoint(run_dir, step)
        save_tensors(model_state, tmp / "model.safetensors")
        save_tensors(ema_state, tmp / "ema.safetensors", metadata={"updates": str(ema.updates)})
        save_torch(optim_state, tmp / "optimizer.pt")
        save_torch(scheduler.state_dict(), tmp / "scheduler.pt")
        save_config(config, tmp / "config.yaml")
    barrier()
    save_torch(rng_state(), tmp / f"rng_{rank}.pt")
    fault_point("checkpoint_write", step, rank)
    barrier()
    if is_main:
        commit_checkpoint(tmp, {**state, "ema_updates": ema.updates})
    barrier()
    return checkpoint_path(run_dir, step)


def load_training_state(folder: str | Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
                        ema: EMA, rank: int) -> dict:
    """Restore weights, optimizer, schedule, EMA and this rank's RNG states (when the checkpoint has this rank)
    from ``folder``; returns its trainer state. Every file is read before anything is restored: a file that cannot
    be read raises CheckpointError naming it (and changes nothing); a checkpoint that does not fit the model raises
    ValueError."""
    folder = Path(folder)
    state = read_state(folder)
    weights = read_file(folder / "model.safetensors", load_file)
    ema_weights = read_file(folder / "ema.safetensors", load_file)
    optim_state = read_file(folder / "optimizer.pt", torch_file)
    scheduler_state = read_file(folder / "scheduler.pt", torch_file)
    rng_file = folder / f"rng_{rank}.pt"
    rng = read_file(rng_file, torch_file) if rng_file.is_file() else None
    full = StateDictOptions(full_state_dict=True, strict=True)
    try:
        set_model_state_dict(model, weights, options=full)
        set_optimizer_state_dict(model, optimizer, optim_state, options=full)
        ema.load_state_dict(ema_weights, state["ema_updates"])
    except (RuntimeError, ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0]
        raise ValueError(f"checkpoint {folder} does not fit this config's model ({first})") from None
    scheduler.load_state_dict(scheduler_state)
    if rng is not None:
        set_rng_state(rng)
    return state
