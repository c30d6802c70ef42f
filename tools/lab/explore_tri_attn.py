"""Where does the triangle-attention time go? Per-kernel device time (torch.profiler) for launch-config and flag
variants of mini_of3's kernel at one shape, in one process. A development tool: `python tools/lab/explore_tri_attn.py`
on the GPU machine; its table is copied into docs/lab/kernels.md with the prediction made before the run.
"""
from __future__ import annotations

import argparse
import contextlib
from collections import defaultdict
from dataclasses import asdict, replace

import torch

from mini_of3.bench.common import device_ms_by_kernel
from mini_of3.kernels import gated_triangle_attention, triangle_attention
from mini_of3.kernels.triangle_attention_host import (TriAttnTiles, autotuned_configs, default_tiles,
                                                    tri_attn_tiles)

KERNELS = ("_fwd", "_bwd_dq", "_bwd_dbias", "_sum_chunks", "_bwd_dkdv")


def inputs(n, d, heads, *, bias="fp32", masked=True):
    """bf16 q, k, v, dO; the bias float32, bf16, or one element broadcast everywhere (what the bias stream costs)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(1, n, n, heads, d, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4))
    bias_leaf = torch.randn(1, 1, 1, 1, device="cuda") if bias == "broadcast" else \
        torch.randn(1, heads, n, n, device="cuda", generator=g).to(torch.bfloat16 if bias == "bf16" else torch.float32)
    leaves = [t.requires_grad_(True) for t in (q, k, v, bias_leaf)]
    mask = torch.ones(1, n, n, dtype=torch.bool, device="cuda")
    mask[..., n - n // 16:] = False
    return leaves, (mask if masked else None), do


def model_inputs(n, d, heads, *, transposed=False):
    """What the model passes (gated_triangle_attention): q, k, v, g as views of one bf16 projection [1, I, J, 4, H,
    D] (the ending node: a view of [1, J, I, 4, H, D]), a heads-first bf16 bias, 10 % of the keys masked."""
    g = torch.Generator(device="cuda").manual_seed(0)
    packed = torch.randn(1, n, n, 4, heads, d, device="cuda", generator=g).to(torch.bfloat16)
    qkvg = (packed.transpose(1, 2) if transposed else packed).requires_grad_(True)
    bias = torch.randn(1, heads, n, n, device="cuda", generator=g).to(torch.bfloat16).requires_grad_(True)
    mask = torch.rand(1, n, n, device="cuda", generator=g) > 0.1
    do = torch.randn(1, n, n, heads, d, device="cuda", generator=g).to(torch.bfloat16)
    return [qkvg, bias], mask, do


def fwd_bwd(leaves, mask, do, split_ds=False):
    if len(leaves) == 2:   # the model's gated call
        return torch.autograd.grad(gated_triangle_attention(*leaves, mask, split_ds=split_ds), leaves, do)
    q, k, v, bias_leaf = leaves
    bias = bias_leaf.expand(1, q.shape[3], q.shape[2], q.shape[2])
    return torch.autograd.grad(triangle_attention(q, k, v, bias, mask, split_ds=split_ds), leaves, do)


def kernel_times(config: TriAttnTiles | None, split_ds: bool, n, d, heads, iters=10, layout=None,
                 **kw) -> dict[str, float]:
    """Device ms per call by kernel with these fixed tiles (None: autotuned, as the model runs) on the separate
    inputs of ``inputs`` or, given a ``layout`` ("model", "model_t"), the model's."""
    leaves, mask, do = model_inputs(n, d, heads, transposed=layout == "model_t") if layout else \
        inputs(n, d, heads, **kw)
    with tri_attn_tiles(**asdict(config)) if config else contextlib.nullcontext():
        by_kernel, wall = device_ms_by_kernel(lambda r: fwd_bwd(leaves, mask, do, split_ds), iters=iters)
    times = defaultdict(float)
    for key, (ms, _count) in by_kernel.items():
        name = next((k for k in KERNELS if key.startswith(k)), None)
        times[name or "other"] += ms   # ms per call
    times["wall"] = wall
    return dict(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=768)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--ncu", action="store_true", help="two fwd+bwd calls of the default config, for ncu")
    parser.add_argument("--quick", action="store_true", help="only the first three variants")
    parser.add_argument("--only", default="", help="comma-separated variant names to run (default: all)")
    parser.add_argument("--autotuned", action="store_true",
                        help="the model's layouts as the model runs them: autotuned tiles, dS rounded; per-kernel "
                             "ms and the autotuner's choices")
    args = parser.parse_args()
    base = default_tiles(args.d)
    if args.autotuned:   # the warm-up calls of device_ms_by_kernel run the autotuner
        for layout in ("model", "model_t"):
            t = kernel_times(None, False, args.n, args.d, args.heads, layout=layout)
            print(f"{layout} autotuned", {k: round(v, 3) for k, v in t.items()}, flush=True)
        for name, chosen in autotuned_configs().items():
            print(name, chosen)
        return
    if args.ncu:
        leaves, mask, do = inputs(args.n, args.d, args.heads)
        with tri_attn_tiles():
            for _ in range(2):
                fwd_bwd(leaves, mask, do)
        torch.cuda.synchronize()
        return

    def tiles(**changes) -> TriAttnTiles:
        return replace(base, **changes)
    default = False        # split_ds
    variants = {   # name: (tiles, split_ds, inputs); the default: the fixed tiles of default_tiles
        "default": (base, default, {}),
        "bf16 bias": (base, default, {"bias": "bf16"}),
        "split dS on": (base, True, {}),
        "fwd 128x64 w8 s2": (tiles(fwd_block_j=128, fwd_warps=8), default, {}),
        "fwd 128x32 w4 s3": (tiles(fwd_block_j=128, fwd_block_k=32, fwd_stages=3), default, {}),
        "fwd 128x64 w4 s3": (tiles(fwd_block_j=128, fwd_stages=3), default, {}),
        "dq 128x32 w8 s3 rows 2": (tiles(dq_block_j=128, dq_warps=8), default, {}),
        "dbias 64x64 w8 s2": (tiles(dbias_warps=8, dbias_stages=2), default, {}),
        "dbias 128x64 w8 s2": (tiles(dbias_block_j=128, dbias_warps=8, dbias_stages=2), default, {}),
        "dbias 64x128 w8 s2": (tiles(dbias_block_k=128, dbias_warps=8, dbias_stages=2), default, {}),
        "dkdv q dO in place (v12)": (tiles(dkdv_prefetch=0), default, {}),
        "dkdv q dO ahead (v13)": (tiles(dkdv_prefetch=1), default, {}),
        "dkdv 32x64 prefetch q dO": (tiles(dkdv_block_j=32, dkdv_prefetch=1), default, {}),
        "dkdv 64x64 w4 s2": (tiles(dkdv_stages=2, dkdv_prefetch=0), default, {}),
        # the model's layouts (gated, packed projection, bf16 bias, dS rounded)
        "model": (base, False, {"layout": "model"}),
        "model dq rows 1": (tiles(dq_rows=1), False, {"layout": "model"}),
        "model dq 64x64 s2": (tiles(dq_block_k=64, dq_stages=2), False, {"layout": "model"}),
        "model dq 64x64 s2 rows 1": (tiles(dq_block_k=64, dq_stages=2, dq_rows=1), False, {"layout": "model"}),
        "model_t": (base, False, {"layout": "model_t"}),
        "model_t dq rows 1": (tiles(dq_rows=1), False, {"layout": "model_t"}),
    }
    if args.only:
        variants = {name: v for name, v in variants.items() if name in args.only.split(",")}
    rows = []
    for name, (config, split_ds, kw) in list(variants.items())[:3 if args.quick else None]:
        try:
            t = kernel_times(config, split_ds, args.n, args.d, args.heads, **kw)
        except Exception as err:
            print(f"{name}: {type(err).__name__}: {str(err)[:300]}", flush=True)
            continue
        rows.append((name, t))
        print(name, {k: round(v, 3) for k, v in t.items()}, flush=True)
    print(f"\nN={args.n} D={args.d} H={args.heads}: device ms per fwd+bwd call (torch.profiler)")
    cols = list(KERNELS) + ["other"]
    print(f"{'variant':38s}" + "".join(f"{c:>11s}" for c in cols) + f"{'device':>9s}{'wall':>9s}")
    for name, t in rows:
        device = sum(t.get(c, 0) for c in cols)
        print(f"{name:38s}" + "".join(f"{t.get(c, 0):11.3f}" for c in cols) + f"{device:9.3f}{t['wall']:9.3f}")


if __name__ == "__main__":
    main()
