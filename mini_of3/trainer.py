"""The training loop behind ``accelerate launch train.py`` (DESIGN.md, Training).

One :class:`Trainer` per process. accelerate does the distribution (DDP, or FSDP2 with
``configs/accelerate/fsdp.yaml``), mixed precision and gradient accumulation. Each rank reads its own shard of the
data (``EpochSampler``), draws the same recycle count (a function of seed and step), and reduces its losses,
validation metrics and stop requests with the others; the main process alone prints, logs (log.jsonl, wandb,
plots) and writes the shared checkpoint files.

Exact resume: a checkpoint holds the weights, AdamW, the schedule, the EMA, every rank's RNG states, the step and
the data position (sampler epoch, examples this rank consumed in it). Every micro-batch also reseeds torch's global
generator (dropout) and draws its diffusion noise from a generator seeded by (seed, step, slot), where the slot is
the micro-batch's place in the step's global batch, not the rank that runs it (:meth:`Trainer._slot`). So a resumed
run repeats the uninterrupted one bitwise on the same number of processes; on another number it continues from the
same step and data position, and with batch_size 1 and the same global batch (processes x grad_accum) it repeats
the run to float rounding (gradients are summed in another order), not bitwise.
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
from .losses import SIGMA_BIN_NAMES, compute_losses, diffusion_loss_by_sigma, rollout_confidence_sums
from .model import build_model
from .model.compiled import compile_blocks, uncompile_blocks
from .training import checkpoint as ckpt
from .training.compile_clock import compile_seconds
from .training.ema import EMA
from .training.optim import build_optimizer, derived_seed, recycles_for_step
from .training.plots import plot_run
from .training.runlog import RunLog, Watchdog, json_safe
from .training.signals import Interrupted, StopRequest, is_worker_death
from .training.validation import means, validation_sums

PARTS = ("distogram", "diffusion", "smooth_lddt", "plddt")
# the modules whose gradient norms every log row holds (``grad_norm/<name>``), by the model's top-level children;
# the recycling projections are the trunk's input, so they count with the embedder
MODULES = {"embedder": ("embedder", "layer_norm_z_cycle", "linear_z_cycle", "layer_norm_s_cycle", "linear_s_cycle"),
           "pairformer": ("pairformer",), "distogram_head": ("distogram_head",), "diffusion": ("diffusion",),
           "plddt_head": ("plddt_head",)}


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
        # several processes and no GPU: gloo on the CPU (accelerate would otherwise run N unaware copies)
        cpu_group = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available()
        # the backend's own timeout (a bare gloo traceback, an NCCL abort) comes a minute after the watchdog's, so
        # that a stalled rank ends the run with the watchdog's message (Watchdog polls every <= timeout / 4)
        group_timeout = timedelta(seconds=t.stall_timeout_s + 60)
        self.acc = Accelerator(mixed_precision=t.mixed_precision, gradient_accumulation_steps=t.grad_accum,
                               cpu=cpu_group, step_scheduler_with_optimizer=False,
                               kwargs_handlers=[InitProcessGroupKwargs(timeout=group_timeout)])
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
        self.step, self.epoch, self.consumed = 0, 0, 0       # data position: sampler epoch, examples this rank used
        self.nonfinite_total, self.nonfinite_in_row = 0, 0
        self.train_s = 0.0                                   # seconds in training steps, compiling left out
        self.out_of_time = False                             # train_s reached trainer.max_minutes (_check_time)
        self.best: dict | None = None                        # {"step", "lddt_ca"} of the best validation
        self.first_val: dict | None = None
        self.last_val: dict | None = None
        self.wandb_id: str | None = None
        if self.resume_from is not None:
            self._load(self.resume_from)
        self.loaders.train_sampler.set_epoch(self.epoch, self.consumed)
        self._iterator = None
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
        """Compile the model's repeated blocks (:func:`mini_of3.model.compiled.compile_blocks`: one graph for all
        Pairformer blocks, one for the diffusion transformer's, one for a step of the diffusion sampler) and run one
        forward and backward on a real example;
        on any failure, warn and train with eager blocks. Later failures of single graphs fall back to eager
        (suppress_errors)."""
        import torch._dynamo
        torch._dynamo.config.suppress_errors = True
        data = self.cfg.data
        example = self._to_device(collate([self.loaders.train.dataset[(0, 0)]],
                                          n_tokens=data.crop_size if data.pad_to_crop else None))
        if self.cfg.trainer.compile_mode == "reduce-overhead" and not data.pad_to_crop:
            self.say("trainer.compile_mode=reduce-overhead records new CUDA graphs for every new crop length: "
                     "data.pad_to_crop=true gives every step the same shape")
        try:
            compile_blocks(self.plain, self.cfg.trainer.compile_mode)
            with torch.random.fork_rng(devices=[]):
                outputs = model(example, n_recycles=0, generator=self._generator(2, 0, 0))
                self.acc.backward(compute_losses(outputs, example, self.cfg.loss)[0])
            self.optimizer.zero_grad(set_to_none=True)
            self.say("trainer.compile: the Pairformer and diffusion blocks and the sampler step are compiled")
        except torch.OutOfMemoryError as err:             # not a compiler failure: eager would run out as well
            raise self._out_of_memory(err) from None
        except Exception as err:                             # noqa: BLE001 - any compiler failure means eager
            self.optimizer.zero_grad(set_to_none=True)
            uncompile_blocks(self.plain)
            torch._dynamo.reset()
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            warnings.warn(f"trainer.compile=true: torch.compile failed ({type(err).__name__}: {first}); "
                          f"training without compiling")
        return model

    def _out_of_memory(self, err: torch.OutOfMemoryError) -> TrainingError:
        """The error that ends a run that ran out of device memory, with the settings that decide the memory."""
        m, t = self.cfg.model, self.cfg.trainer
        if m.checkpointing:
            advice = "a smaller data.crop_size"
        else:
            advice = "model.checkpointing=true (blocks recomputed in the backward; with it trainer.compile_mode " \
                     "reduce-overhead compiles in the default mode), or a smaller data.crop_size"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return TrainingError(f"out of device memory at step {self.step + 1} (data.crop_size={self.cfg.data.crop_size}, "
                             f"model.checkpointing={str(m.checkpointing).lower()}, trainer.compile_mode="
                             f"{t.compile_mode if t.compile else 'off'}): try {advice}; checkpoints so far are in "
                             f"{self.out / 'checkpoints'} ({first[:200]})")

    def _load(self, folder: Path) -> None:
        """Restore the training state of a checkpoint, and the step and data position to continue from."""
        try:
            state = ckpt.load_training_state(folder, model=self.plain, optimizer=self.optimizer.optimizer,
                                             scheduler=self.scheduler, ema=self.ema, rank=self.rank)
        except ValueError as err:
            raise TrainingError(str(err)) from None
        self.step, self.epoch, self.consumed = state["step"], state["epoch"], state["consumed"]
        note = ""
        if state["world_size"] != self.world:                # the same global position, new shards: not bitwise
            self.consumed = self.consumed * state["world_size"] // self.world
            note = f"; saved by {state['world_size']} processes, now {self.world}: same step and data position"
        self.nonfinite_total, self.nonfinite_in_row = state["nonfinite_total"], state["nonfinite_in_row"]
        self.train_s = state.get("train_s", 0.0)
        self.best, self.wandb_id = state.get("best"), state.get("wandb_id")
        self.first_val, self.last_val = state.get("first_val"), state.get("last_val")
        self.say(f"resuming from {folder} (step {self.step}, epoch {self.epoch}, example {self.consumed}){note}")

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
                          resume_step=self.step if self.resume_from is not None else None)
        if self.cfg.wandb:
            self.wandb_id = self.log.start_wandb(self.cfg.wandb_project, config_to_dict(self.cfg), self.wandb_id)
        self._announce()
        bar = tqdm(total=t.max_steps if t.max_minutes is None else None, initial=self.step, disable=not self.main,
                   desc="train", unit="step", dynamic_ncols=True, mininterval=1.0)
        with self.stop:
            try:
                self.watchdog.start()
                self._loop(bar)
            except torch.OutOfMemoryError as err:
                raise self._out_of_memory(err) from None
            finally:
                bar.close()
                self.watchdog.stop()
                self.log.close()
                self._iterator = None
                self.loaders.close()                     # the workers ignore stop signals: end them here
        for death in self.stop.worker_deaths:
            self.say(f"during the stop: {death}")
        wall = time.perf_counter() - started
        if self.main:
            plot_run(self.log.rows, self.out, title=self.out.name)
        self._farewell(wall)
        return TrainResult(self.out, self.step, self.first_val, self.last_val, self.stop.signal, wall, self.train_s)

    def _loop(self, bar: tqdm) -> None:
        t = self.cfg.trainer
        if self.step == 0 and self.resume_from is None:
            self._validate()                                 # the untrained model, for comparison
        self._check_time()                                   # a resumed run may have spent its budget
        while self.step < t.max_steps and not self.out_of_time:
            if not self._step_or_stop():
                return
            self._check_time()
            bar.update(1)
            if self.main and self.step % t.log_every == 0:
                bar.set_postfix(loss=self.log.rows[-1]["loss"], lr=f"{self.log.rows[-1]['lr']:.2e}", refresh=False)
            if self.stop.signal is not None:
                self._save()
                return
            last = self.step == t.max_steps or self.out_of_time
            val = self._validate() if self.step % t.val_every == 0 or last else None
            improved = val is not None and self.best is not None and self.best["step"] == self.step
            if self.step % t.checkpoint_every == 0 or last or improved:
                self._save(val)

    def _check_time(self) -> None:
        """Set ``out_of_time`` once the training steps have taken ``trainer.max_minutes`` (validation, checkpoints
        and compiling do not count: ``train_s``). Every process measures its own steps, so with several the slowest
        decides (one all-reduce per step): all stop after the same step."""
        budget = self.cfg.trainer.max_minutes
        if budget is None:
            return
        spent = self.train_s
        if self.world > 1:
            spent_t = torch.tensor(spent, device=self.acc.device)
            torch.distributed.all_reduce(spent_t, op=torch.distributed.ReduceOp.MAX)
            spent = spent_t.item()
        self.out_of_time = spent >= budget * 60

    def _step_or_stop(self) -> bool:
        """One training step; False when a signal cut it short (the state from before it is then saved). A loader
        worker found dead while a stop is requested (the job's signal reached it too) cuts the step short the same
        way: it is raised while the step waits for a batch, before the weights change."""
        position = (self.epoch, self.consumed)
        try:
            self._train_step()
            return True
        except Interrupted:
            pass
        except RuntimeError as err:
            if self.stop.signal is None or not is_worker_death(err):
                raise
        self.epoch, self.consumed = position                 # the abandoned step's batch comes again on resume
        self.optimizer.zero_grad(set_to_none=True)
        self._save()
        return False

    def _slot(self, index: int) -> int:
        """The place, in the global batch, of this rank's micro-batch (or validation batch) ``index``.

        Rank r's i-th example is example ``i * world + r`` of the sampler's stream (``stream[r::world]``), so with
        batch_size 1 the slot is the example's position in the step's global batch (or its validation entry),
        whatever the process count: seeding by slot rather than by rank makes N processes x grad_accum g draw the
        same dropout masks and noise as 1 process x grad_accum N*g (tests/trainer/test_distributed.py)."""
        return index * self.world + self.rank

    def _generator(self, purpose: int, step: int, slot: int) -> torch.Generator:
        """The diffusion noise generator for ``purpose`` (0 training, 1 validation, 2 compile probe) at ``step`` and
        global ``slot`` (:meth:`_slot`): a function of these and the seed only."""
        seed = derived_seed(self.cfg.seed, purpose, step, slot)
        return torch.Generator(device=self.acc.device).manual_seed(seed)

    def _train_step(self) -> None:
        """Forward, backward (accumulated over ``grad_accum`` micro-batches), reduce, clip, update, log."""
        cfg, t = self.cfg, self.cfg.trainer
        started, compiled_before, step = time.perf_counter(), compile_seconds(), self.step
        self.watchdog.beat(f"training step {step + 1}")
        ckpt.fault_point("step", step + 1, self.rank)
        recycles = recycles_for_step(cfg.seed, step, cfg.model.n_recycles)
        self.model.train()
        sums, data_s, ids = torch.zeros(STEP_SUMS, dtype=torch.float64), 0.0, []
        with self.stop.abortable(self.world == 1):          # several ranks must stop together, at the boundary
            for micro in range(t.grad_accum):
                tick = time.perf_counter()
                batch = self._next_batch()
                data_s += time.perf_counter() - tick
                ids.append(batch["id"])
                slot = self._slot(micro)
                torch.manual_seed(derived_seed(cfg.seed, 3, step, slot))   # dropout: a function of (seed, step, slot)
                with self.acc.accumulate(self.model):
                    with self.acc.autocast():   # FSDP2 casts the parameters to bf16 but does not autocast the forward
                        outputs = self.model(batch, n_recycles=recycles, generator=self._generator(0, step, slot))
                    loss, parts = compute_losses(outputs, batch, cfg.loss)
                    self.acc.backward(loss)
                sums += step_sums(loss, parts, outputs, batch)
        losses, diagnostics = self._reduce_step_sums(sums)
        module_norms = self._module_grad_norms()             # before clipping
        clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        grad_norm = float(self.acc.clip_grad_norm_(self.model.parameters(), clip))
        finite = math.isfinite(losses[0]) and math.isfinite(grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        if finite:
            self.optimizer.step()
            self.ema.update()
            self.nonfinite_in_row = 0
        else:
            self.nonfinite_total += 1
            self.nonfinite_in_row += 1
        self.optimizer.zero_grad(set_to_none=True)
        with warnings.catch_warnings():                      # the schedule follows the step, skipped or not
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            self.scheduler.step()
        self.step += 1
        row = {"step": self.step, "split": "train", "loss": losses[0], **dict(zip(PARTS, losses[1:])), "lr": lr,
               "grad_norm": grad_norm, **module_norms, **diagnostics, "recycles": recycles, "epoch": self.epoch,
               "ids": self._global_ids(ids), "step_s": time.perf_counter() - started, "data_s": data_s,
               "skipped": not finite}
        row["compile_s"] = min(compile_seconds() - compiled_before, row["step_s"])
        self.train_s += row["step_s"] - row["compile_s"]                 # what trainer.max_minutes counts
        row["train_s"] = self.train_s
        if self.acc.device.type == "cuda":     # since the last validation, which resets it (see _validate)
            row["peak_mem_gib"] = torch.cuda.max_memory_allocated(self.acc.device) / 2 ** 30
        self.log.write(row, to_wandb=self.step % t.log_every == 0)
        if not finite:
            self.say(f"step {self.step}: non-finite loss {losses[0]} or gradient norm {grad_norm}; step skipped "
                     f"({self.nonfinite_in_row} in a row, trainer.max_nonfinite={t.max_nonfinite})")
            if self.nonfinite_in_row >= t.max_nonfinite:
                last = ckpt.list_checkpoints(self.out)
                raise TrainingError(
                    f"stopped at step {self.step}: {self.nonfinite_in_row} non-finite losses in a row "
                    f"(trainer.max_nonfinite={t.max_nonfinite}); last checkpoint: "
                    f"{last[-1].path if last else 'none'}; try a lower optim.lr or trainer.mixed_precision=no")

    def _global_ids(self, ids: list[list[str]]) -> list[str]:
        """The entry ids of the step's global batch in the sampler's stream order, from ``ids`` (this rank's, per
        micro-batch): micro-batch, then position in it, then rank (a collective when there are several ranks)."""
        per_rank = gather_object([ids]) if self.world > 1 else [ids]
        return [rank[micro][b] for micro in range(len(ids)) for b in range(len(ids[micro])) for rank in per_rank]

    def _reduce_step_sums(self, sums: torch.Tensor) -> tuple[list[float], dict[str, float]]:
        """Sum this rank's :func:`step_sums` (over its micro-batches) with the other ranks' (and their stop flags):
        the step's mean loss and parts, the diffusion loss per noise bin (:func:`sigma_bin_means`) and the pLDDT
        rollout's target and predicted lDDT (:func:`rollout_means`)."""
        flags = torch.tensor([float(self.stop.signal is not None)], dtype=torch.float64)
        reduced = self.acc.reduce(torch.cat([sums, flags]).to(self.acc.device), "sum").cpu()
        if reduced[-1] > 0:
            self.stop.request("a stop signal on another rank")
        losses = (reduced[: 1 + len(PARTS)] / (self.world * self.cfg.trainer.grad_accum)).tolist()
        sigma_end = 1 + len(PARTS) + 2 * len(SIGMA_BIN_NAMES)
        return losses, {**sigma_bin_means(reduced[1 + len(PARTS): sigma_end]), **rollout_means(reduced[sigma_end: -1])}

    def _module_grad_norms(self) -> dict[str, float]:
        """``{"grad_norm/<module>": norm}`` of the accumulated gradients of each of :data:`MODULES`, before
        clipping (one small collective under FSDP2, whose gradients are shards; unscaled under fp16)."""
        squares = torch.zeros(len(self.module_params), dtype=torch.float64, device=self.acc.device)
        for k, params in enumerate(self.module_params.values()):
            grads = [p.grad for p in params if p.grad is not None]
            grads = [g.to_local() if hasattr(g, "to_local") else g for g in grads]     # DTensor -> this shard
            if grads:
                squares[k] = torch.stack([torch.linalg.vector_norm(g.detach().float()) for g in grads]).double() \
                    .square().sum()
        if self.acc.is_fsdp2:
            squares = self.acc.reduce(squares, "sum")
        norms = squares.sqrt().cpu()
        scaler = getattr(self.acc, "scaler", None)
        if scaler is not None:                               # fp16: the gradients are still scaled here
            norms = norms / scaler.get_scale()
        return {f"grad_norm/{name}": float(v) for name, v in zip(self.module_params, norms)}

    def _next_batch(self) -> dict:
        """The next training batch of this rank, on its device; counts the examples consumed (the data position
        saved in checkpoints: the loader prefetches, so its own position is ahead of what was used)."""
        while True:
            if self._iterator is None:                   # creating one draws from torch's generator: keep it out
                with torch.random.fork_rng(devices=[]):
                    self._iterator = iter(self.loaders.train)
            try:
                batch = next(self._iterator)
                break
            except StopIteration:
                self.epoch, self.consumed, self._iterator = self.epoch + 1, 0, None
                self.loaders.train_sampler.set_epoch(self.epoch, 0)
        self.consumed += len(batch["id"])
        return self._to_device(batch)

    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.acc.device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}

    # ---- validation, checkpoints, reports -------------------------------------------------------------------------

    def _validate(self) -> dict | None:
        """Validate the EMA weights on this rank's validation entries, reduce across ranks, log, plot; returns the
        metrics (None when no entry validates). Every rank runs the same number of batches (padded shards). The
        entries of ``data.train_eval_ids`` are scored the same way after, logged as split ``train_eval``."""
        if self.loaders.val is None:
            if self.step == 0:
                self.say("no validation entries (data.val_ids / data.val_after): validation is skipped")
            metrics = None
        else:
            metrics = self._evaluate(self.loaders.val, self.loaders.val_real, "val")
            self.first_val = self.first_val or {"step": self.step, **metrics}
            self.last_val = {"step": self.step, **metrics}
            lddt = metrics["lddt_ca"]
            if lddt is not None and (self.best is None or lddt > self.best["lddt_ca"]):
                self.best = {"step": self.step, "lddt_ca": lddt}
        if self.loaders.train_eval is not None:
            self._evaluate(self.loaders.train_eval, self.loaders.train_eval_real, "train_eval")
        if self.main and (metrics is not None or self.loaders.train_eval is not None):
            plot_run(self.log.rows, self.out, title=self.out.name)
        return metrics

    def _evaluate(self, loader, real: int, split: str) -> dict:
        """Sample and score the EMA weights on one evaluation loader's entries (all ranks), log the reduced metrics
        and each entry's scores as a row of ``split``, print them; returns the metrics."""
        cfg, started = self.cfg, time.perf_counter()
        devices = [self.acc.device] if self.acc.device.type == "cuda" else []
        self.plain.eval()
        with self.ema.swapped(), torch.random.fork_rng(devices=devices):
            sums, entries = validation_sums(
                self.plain, (self._to_device(b) for b in loader), loss_cfg=cfg.loss,
                n_recycles=cfg.model.n_recycles, steps=cfg.trainer.val_sampling_steps or cfg.model.sampling_steps,
                samples=cfg.trainer.val_samples, generator_for=lambda i: self._generator(1, 0, self._slot(i)),
                autocast=self.acc.autocast, beat=self.watchdog.beat, real=real)
        self.plain.train()
        if self.acc.device.type == "cuda":    # training rows report the peak of training, not of validation's crops
            torch.cuda.reset_peak_memory_stats(self.acc.device)
        metrics = {k: json_safe(v) for k, v in means(self.acc.reduce(sums.to(self.acc.device), "sum").cpu()).items()}
        if self.world > 1:
            entries = gather_object(entries)
        entries = [{k: json_safe(v) for k, v in e.items()} for e in entries]
        self.log.write({"step": self.step, "split": split, **metrics, "val_s": time.perf_counter() - started,
                        "entries": entries})

        def show(key, fmt):
            return "nan" if metrics[key] is None else format(metrics[key], fmt)

        name = "validation" if split == "val" else "training entries"
        self.say(f"step {self.step} {name}: lDDT-Ca {show('lddt_ca', '.3f')}  TM {show('tm_score', '.3f')}  "
                 f"RMSD {show('rmsd', '.2f')} A  contacts {show('contact_precision', '.3f')}  "
                 f"distogram acc {show('distogram_accuracy', '.3f')}  pLDDT {show('mean_plddt', '.1f')}  "
                 f"loss {show('loss', '.3f')}  ({time.perf_counter() - started:.1f} s)")
        return metrics

    def _save(self, val: dict | None = None) -> Path:
        """Write the checkpoint of the current step (every rank calls it), then prune old ones."""
        self.watchdog.beat(f"writing checkpoint step_{self.step}")
        started = time.perf_counter()
        state = {"step": self.step, "epoch": self.epoch, "consumed": self.consumed, "world_size": self.world,
                 "batch_size": self.cfg.data.batch_size, "grad_accum": self.cfg.trainer.grad_accum,
                 "nonfinite_total": self.nonfinite_total, "nonfinite_in_row": self.nonfinite_in_row, "val": val,
                 "train_s": self.train_s, "best": self.best, "first_val": self.first_val, "last_val": self.last_val,
                 "wandb_id": self.wandb_id, "stopped_by": self.stop.signal, "seed": self.cfg.seed,
                 "saved_at": time.time()}
        final = ckpt.save_training_state(self.out, state, model=self.plain, optimizer=self.optimizer.optimizer,
                                         scheduler=self.scheduler, ema=self.ema, config=self.cfg, rank=self.rank,
                                         is_main=self.main, barrier=self.acc.wait_for_everyone)
        if self.main:
            removed = ckpt.prune_checkpoints(self.out, self.cfg.trainer.keep_last)
            pruned = f"; removed {', '.join(p.name for p in removed)}" if removed else ""
            self.say(f"saved {final} ({time.perf_counter() - started:.1f} s{pruned})")
        return final

    def _announce(self) -> None:
        train, val = self.loaders.train.dataset, self.loaders.val
        val_ids = ", ".join(r.id for r in val.dataset.rows) if val is not None else "none"
        params = sum(p.numel() for p in self.plain.parameters()) / 1e6
        minutes = self.cfg.trainer.max_minutes
        budget = "" if minutes is None else f" or {minutes:g} min of steps ({self.train_s / 60:.1f} done)"
        self.say(f"mini_of3: {len(train)} training entries, validation: {val_ids} | model {params:.2f} M parameters "
                 f"| {self.acc.device}, {self.world} process(es), precision {self.acc.mixed_precision} | steps "
                 f"{self.step} -> {self.cfg.trainer.max_steps}{budget} | {self.out}")
        for line in train.removal_report():
            self.say(line)

    def _farewell(self, wall: float) -> None:
        def lddt(v):
            return "n/a" if not v or v.get("lddt_ca") is None else f"{v['lddt_ca']:.3f} (step {v['step']})"

        stopped = f" (stopped by {self.stop.signal})" if self.stop.signal else \
            f" (trainer.max_minutes={self.cfg.trainer.max_minutes:g} reached)" if self.out_of_time else ""
        self.say(f"done{stopped}: step {self.step} in {wall / 60:.1f} min; validation lDDT-Ca {lddt(self.first_val)}"
                 f" -> {lddt(self.last_val)}; run folder {self.out}")


