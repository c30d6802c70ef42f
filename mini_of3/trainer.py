"""The training loop behind ``accelerate launch train.py`` (docs/design.md, Training).

One :class:`Trainer` per process; accelerate does the distribution (DDP, or FSDP2), mixed precision and gradient
accumulation; the main process alone prints, logs and writes the shared checkpoint files. A checkpoint holds the
weights, AdamW, the schedule, the EMA, every rank's RNG states and :class:`~mini_of3.training.run_state.RunState`;
every random choice is a named stream of (seed, step, slot) (:mod:`mini_of3.training.streams`). So a resumed run
repeats the uninterrupted one bitwise on the same number of processes, and on another continues from the same step
and data position (with batch_size 1 and the same global batch, to float rounding).
"""
from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import (DistributedType, InitProcessGroupKwargs, broadcast_object_list, gather_object,
                               set_seed)
from tqdm import tqdm

from .config import Config, ConfigError, config_to_dict, save_config
from .data import collate
from .losses import compute_losses
from .model import build_model
from .training import checkpoint as ckpt
from .training import reports, run_folder
from .training.batches import BatchStream, build_loaders, to_device
from .training.compile_clock import compile_seconds
from .training.compiling import compile_with_probe
from .training.diagnostics import (MODULES, SUMS_SIZE, global_ids, micro_batch_sums, module_grad_norms,
                                   module_parameters, step_report)
from .training.ema import EMA
from .training.evaluation import evaluate
from .training.guards import SpikeWatch, nonfinite_stop_message
from .training.optim import build_optimizer
from .training.plots import plot_run
from .training.process import Process, TrainingError
from .training.run_state import RunState
from .training.runlog import RunLog, Watchdog
from .training.signals import Interrupted, StopRequest, is_worker_death
from .training.streams import Stream, recycles_for_step, stream_generator, stream_seed

__all__ = ["MODULES", "TrainResult", "Trainer", "TrainingError", "train"]


@dataclass
class TrainResult:
    out_dir: Path
    step: int
    first_val: dict | None          # validation at the first step of the run (step 0: the untrained model)
    last_val: dict | None
    stopped_by: str | None          # "SIGINT" / "SIGTERM" when a signal ended the run early
    wall_s: float
    train_s: float = 0.0            # time in training steps over the whole run (resumed parts included)


def train(cfg: Config) -> TrainResult:
    """Train as ``cfg`` says (resuming when ``cfg.trainer.resume`` says so) and return a summary."""
    return Trainer(cfg).fit()


