"""What is alive at the peak of one training step, arm against arm, on the GPU machine: the device allocations live
at the moment each arm's step holds the most memory, grouped by the Python line that made them (torch.cuda.memory's
allocation history), and the difference between the first arm and each other one.

    python tools/lab/peak_step_gpu.py [CONFIG] [--crop 384] [--arms mini_of3+mini_of3,mini_of3+cueq] [key=value ...]

The peak is measured as `python -m mini_of3.bench step` measures it (peak_mib: allocated above what was allocated
before the step, the allocator's cache emptied first), after two warm-up steps per arm. Prints, per arm, the peak and
the largest live groups; then the groups whose live bytes differ between the arms.
"""
from __future__ import annotations

import argparse
import copy
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch

from peak_memory_gpu import allocations  # tools/lab/ is the script's folder

from mini_of3.bench.common import load_bench_config, peak_mib
from mini_of3.bench.step import DEFAULT_CONFIG, Arm, parse_arms, real_crop
from mini_of3.model import build_model


def live_at_peak(fn) -> tuple[int, dict[str, list[int]]]:
    """Run ``fn`` recording every allocation; return the peak of the bytes it holds above the start and, at that
    moment, the live allocations grouped by where they were made ({where: [sizes]})."""
    live: dict[int, tuple[int, str]] = {}
    held = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for action, size, where, addr in allocations(fn, max_entries=1_000_000):
        if action == "alloc":
            live[addr] = (size, where)
            held += size
            if held > peak:
                peak, at_peak = held, dict(live)
        elif addr in live:
            held -= live.pop(addr)[0]
    groups: dict[str, list[int]] = defaultdict(list)
    for size, where in at_peak.values():
        groups[where].append(size)
    return peak, groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG)
    parser.add_argument("--crop", type=int, default=384)
    parser.add_argument("--arms", default="mini_of3+mini_of3,mini_of3+cueq")
    parser.add_argument("--data", default=None)
    args, overrides = parser.parse_known_args()
    _, cfg = load_bench_config(args.config, overrides, DEFAULT_CONFIG, ("model.n_recycles=0",))
    device = torch.device("cuda")
    torch.manual_seed(cfg.seed)
    state = copy.deepcopy(build_model(replace(cfg.model, tri_attn_backend="torch", tri_mul_backend="torch"))
                          .state_dict())
    batch, entry = real_crop(Path(args.data or cfg.data.cache_dir), args.crop, device)
    results = {}
    for name in parse_arms(args.arms, cfg):
        arm = Arm(name, cfg, state, device)
        for _ in range(2):
            arm.step(batch)
        bench_peak = peak_mib(lambda: arm.step(batch))
        torch.cuda.empty_cache()
        peak, groups = live_at_peak(lambda: arm.step(batch))
        results[name] = groups
        print(f"\n{name} at crop {args.crop} ({entry}): bench peak {bench_peak:.3f} MiB; recorded peak "
              f"{peak / 2**20:.3f} MiB above the step's start, {sum(map(len, groups.values()))} live allocations")
        for where, sizes in sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:25]:
            print(f"  {sum(sizes) / 2**20:10.3f} MiB  x{len(sizes):<4d} {where}")
        arm.release()
        del arm
        torch.cuda.empty_cache()
    first, *others = results
    for other in others:
        print(f"\nlive at the peak, {first} minus {other} (MiB, groups that differ):")
        keys = set(results[first]) | set(results[other])
        diffs = sorted(((sum(results[first].get(k, [])) - sum(results[other].get(k, []))) / 2**20, k) for k in keys)
        for mib, where in [d for d in diffs if d[0] != 0]:
            print(f"  {mib:+10.3f}  {where}  ({len(results[first].get(where, []))} | "
                  f"{len(results[other].get(where, []))} allocations)")


if __name__ == "__main__":
    main()
