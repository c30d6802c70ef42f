"""The fused SwiGLU transition (AF3 SI Alg 11) on the pair track beside eager PyTorch and torch.compile of it: device
ms of forward and forward+backward (CUDA events, median), peak MiB, norm-relative errors against float64 and a
bitwise repeat. A development tool for the GPU machine; its table goes into docs/lab/kernels.md.

    python tools/lab/explore_transition.py --ns 384,768 [--sweep 768]

``--sweep N``: the forward kernel's and the backward kernel's tile candidates at N (each with the other kernel at its
default), every candidate's output and gradients checked against the default tiles' (norm-relative).
"""
from __future__ import annotations

import argparse

import torch

from mini_of3.bench.common import median_ms
from mini_of3.kernels import transition, transition_reference
from mini_of3.kernels.transition_host import transition_tiles

# (rows, hidden chunk, warps, stages) of the forward, then of the backward kernel
FWD_CANDIDATES = [dict(fwd_m=m, fwd_hc=hc, fwd_warps=nw, fwd_stages=st) for m, hc, nw, st in
                  [(64, 64, 4, 2), (128, 64, 8, 2), (64, 128, 4, 2), (128, 32, 8, 3), (64, 32, 4, 3), (128, 64, 4, 2)]]
BWD_CANDIDATES = [dict(bwd_m=m, bwd_hc=hc, bwd_warps=nw, bwd_stages=st) for m, hc, nw, st in
                  [(64, 32, 8, 2), (64, 64, 8, 2), (128, 32, 8, 2), (32, 64, 4, 2), (64, 32, 4, 3), (128, 16, 8, 3)]]


def make(n: int, C: int = 128, factor: int = 4, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = dict(device="cuda")
    x = torch.randn(1, n, n, C, generator=g, **dev).requires_grad_(True)
    w = dict(norm_weight=1 + 0.2 * torch.randn(C, generator=g, **dev),
             norm_bias=0.2 * torch.randn(C, generator=g, **dev),
             a_weight=torch.randn(factor * C, C, generator=g, **dev) / C ** 0.5,
             b_weight=torch.randn(factor * C, C, generator=g, **dev) / C ** 0.5,
             out_weight=torch.randn(C, factor * C, generator=g, **dev) / (factor * C) ** 0.5)
    w = {k: v.requires_grad_(True) for k, v in w.items()}
    return x, w, torch.randn(1, n, n, C, generator=g, **dev)


def run(fn, x, w, dout, backward=True):
    """Output and (with ``backward``) the gradients of x and every weight; x and w are leaves that need grad."""
    with torch.autocast("cuda", dtype=torch.bfloat16), torch.set_grad_enabled(backward):
        out = fn(x, **w)
    if not backward:
        return {"out": out}
    grads = torch.autograd.grad(out, [x, *w.values()], dout.to(out.dtype))
    return {"out": out.detach(), "dx": grads[0], **dict(zip(w, grads[1:]))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ns", default="384,768")
    parser.add_argument("--sweep", type=int, default=0)
    args = parser.parse_args()
    impls = {"torch": transition_reference, "torch_compile": torch.compile(transition_reference),
             "mini_of3": lambda x, **w: transition(x, backend="triton", **w)}
    x, w, dout = make(64)
    ref = run(transition_reference, x.detach().double().requires_grad_(True),
              {k: v.detach().double().requires_grad_(True) for k, v in w.items()}, dout.double())
    for name, fn in impls.items():
        got = run(fn, x, w, dout)
        err = {k: f"{((v.double() - ref[k]).norm() / ref[k].norm()).item():.1e}" for k, v in got.items()}
        same = all(all(torch.equal(got[k], again[k]) for k in got) for again in (run(fn, x, w, dout) for _ in range(4)))
        print(f"N=64 {name:14s} bitwise over 5: {same}  err {err}")
    print(f"{'N':>5} {'impl':14s} {'fwd ms':>8} {'fwd+bwd ms':>10} {'peak MiB':>9}")
    for n in map(int, args.ns.split(",")):
        x, w, dout = make(n)
        for name, fn in impls.items():
            fwd = median_ms(lambda r: run(fn, x, w, dout, backward=False), warmup=3, reps=10)
            fb = median_ms(lambda r: run(fn, x, w, dout), warmup=3, reps=10)
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            run(fn, x, w, dout)
            peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
            print(f"{n:5d} {name:14s} {fwd:8.3f} {fb:10.3f} {peak:9.0f}")
    if args.sweep:
        sweep(args.sweep)


def sweep(n: int) -> None:
    x, w, dout = make(n)
    fn = lambda x, **w: transition(x, backend="triton", **w)   # noqa: E731
    base = run(fn, x, w, dout)
    print(f"tile sweep at N = {n} (ms; err: largest norm-relative difference from the default tiles)")
    for tiles in FWD_CANDIDATES + BWD_CANDIDATES:
        try:
            with transition_tiles(**tiles):
                got = run(fn, x, w, dout)
                err = max(((got[k].double() - base[k].double()).norm() / base[k].double().norm()).item() for k in base)
                fwd = median_ms(lambda r: run(fn, x, w, dout, backward=False), warmup=3, reps=10)
                fb = median_ms(lambda r: run(fn, x, w, dout), warmup=3, reps=10)
            print(f"  {tiles}  fwd {fwd:.3f}  fwd+bwd {fb:.3f}  err {err:.1e}")
        except Exception as exc:   # a candidate that does not compile (shared memory) is reported, not fatal
            print(f"  {tiles}  failed: {type(exc).__name__}: {str(exc)[:120]}")


if __name__ == "__main__":
    main()
