"""``python -m mini_of3.bench sigmoid``: sigmoid attention, ours against TritonSigmoid and softmax SDPA, one process.

Shapes (``--shapes``, bf16, H = ``--heads`` = 16): ``b<B>t<T>d<D>`` dense [B, T, H, D] (suffix ``c``: causal), and
``varlen<S>d<D>`` a batch of S sequences with lengths drawn uniformly (seed 0) from ``--varlen-range`` (500,16000).
Implementations (``--impls``):
    mini_of3        ours: dense shapes as [B, T, H, D], the varlen batch packed [total, H, D] with cu_seqlens
    mini_of3_tanh   ours with the sigmoid through tanh.approx (``sigmoid_tiles(sigmoid="tanh")``, TritonSigmoid's
                    evaluation; one MUFU instruction per score instead of ex2 and rcp)
    triton_sigmoid  TritonSigmoid: ``sigmoid_attention`` on dense shapes, ``sigmoid_attention_padded`` (padded to
                    the longest sequence, with seq_lens) on the varlen batch; skipped with a note when not installed
    cudnn, flash    softmax SDPA (``sdpa_kernel(CUDNN_ATTENTION / FLASH_ATTENTION)`` on [B, H, T, D] views), for
                    reference: on the varlen batch they run the padded batch unmasked
Ours take ``sigmoid_tiles`` fields after the name, ``+field=value`` each: ``mini_of3_tanh+scores_budget=0`` is ours
with tanh and the backward that recomputes dq.
Per row: fwd and fwd+bwd ms (median of CUDA-event timings after warm-up, two input sets rotated; random inputs;
the implementations timed in interleaved rounds, so that the card's drift during the run falls on all alike),
TFLOP/s over real tokens only (forward 4 H D sum_s Lq_s Lk_s, halved for causal; forward+backward 3.5x), the error
of o, dq, dk, dv against float64 (norm-relative, computed on the GPU per sequence in query chunks, on the first
``--err-heads`` heads: ``err_heads`` in the row) for the sigmoid implementations, and ``bitwise``: three runs
repeat o and every gradient bit for bit. Writes ``sigmoid[_TAG].json`` (DESIGN.md's schema) and ``.png`` into
``--out`` and prints a table last.

``--sweep`` instead times our kernels under several tile configurations and sigmoid evaluations on the given shapes
(default b4t4096d64, b4t4096d128) and prints the best per shape as a ``Tiles(...)`` line for DEFAULT_TILES;
``--sigmoid tanh`` tunes the tiles for that evaluation instead of the fastest accurate one; ``--tiles
field=value,...`` starts from those fields (with a scores_budget the dq kernel swept is _bwd_dq_scores).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from mini_of3.bench.common import (elapsed_ms, package_versions, print_table, result_header, time_in_rounds,
                                   write_json)
from mini_of3.kernels import sigmoid_attention
from mini_of3.kernels.sigmoid_attention_host import SIGMOID_VARIANTS, current_tiles, gluon_takes, sigmoid_tiles

IMPLS = ("mini_of3", "mini_of3_tanh", "triton_sigmoid", "cudnn", "flash")
DEFAULT_SHAPES = "b4t4096d64,b1t16384d64,b4t4096d128,b1t16384d128,varlen16d128"
SWEEP_SHAPES = "b4t4096d64,b4t4096d128"
NAMES = ("o", "dq", "dk", "dv")


# ---------------------------------------------------------------------------------------------------------------
# shapes and inputs


@dataclass(frozen=True)
class Shape:
    """One benchmark case: B sequences (dense: all of length T; varlen: ``lengths``), H heads of dim D."""
    name: str
    D: int
    H: int
    causal: bool
    lengths: tuple[int, ...]
    dense: bool

    @property
    def T(self) -> int:
        return max(self.lengths)

    @property
    def B(self) -> int:
        return len(self.lengths)

    def flops_fwd(self) -> float:
        pairs = sum(L * (L + 1) / 2 if self.causal else L * L for L in self.lengths)
        return 4.0 * self.H * self.D * pairs


def parse_shape(text: str, heads: int, varlen_range: tuple[int, int]) -> Shape:
    dense = re.fullmatch(r"b(\d+)t(\d+)d(\d+)(c?)", text)
    if dense:
        B, T, D = map(int, dense.groups()[:3])
        return Shape(text, D, heads, bool(dense.group(4)), (T,) * B, True)
    varlen = re.fullmatch(r"varlen(\d+)d(\d+)(c?)", text)
    if varlen:
        S, D = int(varlen.group(1)), int(varlen.group(2))
        g = torch.Generator().manual_seed(0)
        lengths = torch.randint(varlen_range[0], varlen_range[1] + 1, (S,), generator=g).tolist()
        return Shape(text, D, heads, bool(varlen.group(3)), tuple(lengths), False)
    raise SystemExit(f"--shapes: expected b<B>t<T>d<D>[c] or varlen<S>d<D>[c], got {text!r}")


def make_packed(shape: Shape, device: torch.device, seed: int) -> dict[str, torch.Tensor]:
    """q, k, v, do packed [total, H, D] bf16 (random, never zeros) and cu_seqlens."""
    g = torch.Generator(device).manual_seed(seed)
    total = sum(shape.lengths)
    q, k, v, do = (torch.randn(total, shape.H, shape.D, device=device, generator=g).to(torch.bfloat16)
                   for _ in range(4))
    cu = torch.tensor([0, *torch.tensor(shape.lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    return {"q": q, "k": k, "v": v, "do": do, "cu": cu}


def padded(x: torch.Tensor, shape: Shape) -> torch.Tensor:
    """[total, H, D] packed -> [B, T, H, D] with zero padding (a view for dense shapes)."""
    if shape.dense:
        return x.view(shape.B, shape.T, *x.shape[1:])
    out = x.new_zeros(shape.B, shape.T, *x.shape[1:])
    start = 0
    for b, L in enumerate(shape.lengths):
        out[b, :L] = x[start:start + L]
        start += L
    return out


def packed(x: torch.Tensor, shape: Shape) -> torch.Tensor:
    """[B, T, H, D] -> the valid rows packed [total, H, D]."""
    if shape.dense:
        return x.reshape(-1, *x.shape[2:])
    return torch.cat([x[b, :L] for b, L in enumerate(shape.lengths)])


# ---------------------------------------------------------------------------------------------------------------
# implementations: each maps packed inputs to a call f(q, k, v) on its own layout, and its outputs back to packed


@dataclass
class Impl:
    """``prepare(inputs)`` -> the tensors f takes (leaves); ``call(q, k, v)`` -> o; ``unpack(t)`` -> packed rows;
    ``tiles``: the ``sigmoid_tiles`` fields in force around its forward and backward."""
    prepare: Callable
    call: Callable
    unpack: Callable
    sigmoid: bool
    tiles: dict = dataclasses.field(default_factory=dict)


def tile_fields(text: str, separator: str) -> dict:
    """``field=value`` items of ``sigmoid_tiles`` (integers where they parse) split at ``separator``."""
    fields = {}
    for item in filter(None, text.split(separator)):
        field, _, value = item.partition("=")
        if not field or not value:
            raise ValueError(f"expected field=value, got {item!r}")
        fields[field] = int(value) if re.fullmatch(r"-?\d+", value) else value
    return fields


def load_impl(name: str, shape: Shape) -> Impl:
    """The implementation ``name`` for ``shape``; raises with a reason when it cannot run."""
    same = lambda t: t   # noqa: E731
    if "+" in name:
        base, _, fields = name.partition("+")
        impl = load_impl(base, shape)
        impl.tiles = {**impl.tiles, **tile_fields(fields, "+")}
        return impl
    if name == "mini_of3_tanh":
        impl = load_impl("mini_of3", shape)
        impl.tiles = {"sigmoid": "tanh"}
        return impl
    if name == "mini_of3":
        if shape.dense:
            return Impl(lambda x: padded(x, shape),
                        lambda q, k, v: sigmoid_attention(q, k, v, causal=shape.causal),
                        lambda t: packed(t, shape), True)
        extra = {}

        def call(q, k, v):
            return sigmoid_attention(q, k, v, cu_seqlens_q=extra["cu"], cu_seqlens_k=extra["cu"],
                                     max_seqlen_q=shape.T, max_seqlen_k=shape.T, causal=shape.causal)
        impl = Impl(same, call, same, True)
        impl.extra = extra
        return impl
    if name == "triton_sigmoid":
        import triton_sigmoid   # noqa: F401  (raises ImportError or RuntimeError when it cannot run here)
        if shape.dense:
            return Impl(lambda x: padded(x, shape),
                        lambda q, k, v: triton_sigmoid.sigmoid_attention(q, k, v, is_causal=shape.causal),
                        lambda t: packed(t, shape), True)
        lens = {}

        def call(q, k, v):
            return triton_sigmoid.sigmoid_attention_padded(q, k, v, seq_lens_k=lens["lens"], seq_lens_q=lens["lens"],
                                                           is_causal=shape.causal)
        impl = Impl(lambda x: padded(x, shape), call, lambda t: packed(t, shape), True)
        impl.extra = lens
        return impl
    if name in ("cudnn", "flash"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = SDPBackend.CUDNN_ATTENTION if name == "cudnn" else SDPBackend.FLASH_ATTENTION

        def call(q, k, v):
            with sdpa_kernel(backend):
                o = torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=shape.causal)
            return o.transpose(1, 2)
        return Impl(lambda x: padded(x, shape), call, lambda t: packed(t, shape), False)
    raise ValueError(f"unknown implementation {name!r}")


def attach_lengths(impl: Impl, inputs: dict, shape: Shape) -> None:
    """Give a varlen or padded call its cu_seqlens / lengths (the same for every input set of a shape)."""
    if hasattr(impl, "extra"):
        impl.extra["cu"] = inputs["cu"]
        impl.extra["lens"] = torch.tensor(shape.lengths, dtype=torch.int32, device=inputs["q"].device)


def bind(impl: Impl, inputs: dict, shape: Shape) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(leaves q, k, v on the implementation's layout, do on it)."""
    attach_lengths(impl, inputs, shape)
    leaves = [impl.prepare(inputs[n]).detach().requires_grad_(True) for n in ("q", "k", "v")]
    return leaves, impl.prepare(inputs["do"])


