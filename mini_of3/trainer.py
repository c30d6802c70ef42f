"""The training loop behind ``accelerate launch train.py`` (docs/design.md, Training).

One :class:`Trainer` per process. accelerate does the distribution (DDP, or FSDP2 with
``configs/accelerate/fsdp.yaml``), mixed precision and gradient accumulation. Each rank reads its own shard of the
data (``EpochSampler``), draws the same recycle count, and reduces its losses, validation metrics and stop requests
with the others; the main process alone prints, logs (log.jsonl, wandb, plots) and writes the shared checkpoint files.

Exact resume: a checkpoint holds the weights, AdamW, the schedule, the EMA, every rank's RNG states, the step and the
data position (:class:`~mini_of3.training.run_state.RunState`). Every random choice is a named stream of (seed,
step, slot) (:mod:`mini_of3.training.streams`), where the slot is the micro-batch's place in the step's global
batch, not the rank that runs it. So a resumed run repeats the uninterrupted one bitwise on the same number of
processes; on another number it continues from the same step and data position, and with batch_size 1 and the same
global batch (processes x grad_accum) it repeats the run to float rounding (gradients are summed in another order).
"""
from __future__ import annotations

import math
import os
import sys
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
from .data import build_dataloaders, collate, prepare_data
from .losses import compute_losses
from .model import build_model
from .model.compiled import compile_blocks, uncompile_blocks
from .training import checkpoint as ckpt
from .training import reports
from .training.batches import BatchStream, to_device
from .training.compile_clock import compile_seconds
from .training.diagnostics import (MODULES, SUMS_SIZE, micro_batch_sums, module_grad_norms, module_parameters,
                                   step_report)
from .training.ema import EMA
from .training.optim import build_optimizer
from .training.plots import plot_run
from .training.run_state import RunState
from .training.runlog import RunLog, Watchdog, json_safe
from .training.signals import Interrupted, StopRequest, is_worker_death
from .training.streams import Stream, recycles_for_step, stream_generator, stream_seed
from .training.validation import means, validation_sums

__all__ = ["MODULES", "TrainResult", "Trainer", "TrainingError", "train"]


