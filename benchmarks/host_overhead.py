"""The Python host time of one triangle_attention call, on a machine without a GPU: every Triton launch is replaced
by a no-op that only counts it, so what is left is our wrapper (checks, allocations, config choice, autograd).
At N = 256 the forward runs ~0.08 ms on the H200 and the bench measures ~0.27 ms: host time is most of it there.
Triton's own launcher (argument binding, ~40 arguments per kernel) comes on top and is not measured here.

    python benchmarks/host_overhead.py [--n 256] [--reps 200]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
from triton.runtime.jit import JITFunction

import mini_of3.kernels  # noqa: F401  (registers the modules below)

TA = sys.modules["mini_of3.kernels.triangle_attention"]
LAUNCH = sys.modules["mini_of3.kernels.launch"]
launches: list[str] = []


class _CountOnly:
    def __init__(self, fn):
        self.name = fn.__name__

    def __call__(self, *args, **kwargs):
        launches.append(self.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    JITFunction.__getitem__ = lambda self, grid: _CountOnly(self.fn)      # no kernel runs
    TA._resolve_backend = lambda backend, q: "triton"                        # CPU tensors take the Triton path
    LAUNCH.interpreting = lambda: False
    LAUNCH._autotune_enabled = lambda: False                                 # the fixed default configuration
    n, h, d = args.n, args.heads, args.d
    q, k, v = (torch.randn(1, n, n, h, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    bias = torch.randn(1, h, n, n, requires_grad=True)
    mask = torch.ones(1, n, n, dtype=torch.bool)
    mask[..., -n // 16:] = False
    do = torch.randn(1, n, n, h, d, dtype=torch.bfloat16)

    def forward():
        with torch.no_grad():
            TA.triangle_attention(q, k, v, bias, mask, backend="triton")

    def forward_backward():
        o = TA.triangle_attention(q, k, v, bias, mask, backend="triton")
        torch.autograd.grad(o, (q, k, v, bias), do)

    for name, call in (("fwd", forward), ("fwd+bwd", forward_backward)):
        for _ in range(5):
            call()
        launches.clear()
        start = time.perf_counter()
        for _ in range(args.reps):
            call()
        host_us = (time.perf_counter() - start) / args.reps * 1e6
        kernels = sorted(set(launches))
        print(f"{name:8s} {host_us:6.0f} us host per call, {len(launches) // args.reps} launches: {', '.join(kernels)}")


if __name__ == "__main__":
    main()