def tiles_of(impl: Impl):
    """The implementation's ``sigmoid_tiles`` override, or none."""
    return sigmoid_tiles(**impl.tiles) if impl.tiles else contextlib.nullcontext()


def forward_backward(impl: Impl, leaves, do) -> list[torch.Tensor]:
    o = impl.call(*leaves)
    return [o.detach(), *torch.autograd.grad(o, leaves, do)]


# ---------------------------------------------------------------------------------------------------------------
# float64 truth, in query chunks


def float64_reference(inputs: dict, shape: Shape, heads: int, chunk: int = 1024) -> list[torch.Tensor]:
    """o, dq, dk, dv [total, heads, D] float64 for the first ``heads`` heads, with b = -log(keys) and scale
    1/sqrt(D): per sequence and chunk of queries, so that T = 16384 fits (scores [heads, chunk, T])."""
    q, k, v, do = (inputs[n][:, :heads].double() for n in ("q", "k", "v", "do"))
    scale = 1.0 / math.sqrt(shape.D)
    out = [torch.zeros_like(q) for _ in range(4)]
    start = 0
    for L in shape.lengths:
        rows = slice(start, start + L)
        ks, vs = k[rows], v[rows]                                                       # [L, h, D]
        bias = -math.log(max(L, 1))
        for c0 in range(0, L, chunk):
            c = slice(start + c0, start + min(c0 + chunk, L))
            qc, doc = q[c], do[c]                                                       # [c, h, D]
            p = torch.sigmoid(torch.einsum("qhd,khd->hqk", qc, ks) * scale + bias)      # [h, c, L]
            if shape.causal:
                seen = torch.arange(L, device=q.device)[None, :] <= torch.arange(c0, c0 + qc.shape[0],
                                                                                   device=q.device)[:, None]
                p = p * seen
            ds = torch.einsum("qhd,khd->hqk", doc, vs) * p * (1 - p) * scale
            out[0][c] = torch.einsum("hqk,khd->qhd", p, vs)
            out[1][c] = torch.einsum("hqk,khd->qhd", ds, ks)
            out[2][rows] += torch.einsum("hqk,qhd->khd", ds, qc)
            out[3][rows] += torch.einsum("hqk,qhd->khd", p, doc)
            del p, ds
        start += L
    return out


