"""``python -m mini_of3.bench block [CONFIG]``: one Pairformer block, per sub-layer and whole, per implementation.

For each N: forward and forward+backward time (median of CUDA-event timings after warm-up, the implementations
interleaved over rounds) and peak memory of each sub-layer of AF3 SI Alg 17 and of the whole block, under bf16
autocast, with the config's widths (default: the crop configs' c_s 384, c_z 128, 4 x 32 triangle heads), the last
N/10 tokens padding. Implementations (``--impls``):

- ``torch``: eager PyTorch (``tri_attn_backend=torch``, ``tri_mul_backend=torch``)
- ``torch_compile``: the same block under ``torch.compile``
- ``mini_of3``: our triangle attention, triangle multiplication and pair transition kernels
- ``cueq``: cuEquivariance's triangle attention and triangle multiplication
- ``mini_of3_compile``, ``cueq_compile``: the same under ``torch.compile``, as the trainer runs a block
  (``trainer.compile``): the kernels are opaque ops, the PyTorch around them is fused

Rows: ``impl``, ``layer`` (tri_mul_out, tri_mul_in, tri_attn_start, tri_attn_end, pair_transition, single_attention,
single_transition, block), ``N``, ``fwd_ms``, ``fwdbwd_ms``, ``peak_mib``. On a CPU the times are wall-clock (tests).
"""
from __future__ import annotations

import argparse
import traceback
from pathlib import Path

import torch

from mini_of3.bench.common import (elapsed_ms, load_bench_config, package_versions, peak_mib, print_table,
                                   result_header, write_json)
from mini_of3.model.kernel_choice import KernelChoice
from mini_of3.model.pairformer import PairformerBlock

# impl: (tri_attn_backend, tri_mul_backend, compiled, pair_transition_backend)
IMPLS = {"torch": ("torch", "torch", False, "torch"), "torch_compile": ("torch", "torch", True, "torch"),
         "mini_of3": ("mini_of3", "mini_of3", False, "mini_of3"), "cueq": ("cueq", "cueq", False, "torch"),
         "mini_of3_compile": ("mini_of3", "mini_of3", True, "mini_of3"),
         "cueq_compile": ("cueq", "cueq", True, "torch")}
LAYERS = ("tri_mul_out", "tri_mul_in", "tri_attn_start", "tri_attn_end", "pair_transition", "single_attention",
          "single_transition", "block")
DEFAULT_CONFIG = "configs/crop384.yaml"


def build_block(cfg, impl: str, device: torch.device) -> PairformerBlock:
    """The config's Pairformer block with the implementation's backends (same weights for every impl: seeded)."""
    attn, mul, _, transition = IMPLS[impl]
    m = cfg.model
    torch.manual_seed(cfg.seed)
    block = PairformerBlock(c_s=m.c_s, c_z=m.c_z, n_heads_tri=m.n_heads_tri, c_hidden_tri=m.c_hidden_tri,
                            n_heads_single=m.n_heads_single, c_hidden_mul=m.c_hidden_mul,
                            transition_factor=m.transition_factor, pair_dropout=0.0,
                            kernels=KernelChoice(tri_attn_backend=attn, tri_mul_backend=mul,
                                                 tri_attn_activation=m.tri_attn_activation,
                                                 pair_transition_backend=transition)).to(device)
    for p in block.parameters():          # no zero-initialised layer: every sub-layer does its full work
        if not p.any():
            torch.nn.init.normal_(p, std=p.shape[-1] ** -0.5)
    block.tri_mul_backend = mul
    return block


