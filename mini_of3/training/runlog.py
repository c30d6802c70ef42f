"""What a run reports: ``<out_dir>/log.jsonl`` (one JSON object per step, validation rows marked ``"split": "val"``),
wandb (offline unless a key is set; off with ``wandb=false``), and a watchdog that ends a stalled process with a
clear message. Only the main process writes; the others get a RunLog that does nothing.
"""
from __future__ import annotations

import faulthandler
import json
import math
import os
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

LOG_FILE = "log.jsonl"


def json_safe(value: Any) -> Any:
    """A JSON-safe value: floats that are not finite become None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_log(path: str | Path) -> list[dict]:
    """The rows of a log.jsonl (a torn last line, from a killed process, is skipped)."""
    rows = []
    path = Path(path)
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class RunLog:
    """log.jsonl and, when started, a wandb run. ``resume_step``: keep the rows up to that step (a resumed run
    rewrites what the killed one logged after its checkpoint); None: a fresh log."""

    def __init__(self, out_dir: str | Path, *, enabled: bool, resume_step: int | None) -> None:
        self.path = Path(out_dir) / LOG_FILE
        self.enabled = enabled
        self.rows: list[dict] = []
        self.wandb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            self.rows = [r for r in read_log(self.path) if r.get("step", 0) <= resume_step]
        tmp = self.path.with_name(LOG_FILE + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        os.replace(tmp, self.path)
        self._file = open(self.path, "a")

    def start_wandb(self, project: str, config: dict, run_id: str | None) -> str | None:
        """Start (or continue, by ``run_id``) a wandb run in ``<out_dir>/wandb``: online when WANDB_API_KEY is set
        (or WANDB_MODE says so), else offline. Returns the run id, or None when wandb is unavailable."""
        if not self.enabled:
            return None
        try:
            import wandb
        except ImportError:
            warnings.warn("wandb is not installed: logging to log.jsonl only (pip install wandb, or wandb=false)")
            return None
        mode = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        try:
            self.wandb = wandb.init(project=project, dir=str(self.path.parent), config=config, id=run_id,
                                    resume="allow", mode=mode, name=self.path.parent.name,
                                    settings=wandb.Settings(console="off"))
        except Exception as err:                 # a broken login or network must not stop training
            warnings.warn(f"wandb did not start ({type(err).__name__}: {err}); logging to log.jsonl only")
            return None
        return self.wandb.id

    def write(self, row: dict, to_wandb: bool = True) -> None:
        """Append one row (``step`` and ``split`` plus values) to log.jsonl, and to wandb as ``<split>/<key>``."""
        if not self.enabled:
            return
        row = {k: json_safe(v) for k, v in row.items()}
        self.rows.append(row)
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self.wandb is not None and to_wandb:
            split = row.get("split", "train")
            values = {f"{split}/{k}": v for k, v in row.items() if k not in ("step", "split") and v is not None
                      and isinstance(v, (int, float))}
            self.wandb.log(values, step=int(row["step"]))

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


class Watchdog:
    """Ends this process with a clear message when no :meth:`beat` came for ``timeout_s`` seconds: a rank that
    stalls (or waits forever in a collective for one that did) stops instead of hanging the job."""

    def __init__(self, timeout_s: float, rank: int, exit_fn: Callable[[int], Any] = os._exit,
                 poll_s: float | None = None) -> None:
        self.timeout_s, self.rank, self.exit_fn = timeout_s, rank, exit_fn
        self.poll_s = poll_s if poll_s is not None else min(10.0, timeout_s / 4)
        self.what = "starting"
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mini_of3-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def beat(self, what: str) -> None:
        self.what, self._last = what, time.monotonic()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            idle = time.monotonic() - self._last
            if idle > self.timeout_s:
                print(f"\nmini_of3: rank {self.rank} made no progress for {idle:.0f} s while {self.what} "
                      f"(trainer.stall_timeout_s={self.timeout_s:g}); a rank stalled or died, or a collective "
                      f"hangs. Stopping; resume with trainer.resume=auto. Stacks:", file=sys.stderr, flush=True)
                try:
                    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                except (AttributeError, ValueError, OSError):     # a stderr without a file descriptor
                    pass
                self.exit_fn(3)
                return