def errors(got: list[torch.Tensor], ref: list[torch.Tensor], impl: Impl, heads: int) -> dict[str, float]:
    """Norm-relative error of o, dq, dk, dv (packed, first ``heads`` heads) against float64."""
    result = {}
    for name, g, r in zip(NAMES, got, ref):
        g = impl.unpack(g)[:, :heads].double()
        result[name] = ((g - r).norm() / r.norm()).item()
    return result


# ---------------------------------------------------------------------------------------------------------------
# timing


def base_row(name: str, shape: Shape) -> dict:
    row = {"impl": name, "shape": shape.name, "T": shape.T, "D": shape.D, "B": shape.B, "H": shape.H,
           "dtype": "bf16", "causal": shape.causal, "layout": "dense" if shape.dense else "varlen",
           "tokens": sum(shape.lengths)}
    if name == "triton_sigmoid" and not shape.dense:
        row["layout"] = "padded"
    if name in ("cudnn", "flash"):
        row["note"] = "softmax attention" + ("" if shape.dense else ", the padded batch unmasked")
    return row


@dataclass
class Arm:
    """One implementation ready to time on one shape: its row, its calls, its inputs (two sets, rotated)."""
    row: dict
    impl: Impl
    bound: list

    def fwd(self, r: int) -> None:
        with tiles_of(self.impl), torch.no_grad():
            self.impl.call(*self.bound[r % len(self.bound)][0])

    def fwdbwd(self, r: int) -> None:
        with tiles_of(self.impl):
            forward_backward(self.impl, *self.bound[r % len(self.bound)])

    def timers(self, device: torch.device) -> dict[str, Callable[[int], float]]:
        """Milliseconds of one forward and of one forward+backward on input set r."""
        return {"fwd_ms": lambda r: elapsed_ms(lambda: self.fwd(r), device),
                "fwdbwd_ms": lambda r: elapsed_ms(lambda: self.fwdbwd(r), device)}


