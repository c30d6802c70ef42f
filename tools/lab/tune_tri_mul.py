"""Tile sweep of the fused triangle multiplication's four Triton kernels (issue 16), on the GPU.

For each N, each kernel's candidate tiles are timed with the other three kernels at their defaults: the projection
and output forward kernels through ``forward`` (ms per call), the two backward kernels through ``backward``. Every
candidate's output and gradients are compared with the default tiles' (norm-relative; tiles change only the order of
the LayerNorm affine partial sums, so anything above bf16 rounding is a bug) and checked for NaN. Then the best tiles
of each kernel together against the defaults: forward and forward + backward ms, and five repeats bitwise.

    python tools/lab/tune_tri_mul.py --ns 768,384 --out $OUT      (B = 1, C = h = 128, bf16, outgoing)

Writes ``tune_tri_mul.json`` (one row per N, kernel and candidate) and prints the best tiles per kernel last.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from pathlib import Path

import torch

from mini_of3.bench.common import median_ms, rel_err, result_header, write_json
from mini_of3.bench.trimul import make_inputs, make_weights

T = importlib.import_module("mini_of3.kernels.triangle_multiplication")   # the module (the package exports the function)
HOST = importlib.import_module("mini_of3.kernels.triangle_multiplication_host")   # its tiles and launchers

KERNELS = {   # kernel -> (the pass it runs in, candidate tiles: its TriMulTiles fields)
    "proj_fwd": ("fwd", [dict(proj_fwd_m=m, proj_fwd_hc=hc, proj_fwd_warps=w, proj_fwd_stages=s)
                         for m, hc, w, s in [(64, 32, 4, 3), (64, 64, 4, 3), (64, 64, 8, 3), (128, 32, 8, 3),
                                             (128, 64, 8, 3), (128, 32, 4, 3)]]),
    "out_fwd": ("fwd", [dict(out_fwd_p=p, out_fwd_warps=w, out_fwd_stages=s, out_fwd_per_sm=ps)
                        for p, w, s, ps in [(64, 4, 1, 0), (64, 8, 1, 0), (64, 8, 2, 2), (64, 8, 2, 1), (64, 8, 1, 2),
                                            (64, 8, 3, 1), (64, 4, 2, 2), (128, 8, 2, 1), (32, 4, 2, 4)]]),
    "out_bwd": ("bwd", [dict(out_bwd_p=p, out_bwd_warps=w, out_bwd_stages=s, out_bwd_per_sm=ps)
                        for p, w, s, ps in [(64, 8, 1, 0), (64, 8, 2, 1), (64, 8, 3, 1), (64, 8, 1, 1), (64, 8, 2, 2),
                                            (64, 4, 2, 2), (128, 8, 2, 1), (32, 4, 2, 2)]]),
    "proj_bwd": ("bwd", [dict(proj_bwd_m=m, proj_bwd_hc=hc, proj_bwd_warps=w, proj_bwd_stages=s)
                         for m, hc, w, s in [(128, 32, 8, 3), (64, 32, 4, 3), (64, 32, 8, 3), (64, 32, 8, 2),
                                             (128, 32, 8, 2), (128, 64, 8, 3), (64, 64, 8, 3), (64, 64, 4, 3)]]),
    "gates": ("bwd", [dict(fast_gates=False), dict(fast_gates=True)]),   # every kernel's; the forward's share in
                                                                          # the best-against-default comparison
}


def setup(n: int, device):
    """Three input sets and the fixed arguments of forward/backward (outgoing, bf16 compute, float32 z)."""
    w = make_weights(128, 128, device)
    weights = [w[k].detach() for k in T.WEIGHT_NAMES]              # in forward's and backward's argument order
    sets = [make_inputs(n, 128, device, seed) for seed in range(3)]
    return [(z.detach(), mask, dout) for z, mask, dout in sets], weights


def run_fwd(z, mask, weights):
    return T.forward(z, mask, *weights, True, 1e-5, torch.bfloat16, torch.bfloat16)


def run_bwd(dout, z, mask, weights, residuals):
    return T.backward(dout, z, mask, *weights, *residuals, True, 1e-5)


def outputs(z, mask, dout, weights) -> list[torch.Tensor]:
    out, *res = run_fwd(z, mask, weights)
    return [out, *run_bwd(dout, z, mask, weights, res)]


def time_pass(which: str, sets, weights) -> float:
    """ms of one forward or one backward (the backward's residuals made once per input set, outside the timing)."""
    if which == "fwd":
        return median_ms(lambda r: run_fwd(sets[r][0], sets[r][1], weights), warmup=3, reps=20, rotate=3)
    residuals = [run_fwd(z, mask, weights)[1:] for z, mask, _ in sets]
    return median_ms(lambda r: run_bwd(sets[r][2], sets[r][0], sets[r][1], weights, residuals[r]),
                     warmup=3, reps=20, rotate=3)


def sweep(n: int, device, kernels: list[str]) -> tuple[list[dict], dict]:
    sets, weights = setup(n, device)
    z, mask, dout = sets[0]
    reference = outputs(z, mask, dout, weights)
    rows, best = [], {}
    for kernel in kernels:
        which, candidates = KERNELS[kernel]
        for tiles in candidates:
            row = {"N": n, "kernel": kernel, "pass": which, "tiles": tiles}
            try:
                with HOST.tri_mul_tiles(**tiles):
                    got = outputs(z, mask, dout, weights)
                    row["max_err"] = max(rel_err(g, r) for g, r in zip(got, reference))
                    row["nan"] = any(bool(torch.isnan(g).any()) for g in got)
                    row["ms"] = time_pass(which, sets, weights)
            except Exception as error:              # a tile that does not compile (shared memory, registers)
                row["error"] = f"{type(error).__name__}: {str(error)[:200]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
            ok = "ms" in row and not row["nan"] and row["max_err"] < 2e-2
            if ok and (kernel not in best or row["ms"] < best[kernel]["ms"]):
                best[kernel] = row
    return rows, best


def compare(n: int, best: dict, device, before=None) -> dict:
    """The best tiles of every kernel together against the defaults: fwd and fwd+bwd ms, bitwise over 5 repeats;
    with ``before`` (an earlier commit's module, ``--before``) its defaults too, in the same process."""
    sets, weights = setup(n, device)
    tiles = {k: v for row in best.values() for k, v in row["tiles"].items()}

    def fwdbwd(r):
        z, mask, dout = sets[r]
        out, *res = run_fwd(z, mask, weights)
        run_bwd(dout, z, mask, weights, res)

    result = {"N": n, "best_tiles": tiles}

    def time_fwd_and_fwdbwd(name: str) -> None:
        result[f"{name}_fwd_ms"] = median_ms(lambda r: run_fwd(sets[r][0], sets[r][1], weights), warmup=3, reps=20,
                                             rotate=3)
        result[f"{name}_fwdbwd_ms"] = median_ms(fwdbwd, warmup=3, reps=20, rotate=3)

    z, mask, dout = sets[0]
    if before is not None:
        ours = outputs(z, mask, dout, weights)
        with _module(before):
            time_fwd_and_fwdbwd("before")
            result["before_bwd_ms"] = time_pass("bwd", sets, weights)
            result["before_max_err_to_ours"] = max(rel_err(a, b) for a, b in zip(outputs(z, mask, dout, weights),
                                                                                   ours))
        result["default_bwd_ms"] = time_pass("bwd", sets, weights)
    for name, ctx in (("default", {}), ("best", tiles)):
        with HOST.tri_mul_tiles(**ctx):
            time_fwd_and_fwdbwd(name)
            first = outputs(z, mask, dout, weights)
            result[f"{name}_bitwise"] = all(all(torch.equal(a, b) for a, b in zip(first, outputs(z, mask, dout,
                                                                                               weights)))
                                            for _ in range(4))
    return result


@contextlib.contextmanager
def _module(module):
    """``module`` (an earlier commit's) as the triangle multiplication module that run_fwd and run_bwd call."""
    global T
    saved, T = T, module
    try:
        yield
    finally:
        T = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ns", default="768,384")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--before", action="store_true",
                        help="also time the module of an earlier commit, written by `python "
                             "tools/lab/kernels_before_after.py --extract COMMIT` (carry .device)")
    parser.add_argument("--kernels", default=",".join(KERNELS), help="which candidate groups to sweep")
    args = parser.parse_args()
    device = torch.device("cuda")
    before = None
    if args.before:
        sys.path.insert(0, ".device/old")
        before = importlib.import_module("old_kernels.triangle_multiplication")
    result = result_header("tune_tri_mul", prog="python tools/lab/tune_tri_mul.py")
    result["summary"] = []
    for n in (int(x) for x in args.ns.split(",")):
        rows, best = sweep(n, device, args.kernels.split(","))
        result["rows"] += rows
        result["summary"].append(compare(n, best, device, before))
        write_json(result, Path(args.out) / "tune_tri_mul.json")
    for s in result["summary"]:
        if "before_fwdbwd_ms" in s:
            print(f"N={s['N']}: before fwd {s['before_fwd_ms']:.3f} bwd {s['before_bwd_ms']:.3f} fwd+bwd "
                  f"{s['before_fwdbwd_ms']:.3f}; ours bwd {s['default_bwd_ms']:.3f}; max rel diff "
                  f"{s['before_max_err_to_ours']:.1e}")
        print(f"N={s['N']}: default fwd {s['default_fwd_ms']:.3f} fwd+bwd {s['default_fwdbwd_ms']:.3f} "
              f"(bitwise {s['default_bitwise']}); best fwd {s['best_fwd_ms']:.3f} fwd+bwd {s['best_fwdbwd_ms']:.3f} "
              f"(bitwise {s['best_bitwise']}); tiles {s['best_tiles']}")
    for row in result["rows"]:
        if "error" in row:
            print("failed:", row["N"], row["kernel"], row["tiles"], row["error"][:100])


if __name__ == "__main__":
    main()
