"""``python -m mini_of3.bench trimul``: the triangle multiplication (AF3 SI Alg 12/13) alone, per implementation.

For each N and direction: forward and forward+backward time (median of CUDA-event timings after warm-up, three input
sets rotated; the implementations interleaved over ``--rounds`` rounds, the median round reported with the spread of
the rounds), peak memory of one forward+backward, and at the ``--check-ns`` sizes the norm-relative error of the
output, dz and every weight gradient against the float64 reference (``mini_of3.kernels.reference``) and whether five
repeats give identical bits (output and every gradient). Inputs: B = 1, C = h = 128 (``--c``, ``--hidden``), z
float32 as the model's residual stream, bf16 autocast, the last N/10 tokens padding (their pair mask False).

Implementations (``--impls``): ``torch`` (the eager ``triangle_multiplication_torch``), ``torch_compile`` (it under
``torch.compile``), ``cueq`` (cuEquivariance through the model's adapter, ``tri_mul_backend``), ``mini_of3`` (our
fused kernel). One that does not import or fails is reported with its error, not fatal.

Rows (``"bench": "tri_mul"``): ``impl``, ``layer`` (``tri_mul_out`` outgoing, ``tri_mul_in`` incoming, as the block
benchmark names them), ``direction``, ``N``, ``B``, ``C``, ``h``, ``dtype`` ("bf16": the autocast dtype),
``fwd_ms``, ``fwdbwd_ms`` and their ``*_spread_ms``, ``fwdbwd_stream_ms`` (forward+backward per call over
``STREAM_CALLS`` calls back to back, one synchronisation: as a training loop issues them, so that a call's host time
overlaps the previous call's kernels; ``fwdbwd_ms`` times each call alone, host and device in series),
``fwdbwd_graph_ms`` (forward+backward recorded once as a CUDA graph and replayed, median of the replays: the GPU time
alone, as the crop 256-512 configs train in ``reduce-overhead`` mode; null on a CPU, or with ``graph_error`` where an
implementation cannot be recorded), ``peak_mib``, and where checked ``err`` {out, dz, <weight name>: ...},
``bitwise``, ``bitwise_each``. On a CPU the times are wall-clock (tests) and ``peak_mib`` is null.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch

from mini_of3.bench.common import (elapsed_ms, graph_replay_ms, package_versions, peak_mib, print_table,
                                   result_header, time_in_rounds, write_json)
from mini_of3.kernels import triangle_multiplication, triangle_multiplication_reference
from mini_of3.model.kernel_choice import KernelChoice
from mini_of3.model.tri_mul_backends import tri_mul_backend, triangle_multiplication_torch

IMPLS = ("torch", "torch_compile", "cueq", "mini_of3")
STREAM_CALLS = 20
DIRECTIONS = {"outgoing": "tri_mul_out", "incoming": "tri_mul_in"}
WEIGHT_NAMES = ("norm_in_weight", "norm_in_bias", "p_in_weight", "g_in_weight", "norm_out_weight", "norm_out_bias",
                "p_out_weight", "g_out_weight")


def load_impl(name: str) -> Callable:
    """The function of one implementation (imports cueq now)."""
    if name == "torch":
        return triangle_multiplication_torch
    if name == "torch_compile":
        return torch.compile(triangle_multiplication_torch)
    if name == "cueq":
        return tri_mul_backend(KernelChoice(tri_mul_backend="cueq"))
    if name == "mini_of3":
        return lambda z, mask, **kw: triangle_multiplication(z, mask, backend="triton", **kw)
    raise ValueError(f"unknown implementation {name!r}")


def make_weights(C: int, h: int, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """The layer's eight weights, float32 leaves, non-trivial (LayerNorm affines away from 1 and 0)."""
    g = torch.Generator().manual_seed(seed)
    w = dict(norm_in_weight=1 + 0.2 * torch.randn(C, generator=g), norm_in_bias=0.2 * torch.randn(C, generator=g),
             p_in_weight=torch.randn(2 * h, C, generator=g) / C ** 0.5,
             g_in_weight=torch.randn(2 * h, C, generator=g) / C ** 0.5,
             norm_out_weight=1 + 0.2 * torch.randn(h, generator=g), norm_out_bias=0.2 * torch.randn(h, generator=g),
             p_out_weight=torch.randn(C, h, generator=g) / h ** 0.5,
             g_out_weight=torch.randn(C, C, generator=g) / C ** 0.5)
    return {k: v.to(device).requires_grad_(True) for k, v in w.items()}