def _fail(row: dict, err: Exception) -> None:
    """A missing or failing implementation is reported in its row, not fatal."""
    row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
    if not isinstance(err, (ImportError, RuntimeError)):
        traceback.print_exc(limit=3)


def prepare_arms(shape: Shape, names: list[str], sets: list[dict], args) -> tuple[list[dict], list[Arm]]:
    """Every implementation's row, and an Arm for each that loads, binds and runs its warm-up calls (compilation
    included). Ours share their inputs (one layout)."""
    rows, arms, inputs = [], [], {}
    for name in names:
        t0 = time.time()
        row = base_row(name, shape)
        rows.append(row)
        try:
            impl = load_impl(name, shape)
            layout = "mini_of3" if name.startswith("mini_of3") else name
            if layout not in inputs:
                inputs[layout] = [bind(impl, s, shape) for s in sets]
            attach_lengths(impl, sets[0], shape)
            arm = Arm(row, impl, inputs[layout])
            for r in range(args.warmup):
                arm.fwd(r)
                arm.fwdbwd(r)
            arms.append(arm)
            if name.startswith("mini_of3"):
                row["kernels"] = kernels_of(impl, sets[0], shape)
        except Exception as err:
            _fail(row, err)
        print(f"{shape.name} {name}: ready in {time.time() - t0:.0f} s", flush=True)
    return rows, arms


def kernels_of(impl: Impl, inputs: dict, shape: Shape) -> str:
    """Which kernels ours run at this shape: "gluon" (sigmoid_attention_hopper.py), "triton", or "triton/gluon"
    (the forward's / the backward's)."""
    with tiles_of(impl):
        tiles = current_tiles(shape.D, inputs["q"].dtype)
    layout = "dense" if shape.dense else "varlen"
    forward, backward = (("gluon" if takes else "triton")
                         for takes in gluon_takes(inputs["q"], inputs["k"], layout, shape.T, shape.causal, tiles))
    return forward if forward == backward else f"{forward}/{backward}"


def time_interleaved(arms: list[Arm], device: torch.device, reps: int) -> None:
    """fwd_ms and fwdbwd_ms of every arm: the median (and spread) of ``reps`` interleaved rounds, one call of each
    direction per arm and round (``time_in_rounds``)."""
    time_in_rounds([arm.row for arm in arms], [arm.timers(device) for arm in arms], reps)


