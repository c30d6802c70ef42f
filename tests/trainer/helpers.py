"""Helpers of the trainer tests: a tiny config, a small prepared data set, and train.py in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMALL_ENTRIES = ("1CRN", "1L2Y", "2OFG", "4ZEY", "1A7G")    # 46, 20, 111, 84, 82 residues (shared set)
OFFLINE_ENTRIES = ("5PTI", "1BD2", "3PWP", "3KPR")         # the fallback when only the offline package is there

# The tiny model of tests/model/tiny.py, with pair dropout on (exact resume must replay the dropout masks) and two
# recycles (so the per-step recycle count varies).
TINY_MODEL = dict(n_blocks=1, c_s=32, c_z=16, n_heads_tri=2, c_hidden_tri=16, n_heads_single=2, c_hidden_mul=16,
                  transition_factor=2, pair_dropout=0.25, n_recycles=2, tri_attn_backend="torch",
                  checkpointing=False, diffusion_blocks=1, diffusion_heads=2, c_token=32, diffusion_samples=2,
                  plddt_rollout_steps=2, sampling_steps=3)


def tiny_overrides(prepared: Path, out_dir: Path, val_id: str, **extra) -> list[str]:
    """``key=value`` overrides of a 6-step run of the tiny model on ``prepared`` (checkpoints and validation every 3
    steps), with ``extra`` (``trainer__max_steps=4`` style keys) on top."""
    values = {"wandb": "false", "data.root": prepared, "data.cache_dir": prepared, "data.val_ids": f"[{val_id}]",
              "data.crop_size": 32, "data.num_workers": 0, "data.batch_size": 1, "optim.warmup_steps": 2,
              "optim.lr": "1e-3", "trainer.max_steps": 6, "trainer.checkpoint_every": 3, "trainer.val_every": 3,
              "trainer.keep_last": 2, "trainer.out_dir": out_dir, "trainer.val_samples": 2}
    values.update({f"model.{k}": v for k, v in TINY_MODEL.items()})
    values.update({k.replace("__", "."): v for k, v in extra.items()})
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()]


def run_train(args: list[str], *, fault: str | None = None, timeout: float = 300,
              launcher: list[str] | None = None) -> subprocess.CompletedProcess:
    """``python train.py ARGS`` (or ``LAUNCHER train.py ARGS``) in the repository root; with ``fault``, the process
    SIGKILLs itself at that point (MINI_OF3_FAULT, see mini_of3.training.checkpoint.fault_point)."""
    # one thread: on a shared 2-core machine, two OpenMP threads wait on each other whenever another job holds a core
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "OMP_NUM_THREADS": "1"}
    env.pop("MINI_OF3_FAULT", None)
    if fault is not None:
        env["MINI_OF3_FAULT"] = fault
    command = [*(launcher or [sys.executable]), "train.py", *map(str, args)]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def log_rows(run_dir: Path, split: str = "train") -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("split") == split]


def describe(done: subprocess.CompletedProcess) -> str:
    """The end of a finished process's output, for assertion messages."""
    return f"exit {done.returncode}\n--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-3000:]}"