def make_inputs(n: int, C: int, device: torch.device, seed: int, batch: int = 1):
    """z [B, N, N, C] float32 (a leaf), the pair mask of a crop whose last N/10 tokens are padding, dout bf16."""
    g = torch.Generator(device).manual_seed(seed)
    z = torch.randn(batch, n, n, C, device=device, generator=g).requires_grad_(True)
    token = torch.ones(batch, n, dtype=torch.bool, device=device)
    token[:, n - max(1, n // 10):] = False
    dout = torch.randn(batch, n, n, C, device=device, generator=g).to(torch.bfloat16)
    return z, token[:, :, None] & token[:, None, :], dout


def call(fn, z, mask, weights, direction, device):
    with torch.autocast(device.type, dtype=torch.bfloat16):
        return fn(z, mask, direction=direction, **weights)


def grads(fn, z, mask, weights, dout, direction, device) -> dict[str, torch.Tensor]:
    """Output, dz and every weight gradient of one forward + backward."""
    out = call(fn, z, mask, weights, direction, device)
    leaves = [z, *weights.values()]
    got = torch.autograd.grad(out, leaves, dout.to(out.dtype))
    return {"out": out.detach(), "dz": got[0], **dict(zip(weights, got[1:]))}


def reference_fp64(z, mask, weights, dout, direction) -> dict[str, torch.Tensor]:
    z64 = z.detach().double().requires_grad_(True)
    w64 = {k: v.detach().double().requires_grad_(True) for k, v in weights.items()}
    out = triangle_multiplication_reference(z64, mask, direction=direction, **w64)
    got = torch.autograd.grad(out, [z64, *w64.values()], dout.double())
    return {"out": out.detach(), "dz": got[0], **dict(zip(w64, got[1:]))}


def median_ms(fn: Callable[[int], object], device: torch.device, reps: int, warmup: int = 3, rotate: int = 3) -> float:
    """Median of ``reps`` timings of ``fn(r)`` (r cycling over the input sets), after ``warmup`` calls."""
    for r in range(warmup):
        fn(r % rotate)
    times = sorted(elapsed_ms(lambda r=r: fn(r % rotate), device) for r in range(reps))
    return times[len(times) // 2]


def bench_shape(impls: dict[str, Callable], n: int, direction: str, args, device: torch.device,
                check: bool) -> list[dict]:
    """Rows of one (N, direction): every implementation timed, interleaved over rounds; errors when ``check``."""
    weights = make_weights(args.c, args.hidden, device)
    sets = [make_inputs(n, args.c, device, seed, args.batch) for seed in range(3)]
    leaves = lambda r: [sets[r][0], *weights.values()]   # noqa: E731
    rows, work = {}, {}
    for name, fn in impls.items():
        rows[name] = {"impl": name, "layer": DIRECTIONS[direction], "direction": direction, "N": n, "B": args.batch,
                      "C": args.c, "h": args.hidden, "dtype": "bf16"}

        def fwd(r, fn=fn):
            with torch.no_grad():
                call(fn, sets[r][0], sets[r][1], weights, direction, device)

        def fwdbwd(r, fn=fn):
            out = call(fn, sets[r][0], sets[r][1], weights, direction, device)
            torch.autograd.grad(out, leaves(r), sets[r][2].to(out.dtype))

        def stream(r, fwdbwd=fwdbwd):
            for k in range(STREAM_CALLS):
                fwdbwd((r + k) % len(sets))
        work[name] = (fwd, fwdbwd, stream)
    time_in_rounds(list(rows.values()),
                   [{"fwd_ms": lambda r, fwd=fwd: median_ms(fwd, device, args.reps),
                     "fwdbwd_ms": lambda r, fwdbwd=fwdbwd: median_ms(fwdbwd, device, args.reps),
                     "fwdbwd_stream_ms": lambda r, stream=stream: elapsed_ms(lambda: stream(r), device) / STREAM_CALLS}
                    for fwd, fwdbwd, stream in work.values()],
                   args.rounds)
    reference = reference_fp64(*sets[0][:2], weights, sets[0][2], direction) if check else None
    for name, fn in impls.items():
        row = rows[name]
        if "error" in row:
            continue
        row["peak_mib"] = peak_mib(lambda: work[name][1](0)) if device.type == "cuda" else None
        row["fwdbwd_graph_ms"] = None
        if device.type == "cuda":
            try:
                row["fwdbwd_graph_ms"] = graph_replay_ms(lambda: work[name][1](0), reps=args.reps)
            except Exception as err:   # e.g. an implementation that synchronises with the host
                row["graph_error"] = f"{type(err).__name__}: {str(err)[:300]}"
        if check:
            first = grads(fn, *sets[0][:2], weights, sets[0][2], direction, device)
            row["err"] = {k: ((v.double() - reference[k]).norm() / reference[k].norm()).item()
                          for k, v in first.items()}
            same = {k: True for k in first}
            for _ in range(4):   # five runs in all
                again = grads(fn, *sets[0][:2], weights, sets[0][2], direction, device)
                same = {k: same[k] and torch.equal(first[k], again[k]) for k in first}
            row["bitwise_each"] = same
            row["bitwise"] = all(same.values())
    return list(rows.values())


def plot(rows: list[dict], path: Path) -> None:
    """Forward (dashed) and forward+backward (solid) ms against N, one panel per direction."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), squeeze=False)
    for ax, direction in zip(axes[0], DIRECTIONS):
        mine = [r for r in rows if r["direction"] == direction and "fwdbwd_ms" in r]
        for k, name in enumerate(dict.fromkeys(r["impl"] for r in mine)):
            color = f"C{k}"
            pts = sorted((r["N"], r["fwd_ms"], r["fwdbwd_ms"]) for r in mine if r["impl"] == name)
            ns, fwd, fwdbwd = zip(*pts)
            ax.plot(ns, fwdbwd, marker="o", color=color, label=f"{name} fwd+bwd",
                    lw=2.5 if name == "mini_of3" else 1.2)
            ax.plot(ns, fwd, marker=".", ls="--", color=color, label=f"{name} fwd")
        ax.set_yscale("log")
        ax.set_xlabel("N (tokens)")
        ax.set_ylabel("ms (median)")
        ax.set_title(f"triangle multiplication, {direction}: B=1, C=h=128, bf16 autocast", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise SystemExit(f"--{name}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 2:
        raise SystemExit(f"--{name}: expected sizes >= 2, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mini_of3.bench trimul", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ns", default="256,384,512,640,768")
    parser.add_argument("--directions", default="outgoing,incoming")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--check-ns", default="256", help="sizes at which errors and bitwise repeats are measured")
    parser.add_argument("--c", type=int, default=128, help="pair channels C")
    parser.add_argument("--hidden", type=int, default=128, help="hidden channels h")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="runs/bench", help="folder of the JSON and PNG (default: runs/bench)")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    ns = _int_list(args.ns, "ns")
    check_ns = set(_int_list(args.check_ns, "check-ns")) if args.check_ns else set()
    directions = [d for d in args.directions.split(",") if d]
    names = [i for i in args.impls.split(",") if i]
    if not directions or any(d not in DIRECTIONS for d in directions):
        raise SystemExit(f"--directions: expected some of {list(DIRECTIONS)}, got {args.directions!r}")
    if not names or any(i not in IMPLS for i in names):
        raise SystemExit(f"--impls: expected some of {list(IMPLS)}, got {args.impls!r}")
    if args.reps < 1 or args.rounds < 1:
        raise SystemExit(f"--reps, --rounds: expected counts >= 1, got {args.reps}, {args.rounds}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = result_header("tri_mul", package_versions(["cuequivariance-torch", "cuequivariance-ops-torch-cu12"]))
    impls, skipped = {}, {}
    for name in names:
        try:
            impls[name] = load_impl(name)
        except Exception as err:   # an anchor missing here is reported, not fatal
            skipped[name] = f"{type(err).__name__}: {str(err)[:200]}"
    result["skipped"] = skipped
    out = Path(args.out)
    stem = f"trimul{('_' + args.tag) if args.tag else ''}"
    for n in ns:
        for direction in directions:
            t0 = time.time()
            result["rows"].extend(bench_shape(impls, n, direction, args, device, n in check_ns))
            write_json(result, out / f"{stem}.json")
            print(f"N={n} {direction}: {time.time() - t0:.0f} s", flush=True)
        plot(result["rows"], out / f"{stem}.png")   # after every N, so that a run cut short keeps its figure
    for r in result["rows"]:
        if "err" in r:
            print(f"{r['impl']:>14} {r['layer']} N={r['N']} bitwise={r['bitwise']} err: "
                  + " ".join(f"{k}={v:.1e}" for k, v in r["err"].items()))
        if "error" in r:
            print(f"{r['impl']} {r['layer']} N={r['N']}: {r['error'][:200]}")
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    print_table([r for r in result["rows"] if "fwd_ms" in r],
                [("impl", "impl", "s"), ("layer", "layer", "s"), ("N", "N", "d"), ("fwd_ms", "fwd ms", ".3f"),
                 ("fwdbwd_ms", "fwd+bwd ms", ".3f"), ("fwdbwd_stream_ms", "back to back", ".3f"),
                 ("fwdbwd_graph_ms", "CUDA graph", ".3f"), ("peak_mib", "peak MiB", ".0f")])
    print(f"\nwrote {out / (stem + '.json')} and {out / (stem + '.png')}")


if __name__ == "__main__":
    main()
