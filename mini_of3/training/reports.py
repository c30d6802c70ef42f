"""The lines a run prints: its start, each evaluation, its end, and why it ran out of memory."""
from __future__ import annotations

from pathlib import Path

from ..config import Config


def start_line(cfg: Config, n_train: int, val_ids: list[str], params_m: float, device: str, processes: int,
               precision: str, step: int, train_s: float, out: Path) -> str:
    minutes = cfg.trainer.max_minutes
    budget = "" if minutes is None else f" or {minutes:g} min of steps ({train_s / 60:.1f} done)"
    return (f"mini_of3: {n_train} training entries, validation: {', '.join(val_ids) or 'none'} | model "
            f"{params_m:.2f} M parameters | {device}, {processes} process(es), precision {precision} | steps "
            f"{step} -> {cfg.trainer.max_steps}{budget} | {out}")


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


def out_of_memory_message(cfg: Config, step: int, out: Path, err: BaseException) -> str:
    """The one line that ends a run out of (device or host) memory, with the settings that decide the memory."""
    m, t = cfg.model, cfg.trainer
    if m.checkpointing:
        advice = "a smaller data.crop_size"
    else:
        advice = "model.checkpointing=true (blocks recomputed in the backward; with it trainer.compile_mode " \
                 "reduce-overhead compiles in the default mode), or a smaller data.crop_size"
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (f"out of device memory at step {step + 1} (data.crop_size={cfg.data.crop_size}, model.checkpointing="
            f"{str(m.checkpointing).lower()}, trainer.compile_mode={t.compile_mode if t.compile else 'off'}): try "
            f"{advice}; checkpoints so far are in {out / 'checkpoints'} ({first[:200]})")