STEP_SUMS = 1 + len(PARTS) + 2 * len(SIGMA_BIN_NAMES) + 3     # what step_sums returns per micro-batch


def step_sums(loss: torch.Tensor, parts: dict[str, torch.Tensor], outputs: dict, batch: dict) -> torch.Tensor:
    """``[STEP_SUMS]`` float64 on the CPU, one micro-batch's: the loss, its PARTS, the diffusion loss sums and
    sample counts per noise bin (:func:`mini_of3.losses.diffusion_loss_by_sigma`), then the pLDDT rollout's target
    and predicted lDDT sums and structure count (:func:`mini_of3.losses.rollout_confidence_sums`)."""
    return torch.cat([torch.stack([loss.detach(), *(parts[p] for p in PARTS)]).double().cpu(),
                      *diffusion_loss_by_sigma(outputs, batch), rollout_confidence_sums(outputs, batch)])


def module_parameters(model: torch.nn.Module) -> dict[str, list[torch.nn.Parameter]]:
    """The parameters of each of :data:`MODULES` (a model without one of them gets an empty list)."""
    children = dict(model.named_children())
    return {name: [p for child in parts if child in children for p in children[child].parameters()]
            for name, parts in MODULES.items()}


def rollout_means(sums: torch.Tensor) -> dict[str, float]:
    """``{"rollout_lddt": target, "rollout_plddt": predicted}`` (0-1, means over structures) from the summed
    :func:`mini_of3.losses.rollout_confidence_sums`; NaN when no structure had a scored token."""
    target, predicted, count = sums.tolist()
    return {"rollout_lddt": target / count if count > 0 else float("nan"),
            "rollout_plddt": predicted / count if count > 0 else float("nan")}


def sigma_bin_means(sums_counts: torch.Tensor) -> dict[str, float]:
    """``{"diffusion/sigma<bin>": mean}`` from the summed (sums [4], counts [4]) of
    :func:`mini_of3.losses.diffusion_loss_by_sigma`; NaN (None in the log) for a bin that no sample fell in."""
    n = len(SIGMA_BIN_NAMES)
    sums, counts = sums_counts[:n], sums_counts[n:]
    return {f"diffusion/sigma{name}": float(s / c) if c > 0 else float("nan")
            for name, s, c in zip(SIGMA_BIN_NAMES, sums, counts)}
