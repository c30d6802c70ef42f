"""``python -m mini_of3.bench kernels``: triangle attention, mini_of3 against every anchor, side by side, one process.

For each N and D: forward and forward+backward time (median of CUDA-event timings after warm-up and autotuning,
three input sets rotated; the implementations interleaved over ``--rounds`` rounds, the median round reported with
the spread of the rounds), TFLOP/s (forward 4*B*I*H*J*K*D, forward+backward 3.5x), peak memory, relative error of
the output and the four gradients against a float64 reference (computed in chunks of rows), and whether five
repeats are bitwise identical.

``--layouts`` picks the inputs' layout:
- ``contiguous``: B = 1, H = 4, bf16 q/k/v, float32 bias (cast to bf16 for the anchors that take only the input
  dtype), the last N/16 keys masked out; each anchor gets its own contiguous layout, made outside the timed region.
- ``start``, ``end``: exactly what the model's ``TriangleAttention`` (starting / ending node, c_z = 128, under bf16
  autocast) hands its backend: q, k, v views of one projection, the bias from autocast (bf16), the pair mask of a
  crop whose last N/16 tokens are padding. Every implementation is called through the model's own adapter
  (``mini_of3.model.tri_attn_backends``), so any layout conversion an anchor needs is timed, as in a training step.
  ``mini_of3`` gets the bias cast to float32 beforehand, ``mini_of3_bf16bias`` the bf16 bias as it comes.

``--padded 300:768`` (issue 42) measures what a padded entry costs instead: ``mini_of3`` in the model's layout (start
unless ``--layouts`` names end) on a 300-token entry padded to N = 768 with ``mask_queries=True`` (as the model
calls it), the same with ``mask_queries=False`` (every padded query computed), and an entry of 320 tokens without
padding (the real count rounded up to 64, or ``300:768:320``), interleaved; the padded rows carry ``ratio_fwd`` and
``ratio_fwdbwd``, their times over the unpadded one's (the issue's bar: 1.3x).
"""
from __future__ import annotations

import argparse
import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from mini_of3.bench.anchors import FACTORIES, Impl, load_impls
from mini_of3.bench.common import (median_ms, package_versions, peak_mib, print_table, rel_err, result_header,
                                   time_in_rounds, write_json)
from mini_of3.kernels import triangle_attention_ref
from mini_of3.kernels.triangle_attention_host import autotuned_configs
from mini_of3.model.kernel_choice import KernelChoice
from mini_of3.model.tri_attn_backends import tri_attn_backend
from mini_of3.model.triangle import TriangleAttention

LAYOUTS = ("contiguous", "start", "end")
C_Z = 128          # the pair channels of every GPU config

GRAD_NAMES = ("o", "dq", "dk", "dv", "dbias")
# The floor at N = 768, H = 4, D = 32 (one exp per score on the special-function units for the forward; about three
# times that for forward + backward), scaled by N^3 and H for other shapes.
FLOOR_768_MS = {"fwd": 0.5, "fwdbwd": 1.5}


