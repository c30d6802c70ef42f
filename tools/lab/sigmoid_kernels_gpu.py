"""Where a sigmoid-attention call's time goes, on the GPU machine: per implementation and shape, the device time of
each kernel (torch.profiler) in a forward and in a forward+backward, their sum, the wall time of back-to-back calls
and the bench's synced time (CUDA events around one call). The gap between the kernels' sum and the synced time is
what the host and the glue (allocations, casts, index tables) add. Those of --direct run twice: launched as shipped
(through Gluon's JIT on every call) and by host.launch (the compiled kernel called directly after the first call of
a specialisation: "direct").

    python tools/lab/sigmoid_kernels_gpu.py [--shapes b1t16384d128,varlen16d128]
                                            [--impls mini_of3_tanh+hopper_fwd_min_keys=0,mini_of3_tanh+hopper=0]
"""
from __future__ import annotations

import argparse
import statistics

import torch

from mini_of3.bench.common import device_ms_by_kernel, elapsed_ms
from mini_of3.bench.sigmoid import Arm, base_row, bind, load_impl, make_packed, parse_shape
from mini_of3.kernels import host
from mini_of3.kernels import sigmoid_attention_hopper as hopper




def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="b1t16384d128,b4t4096d128,varlen16d128")
    parser.add_argument("--impls", default="mini_of3_tanh+hopper_fwd_min_keys=0,"
                                           "mini_of3_tanh+hopper_fwd_min_keys=0+hopper_bwd_fused=1,"
                                           "mini_of3_tanh+hopper_fwd_min_keys=0+hopper_bwd_fused=2,"
                                           "mini_of3_tanh+hopper=0")
    parser.add_argument("--direct", default="mini_of3_tanh+hopper_fwd_min_keys=0")
    parser.add_argument("--heads", type=int, default=16)
    args = parser.parse_args()
    device = torch.device("cuda")
    print(f"device {torch.cuda.get_device_name()}")
    for text in args.shapes.split(","):
        shape = parse_shape(text, args.heads, (500, 16000))
        inputs = make_packed(shape, device, 0)
        shipped = hopper.launch
        runs = [(name, launcher) for name in args.impls.split(",")
                for launcher in ((shipped, host.launch) if name in args.direct.split(",") else (shipped, ))]
        for name, launcher in runs:
            hopper.launch = launcher
            impl = load_impl(name, shape)
            arm = Arm(base_row(name, shape), impl, [bind(impl, inputs, shape)])
            name = name + (" direct" if launcher is host.launch else "")
            for kind in ("fwd", "fwdbwd"):
                call = getattr(arm, kind)
                kernels, wall = device_ms_by_kernel(call, iters=5, warmup=2)
                synced = statistics.median(elapsed_ms(lambda: call(0), device) for _ in range(5))
                total = sum(ms for ms, _ in kernels.values())
                print(f"\n{text} {name} {kind}: kernels {total:.3f} ms, back-to-back {wall:.3f}, synced {synced:.3f}")
                for key, (ms, count) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
                    print(f"    {ms:8.3f} ms  x{count:<3d} {key[:110]}")


if __name__ == "__main__":
    main()