def check_arm(arm: Arm, shape: Shape, reference: list[torch.Tensor] | None, args) -> None:
    """TFLOP/s over real tokens, and for sigmoid implementations the errors against float64 and whether three runs
    repeat bit for bit."""
    row, flops = arm.row, shape.flops_fwd()
    row["tflops_fwd"] = flops / row["fwd_ms"] / 1e9
    row["tflops_fwdbwd"] = 3.5 * flops / row["fwdbwd_ms"] / 1e9
    if arm.impl.sigmoid and reference is not None:
        with tiles_of(arm.impl):
            runs = [forward_backward(arm.impl, *arm.bound[0]) for _ in range(3)]
        row["err"] = errors(runs[0], reference, arm.impl, args.err_heads)
        row["err_heads"] = args.err_heads
        row["bitwise"] = all(torch.equal(a, b) for other in runs[1:] for a, b in zip(runs[0], other))


def bench_shape(shape: Shape, names: list[str], args, device: torch.device) -> list[dict]:
    """The rows of one shape: every implementation prepared and warmed up, timed in interleaved rounds, then
    checked."""
    sets = [make_packed(shape, device, seed) for seed in range(2)]
    reference = float64_reference(sets[0], shape, args.err_heads) if args.err_heads > 0 else None
    rows, arms = prepare_arms(shape, names, sets, args)
    time_interleaved(arms, device, args.reps)
    for arm in arms:
        if "error" not in arm.row:
            check_arm(arm, shape, reference, args)
    del sets, reference, arms
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------------------------------------------------
# tile sweep


FWD_CANDIDATES = [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (128, 32, 8, 3), (64, 64, 4, 3),
                  (64, 32, 4, 3), (128, 128, 8, 3)]
DKDV_CANDIDATES = [(64, 128, 8, 3), (32, 128, 8, 3), (64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 3),
                   (32, 64, 4, 3), (16, 128, 4, 3), (32, 64, 8, 3)]
DQ_CANDIDATES = [(128, 64, 8, 3), (128, 64, 8, 2), (128, 32, 8, 3), (128, 32, 4, 3), (64, 64, 4, 3),
                 (64, 32, 4, 3), (128, 128, 8, 2)]

DQS_CANDIDATES = [(64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 4, 3), (64, 128, 4, 3), (128, 128, 8, 2),
                  (64, 32, 4, 4), (32, 64, 4, 3)]


def _fields(kernel: str, config: tuple[int, int, int, int]) -> dict:
    return dict(zip((f"{kernel}_block_m", f"{kernel}_block_n", f"{kernel}_warps", f"{kernel}_stages"), config))


