"""The lines a run prints: its start, each evaluation, its end, and why it ran out of memory."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch

from ..config import Config
from .process import Process, TrainingError
from .run_state import RunState


def start_lines(cfg: Config, loaders, model: torch.nn.Module, proc: Process, precision: str, state: RunState,
                out: Path) -> list[str]:
    """What the run trains and validates on, the model's size, where it runs, the steps to go; then the training
    entries left out as homologues of validation chains."""
    minutes, val = cfg.trainer.max_minutes, loaders.val
    budget = "" if minutes is None else f" or {minutes:g} min of steps ({state.train_s / 60:.1f} done)"
    val_ids = ", ".join(f"{r.id} ({r.tokens})" for r in val.dataset.rows) if val is not None else "none"
    if cfg.data.val_ids == "auto":
        val_ids += " (data.val_ids=auto: chosen by size and sequence identity)"
    params = sum(p.numel() for p in model.parameters()) / 1e6
    return [f"mini_of3: {len(loaders.train.dataset)} training entries, validation: {val_ids} | model {params:.2f} M "
            f"parameters | {proc.device}, {proc.world} process(es), precision {precision} | steps {state.step} -> "
            f"{cfg.trainer.max_steps}{budget} | {out}", *loaders.train.dataset.removal_report()]


def evaluation_line(step: int, split: str, metrics: dict, seconds: float) -> str:
    def show(key, fmt):
        return "nan" if metrics[key] is None else format(metrics[key], fmt)

    name = "validation" if split == "val" else "training entries"
    return (f"step {step} {name}: lDDT-Ca {show('lddt_ca', '.3f')}  TM {show('tm_score', '.3f')}  "
            f"RMSD {show('rmsd', '.2f')} A  contacts {show('contact_precision', '.3f')}  "
            f"distogram acc {show('distogram_accuracy', '.3f')}  pLDDT {show('mean_plddt', '.1f')}  "
            f"loss {show('loss', '.3f')}  ({seconds:.1f} s)")


def end_line(step: int, wall_s: float, first_val: dict | None, last_val: dict | None, out: Path,
             stopped_by: str | None, budget_minutes: float | None) -> str:
    def lddt(v):
        return "n/a" if not v or v.get("lddt_ca") is None else f"{v['lddt_ca']:.3f} (step {v['step']})"

    stopped = f" (stopped by {stopped_by})" if stopped_by else \
        f" (trainer.max_minutes={budget_minutes:g} reached)" if budget_minutes is not None else ""
    return (f"done{stopped}: step {step} in {wall_s / 60:.1f} min; validation lDDT-Ca {lddt(first_val)} -> "
            f"{lddt(last_val)}; run folder {out}")


@contextmanager
def memory_errors_as_one_line(cfg: Config, out: Path, device: torch.device, step: Callable[[], int]):
    """Running out of device or host memory ends the run with one TrainingError line: the settings that decide the
    memory (``step()`` is the step that ran out)."""
    try:
        yield
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not is_out_of_memory(err):
            raise
        raise TrainingError(out_of_memory_message(cfg, step(), out, err, device.type)) from None


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is running out of device memory (torch.OutOfMemoryError) or of host memory (the CPU
    allocator's RuntimeError)."""
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "can't allocate memory" in str(err))


def out_of_memory_message(cfg: Config, step: int, out: Path, err: BaseException, device: str) -> str:
    """The one line that ends a run out of (device or host) memory, with the settings that decide the memory."""
    m, t = cfg.model, cfg.trainer
    if m.checkpointing:
        advice = "a smaller data.crop_size"
    else:
        advice = "model.checkpointing=true (blocks recomputed in the backward; with it trainer.compile_mode " \
                 "reduce-overhead compiles in the default mode), or a smaller data.crop_size"
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (f"out of memory on {device} at step {step + 1} (data.crop_size={cfg.data.crop_size}, model.checkpointing="
            f"{str(m.checkpointing).lower()}, trainer.compile_mode={t.compile_mode if t.compile else 'off'}): try "
            f"{advice}; checkpoints so far are in {out / 'checkpoints'} ({first[:200]})")