class TrainingError(RuntimeError):
    """A run that cannot start or go on; the message is one clear line (train.py prints it, exit status 1)."""


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
        self.acc = Accelerator(mixed_precision=t.mixed_precision, gradient_accumulation_steps=t.grad_accum,
                               cpu=cpu_group, step_scheduler_with_optimizer=False, kwargs_handlers=[
                                   InitProcessGroupKwargs(timeout=timedelta(seconds=t.stall_timeout_s + 60))])
        if self.acc.distributed_type == DistributedType.FSDP and not self.acc.is_fsdp2:
            raise TrainingError("FSDP needs fsdp_version: 2 in the accelerate config (configs/accelerate/fsdp.yaml)")
        self.rank, self.world, self.main = self.acc.process_index, self.acc.num_processes, self.acc.is_main_process
        self.out = Path(t.out_dir)
        self.watchdog = Watchdog(t.stall_timeout_s, self.rank)   # started by fit(); set-up waits use the group timeout
        self.resume_from = self._find_resume()
        set_seed(cfg.seed)                                   # the same initial weights on every rank
        self.model, self.optimizer, self.scheduler = self._build_model()    # first: a bad model.* fails fast
        self.loaders = self._build_data()
        self.plain = self.acc.unwrap_model(self.model, keep_torch_compile=False)
        if self.acc.is_fsdp2:                                # validation calls sample(), not forward(): FSDP2 must
            from torch.distributed.fsdp import register_fsdp_forward_method     # gather the shards for it as well
            register_fsdp_forward_method(self.plain, "sample")
        self.ema = EMA(self.plain, cfg.optim.ema_decay)
        self.module_params = module_parameters(self.plain)
        self.state = RunState()
        self.out_of_time = False                             # train_s reached trainer.max_minutes (_check_time)
        if self.resume_from is not None:
            self._load(self.resume_from)
        self.batches = BatchStream(self.loaders.train, self.loaders.train_sampler, self.acc.device)
        self.batches.seek(self.state.epoch, self.state.consumed)
        self.stop = StopRequest(announce=self.main)
        if t.compile:
            self.model = self._compile(self.model)

    # ---- set-up -----------------------------------------------------------------------------------------------

    def say(self, message: str) -> None:
        """A line on the main process's stdout (above the progress bar)."""
        if self.main:
            tqdm.write(message, file=sys.stdout)

    def _find_resume(self) -> Path | None:
        """The checkpoint to start from, per ``trainer.resume`` (auto | never | PATH)."""
        resume = self.cfg.trainer.resume
        if self.main:
            for path in ckpt.clean_partial(self.out):
                self.say(f"removed {path} (a run stopped while writing or deleting it)")
        found = ckpt.list_checkpoints(self.out)
        if resume == "never":
            if found:
                raise TrainingError(f"trainer.resume=never but {self.out} already holds checkpoints (latest "
                                    f"{found[-1].path.name}); choose another trainer.out_dir, or trainer.resume=auto")
            return None
        if resume == "auto":
            return found[-1].path if found else None
        try:
            return ckpt.resolve_checkpoint(resume, prefer="latest")
        except FileNotFoundError as err:
            raise TrainingError(f"trainer.resume={resume}: {err}") from None

    def _build_data(self):
        """Prepare data.root on the main process (the others wait), then this rank's loaders."""
        cfg = self.cfg
        result: list = [None, None]                          # [prepared folder, error message]
        if self.main:
            try:
                result[0] = str(prepare_data(cfg.data, progress=True))
            except (OSError, ValueError, RuntimeError) as err:
                result[1] = f"data.root={cfg.data.root}: {err}"
        if self.world > 1:
            broadcast_object_list(result)
        if result[1] is not None:
            raise TrainingError(result[1])
        try:
            return build_dataloaders(cfg.data, result[0], cfg.seed, rank=self.rank, world_size=self.world)
        except ValueError as err:
            raise TrainingError(str(err)) from None

    def _build_model(self):
        try:
            model = build_model(self.cfg.model)
        except ValueError as err:                            # a bad combination of model.* values
            raise ConfigError(str(err)) from None
        optimizer, scheduler = build_optimizer(model, self.cfg.optim)
        return self.acc.prepare(model, optimizer, scheduler)

    def _compile(self, model: torch.nn.Module) -> torch.nn.Module:
        """Compile the model's repeated blocks (:func:`mini_of3.model.compiled.compile_blocks`) and run one forward
        and backward on a real example; on any failure, warn and train with eager blocks (later failures of single
        graphs fall back to eager: suppress_errors)."""
        import torch._dynamo
        torch._dynamo.config.suppress_errors = True
        data = self.cfg.data
        example = to_device(collate([self.loaders.train.dataset[(0, 0)]],
                                    n_tokens=data.crop_size if data.pad_to_crop else None), self.acc.device)
        if self.cfg.trainer.compile_mode == "reduce-overhead" and not data.pad_to_crop:
            self.say("trainer.compile_mode=reduce-overhead records new CUDA graphs for every new crop length: "
                     "data.pad_to_crop=true gives every step the same shape")
        try:
            compile_blocks(self.plain, self.cfg.trainer.compile_mode)
            with torch.random.fork_rng(devices=[]):
                outputs = model(example, n_recycles=0, generator=self._generator(Stream.COMPILE_PROBE, 0, 0))
                self.acc.backward(compute_losses(outputs, example, self.cfg.loss)[0])
            self.optimizer.zero_grad(set_to_none=True)
            self.say("trainer.compile: the Pairformer and diffusion blocks and the sampler step are compiled")
        except torch.OutOfMemoryError as err:             # not a compiler failure: eager would run out as well
            raise TrainingError(reports.out_of_memory_message(self.cfg, self.state.step, self.out, err)) from None
        except Exception as err:                             # noqa: BLE001 - any compiler failure means eager
            self.optimizer.zero_grad(set_to_none=True)
            uncompile_blocks(self.plain)
            torch._dynamo.reset()
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            warnings.warn(f"trainer.compile=true: torch.compile failed ({type(err).__name__}: {first}); "
                          f"training without compiling")
        return model

    def _load(self, folder: Path) -> None:
        """Restore the training state of a checkpoint, and the step and data position to continue from."""
        try:
            saved = ckpt.load_training_state(folder, model=self.plain, optimizer=self.optimizer.optimizer,
                                             scheduler=self.scheduler, ema=self.ema, rank=self.rank)
        except ValueError as err:
            raise TrainingError(str(err)) from None
        self.state = RunState.restored(saved)
        note = ""
        if saved["world_size"] != self.world:                # the same global position, new shards: not bitwise
            self.state.consumed = self.state.consumed * saved["world_size"] // self.world
            note = f"; saved by {saved['world_size']} processes, now {self.world}: same step and data position"
        s = self.state
        self.say(f"resuming from {folder} (step {s.step}, epoch {s.epoch}, example {s.consumed}){note}")

    # ---- the loop -----------------------------------------------------------------------------------------------

    def fit(self) -> TrainResult:
        """Train to ``trainer.max_steps`` (or until the training steps have taken ``trainer.max_minutes``): validate
        at the start, every ``val_every`` steps and at the end; checkpoint every ``checkpoint_every`` steps, at a new
        best, at the end and on SIGINT/SIGTERM."""
        t, started = self.cfg.trainer, time.perf_counter()
        if self.main:
            self.out.mkdir(parents=True, exist_ok=True)
            save_config(self.cfg, self.out / "config.yaml")
        self.log = RunLog(self.out, enabled=self.main,
                          resume_step=self.state.step if self.resume_from is not None else None)
        if self.cfg.wandb:
            self.state.wandb_id = self.log.start_wandb(self.cfg.wandb_project, config_to_dict(self.cfg),
                                                       self.state.wandb_id)
        self._announce()
        bar = tqdm(total=t.max_steps if t.max_minutes is None else None, initial=self.state.step,
                   disable=not self.main, desc="train", unit="step", dynamic_ncols=True, mininterval=1.0)
        with self.stop:
            try:
                self.watchdog.start()
                self._loop(bar)
            except torch.OutOfMemoryError as err:
                raise TrainingError(reports.out_of_memory_message(self.cfg, self.state.step, self.out, err)) \
                    from None
            finally:
                bar.close()
                self.watchdog.stop()
                self.log.close()
                self.batches.close()
                self.loaders.close()                     # the workers ignore stop signals: end them here
        for death in self.stop.worker_deaths:
            self.say(f"during the stop: {death}")
        wall, s = time.perf_counter() - started, self.state
        if self.main:
            plot_run(self.log.rows, self.out, title=self.out.name)
        self.say(reports.end_line(s.step, wall, s.first_val, s.last_val, self.out, self.stop.signal,
                                  t.max_minutes if self.out_of_time else None))
        return TrainResult(self.out, s.step, s.first_val, s.last_val, self.stop.signal, wall, s.train_s)

    def _loop(self, bar: tqdm) -> None:
        t = self.cfg.trainer
        if self.state.step == 0 and self.resume_from is None:
            self._validate()                                 # the untrained model, for comparison
        self._check_time()                                   # a resumed run may have spent its budget
        while self.state.step < t.max_steps and not self.out_of_time:
            if not self._step_or_stop():
                return
            self._check_time()
            bar.update(1)
            step = self.state.step
            if self.main and step % t.log_every == 0:
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
        if budget is None:
            return
        spent = self.state.train_s
        if self.world > 1:
            spent_t = torch.tensor(spent, device=self.acc.device)
            torch.distributed.all_reduce(spent_t, op=torch.distributed.ReduceOp.MAX)
            spent = spent_t.item()
        self.out_of_time = spent >= budget * 60

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

    def _slot(self, index: int) -> int:
        """The place, in the global batch, of this rank's micro-batch (or validation batch) ``index``: rank r's i-th
        example is example ``i * world + r`` of the sampler's stream (tests/trainer/test_distributed.py)."""
        return index * self.world + self.rank

    def _generator(self, stream: Stream, step: int, slot: int) -> torch.Generator:
        return stream_generator(self.cfg.seed, stream, step, slot, self.acc.device)

    def _train_step(self) -> None:
        """Forward, backward (accumulated over ``grad_accum`` micro-batches), reduce, clip, update, log."""
        cfg, step, started, compiled_before = self.cfg, self.state.step, time.perf_counter(), compile_seconds()
        self.watchdog.beat(f"training step {step + 1}")
        ckpt.fault_point("step", step + 1, self.rank)
        recycles = recycles_for_step(cfg.seed, step, cfg.model.n_recycles)
        self.model.train()
        sums, data_s, ids = torch.zeros(SUMS_SIZE, dtype=torch.float64), 0.0, []
        with self.stop.abortable(self.world == 1):          # several ranks must stop together, at the boundary
            for micro in range(cfg.trainer.grad_accum):
                tick = time.perf_counter()
                batch = self.batches.next()
                data_s, slot = data_s + time.perf_counter() - tick, self._slot(micro)
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
        self._log_step({**losses, **grad_norms, **diagnostics, "recycles": recycles, "ids": self._global_ids(ids),
                        "step_s": time.perf_counter() - started, "data_s": data_s, "skipped": not finite},
                       compile_seconds() - compiled_before)

    def _reduce(self, sums: torch.Tensor) -> tuple[dict[str, float], dict[str, float]]:
        """The step's means (:func:`step_report`) over every rank's micro-batches; a stop flag rides along."""
        flags = torch.tensor([float(self.stop.signal is not None)], dtype=torch.float64)
        reduced = self.acc.reduce(torch.cat([sums, flags]).to(self.acc.device), "sum").cpu()
        if reduced[-1] > 0:
            self.stop.request("a stop signal on another rank")
        return step_report(reduced[:-1], self.world * self.cfg.trainer.grad_accum)

    def _update(self, loss: float) -> tuple[dict[str, float], bool]:
        """Clip and apply the accumulated gradients unless the loss or their norm is not finite (the step is then
        skipped and counted); the schedule follows the step either way. Returns the gradient norms and finiteness."""
        scaler = getattr(self.acc, "scaler", None)                  # fp16: the gradients are still scaled here
        norms = module_grad_norms(self.module_params, self.acc.device,
                                  (lambda x: self.acc.reduce(x, "sum")) if self.acc.is_fsdp2 else None,
                                  scaler.get_scale() if scaler is not None else 1.0)
        clip = self.cfg.optim.grad_clip if self.cfg.optim.grad_clip > 0 else float("inf")
        grad_norm = float(self.acc.clip_grad_norm_(self.model.parameters(), clip))
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        self.lr = self.scheduler.get_last_lr()[0]
        if finite:
            self.optimizer.step()
            self.ema.update()
            self.state.nonfinite_in_row = 0
        else:
            self.state.nonfinite_total += 1
            self.state.nonfinite_in_row += 1
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            self.scheduler.step()
        self.state.step += 1
        return {"grad_norm": grad_norm, **norms}, finite

    def _log_step(self, values: dict, compile_s: float) -> None:
        """Write the step's log row (time in steps counts towards trainer.max_minutes, compiling not); stop the run
        after ``trainer.max_nonfinite`` skipped steps in a row."""
        t, s = self.cfg.trainer, self.state
        values["compile_s"] = min(compile_s, values["step_s"])
        s.train_s += values["step_s"] - values["compile_s"]
        row = {"step": s.step, "split": "train", **values, "lr": self.lr, "epoch": self.batches.epoch,
               "train_s": s.train_s}
        if self.acc.device.type == "cuda":     # since the last validation, which resets it (see _evaluate)
            row["peak_mem_gib"] = torch.cuda.max_memory_allocated(self.acc.device) / 2 ** 30
        self.log.write(row, to_wandb=s.step % t.log_every == 0)
        if not row["skipped"]:
            return
        self.say(f"step {s.step}: non-finite loss {row['loss']} or gradient norm {row['grad_norm']}; step skipped "
                 f"({s.nonfinite_in_row} in a row, trainer.max_nonfinite={t.max_nonfinite})")
        if s.nonfinite_in_row >= t.max_nonfinite:
            last = ckpt.list_checkpoints(self.out)
            raise TrainingError(f"stopped at step {s.step}: {s.nonfinite_in_row} non-finite losses in a row "
                                f"(trainer.max_nonfinite={t.max_nonfinite}); last checkpoint: "
                                f"{last[-1].path if last else 'none'}; try a lower optim.lr or "
                                f"trainer.mixed_precision=no")

    def _global_ids(self, ids: list[list[str]]) -> list[str]:
        """The entry ids of the step's global batch in the sampler's stream order, from ``ids`` (this rank's, per
        micro-batch): micro-batch, then position in it, then rank (a collective when there are several ranks)."""
        per_rank = gather_object([ids]) if self.world > 1 else [ids]
        return [rank[micro][b] for micro in range(len(ids)) for b in range(len(ids[micro])) for rank in per_rank]

    # ---- validation, checkpoints, reports -------------------------------------------------------------------------

    def _validate(self) -> dict | None:
        """Validate the EMA weights on the validation entries (and score ``data.train_eval_ids`` the same way after,
        logged as split ``train_eval``), plot; returns the validation metrics (None without validation entries)."""
        metrics, s = None, self.state
        if self.loaders.val is None:
            if s.step == 0:
                self.say("no validation entries (data.val_ids / data.val_after): validation is skipped")
        else:
            metrics = self._evaluate(self.loaders.val, self.loaders.val_real, "val")
            s.first_val = s.first_val or {"step": s.step, **metrics}
            s.last_val = {"step": s.step, **metrics}
            if metrics["lddt_ca"] is not None and (s.best is None or metrics["lddt_ca"] > s.best["lddt_ca"]):
                s.best = {"step": s.step, "lddt_ca": metrics["lddt_ca"]}
        if self.loaders.train_eval is not None:
            self._evaluate(self.loaders.train_eval, self.loaders.train_eval_real, "train_eval")
        if self.main and (metrics is not None or self.loaders.train_eval is not None):
            plot_run(self.log.rows, self.out, title=self.out.name)
        return metrics

    def _evaluate(self, loader, real: int, split: str) -> dict:
        """Sample and score the EMA weights on one evaluation loader's entries (every rank runs the same number of
        batches: padded shards), log the reduced metrics and each entry's scores as a row of ``split``, print them."""
        cfg, started = self.cfg, time.perf_counter()
        devices = [self.acc.device] if self.acc.device.type == "cuda" else []
        self.plain.eval()
        with self.ema.swapped(), torch.random.fork_rng(devices=devices):
            sums, entries = validation_sums(
                self.plain, (to_device(b, self.acc.device) for b in loader), loss_cfg=cfg.loss,
                n_recycles=cfg.model.n_recycles, steps=cfg.trainer.val_sampling_steps or cfg.model.sampling_steps,
                samples=cfg.trainer.val_samples, beat=self.watchdog.beat, real=real, autocast=self.acc.autocast,
                generator_for=lambda i: self._generator(Stream.VALIDATION_NOISE, 0, self._slot(i)))
        self.plain.train()
        if self.acc.device.type == "cuda":    # training rows report the peak of training, not of validation's crops
            torch.cuda.reset_peak_memory_stats(self.acc.device)
        metrics = {k: json_safe(v) for k, v in means(self.acc.reduce(sums.to(self.acc.device), "sum").cpu()).items()}
        entries = gather_object(entries) if self.world > 1 else entries
        entries = [{k: json_safe(v) for k, v in e.items()} for e in entries]
        seconds = time.perf_counter() - started
        self.log.write({"step": self.state.step, "split": split, **metrics, "val_s": seconds, "entries": entries})
        self.say(reports.evaluation_line(self.state.step, split, metrics, seconds))
        return metrics

    def _save(self, val: dict | None = None) -> Path:
        """Write the checkpoint of the current step (every rank calls it), then prune old ones."""
        s = self.state
        self.watchdog.beat(f"writing checkpoint step_{s.step}")
        started = time.perf_counter()
        s.epoch, s.consumed = self.batches.epoch, self.batches.consumed
        saved = {**s.saved(), "world_size": self.world, "batch_size": self.cfg.data.batch_size, "val": val,
                 "grad_accum": self.cfg.trainer.grad_accum, "stopped_by": self.stop.signal, "seed": self.cfg.seed,
                 "saved_at": time.time()}
        final = ckpt.save_training_state(self.out, saved, model=self.plain, optimizer=self.optimizer.optimizer,
                                         scheduler=self.scheduler, ema=self.ema, config=self.cfg, rank=self.rank,
                                         is_main=self.main, barrier=self.acc.wait_for_everyone)
        if self.main:
            removed = ckpt.prune_checkpoints(self.out, self.cfg.trainer.keep_last)
            pruned = f"; removed {', '.join(p.name for p in removed)}" if removed else ""
            self.say(f"saved {final} ({time.perf_counter() - started:.1f} s{pruned})")
        return final

    def _announce(self) -> None:
        val = self.loaders.val
        self.say(reports.start_line(
            self.cfg, len(self.loaders.train.dataset), [r.id for r in val.dataset.rows] if val is not None else [],
            sum(p.numel() for p in self.plain.parameters()) / 1e6, str(self.acc.device), self.world,
            self.acc.mixed_precision, self.state.step, self.state.train_s, self.out))
        for line in self.loaders.train.dataset.removal_report():
            self.say(line)