def sweep_shape(shape: Shape, args, device: torch.device) -> list[dict]:
    """Rows of the sweep on one shape: each sigmoid evaluation at the default tiles (with its error), then the
    candidates of each kernel (the others at their defaults, the fastest accurate evaluation), then the best of
    each combined; the best printed as a ``Tiles(...)`` line. Each group is timed in interleaved rounds."""
    sets = [make_packed(shape, device, seed) for seed in range(2)]
    reference = float64_reference(sets[0], shape, args.err_heads) if args.err_heads > 0 else None
    impl = load_impl("mini_of3", shape)
    bound = [bind(impl, s, shape) for s in sets]

    def measure(group: list[dict]) -> list[dict]:
        """One row per tile fields of ``group``, the group timed in interleaved rounds after its warm-up."""
        rows, arms = [], []
        for fields in group:
            row = {"shape": shape.name, "D": shape.D, "fields": fields}
            rows.append(row)
            arm = Arm(row, dataclasses.replace(impl, tiles={**args.tile_fields, **fields}), bound)
            try:
                for r in range(args.warmup):
                    arm.fwd(r)
                    arm.fwdbwd(r)
                arms.append(arm)
            except Exception as err:   # a configuration that does not fit (shared memory, registers) is reported
                row["error"] = f"{type(err).__name__}: {str(err)[:200]}"
        time_interleaved(arms, device, args.reps)
        for arm in arms:
            if reference is not None and list(arm.row["fields"]) == ["sigmoid"] and "error" not in arm.row:
                with tiles_of(arm.impl):
                    arm.row["err"] = errors(forward_backward(arm.impl, *bound[0]), reference, arm.impl,
                                            args.err_heads)
        for row in rows:
            print(" ", {k: v for k, v in row.items() if k not in ("shape", "D")}, flush=True)
        return rows

    with sigmoid_tiles(**args.tile_fields):
        default = current_tiles(shape.D, torch.bfloat16)
    rows = measure([{"sigmoid": variant} for variant in SIGMOID_VARIANTS])
    best = {"sigmoid": args.sigmoid or _fastest(rows, "fwdbwd_ms", lambda r: r["fields"]["sigmoid"] != "tanh",
                                                default.sigmoid)}
    dq = ("dqs", DQS_CANDIDATES) if default.scores_budget > 0 else ("dq", DQ_CANDIDATES)
    kernels = (("fwd", FWD_CANDIDATES, "fwd_ms"), ("dkdv", DKDV_CANDIDATES, "fwdbwd_ms"), (*dq, "fwdbwd_ms"))
    for kernel, candidates, key in [k for k in kernels if k[0] in args.sweep_kernels or k[0] == "dqs" and
                                    "dq" in args.sweep_kernels]:
        kernel_rows = measure([{**_fields(kernel, c), "sigmoid": best["sigmoid"]} for c in candidates])
        rows += kernel_rows
        fallback = {f: getattr(default, f) for f in _fields(kernel, (0, 0, 0, 0))}
        best.update(_fastest(kernel_rows, key, None, fallback, kernel))
    combined, = measure([dict(best)])
    rows.append(combined)
    tiles = dataclasses.replace(default, **best)   # the --tiles fields included
    print(f"\nbest for {shape.name}: {tiles}\n  fwd {combined.get('fwd_ms')} ms, fwd+bwd {combined.get('fwdbwd_ms')} "
          "ms", flush=True)
    for row in rows:
        row["best"] = dataclasses.asdict(tiles)
    return rows


def _fastest(rows: list[dict], key: str, keep, fallback, kernel: str | None = None):
    """Of the rows that ran (and pass ``keep``), the fastest one's sigmoid, or (``kernel``) its tile fields."""
    ok = [r for r in rows if key in r and (keep is None or keep(r))]
    if not ok:
        return fallback
    fields = min(ok, key=lambda r: r[key])["fields"]
    if kernel is None:
        return fields["sigmoid"]
    return {f: fields[f] for f in _fields(kernel, (0, 0, 0, 0))}


# ---------------------------------------------------------------------------------------------------------------
# figure, arguments, main