def make_inputs(n: int, d: int, heads: int, seed: int, device: str = "cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (torch.randn(1, n, n, heads, d, device=device, generator=g).to(torch.bfloat16) for _ in range(4))
    bias = torch.randn(1, heads, n, n, device=device, generator=g)
    mask = torch.ones(1, n, n, dtype=torch.bool, device=device)
    mask[..., n - max(1, n // 16):] = False
    return q, k, v, bias, mask, do


def make_model_inputs(n: int, d: int, heads: int, seed: int, node: str, device: str = "cuda",
                      real: int | None = None):
    """The inputs of the model's triangle attention, node "starting" or "ending", as it passes them to the backend
    under bf16 autocast: q, k, v [1, I, J, H, D] (views of one projection), bias [1, H, J, K] bf16, mask [1, I, K],
    and a contiguous dO. The first ``real`` tokens are real (default: all but the last N/16), the rest padding."""
    torch.manual_seed(seed)
    layer = TriangleAttention(c_z=C_Z, n_heads=heads, c_hidden=d, node=node).to(device)
    z = torch.randn(1, n, n, C_Z, device=device)
    tokens = torch.ones(1, n, dtype=torch.bool, device=device)
    tokens[:, n - max(1, n // 16) if real is None else real:] = False
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
        qkvg, bias, mask = layer.attention_inputs(z, tokens[:, :, None] & tokens[:, None, :])
    q, k, v, _ = qkvg.unbind(3)
    do = torch.randn(q.shape, device=device).to(q.dtype)
    return q, k, v, bias, mask, do


def layout_inputs(layout: str, n: int, d: int, heads: int, seed: int, real: int | None = None,
                  device: str = "cuda"):
    """The inputs of one layout; ``real``: the real tokens of the model layouts (see make_model_inputs)."""
    if layout == "contiguous":
        return make_inputs(n, d, heads, seed, device)
    return make_model_inputs(n, d, heads, seed, {"start": "starting", "end": "ending"}[layout], device, real)


def adapter_impl(name: str) -> Impl:
    """An implementation called through the model's backend adapter, on the inputs as the model passes them."""
    backend = "mini_of3" if name.startswith("mini_of3") else name
    attend = tri_attn_backend(KernelChoice(tri_attn_backend=backend))
    fp32_bias = name == "mini_of3"

    def native(q, k, v, bias, mask):
        return q, k, v, bias.float() if fp32_bias else bias, mask

    return Impl(name, "fp32" if fp32_bias else "input", native, attend, lambda t, kind: t)


def leaf(t: torch.Tensor, keep_layout: bool) -> torch.Tensor:
    """A fresh autograd leaf with t's values: a copy, or (``keep_layout``) t's own storage and strides."""
    return (t.detach() if keep_layout else t.detach().clone()).requires_grad_(True)


def reference_fp64(q, k, v, bias, mask, do, rows_per_chunk: int = 32, mask_queries: bool = False
                   ) -> list[torch.Tensor]:
    """Output and gradients in float64, rows i in chunks (they are independent except for the bias gradient)."""
    bias64 = bias.double()
    outs = {name: [] for name in GRAD_NAMES[:4]}
    dbias = torch.zeros_like(bias64)
    for i0 in range(0, q.shape[1], rows_per_chunk):
        rows = slice(i0, i0 + rows_per_chunk)
        leaves = [t[:, rows].double().requires_grad_(True) for t in (q, k, v)]
        b = bias64.clone().requires_grad_(True)
        o = triangle_attention_ref(*leaves, b, mask[:, rows], mask_queries=mask_queries)
        o.backward(do[:, rows].double())
        for name, t in zip(GRAD_NAMES[:4], [o.detach()] + [x.grad for x in leaves]):
            outs[name].append(t)
        dbias += b.grad
    return [torch.cat(outs[name], dim=1) for name in GRAD_NAMES[:4]] + [dbias]


def run_grads(impl: Impl, native, do_native, keep_layout: bool = False) -> list[torch.Tensor]:
    q, k, v, bias, mask = native
    leaves = [leaf(t, keep_layout) for t in (q, k, v, bias)]
    o = impl.call(*leaves, mask)
    grads = torch.autograd.grad(o, leaves, do_native)
    return [impl.back(o.detach(), "qkvo")] + [impl.back(g, "qkvo") for g in grads[:3]] + [impl.back(grads[3], "bias")]


@dataclass
class Prepared:
    """One implementation at one shape: its inputs in its native layout and the two timed closures."""
    impl: Impl
    row: dict
    natives: list
    dos: list
    fwd: Callable[[int], object]
    fwdbwd: Callable[[int], object]


def prepare(impl: Impl, n: int, d: int, heads: int, layout: str = "contiguous", real: int | None = None,
            device: str = "cuda") -> Prepared:
    row = {"impl": impl.name, "N": n, "D": d, "H": heads, "dtype": "bf16", "bias_dtype": impl.bias_dtype,
           "layout": layout}
    sets = [layout_inputs(layout, n, d, heads, seed, real, device) for seed in range(3)]
    natives = [impl.native(*s[:5]) for s in sets]
    dos = [impl.native(s[5], s[5], s[5], s[3], s[4])[0] for s in sets]   # dO laid out as the impl's q
    leaves = [[leaf(t, layout != "contiguous") for t in nat[:4]] for nat in natives]

    def fwd(r):
        with torch.no_grad():
            impl.call(*natives[r])

    def fwdbwd(r):
        o = impl.call(*leaves[r], natives[r][4])
        torch.autograd.grad(o, leaves[r], dos[r])
    return Prepared(impl, row, natives, dos, fwd, fwdbwd)


def time_rounds(prepared: list[Prepared], rounds: int, reps: int) -> None:
    """Fwd and fwd+bwd times of every implementation in interleaved rounds (``time_in_rounds``), each round's value
    the median of ``reps`` calls over three input sets."""
    time_in_rounds([p.row for p in prepared],
                   [{"fwd_ms": lambda r, p=p: median_ms(p.fwd, reps=reps, rotate=3),
                     "fwdbwd_ms": lambda r, p=p: median_ms(p.fwdbwd, reps=reps, rotate=3)} for p in prepared],
                   rounds)


def finish(p: Prepared, *, check: bool, reference) -> dict:
    """Peak memory, throughput, floor ratios and (with ``check``) errors and the bitwise repeat check of one row."""
    row, n, d, heads = p.row, p.row["N"], p.row["D"], p.row["H"]
    row["peak_mib"] = peak_mib(lambda: p.fwdbwd(0))
    flops = 4 * n**3 * heads * d
    row["fwd_tflops"] = flops / row["fwd_ms"] / 1e9
    row["fwdbwd_tflops"] = 3.5 * flops / row["fwdbwd_ms"] / 1e9
    floor_scale = (n / 768) ** 3 * heads / 4
    row["floor_ratio_fwd"] = row["fwd_ms"] / (FLOOR_768_MS["fwd"] * floor_scale)
    row["floor_ratio_fwdbwd"] = row["fwdbwd_ms"] / (FLOOR_768_MS["fwdbwd"] * floor_scale)
    if check:
        keep = row["layout"] != "contiguous"
        first = run_grads(p.impl, p.natives[0], p.dos[0], keep)
        row["err"] = {name: rel_err(g, r) for name, g, r in zip(GRAD_NAMES, first, reference)}
        if keep:   # the model's layouts pad whole tokens: rows i without a valid key (padding) come apart
            real = p.natives[0][4].any(-1)                                   # [B, I]
            row["err"] = {name: rel_err(g[real], r[real]) if name != "dbias" else row["err"][name]
                          for name, g, r in zip(GRAD_NAMES, first, reference)}
            row["err_note"] = "o, dq, dk, dv over rows with a valid key; dbias whole"
            row["padding_rows_zero"] = all(bool((g[~real] == 0).all()) for g in first[:4])
            if row.get("mask_queries"):   # o and dq of every masked query (dk, dv: masked keys)
                masked = ~p.natives[0][4]                                    # [B, I, J]
                row["masked_queries_zero"] = all(bool((g[masked] == 0).all()) for g in first[:4])
        same = {name: True for name in GRAD_NAMES}
        for _ in range(4):   # five runs in all
            again = run_grads(p.impl, p.natives[0], p.dos[0], keep)
            for name, a, b in zip(GRAD_NAMES, first, again):
                same[name] = same[name] and torch.equal(a, b)
        row["bitwise_each"] = same
        row["bitwise"] = all(same.values())
    return row


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = sorted({(r.get("layout", "contiguous"), r["D"]) for r in rows},
                    key=lambda p: (LAYOUTS.index(p[0]), -p[1]))
    fig, axes = plt.subplots(len(panels), 2, figsize=(11, 4 * len(panels)), squeeze=False)
    for a, (layout, d) in enumerate(panels):
        for b, key in enumerate(("fwd_ms", "fwdbwd_ms")):
            ax = axes[a][b]
            mine = [r for r in rows if r.get("layout", "contiguous") == layout and r["D"] == d and key in r]
            for name in dict.fromkeys(r["impl"] for r in mine):
                pts = sorted((r["N"], r[key]) for r in mine if r["impl"] == name)
                ax.plot(*zip(*pts), marker="o", label=name, lw=2.5 if name.startswith("mini_of3") else 1.2)
            ax.set_yscale("log")
            ax.set_xlabel("N (tokens)")
            ax.set_ylabel("ms (median)")
            ax.set_title(f"{layout}: {'forward' if b == 0 else 'forward + backward'}, H=4, D={d}, bf16", fontsize=10)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def load_layout_impls(names: list[str], layout: str) -> tuple[list[Impl], dict[str, str]]:
    """The implementations of one layout: native-layout ones for ``contiguous``, the model's adapters otherwise."""
    if layout == "contiguous":
        return load_impls(names)
    impls, skipped = [], {}
    for name in names:
        try:
            impls.append(adapter_impl(name))
        except Exception as err:  # an anchor missing here is reported, not fatal
            skipped[name] = f"{type(err).__name__}: {str(err)[:200]}"
    return impls, skipped


def parse_list(text: str, name: str, cast=int, allowed=None) -> list:
    """A comma-separated option, or one clear error line."""
    try:
        values = [cast(x) for x in text.split(",") if x]
    except ValueError:
        raise SystemExit(f"--{name}: expected a comma-separated list, got {text!r}") from None
    bad = [v for v in values if allowed is not None and v not in allowed]
    if not values or bad:
        raise SystemExit(f"--{name}: {bad or 'nothing'} not allowed; choose from {list(allowed or [])}")
    return values


ADAPTED = ("mini_of3", "mini_of3_bf16bias", "trifast", "cueq", "of3_triton", "torch")


def bench_shape(result: dict, impls: list[Impl], layout: str, n: int, d: int, args, check: bool) -> None:
    """Time every implementation at one (layout, N, D), interleaved; append one row each to ``result``."""
    t0 = time.time()
    reference = reference_fp64(*layout_inputs(layout, n, d, args.heads, 0)) if check else None
    if check:
        print(f"float64 reference {layout} N={n} D={d}: {time.time() - t0:.1f}s", flush=True)
    prepared = []
    for impl in impls:
        try:
            prepared.append(prepare(impl, n, d, args.heads, layout))
        except Exception as err:
            result["rows"].append({"impl": impl.name, "layout": layout, "N": n, "D": d,
                                   "error": f"{type(err).__name__}: {str(err)[:300]}"})
            traceback.print_exc(limit=4)
    time_rounds(prepared, args.rounds, args.reps)
    for p in prepared:
        try:
            row = p.row if "error" in p.row else finish(p, check=check, reference=reference)
        except Exception as err:
            row = {"impl": p.impl.name, "layout": layout, "N": n, "D": d,
                   "error": f"{type(err).__name__}: {str(err)[:300]}"}
            traceback.print_exc(limit=4)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    del prepared, reference
    torch.cuda.empty_cache()


def parse_padded(text: str) -> list[tuple[int, int, int]]:
    """``--padded``: comma-separated REAL:CROP[:BASE] -> (real tokens, padded N, unpadded N), BASE defaulting to
    REAL rounded up to 64; or one clear error line."""
    specs = []
    for item in text.split(","):
        try:
            values = [int(x) for x in item.split(":")]
        except ValueError:
            values = []
        if len(values) == 2:
            values.append(-(-values[0] // 64) * 64)
        if len(values) != 3 or not 0 < values[0] <= min(values[1:]):
            raise SystemExit(f"--padded: expected REAL:CROP[:BASE] with 0 < REAL <= CROP and REAL <= BASE, got "
                             f"{item!r}")
        specs.append(tuple(values))
    return specs


def bench_padded(result: dict, spec: tuple[int, int, int], layout: str, d: int, args, check: bool,
                 device: str = "cuda") -> None:
    """Issue 42's measurement: ``mini_of3`` on an entry of ``real`` tokens padded to ``crop`` (mask_queries True,
    then False) and on one of ``base`` tokens without padding, interleaved; appends the three rows, the padded ones
    with their time ratios to the unpadded one."""
    real, crop, base = spec
    adapter = adapter_impl("mini_of3")
    cases = [(crop, real, True), (crop, real, False), (base, base, True)]
    prepared = []
    for n, tokens, mask_queries in cases:
        call = (lambda mq: lambda *a: adapter.call(*a, mask_queries=mq))(mask_queries)
        impl = Impl(adapter.name, adapter.bias_dtype, adapter.native, call, adapter.back)
        p = prepare(impl, n, d, args.heads, layout, real=tokens, device=device)
        p.row.update(real_tokens=tokens, mask_queries=mask_queries, padded=f"{real}:{crop}")
        prepared.append(p)
    time_rounds(prepared, args.rounds, args.reps)
    for p in prepared:
        if "error" in p.row:
            result["rows"].append(p.row)
            continue
        n, tokens, mask_queries = p.row["N"], p.row["real_tokens"], p.row["mask_queries"]
        reference = None
        if check:
            inputs = layout_inputs(layout, n, d, args.heads, 0, tokens, device)
            reference = reference_fp64(*inputs, mask_queries=mask_queries)
        result["rows"].append(finish(p, check=check, reference=reference))
    unpadded = prepared[-1].row
    for p in prepared[:-1]:
        p.row.update(ratio_to_N=unpadded["N"], ratio_fwd=p.row["fwd_ms"] / unpadded["fwd_ms"],
                     ratio_fwdbwd=p.row["fwdbwd_ms"] / unpadded["fwdbwd_ms"])
    for p in prepared:
        print(json.dumps(p.row), flush=True)


def main_padded(args, specs: list[tuple[int, int, int]], layouts: list[str], ds: list[int], check_ns) -> None:
    """``--padded``: bench_padded for each spec, layout and D; a table and the JSON."""
    result = result_header("kernels")
    result["shapes"] = {"B": 1, "H": args.heads, "dtype": "bf16", "padded": [f"{r}:{c}:{b}" for r, c, b in specs],
                        "mask": "the first real_tokens tokens real, the rest padding (pair mask token_i & token_k)"}
    out = Path(args.out) / f"kernels_padded{('_' + args.tag) if args.tag else ''}.json"
    for layout in [x for x in layouts if x != "contiguous"] or ["start"]:
        for d in ds:
            for spec in specs:
                bench_padded(result, spec, layout, d, args, check=check_ns is None or spec[1] in check_ns)
                write_json(result, out)
    result["autotuned"] = autotuned_configs()
    write_json(result, out)
    print()
    print_table(result["rows"], [("layout", "layout", "s"), ("D", "D", "d"), ("N", "N", "d"),
                                 ("real_tokens", "real", "d"), ("mask_queries", "mask_queries", ""),
                                 ("fwd_ms", "fwd ms", ".3f"), ("fwdbwd_ms", "fwd+bwd ms", ".3f"),
                                 ("ratio_fwd", "fwd / unpadded", ".2f"), ("ratio_fwdbwd", "f+b / unpadded", ".2f")])
    print(f"\nwrote {out}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mini_of3.bench kernels", description=__doc__)
    parser.add_argument("--ns", default="256,384,512,640,768")
    parser.add_argument("--ds", default="32,16")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--impls", default="mini_of3,mini_of3_bf16bias,cueq,trifast,of3_triton,torch")
    parser.add_argument("--layouts", default="contiguous", help=f"any of {','.join(LAYOUTS)}")
    parser.add_argument("--check-ns", default="all", help="N values with float64 errors and bitwise repeats")
    parser.add_argument("--reps", type=int, default=10, help="timed calls per round (their median is the round's)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over all implementations, interleaved")
    parser.add_argument("--out", default="runs/bench", help="folder of the JSON and PNG (default: runs/bench)")
    parser.add_argument("--tag", default="", help="suffix of the result file names")
    parser.add_argument("--padded", default="", help="REAL:CROP[:BASE],...: only the padded-entry measurement "
                        "(mini_of3, mask_queries on and off, against BASE tokens unpadded; see above)")
    args = parser.parse_args(argv)
    names = parse_list(args.impls, "impls", str, FACTORIES)
    layouts = parse_list(args.layouts, "layouts", str, LAYOUTS)
    ns, ds = parse_list(args.ns, "ns"), parse_list(args.ds, "ds")
    check_ns = None if args.check_ns == "all" else set(parse_list(args.check_ns, "check-ns"))
    if set(layouts) - {"contiguous"} and set(names) - set(ADAPTED):
        raise SystemExit(f"--impls: the model layouts run {list(ADAPTED)} only, got {names}")
    specs = parse_padded(args.padded) if args.padded else None
    if not torch.cuda.is_available():
        raise SystemExit("the kernel benchmark needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    if specs:
        main_padded(args, specs, layouts, ds, check_ns)
        return
    result = result_header("kernels", package_versions(
        ["trifast", "cuequivariance", "cuequivariance-torch", "cuequivariance-ops-torch-cu13", "openfold3"]))
    result["skipped"] = {}
    result["shapes"] = {"B": 1, "H": args.heads, "mask": "last N/16 keys (contiguous) or tokens (start, end) masked",
                        "dtype": "bf16"}
    out = Path(args.out)
    stem = f"kernels{('_' + args.tag) if args.tag else ''}"
    for layout in layouts:
        impls, skipped = load_layout_impls(names, layout)
        for name, why in skipped.items():
            result["skipped"][f"{name} ({layout})"] = why
            print(f"skipped {name} ({layout}): {why}", flush=True)
        for d in ds:
            for n in ns:
                bench_shape(result, impls, layout, n, d, args, check=check_ns is None or n in check_ns)
                write_json(result, out / f"{stem}.json")
    result["autotuned"] = autotuned_configs()
    write_json(result, out / f"{stem}.json")
    rows = [r for r in result["rows"] if "error" not in r]
    plot(rows, out / f"{stem}.png")
    print()
    print_table(rows, [("impl", "impl", "s"), ("layout", "layout", "s"), ("N", "N", "d"), ("D", "D", "d"),
                       ("fwd_ms", "fwd ms", ".3f"),
                       ("fwdbwd_ms", "fwd+bwd ms", ".3f"), ("fwd_tflops", "fwd TF/s", ".0f"),
                       ("fwdbwd_tflops", "f+b TF/s", ".0f"), ("peak_mib", "peak MiB", ".0f")])
    for r in rows:
        if "err" in r:
            errs = " ".join(f"{k} {v:.1e}" for k, v in r["err"].items())
            print(f"{r['impl']:>18s} {r['layout']:>10s} N={r['N']}: {errs}  bitwise={r['bitwise']}")
    print(f"\nwrote {out / (stem + '.json')} and {out / (stem + '.png')}")

