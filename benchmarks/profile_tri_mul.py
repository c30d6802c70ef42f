"""Where does the fused triangle multiplication's time go? Device time per kernel of one forward + backward
(torch.profiler), outgoing and incoming, at the issue-16 shape (B = 1, C = h = 128, bf16 autocast, float32 z, the
last N/10 tokens padding). A development tool for the GPU machine; its table goes into mini_of3/kernels/NOTES.md.

    python benchmarks/profile_tri_mul.py --ns 768 [--iters 10]
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from mini_of3.bench.trimul import grads, make_inputs, make_weights
from mini_of3.kernels import triangle_multiplication


def kernel_times(n: int, direction: str, iters: int) -> tuple[dict[str, tuple[float, int]], float]:
    """{kernel name: (ms per fwd+bwd, launches per fwd+bwd)} and the wall ms of one fwd+bwd."""
    device = torch.device("cuda")
    weights = make_weights(128, 128, device)
    z, mask, dout = make_inputs(n, 128, device, seed=0)

    def once():
        return grads(triangle_multiplication, z, mask, weights, dout, direction, device)

    for _ in range(3):
        once()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            once()
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        once()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) * 1e3 / iters
    times: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for event in prof.key_averages():
        if event.device_time_total > 0:
            times[event.key[:60]][0] += event.device_time_total / 1e3 / iters
            times[event.key[:60]][1] += event.count // iters
    return {k: (v[0], v[1]) for k, v in times.items()}, wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ns", default="768")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    for n in map(int, args.ns.split(",")):
        for direction in ("outgoing", "incoming"):
            times, wall = kernel_times(n, direction, args.iters)
            total = sum(ms for ms, _ in times.values())
            print(f"\nN = {n} {direction}: wall {wall:.3f} ms per fwd+bwd, device {total:.3f} ms")
            for name, (ms, count) in sorted(times.items(), key=lambda kv: -kv[1][0]):
                print(f"  {ms:7.3f} ms  x{count:<3d} {name}")


if __name__ == "__main__":
    main()
