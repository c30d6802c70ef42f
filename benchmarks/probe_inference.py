"""Which inference forward faults: our kernel without autograd on the model's layouts, one case per process.

    python benchmarks/probe_inference.py LAYOUT BIAS [--n 768]     (LAYOUT: start | end | contiguous, BIAS: fp32 | bf16)
"""
import argparse
import sys

import torch

from mini_of3.bench.kernels import layout_inputs
from mini_of3.kernels import triangle_attention

parser = argparse.ArgumentParser()
parser.add_argument("layout")
parser.add_argument("bias")
parser.add_argument("--n", type=int, default=768)
args = parser.parse_args()
q, k, v, bias, mask, _ = layout_inputs(args.layout, args.n, 32, 4, 0)
bias = bias.float() if args.bias == "fp32" else bias.to(q.dtype)
try:
    with torch.no_grad():
        o = triangle_attention(q, k, v, bias, mask, backend="triton")
    torch.cuda.synchronize()
    print(f"inference {args.layout} {args.bias}: ok, |o| {o.float().norm().item():.3e}")
except Exception as err:
    print(f"inference {args.layout} {args.bias}: FAILED {type(err).__name__}: {str(err)[:120]}")
    sys.exit(1)
