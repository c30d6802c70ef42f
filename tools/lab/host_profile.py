"""Where the host time of one triangle_multiplication forward+backward goes, on the GPU machine: cProfile over
back-to-back calls at a small N (the kernels take a few µs there, so the host is the whole call), the functions that
took longest by their own time. The bench's `fwdbwd_stream_ms` at N = 256 (2.4 ms for ours against 1.9 for
torch.compile's, H100, bad122f) is host time; this says which part.

    python tools/lab/host_profile.py [--n 64] [--calls 200] [--impl mini_of3|torch_compile]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats

import torch
from host_time_gpu import host_ms

from mini_of3.bench.trimul import load_impl, make_inputs, make_weights


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--impl", default="mini_of3")
    parser.add_argument("--top", type=int, default=22)
    args = parser.parse_args()
    device = torch.device("cuda")
    fn = load_impl(args.impl)
    weights = make_weights(128, 128, device)
    z, mask, dout = make_inputs(args.n, 128, device, seed=0)
    leaves = [z, *weights.values()]

    def fwdbwd():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = fn(z, mask, direction="outgoing", **weights)
        torch.autograd.grad(out, leaves, dout)
    for _ in range(10):
        fwdbwd()
    per_call = host_ms(lambda r: fwdbwd(), reps=args.calls)
    print(f"{args.impl} N={args.n}: {per_call:.3f} ms per fwd+bwd, back to back (median of 5 batches)")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.calls):
        fwdbwd()
    torch.cuda.synchronize()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(args.top)
    print("\n".join(line[:150] for line in text.getvalue().splitlines()[4:]))


if __name__ == "__main__":
    main()
