"""The triangle attention kernel of an earlier commit beside the current one, in one process (issue 15: a clean-up
must leave the numbers where they were).

    python tools/lab/kernels_before_after.py --extract eee1862     (here, with git: writes .device/old/old_kernels)
    python tools/lab/kernels_before_after.py --out DIR             (on the GPU; carry .device)

The old ``mini_of3/kernels`` is copied as the package ``old_kernels`` (its imports and its torch.library namespace
renamed), so both register their ops side by side. Per N and D: forward and forward+backward ms (CUDA events, median
of interleaved rounds, both autotuned first), peak MiB, and whether the outputs and gradients are bitwise equal, with
the fixed tiles of both (MINI_OF3_AUTOTUNE=0) and with each autotuned (equal when both pick the same tiles).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

OLD_ROOT = Path(".device/old")


def extract(commit: str) -> None:
    """Write the kernels of ``commit`` as the package ``old_kernels`` under OLD_ROOT."""
    dest = OLD_ROOT / "old_kernels"
    dest.mkdir(parents=True, exist_ok=True)
    names = subprocess.run(["git", "ls-tree", "--name-only", commit, "mini_of3/kernels/"], check=True,
                           capture_output=True, text=True).stdout.split()
    for name in (n for n in names if n.endswith(".py")):
        text = subprocess.run(["git", "show", f"{commit}:{name}"], check=True, capture_output=True, text=True).stdout
        text = text.replace("mini_of3.kernels", "old_kernels").replace('"mini_of3::', '"mini_of3_old::')
        (dest / Path(name).name).write_text(text)
    (OLD_ROOT / "COMMIT").write_text(commit + "\n")
    print(f"wrote {dest} from {commit}")


def inputs(n: int, d: int, heads: int = 4):
    import torch
    g = torch.Generator("cuda").manual_seed(0)
    q, k, v = (torch.randn(1, n, n, heads, d, device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(3))
    bias = torch.randn(1, heads, n, n, device="cuda", generator=g)
    mask = torch.rand(1, n, n, device="cuda", generator=g) > 0.1
    do = torch.randn(1, n, n, heads, d, device="cuda", generator=g, dtype=torch.bfloat16)
    return q, k, v, bias, mask, do


def run(fn, q, k, v, bias, mask, do, backward: bool):
    leaves = [t.detach().requires_grad_(backward) for t in (q, k, v, bias)]
    o = fn(*leaves, mask)
    if not backward:
        return [o]
    o.backward(do)
    return [o, *(t.grad for t in leaves)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--extract", metavar="COMMIT")
    parser.add_argument("--ns", default="768")
    parser.add_argument("--ds", default="32,16")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    if args.extract:
        extract(args.extract)
        return
    import torch
    sys.path.insert(0, str(OLD_ROOT))
    import old_kernels
    from mini_of3 import kernels
    from mini_of3.bench.common import elapsed_ms, peak_mib, result_header, write_json
    impls = {"before": old_kernels.triangle_attention, "after": kernels.triangle_attention}
    result = result_header("kernel", prog="python tools/lab/kernels_before_after.py")
    result["before_commit"] = (OLD_ROOT / "COMMIT").read_text().strip()
    for n in (int(x) for x in args.ns.split(",")):
        for d in (int(x) for x in args.ds.split(",")):
            data = inputs(n, d)
            bitwise = {}
            for tuned in ("0", "1"):      # the fixed tiles of both, then each autotuned (the timed configuration)
                os.environ["MINI_OF3_AUTOTUNE"] = tuned
                outs = {name: run(fn, *data, True) for name, fn in impls.items()}
                bitwise[tuned] = all(torch.equal(a, b) for a, b in zip(outs["before"], outs["after"]))
            times = {(name, bwd): [] for name in impls for bwd in (False, True)}
            for r in range(args.rounds):
                for name, fn in (list(impls.items()) if r % 2 == 0 else list(impls.items())[::-1]):
                    for bwd in (False, True):
                        times[name, bwd].append(elapsed_ms(lambda: run(fn, *data, bwd), data[0].device))
            for name, fn in impls.items():
                row = {"impl": f"mini_of3_{name}", "layout": "contiguous", "N": n, "D": d, "H": 4,
                       "fwd_ms": statistics.median(times[name, False]),
                       "fwdbwd_ms": statistics.median(times[name, True]),
                       "peak_mib": peak_mib(lambda: run(fn, *data, True)),
                       "bitwise_before_after_fixed": bitwise["0"], "bitwise_before_after_autotuned": bitwise["1"]}
                result["rows"].append(row)
                print(f"{name:6s} N {n} D {d}: fwd {row['fwd_ms']:.3f} ms, fwd+bwd {row['fwdbwd_ms']:.3f} ms, "
                      f"peak {row['peak_mib']:.1f} MiB, bitwise before = after: fixed tiles {bitwise['0']}, "
                      f"autotuned {bitwise['1']}", flush=True)
    out = Path(args.out)
    write_json(result, out / "kernels_before_after.json")
    print(json.dumps({"wrote": str(out / "kernels_before_after.json")}))


if __name__ == "__main__":
    main()
