"""Where does the fused triangle multiplication's time go? Device time per kernel of one forward + backward
(torch.profiler), outgoing and incoming, at the issue-16 shape (B = 1, C = h = 128, bf16 autocast, float32 z, the
last N/10 tokens padding). A development tool for the GPU machine; its table goes into docs/lab/kernels.md.

    python tools/lab/profile_tri_mul.py --ns 768 [--iters 10]
    ncu ... python tools/lab/profile_tri_mul.py --ncu     (two outgoing fwd+bwd calls at the first N, for ncu:
                                                            tools/lab/device_tri_mul.sh's ncu step)
"""
from __future__ import annotations

import argparse

import torch

from mini_of3.bench.common import device_ms_by_kernel
from mini_of3.bench.trimul import grads, make_inputs, make_weights
from mini_of3.kernels import triangle_multiplication


def kernel_times(n: int, direction: str, iters: int) -> tuple[dict[str, tuple[float, int]], float]:
    """{kernel name: (ms per fwd+bwd, launches per fwd+bwd)} and the wall ms of one fwd+bwd."""
    device = torch.device("cuda")
    weights = make_weights(128, 128, device)
    z, mask, dout = make_inputs(n, 128, device, seed=0)
    return device_ms_by_kernel(lambda r: grads(triangle_multiplication, z, mask, weights, dout, direction, device),
                               iters=iters)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ns", default="768")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--ncu", action="store_true", help="two fwd+bwd calls only (the first compiles)")
    args = parser.parse_args()
    if args.ncu:
        device = torch.device("cuda")
        n = int(args.ns.split(",")[0])
        weights = make_weights(128, 128, device)
        z, mask, dout = make_inputs(n, 128, device, seed=0)
        for _ in range(2):
            grads(triangle_multiplication, z, mask, weights, dout, "outgoing", device)
        torch.cuda.synchronize()
        return
    for n in map(int, args.ns.split(",")):
        for direction in ("outgoing", "incoming"):
            times, wall = kernel_times(n, direction, args.iters)
            total = sum(ms for ms, _ in times.values())
            print(f"\nN = {n} {direction}: wall {wall:.3f} ms per fwd+bwd, device {total:.3f} ms")
            for name, (ms, count) in sorted(times.items(), key=lambda kv: -kv[1][0]):
                print(f"  {ms:7.3f} ms  x{count:<3d} {name[:60]}")


if __name__ == "__main__":
    main()