def plot(rows: list[dict], path: Path) -> None:
    """ms per shape per implementation: forward and forward+backward side by side, log scale."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    width = 0.8 / max(len(impls), 1)
    for ax, key, title in ((axes[0], "fwd_ms", "forward"), (axes[1], "fwdbwd_ms", "forward + backward")):
        for j, name in enumerate(impls):
            values = [next((r.get(key) for r in rows if r["shape"] == s and r["impl"] == name), None)
                      for s in shapes]
            values = [math.nan if v is None else v for v in values]
            ax.bar([i + j * width for i in range(len(shapes))], values, width, label=name, color=f"C{j}")
        ax.set_xticks([i + width * (len(impls) - 1) / 2 for i in range(len(shapes))], shapes, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms (median)")
        ax.set_title(f"sigmoid attention, {title} (bf16, H={rows[0]['H']})", fontsize=10)
        ax.grid(alpha=0.3, axis="y", which="both")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="python -m mini_of3.bench sigmoid", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=None, help=f"default {DEFAULT_SHAPES} (--sweep: {SWEEP_SHAPES})")
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--varlen-range", default="500,16000", help="shortest,longest sequence of varlen shapes")
    parser.add_argument("--err-heads", type=int, default=4, help="heads checked against float64 (0: none)")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--sweep", action="store_true", help="tune our tiles and sigmoid evaluation instead")
    parser.add_argument("--sigmoid", choices=SIGMOID_VARIANTS, default=None,
                        help="--sweep: tune the tiles for this evaluation (default: the fastest accurate one)")
    parser.add_argument("--tiles", default="", help="--sweep: start from these sigmoid_tiles fields, "
                        "field=value,... (e.g. scores_budget=0)")
    parser.add_argument("--sweep-kernels", default="fwd,dkdv,dq",
                        help="--sweep: the kernels whose tiles are swept (fwd, dkdv, dq), the others at defaults")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, errors on one head")
    parser.add_argument("--out", default="runs/bench", help="folder of the JSON and PNG (default: runs/bench)")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    if args.quick:
        args.reps, args.warmup, args.err_heads = min(args.reps, 5), min(args.warmup, 2), min(args.err_heads, 1)
    try:
        low, high = (int(x) for x in args.varlen_range.split(","))
    except ValueError:
        raise SystemExit(f"--varlen-range: expected two integers low,high, got {args.varlen_range!r}") from None
    if not 1 <= low <= high:
        raise SystemExit(f"--varlen-range: expected 1 <= low <= high, got {args.varlen_range!r}")
    args.impl_names = [i for i in args.impls.split(",") if i]
    bases = [i.partition("+")[0] for i in args.impl_names]
    if not args.impl_names or any(b not in IMPLS for b in bases):
        raise SystemExit(f"--impls: expected some of {list(IMPLS)}, got {args.impls!r}")
    try:
        args.tile_fields = tile_fields(args.tiles, ",")
        for name in args.impl_names:
            if "+" in name and not name.startswith("mini_of3"):
                raise ValueError(f"{name}: only ours (mini_of3...) take tile fields")
            with sigmoid_tiles(**{**args.tile_fields, **tile_fields(name.partition("+")[2], "+")}):
                pass
    except ValueError as err:
        raise SystemExit(f"--impls / --tiles: {err}") from None
    if args.sigmoid and not args.sweep:
        raise SystemExit("--sigmoid: only with --sweep (the benchmark times mini_of3 and mini_of3_tanh as impls)")
    if args.reps < 1 or args.warmup < 0 or args.heads < 1 or not 0 <= args.err_heads <= args.heads:
        raise SystemExit("--reps >= 1, --warmup >= 0, --heads >= 1 and 0 <= --err-heads <= --heads expected")
    args.sweep_kernels = args.sweep_kernels.split(",")
    if not set(args.sweep_kernels) <= {"fwd", "dkdv", "dq"}:
        raise SystemExit(f"--sweep-kernels: expected some of fwd,dkdv,dq, got {','.join(args.sweep_kernels)!r}")
    shapes = args.shapes or (SWEEP_SHAPES if args.sweep else DEFAULT_SHAPES)
    args.shape_list = [parse_shape(s, args.heads, (low, high)) for s in shapes.split(",") if s]
    if not args.shape_list:
        raise SystemExit("--shapes: expected at least one shape")
    return args


ROW_COLUMNS = [("impl", "impl", "s"), ("shape", "shape", "s"), ("fwd_ms", "fwd ms", ".3f"),
               ("fwdbwd_ms", "fwd+bwd ms", ".3f"), ("tflops_fwd", "TFLOP/s fwd", ".0f"),
               ("tflops_fwdbwd", "TFLOP/s f+b", ".0f"), ("err_o", "err o", ".1e"), ("err_dq", "err dq", ".1e"),
               ("err_dk", "err dk", ".1e"), ("err_dv", "err dv", ".1e"), ("bitwise", "bitwise", "")]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    versions = package_versions(["triton-sigmoid"])
    result = result_header("sigmoid", versions)
    stem = "sigmoid" + ("_sweep" if args.sweep else "") + (f"_{args.tag}" if args.tag else "")
    for shape in args.shape_list:
        rows = sweep_shape(shape, args, device) if args.sweep else bench_shape(shape, args.impl_names, args, device)
        result["rows"].extend(rows)
        write_json(result, out / f"{stem}.json")
    if args.sweep:
        print(f"\nwrote {out / (stem + '.json')}")
        return
    plot(result["rows"], out / f"{stem}.png")
    for row in result["rows"]:
        if "error" in row:
            print(f"{row['impl']} {row['shape']}: {row['error'][:200]}")
    table = [dict(r, **{f"err_{k}": v for k, v in r.get("err", {}).items()}) for r in result["rows"]]
    print(f"\ndevice {result['device']}, torch {result['torch']}, triton {result['triton']}, {versions}; "
          f"errors against float64 on {args.err_heads} of {args.heads} heads")
    print_table(table, ROW_COLUMNS)
    print(f"wrote {out / (stem + '.json')} and {out / (stem + '.png')}")


if __name__ == "__main__":
    main()
