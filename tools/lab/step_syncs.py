"""Every host-device synchronisation inside one training step, with the lines of mini_of3 that cause it (GPU only).

A synchronisation in the middle of a step drains the GPU's queue: the host work after it (launches of small kernels)
is then exposed instead of overlapping the GPU's backlog. This runs the bench step's training step (bench.step.Arm:
forward under bf16 autocast, losses, backward, AdamW) of one arm at one crop, eager, twice to warm up, then once
under ``torch.cuda.set_sync_debug_mode("warn")`` and counts the warnings by the innermost three mini_of3 frames.

    python tools/lab/step_syncs.py configs/crop384.yaml --data .device/data/cache --crop 384 --arm mini_of3+mini_of3
"""
from __future__ import annotations

import argparse
import collections
import copy
import traceback
import warnings
from dataclasses import replace
from pathlib import Path

import torch

from mini_of3.bench.common import load_bench_config
from mini_of3.bench.step import Arm, real_crop
from mini_of3.model import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default="configs/crop384.yaml")
    parser.add_argument("--data", required=True)
    parser.add_argument("--crop", type=int, default=384)
    parser.add_argument("--arm", default="mini_of3+mini_of3")
    args, overrides = parser.parse_known_args()
    _, cfg = load_bench_config(args.config, [*overrides, "trainer.compile=false"], args.config,
                               ("model.n_recycles=0",))
    device = torch.device("cuda")
    torch.manual_seed(cfg.seed)
    state = copy.deepcopy(build_model(replace(cfg.model, tri_attn_backend="torch", tri_mul_backend="torch"))
                          .state_dict())
    arm = Arm(args.arm, cfg, state, device)
    batch, entry = real_crop(Path(args.data), args.crop, device)
    for _ in range(2):
        arm.step(batch)
    torch.cuda.synchronize()

    counts: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1]
                  if "mini_of3" in f.filename and not f.filename.endswith("step_syncs.py")]
        counts[" < ".join(f"{Path(f.filename).name}:{f.lineno} {f.line}" for f in frames[-3:][::-1]) or
               f"{filename}:{lineno}"] += 1

    warnings.showwarning = record
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    arm.step(batch)                          # its last line, loss.item(), is the one synchronisation it must have
    torch.cuda.set_sync_debug_mode("default")
    print(f"{args.arm} at crop {args.crop} ({entry}): {sum(counts.values())} synchronising calls in one step")
    for where, n in counts.most_common():
        print(f"  x{n:4d}  {where}")


if __name__ == "__main__":
    main()
