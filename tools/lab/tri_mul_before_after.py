"""The triangle multiplication of an earlier commit beside the current one, in one process on the GPU: host time per
forward+backward (back-to-back calls at small N, where the host is the whole call), and per-pass device-bound times
at the given N with each version's default tiles, plus the largest norm-relative difference of their outputs and
gradients.

    python tools/lab/kernels_before_after.py --extract COMMIT     (here, with git: writes .device/old/old_kernels)
    python tools/lab/tri_mul_before_after.py [--ns 768,384] [--out DIR]   (on the GPU; carry .device)

Writes DIR/tri_mul_before_after.json: rows {"what": "host", N, before_ms, after_ms} and {"what": "passes", N,
before_/after_ fwd_ms, bwd_ms, fwdbwd_ms, max_rel_diff, after_bitwise}.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, ".device/old")
import tune_tri_mul as tune  # noqa: E402  (tools/lab/ is the script's folder)
from host_time_gpu import host_ms  # noqa: E402

from mini_of3.bench.common import result_header, write_json  # noqa: E402
from mini_of3.bench.trimul import make_inputs, make_weights  # noqa: E402


def host_per_call(module, n: int) -> float:
    weights = make_weights(128, 128, torch.device("cuda"))
    z, mask, dout = make_inputs(n, 128, torch.device("cuda"), seed=0)
    leaves = [z, *weights.values()]

    def fwdbwd(_):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = module.triangle_multiplication(z, mask, direction="outgoing", backend="triton", **weights)
        torch.autograd.grad(out, leaves, dout)
    for _ in range(10):
        fwdbwd(0)
    return host_ms(fwdbwd, reps=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ns", default="768,384")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    before = importlib.import_module("old_kernels.triangle_multiplication")
    after = importlib.import_module("mini_of3.kernels.triangle_multiplication")
    commit = open(".device/old/COMMIT").read().strip()
    result = result_header("tri_mul_before_after", prog="python tools/lab/tri_mul_before_after.py")
    result["before_commit"] = commit
    for n in (64, 256):
        times = {name: [] for name in ("before", "after")}
        for _ in range(3):      # interleaved
            for name, module in (("before", before), ("after", after)):
                times[name].append(host_per_call(module, n))
        result["rows"].append({"what": "host", "N": n, "before_ms": min(times["before"]),
                               "after_ms": min(times["after"])})
        print(f"host N={n}: before ({commit}) {min(times['before']):.3f} ms, after {min(times['after']):.3f} ms per "
              f"fwd+bwd back to back (best of 3 interleaved medians)", flush=True)
    for n in (int(x) for x in args.ns.split(",")):
        r = tune.compare(n, {}, torch.device("cuda"), before)
        result["rows"].append({"what": "passes", "N": n, "max_rel_diff": r["before_max_err_to_ours"],
                               "after_bitwise": r["default_bitwise"],
                               **{f"{who}_{p}_ms": r[f"{key}_{p}_ms"] for who, key in (("before", "before"),
                                                                                      ("after", "default"))
                                  for p in ("fwd", "bwd", "fwdbwd")}})
        print(f"N={n}: before fwd {r['before_fwd_ms']:.3f} bwd {r['before_bwd_ms']:.3f} fwd+bwd "
              f"{r['before_fwdbwd_ms']:.3f} | after fwd {r['default_fwd_ms']:.3f} bwd {r['default_bwd_ms']:.3f} "
              f"fwd+bwd {r['default_fwdbwd_ms']:.3f} ms | max rel diff {r['before_max_err_to_ours']:.1e}, after "
              f"bitwise over 5 repeats {r['default_bitwise']}", flush=True)
    write_json(result, Path(args.out) / "tri_mul_before_after.json")


if __name__ == "__main__":
    main()
