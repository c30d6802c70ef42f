"""Probe one implementation on the model's layouts in a process of its own (a kernel that faults poisons the CUDA
context of its process): one forward without autograd and one forward + backward at N, start and end node. Exit 0 and "ok", or 1 and the error.

    python tools/lab/probe_layouts.py IMPL [--n 768] [--d 32]
"""
import argparse
import sys

import torch

from mini_of3.bench.kernels import adapter_impl, leaf, make_model_inputs

parser = argparse.ArgumentParser()
parser.add_argument("impl")
parser.add_argument("--n", type=int, default=768)
parser.add_argument("--d", type=int, default=32)
args = parser.parse_args()
try:
    impl = adapter_impl(args.impl)
    for node in ("starting", "ending"):
        q, k, v, bias, mask, do = make_model_inputs(args.n, args.d, 4, 0, node)
        native = impl.native(q, k, v, bias, mask)
        with torch.no_grad():
            impl.call(*native)
        torch.cuda.synchronize()
        leaves = [leaf(t, True) for t in native[:4]]
        o = impl.call(*leaves, mask)
        torch.autograd.grad(o, leaves, do)
        torch.cuda.synchronize()
    print(f"probe {args.impl}: ok")
except Exception as err:
    print(f"probe {args.impl}: FAILED {type(err).__name__}: {str(err)[:200]}")
    sys.exit(1)