def layer_calls(block: PairformerBlock, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor, compiled: bool):
    """{layer: fn() -> output} for every sub-layer and the whole block, on fixed inputs."""
    pair = mask[:, :, None] & mask[:, None, :]
    calls = {
        "tri_mul_out": lambda: block.tri_mul_out(z, pair),
        "tri_mul_in": lambda: block.tri_mul_in(z, pair),
        "tri_attn_start": lambda: block.tri_attn_start(z, pair),
        "tri_attn_end": lambda: block.tri_attn_end(z, pair),
        "pair_transition": lambda: block.pair_transition(z),
        "single_attention": lambda: block.single_attention(s[:, None], z, mask),
        "single_transition": lambda: block.single_transition(s),
        "block": lambda: block(s, z, mask),
    }
    if compiled:
        calls = {name: torch.compile(fn) for name, fn in calls.items()}
    return calls


def _sum_outputs(out) -> torch.Tensor:
    outs = out if isinstance(out, tuple) else (out,)
    return sum(o.float().square().mean() for o in outs)


def time_layer(fn, inputs: list[torch.Tensor], device: torch.device, reps: int) -> tuple[float, float]:
    """Median forward and forward+backward milliseconds of one layer (after one warm-up each)."""
    def fwd():
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            fn()

    def fwdbwd():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = _sum_outputs(fn())
        torch.autograd.grad(loss, inputs, allow_unused=True)
    medians = []
    for work in (fwd, fwdbwd):
        work()
        times = sorted(elapsed_ms(work, device) for _ in range(reps))
        medians.append(times[len(times) // 2])
    return medians[0], medians[1]


def layer_peak_mib(fn, inputs, device: torch.device) -> float | None:
    """Peak memory (MiB) of one forward + backward of a layer (:func:`mini_of3.bench.common.peak_mib`)."""
    if device.type != "cuda":
        return None

    def fwdbwd():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = _sum_outputs(fn())
        torch.autograd.grad(loss, inputs, allow_unused=True)
    return peak_mib(fwdbwd)


def bench_n(cfg, impls: list[str], n: int, device: torch.device, reps: int, rounds: int) -> list[dict]:
    """Rows of one N: every (impl, layer), interleaved over rounds."""
    g = torch.Generator(device).manual_seed(0)
    s = torch.randn(1, n, cfg.model.c_s, device=device, generator=g).requires_grad_(True)
    z = torch.randn(1, n, n, cfg.model.c_z, device=device, generator=g).requires_grad_(True)
    mask = torch.ones(1, n, dtype=torch.bool, device=device)
    mask[:, n - max(1, n // 10):] = False
    params, rows = {}, {}
    for impl in impls:
        try:
            block = build_block(cfg, impl, device)
            calls = layer_calls(block, s, z, mask, IMPLS[impl][2])
            params[impl] = (block, calls)
        except Exception as err:     # an anchor missing here is reported, not fatal
            rows[(impl, "block")] = {"impl": impl, "layer": "block", "N": n, "error": f"{type(err).__name__}: {err}"}
    times: dict[tuple[str, str], list] = {}
    for r in range(rounds):
        order = list(params)[r % max(1, len(params)):] + list(params)[:r % max(1, len(params))]
        for impl in order:
            block, calls = params[impl]
            inputs = [s, z, *block.parameters()]
            for layer, fn in calls.items():
                try:
                    times.setdefault((impl, layer), []).append(time_layer(fn, inputs, device, reps))
                except Exception as err:
                    rows[(impl, layer)] = {"impl": impl, "layer": layer, "N": n,
                                           "error": f"{type(err).__name__}: {str(err)[:200]}"}
                    traceback.print_exc(limit=3)
    for (impl, layer), values in times.items():
        if (impl, layer) in rows:
            continue
        block, calls = params[impl]
        fwd, fwdbwd = sorted(v[0] for v in values), sorted(v[1] for v in values)
        rows[(impl, layer)] = {"impl": impl, "layer": layer, "N": n, "fwd_ms": fwd[len(fwd) // 2],
                               "fwdbwd_ms": fwdbwd[len(fwdbwd) // 2],
                               "peak_mib": layer_peak_mib(calls[layer], [s, z, *block.parameters()], device),
                               "tri_attn_backend": IMPLS[impl][0], "tri_mul_backend": block.tri_mul_backend,
                               "pair_transition_backend": IMPLS[impl][3], "compiled": IMPLS[impl][2]}
    return list(rows.values())


def plot(rows: list[dict], path: Path) -> None:
    """Forward+backward ms per sub-layer at the largest N (left) and of the whole block against N (right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    timed = [r for r in rows if "fwdbwd_ms" in r]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    if timed:
        largest = max(r["N"] for r in timed)
        impls = list(dict.fromkeys(r["impl"] for r in timed))
        width = 0.8 / len(impls)
        for k, impl in enumerate(impls):
            ms = [next((r["fwdbwd_ms"] for r in timed if r["impl"] == impl and r["layer"] == layer
                        and r["N"] == largest), 0.0) for layer in LAYERS[:-1]]
            left.bar([i + k * width for i in range(len(LAYERS) - 1)], ms, width, label=impl)
            pts = sorted((r["N"], r["fwdbwd_ms"]) for r in timed if r["impl"] == impl and r["layer"] == "block")
            if pts:
                right.plot(*zip(*pts), marker="o", label=impl)
        left.set_xticks([i + 0.4 - width / 2 for i in range(len(LAYERS) - 1)], LAYERS[:-1], rotation=30, ha="right")
        left.set_ylabel("ms, forward + backward")
        left.set_title(f"sub-layers of one Pairformer block, N = {largest}")
        left.legend(fontsize=8)
    right.set_xlabel("N (tokens)")
    right.set_ylabel("ms, forward + backward")
    right.set_title("whole block")
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mini_of3.bench block", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", nargs="?", default=DEFAULT_CONFIG, help="a config (its model widths)")
    parser.add_argument("--ns", default="256,384,512,640,768")
    parser.add_argument("--impls", default="torch,torch_compile,mini_of3,cueq")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="runs/bench", help="folder of the JSON and PNG (default: runs/bench)")
    parser.add_argument("--tag", default="")
    args, overrides = parser.parse_known_args(argv)
    impls = [i for i in args.impls.split(",") if i]
    unknown = [i for i in impls if i not in IMPLS]
    if unknown or not impls:
        raise SystemExit(f"--impls: {unknown or 'nothing'} not known; choose from {list(IMPLS)}")
    try:
        ns = [int(n) for n in args.ns.split(",") if n]
    except ValueError:
        raise SystemExit(f"--ns: expected comma-separated token counts, got {args.ns!r}") from None
    if not ns or min(ns) < 2 or args.reps < 1 or args.rounds < 1:
        raise SystemExit(f"--ns, --reps, --rounds: expected N >= 2 and counts >= 1, got {args.ns!r}, {args.reps}, "
                         f"{args.rounds}")
    args.config, cfg = load_bench_config(args.config, overrides, DEFAULT_CONFIG)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result = result_header("block", package_versions(["cuequivariance-torch"]))
    result["config"] = args.config
    out = Path(args.out)
    stem = f"block{('_' + args.tag) if args.tag else ''}"
    for n in ns:
        result["rows"].extend(bench_n(cfg, impls, n, device, args.reps, args.rounds))
        write_json(result, out / f"{stem}.json")
    plot(result["rows"], out / f"{stem}.png")
    print_table([r for r in result["rows"] if "fwd_ms" in r],
                [("impl", "impl", "s"), ("layer", "layer", "s"), ("N", "N", "d"), ("fwd_ms", "fwd ms", ".2f"),
                 ("fwdbwd_ms", "fwd+bwd ms", ".2f"), ("peak_mib", "peak MiB", ".0f")])
    for r in result["rows"]:
        if "error" in r:
            print(f"{r['impl']} {r['layer']} N={r['N']}: {r['error'][:200]}")
    print(f"\nwrote {out / (stem + '.json')} and {out / (stem + '.png')}")


if __name__ == "__main__":
    main()