class Trainer:
    """Builds everything for one process in ``__init__`` (data, model, optimizer, resume), trains in :meth:`fit`."""

    def __init__(self, cfg: Config) -> None:
        self.cfg, t = cfg, cfg.trainer
        # several processes and no GPU: gloo on the CPU (accelerate would otherwise run N unaware copies); the
        # backend's own timeout comes a minute after the watchdog's, so a stalled rank ends with the watchdog's message
        cpu_group = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available()
        self.acc = acc = Accelerator(mixed_precision=t.mixed_precision, gradient_accumulation_steps=t.grad_accum,
                                     cpu=cpu_group, step_scheduler_with_optimizer=False, kwargs_handlers=[
                                         InitProcessGroupKwargs(timeout=timedelta(seconds=t.stall_timeout_s + 60))])
        if acc.distributed_type == DistributedType.FSDP and not acc.is_fsdp2:
            raise TrainingError("FSDP needs fsdp_version: 2 in the accelerate config (configs/accelerate/fsdp.yaml)")
        self.proc = Process(acc.process_index, acc.num_processes, acc.is_main_process, acc.device,
                            reduce_sum=lambda x: acc.reduce(x, "sum"), gather=gather_object,
                            broadcast=broadcast_object_list)
        self.out, self.say = Path(t.out_dir), self.proc.say
        self.watchdog = Watchdog(t.stall_timeout_s, self.proc.rank)   # started by fit(); set-up: the group timeout
        candidates, changed = run_folder.open_run(self.proc, self.out, t.resume, config_to_dict(cfg))
        set_seed(cfg.seed)                                   # the same initial weights on every rank
        self.model, self.optimizer, self.scheduler = self._build_model()    # first: a bad model.* fails fast
        self.loaders = build_loaders(self.proc, cfg)
        self.plain = acc.unwrap_model(self.model, keep_torch_compile=False)
        if acc.is_fsdp2:                                     # validation calls sample(), not forward(): FSDP2 must
            from torch.distributed.fsdp import register_fsdp_forward_method     # gather the shards for it as well
            register_fsdp_forward_method(self.plain, "sample")
        self.ema = EMA(self.plain, cfg.optim.ema_decay)
        self.module_params = module_parameters(self.plain)
        self.state, self.resumed, self.out_of_time = RunState(), None, False   # out_of_time: see _check_time
        if candidates:
            self._resume(candidates, changed)
        self.spikes = SpikeWatch(t.loss_spike_factor)
        self.batches = BatchStream(self.loaders.train, self.loaders.train_sampler, acc.device)
        self.batches.seek(self.state.epoch, self.state.consumed)
        self.stop = StopRequest(announce=self.proc.main)
        if t.compile:
            with reports.memory_errors_as_one_line(self.cfg, self.out, self.proc.device, lambda: self.state.step):
                self._compile()


    def _build_model(self):
        """The model (a bad combination of model.* values is a config error), AdamW and its schedule, prepared."""
        try:
            model = build_model(self.cfg.model)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        optimizer, scheduler = build_optimizer(model, self.cfg.optim)
        return self.acc.prepare(model, optimizer, scheduler)

    def _resume(self, candidates: list[ckpt.CheckpointInfo], changed: list[str]) -> None:
        """Restore the training state, the step and the data position of the first readable checkpoint."""
        saved, self.resumed = run_folder.restore(self.proc, candidates, model=self.plain, changed=changed,
                                                 optimizer=self.optimizer.optimizer, scheduler=self.scheduler,
                                                 ema=self.ema, optim_cfg=self.cfg.optim)
        s = self.state = RunState.restored(saved)
        note = ""
        if saved["world_size"] != self.proc.world:           # the same global position, new shards: not bitwise
            s.consumed = s.consumed * saved["world_size"] // self.proc.world
            note = f"; saved by {saved['world_size']} processes, now {self.proc.world}: same step and data position"
        note += f"; with the new values {'; '.join(changed)}" if changed else ""
        self.say(f"resuming from {self.resumed} (step {s.step}, epoch {s.epoch}, example {s.consumed}){note}")

    def _compile(self) -> None:
        """Compile the repeated blocks and try them on one real example (:func:`compile_with_probe`)."""
        data = self.cfg.data
        example = to_device(collate([self.loaders.train.dataset[(0, 0)]],
                                    n_tokens=data.crop_size if data.pad_to_crop else None), self.proc.device)

        def probe() -> None:
            with torch.random.fork_rng(devices=[]):
                outputs = self.model(example, n_recycles=0, generator=self._generator(Stream.COMPILE_PROBE, 0, 0))
                self.acc.backward(compute_losses(outputs, example, self.cfg.loss)[0])
        try:
            compile_with_probe(self.plain, self.cfg, probe, self.say)
        finally:
            self.optimizer.zero_grad(set_to_none=True)


    def fit(self) -> TrainResult:
        """Train to ``trainer.max_steps`` (or until the training steps have taken ``trainer.max_minutes``): validate
        at the start, every ``val_every`` steps and at the end; checkpoint every ``checkpoint_every`` steps, at a new
        best, at the end and on SIGINT/SIGTERM."""
        t, s, started = self.cfg.trainer, self.state, time.perf_counter()
        if self.proc.main:
            save_config(self.cfg, self.out / "config.yaml")
        self.log = RunLog(self.out, enabled=self.proc.main, resume_step=s.step if self.resumed else None)
        if self.cfg.wandb:
            s.wandb_id = self.log.start_wandb(self.cfg.wandb_project, config_to_dict(self.cfg), s.wandb_id)
        for line in reports.start_lines(self.cfg, self.loaders, self.plain, self.proc, self.acc.mixed_precision, s,
                                        self.out):
            self.say(line)
        bar = tqdm(total=t.max_steps if t.max_minutes is None else None, initial=s.step, disable=not self.proc.main,
                   desc="train", unit="step", dynamic_ncols=True, mininterval=1.0)
        with self.stop, reports.memory_errors_as_one_line(self.cfg, self.out, self.proc.device,
                                                                  lambda: self.state.step):
            try:
                self.watchdog.start()
                self._loop(bar)
            finally:
                bar.close()
                self.watchdog.stop()
                self.log.close()
                self.batches.close()
                self.loaders.close()                     # the workers ignore stop signals: end them here
        for death in self.stop.worker_deaths:
            self.say(f"during the stop: {death}")
        wall = time.perf_counter() - started
        if self.proc.main:
            plot_run(self.log.rows, self.out, title=self.out.name)
        self.say(reports.end_line(s.step, wall, s.first_val, s.last_val, self.out, self.stop.signal,
                                  t.max_minutes if self.out_of_time else None))
        return TrainResult(self.out, s.step, s.first_val, s.last_val, self.stop.signal, wall, s.train_s)

    def _loop(self, bar: tqdm) -> None:
        t = self.cfg.trainer
        if self.state.step == 0 and self.resumed is None:
            self._validate()                                 # the untrained model, for comparison
        self._check_time()                                   # a resumed run may have spent its budget
        while self.state.step < t.max_steps and not self.out_of_time:
            if not self._step_or_stop():
                return
            self._check_time()
            bar.update(1)
            step = self.state.step
            if self.proc.main and step % t.log_every == 0:
                bar.set_postfix(loss=self.log.rows[-1]["loss"], lr=f"{self.log.rows[-1]['lr']:.2e}", refresh=False)
            if self.stop.signal is not None:
                self._save()
                return
            last = step == t.max_steps or self.out_of_time
            val = self._validate() if step % t.val_every == 0 or last else None
            improved = val is not None and self.state.best is not None and self.state.best["step"] == step
            if step % t.checkpoint_every == 0 or last or improved:
                self._save(val)

    def _check_time(self) -> None:
        """Set ``out_of_time`` once the training steps have taken ``trainer.max_minutes`` (validation, checkpoints
        and compiling do not count). With several processes the slowest decides: all stop after the same step."""
        budget = self.cfg.trainer.max_minutes
        if budget is not None:
            self.out_of_time = self.proc.max_over_ranks(self.state.train_s) >= budget * 60

    def _step_or_stop(self) -> bool:
        """One training step; False when a signal cut it short (the state from before it is then saved). A loader
        worker found dead while a stop is requested (the job's signal reached it too) cuts the step short the same
        way: it is raised while the step waits for a batch, before the weights change."""
        position = (self.batches.epoch, self.batches.consumed)
        try:
            self._train_step()
            return True
        except Interrupted:
            pass
        except RuntimeError as err:
            if self.stop.signal is None or not is_worker_death(err):
                raise
        self.batches.epoch, self.batches.consumed = position  # the abandoned step's batch comes again on resume
        self.optimizer.zero_grad(set_to_none=True)
        self._save()
        return False

    def _generator(self, stream: Stream, step: int, slot: int) -> torch.Generator:
        return stream_generator(self.cfg.seed, stream, step, slot, self.proc.device)

    def _train_step(self) -> None:
        """Forward, backward (accumulated over ``grad_accum`` micro-batches), reduce, clip, update, log."""
        cfg, step, started, compiled_before = self.cfg, self.state.step, time.perf_counter(), compile_seconds()
        self.watchdog.beat(f"training step {step + 1}")
        ckpt.fault_point("step", step + 1, self.proc.rank)
        recycles = recycles_for_step(cfg.seed, step, cfg.model.n_recycles)
        self.model.train()
        sums, data_s, ids = torch.zeros(SUMS_SIZE, dtype=torch.float64), 0.0, []
        with self.stop.abortable(self.proc.world == 1):     # several ranks must stop together, at the boundary
            for micro in range(cfg.trainer.grad_accum):
                tick = time.perf_counter()
                batch = self.batches.next()
                data_s, slot = data_s + time.perf_counter() - tick, self.proc.slot(micro)
                ids.append(batch["id"])
                torch.manual_seed(stream_seed(cfg.seed, Stream.DROPOUT, step, slot))
                with self.acc.accumulate(self.model):
                    with self.acc.autocast():   # FSDP2 casts the parameters to bf16 but does not autocast the forward
                        outputs = self.model(batch, n_recycles=recycles,
                                             generator=self._generator(Stream.TRAIN_NOISE, step, slot))
                    loss, parts = compute_losses(outputs, batch, cfg.loss)
                    self.acc.backward(loss)
                sums += micro_batch_sums(loss, parts, outputs, batch)
        losses, diagnostics = self._reduce(sums)
        grad_norms, finite = self._update(losses["loss"])
        self._log_step({**losses, **grad_norms, **diagnostics, "recycles": recycles, "ids": global_ids(self.proc, ids),
                        "step_s": time.perf_counter() - started, "data_s": data_s, "skipped": not finite},
                       compile_seconds() - compiled_before)

    def _reduce(self, sums: torch.Tensor) -> tuple[dict[str, float], dict[str, float]]:
        """The step's means (:func:`step_report`) over every rank's micro-batches; a stop flag rides along."""
        flags = torch.tensor([float(self.stop.signal is not None)], dtype=torch.float64)
        reduced = self.proc.reduce_sum(torch.cat([sums, flags]).to(self.proc.device)).cpu()
        if reduced[-1] > 0:
            self.stop.request("a stop signal on another rank")
        return step_report(reduced[:-1], self.proc.world * self.cfg.trainer.grad_accum)

    def _update(self, loss: float) -> tuple[dict[str, float], bool]:
        """Clip and apply the accumulated gradients unless the loss or their norm is not finite (the step is then
        skipped and counted); the schedule follows the step either way. Returns the gradient norms and finiteness."""
        scaler = getattr(self.acc, "scaler", None)                  # fp16: the gradients are still scaled here
        norms = module_grad_norms(self.module_params, self.proc.device,
                                  self.proc.reduce_sum if self.acc.is_fsdp2 else None,
                                  scaler.get_scale() if scaler is not None else 1.0)
        clip = self.cfg.optim.grad_clip if self.cfg.optim.grad_clip > 0 else float("inf")
        grad_norm = float(self.acc.clip_grad_norm_(self.model.parameters(), clip))
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        self.lr = self.scheduler.get_last_lr()[0]
        if finite:
            self.optimizer.step()
            self.ema.update()
        self.state.nonfinite_in_row = 0 if finite else self.state.nonfinite_in_row + 1
        self.state.nonfinite_total += int(not finite)
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            self.scheduler.step()
        self.state.step += 1
        return {"grad_norm": grad_norm, **norms}, finite

    def _log_step(self, values: dict, compile_s: float) -> None:
        """Write the step's log row (time in steps counts towards trainer.max_minutes, compiling not); warn of a loss
        spike; stop the run after ``trainer.max_nonfinite`` skipped steps in a row."""
        t, s = self.cfg.trainer, self.state
        values["compile_s"] = min(compile_s, values["step_s"])
        s.train_s += values["step_s"] - values["compile_s"]
        row = {"step": s.step, "split": "train", **values, "lr": self.lr, "epoch": self.batches.epoch,
               "train_s": s.train_s}
        if self.proc.device.type == "cuda":   # since the last validation, which resets it (see evaluate)
            row["peak_mem_gib"] = torch.cuda.max_memory_allocated(self.proc.device) / 2 ** 30
        self.log.write(row, to_wandb=s.step % t.log_every == 0)
        for line in filter(None, [self.spikes.observe(s.step, row["loss"])]):
            self.say(line)
        if not row["skipped"]:
            return
        self.say(f"step {s.step}: non-finite loss {row['loss']} or gradient norm {row['grad_norm']}; step skipped "
                 f"({s.nonfinite_in_row} in a row, trainer.max_nonfinite={t.max_nonfinite})")
        if s.nonfinite_in_row >= t.max_nonfinite:
            raise TrainingError(nonfinite_stop_message(s.step, s.nonfinite_in_row, t.max_nonfinite, self.out))


    def _validate(self) -> dict | None:
        """Validate the EMA weights on the validation entries (and score ``data.train_eval_ids`` the same way after,
        logged as split ``train_eval``), plot; returns the validation metrics (None without validation entries)."""
        metrics, s, loaders = None, self.state, self.loaders
        common = dict(step=s.step, log=self.log, autocast=self.acc.autocast, beat=self.watchdog.beat,
                      with_baseline=s.step == 0 and self.resumed is None)
        if loaders.val is None:
            if s.step == 0:
                self.say("no validation entries (data.val_ids / data.val_after): validation is skipped")
        else:
            metrics = evaluate(self.proc, self.cfg, self.plain, self.ema, loaders.val, loaders.val_real, split="val",
                               **common)
            s.record_validation(metrics)
        if loaders.train_eval is not None:
            evaluate(self.proc, self.cfg, self.plain, self.ema, loaders.train_eval, loaders.train_eval_real,
                     split="train_eval", **common)
        if self.proc.main and (metrics is not None or loaders.train_eval is not None):
            plot_run(self.log.rows, self.out, title=self.out.name)
        return metrics

    def _save(self, val: dict | None = None) -> Path | None:
        """Write the checkpoint of the current step (every rank calls it), then prune old ones; none while the
        losses are non-finite (the weights may have diverged: the last checkpoint stays the one from before)."""
        s, t = self.state, self.cfg.trainer
        if s.nonfinite_in_row:
            self.say(f"no checkpoint at step {s.step}: the last {s.nonfinite_in_row} losses were non-finite")
            return None
        self.watchdog.beat(f"writing checkpoint step_{s.step}")
        started = time.perf_counter()
        s.epoch, s.consumed = self.batches.epoch, self.batches.consumed
        saved = {**s.saved(), "world_size": self.proc.world, "batch_size": self.cfg.data.batch_size, "val": val,
                 "grad_accum": t.grad_accum, "stopped_by": self.stop.signal, "seed": self.cfg.seed}
        final = ckpt.save_training_state(self.out, saved, model=self.plain, optimizer=self.optimizer.optimizer,
                                         scheduler=self.scheduler, ema=self.ema, config=self.cfg, rank=self.proc.rank,
                                         is_main=self.proc.main, barrier=self.acc.wait_for_everyone)
        if self.proc.main:
            removed = ckpt.prune_checkpoints(self.out, t.keep_last)
            pruned = f"; removed {', '.join(p.name for p in removed)}" if removed else ""
            self.say(f"saved {final} ({time.perf_counter() - started:.1f} s{pruned})")
        return final
