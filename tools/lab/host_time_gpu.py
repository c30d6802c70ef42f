"""Where a small call's time goes, on the GPU machine: for ours and trifast, at a tiny N (the kernels take a few µs,
so back-to-back calls measure the host) and at N = 256 (the bench's smallest shape):

    host     back-to-back calls at N = 16 with one synchronize at the end: the host time of one call
    device   the kernels' own time per call (torch.profiler's CUDA time) at N = 256
    synced   the bench's way: CUDA events around one call, synchronized after each (host and device in series)

At N = 256 the bench's forward medians (ours 0.27 ms, trifast 0.23) are several times the forward kernel's device
time (~0.07 ms): this separates what the host adds from what the kernels take.

    python tools/lab/host_time_gpu.py [--impls mini_of3,trifast] [--d 32]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from mini_of3.bench.anchors import load_impls_reported
from mini_of3.bench.common import device_ms_by_kernel, median_ms
from mini_of3.bench.kernels import prepare


def host_ms(fn, reps: int = 200) -> float:
    """Median over 5 batches of ``reps`` back-to-back calls (one synchronize per batch), per call."""
    batches = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for r in range(reps):
            fn(r % 3)
        torch.cuda.synchronize()
        batches.append((time.perf_counter() - start) * 1000 / reps)
    return statistics.median(batches)


def device_ms(fn, reps: int = 20) -> float:
    """CUDA time of the kernels per call (every device activity the profiler sees, summed)."""
    by_kernel, _wall = device_ms_by_kernel(lambda r: fn(r % 3), iters=reps, warmup=0)
    return sum(ms for ms, _count in by_kernel.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impls", default="mini_of3,trifast")
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    args = parser.parse_args()
    impls = load_impls_reported(args.impls)
    rows = []
    for impl in impls:
        tiny, small = prepare(impl, 16, args.d, args.heads), prepare(impl, 256, args.d, args.heads)
        for kind in ("fwd", "fwdbwd"):
            median_ms(getattr(tiny, kind), reps=5, rotate=3)       # warm-up, autotuning
            median_ms(getattr(small, kind), reps=5, rotate=3)
            rows.append((impl.name, kind, host_ms(getattr(tiny, kind)), device_ms(getattr(small, kind)),
                         median_ms(getattr(small, kind), reps=50, rotate=3)))
    print(f"\nD={args.d} H={args.heads}: ms per call")
    print(f"{'impl':14s}{'call':>8s}{'host N=16':>11s}{'device N=256':>14s}{'synced N=256':>14s}")
    for name, kind, host, device, synced in rows:
        print(f"{name:14s}{kind:>8s}{host:11.3f}{device:14.3f}{synced:14.3f}")


if __name__ == "__main__":
    main()
