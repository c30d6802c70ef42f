"""The Python host time of one triangle_attention call (or, ``--op tri_mul``, one triangle_multiplication call), on a
machine without a GPU: every Triton launch is replaced by a no-op that only counts it, so what is left is our wrapper
(checks, allocations, config choice, autograd) and the torch ops around the kernels, which run for real on the CPU
(use tiny tensors, ``--n 8``, for the triangle multiplication). The torch ops that would each launch a kernel on the
GPU are listed too (every aten op but views and allocations).
At N = 256 the attention's forward runs ~0.08 ms on the H200 and the bench measures ~0.27 ms: host time is most of it
there. Triton's own launcher (argument binding, ~40 arguments per kernel) comes on top and is not measured here.

    python tools/lab/host_overhead.py [--n 256] [--reps 200]
    python tools/lab/host_overhead.py --op tri_mul --n 8
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime.jit import JITFunction

import mini_of3.kernels  # noqa: F401  (registers the modules below)
from mini_of3.bench.trimul import make_inputs, make_weights

TA = sys.modules["mini_of3.kernels.triangle_attention"]
TM = sys.modules["mini_of3.kernels.triangle_multiplication"]
LAUNCH = sys.modules["mini_of3.kernels.triangle_attention_host"]
launches: list[str] = []
# aten ops that only make a view or an allocation: no kernel on the GPU
NO_KERNEL = {"view", "_unsafe_view", "empty", "slice", "select", "t", "transpose", "expand", "alias", "detach",
             "as_strided", "unsqueeze", "squeeze", "permute", "reshape", "split", "unbind", "_reshape_alias",
             "empty_strided", "lift_fresh", "new_empty", "set_"}


class _CountOnly:
    """A launch that only counts: stands for ``kernel[grid]`` and for the compiled kernel the launcher keeps."""

    def __init__(self, fn):
        self.name = fn.__name__

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, **kwargs):
        launches.append(self.name)
        return self


class _OpCounter(TorchDispatchMode):
    """The aten ops of a call that would launch a GPU kernel (every op but views and allocations)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NO_KERNEL:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def tri_attn_calls(args):
    """forward() and forward_backward() of one triangle_attention call on CPU tensors, at the fixed tiles."""
    TA._resolve_backend = lambda backend, q: "triton"                        # CPU tensors take the Triton path
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
    return forward, forward_backward


def tri_mul_calls(args):
    """forward() and forward_backward() of one outgoing triangle_multiplication under bf16 autocast (C = h = 128,
    float32 z and weights, as in the model), on CPU tensors."""
    TM._resolve_backend = lambda backend, z, hidden: "triton"
    cpu = torch.device("cpu")
    weights = {k: w.requires_grad_(True) for k, w in make_weights(128, 128, cpu).items()}
    z, mask, dout = make_inputs(args.n, 128, cpu, seed=0)
    leaves = [z.requires_grad_(True), *weights.values()]

    def call():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return TM.triangle_multiplication(z, mask, direction="outgoing", backend="triton", **weights)

    def forward():
        with torch.no_grad():
            call()

    def forward_backward():
        out = call()
        torch.autograd.grad(out, leaves, dout.to(out.dtype))
    return forward, forward_backward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", choices=("tri_attn", "tri_mul"), default="tri_attn")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    JITFunction.__getitem__ = lambda self, grid: _CountOnly(self.fn)      # no kernel runs
    for name, module in list(sys.modules.items()):                       # the GPU's paths, not the interpreter's
        if name.startswith("mini_of3.kernels") and hasattr(module, "interpreting"):
            module.interpreting = lambda: False
    torch.cuda.current_device = lambda: 0                                # the launcher's key asks for it
    forward, forward_backward = (tri_mul_calls if args.op == "tri_mul" else tri_attn_calls)(args)
    for name, call in (("fwd", forward), ("fwd+bwd", forward_backward)):
        for _ in range(5):
            call()
        launches.clear()
        start = time.perf_counter()
        for _ in range(args.reps):
            call()
        host_us = (time.perf_counter() - start) / args.reps * 1e6
        kernels = sorted(set(launches))
        n_launches = len(launches) // args.reps
        with _OpCounter() as counter:
            call()
        ops = ", ".join(f"{op} x{counter.ops.count(op)}" for op in sorted(set(counter.ops)))
        print(f"{name:8s} {host_us:6.0f} us host per call, {n_launches} Triton launches ({', '.join(kernels)}); "
              f"{len(counter.ops)} torch ops ({ops})")


if __name__ == "__main__":
    main()
