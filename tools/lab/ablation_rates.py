"""Steps per second of training runs that shared a device: per run folder, the mean step time after its first 5
steps (compiling, autotuning), and their sum. Used by tools/lab/ablation_mps_probe.sh.

    python tools/lab/ablation_rates.py NAME RUN_FOLDER [RUN_FOLDER ...]
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from mini_of3.ablation.cost import WARMUP
from mini_of3.training.runlog import read_log


def rate(run: Path) -> tuple[int, float]:
    """(steps logged, steps per second after the warm-up) of one run folder; (n, 0) when too few steps."""
    times = [r["step_s"] for r in read_log(run / "log.jsonl") if r.get("split") == "train"]
    timed = times[WARMUP:]
    return len(times), (1.0 / statistics.fmean(timed) if timed else 0.0)


def main(name: str, runs: list[str]) -> None:
    total = 0.0
    for run in map(Path, runs):
        if not (run / "log.jsonl").is_file():
            print(f"{name:7s} {run.name}: no log")
            continue
        steps, per_s = rate(run)
        total += per_s
        print(f"{name:7s} {run.name}: {steps:5d} steps, {per_s:6.2f} steps/s")
    print(f"{name:7s} all: {total:6.2f} steps/s")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
