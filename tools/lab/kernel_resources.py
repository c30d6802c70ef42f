"""Compile the triangle-attention kernels (and the transition's, ``--kernel transition``) for the H200 (sm_90) on a
machine without a GPU, and report what each launch configuration costs in registers, spills (local-memory
loads/stores), shared memory, the CTAs per SM that registers and shared memory each allow, and which MMA
instructions the SASS holds (HGMMA = Hopper wgmma, HMMA = mma.sync).

Occupancy, not bandwidth, limits these kernels (Nsight Compute: 12.5 % occupancy, register-limited), and
registers can be read here at no device time. The problem is specialised as the JIT sees a contiguous one (unit
strides are the constant 1, pointers and other strides divisible by 16), which is what makes the loads vectorise.
Uses ptxas and cuobjdump from Triton's own package, so the figures are those of the Triton that runs it. The GPU
machine's is 3.6, and its register allocation differs from 3.9's (the packed sigmoid forward: 184 registers with 3.6,
140 with 3.9); to read what the GPU will run, compile with 3.6 in a virtual environment that sees this torch:

    python -m venv --system-site-packages /tmp/t36 && /tmp/t36/bin/pip install triton==3.6.0
    PYTHONPATH=. /tmp/t36/bin/python tools/lab/kernel_resources.py --kernel sigmoid --head-dim 128 --layout varlen

    python tools/lab/kernel_resources.py                 # the autotuning candidates of every kernel, D = 32
    python tools/lab/kernel_resources.py --head-dim 64 --maxnreg 168
    python tools/lab/kernel_resources.py --mask-queries  # the key- and query-bounded loops (mask_queries=True)
    python tools/lab/kernel_resources.py --kernel transition   # tiles of the fused transition, C = 128, n = 4
    python tools/lab/kernel_resources.py --kernel sigmoid --head-dim 128 --sigmoid rcp,tanh
                                         # sigmoid attention's kernels at their default tiles, dense, with the
                                         # special-function (MUFU) and branch instructions of each evaluation
    python tools/lab/kernel_resources.py --kernel sigmoid --head-dim 128 --layout varlen   # the packed layout
    python tools/lab/kernel_resources.py --kernel sigmoid_hopper --head-dim 64   # sigmoid_attention_hopper.py's
                                         # Gluon kernels at their default tiles (BJ, BK: rows kept, rows ringed
                                         # per stage; D = 64 or 128)
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from mini_of3.kernels import sigmoid_attention_hopper as SH  # noqa: E402
from mini_of3.kernels import sigmoid_attention_kernels as SK  # noqa: E402
from mini_of3.kernels import transition_kernels as TK  # noqa: E402
from mini_of3.kernels import triangle_attention_kernels as K  # noqa: E402
from mini_of3.kernels.sigmoid_attention_host import DEFAULT_TILES  # noqa: E402
from mini_of3.kernels.triangle_attention_host import _dkdv_configs, _dq_configs, _fwd_configs  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
SMEM_PER_SM, SMEM_PER_CTA = 228 * 1024, 1024   # sm_90: shared memory per SM, and what the system reserves per CTA
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
DIVISIBLE = ("N", "NN", "AB_PART", "Tq", "Tk")   # N a multiple of 16 (every crop size), T too, as the JIT sees them
UNIT_STRIDES = ("sq_d", "sk_d", "sv_d", "so_d", "sd_d", "sg_d", "sb_k", "sm_k", "so_k")
POINTERS = dict(Q="*bf16", K="*bf16", V="*bf16", BIAS="*fp32", KEY_BIAS="*i1", KEY_END="*i32", BOUNDS="*i32",
                O="*bf16", LSE="*fp32", DO="*bf16",
                DELTA="*fp32", DELTA0="*fp32", G="*bf16", DQ="*bf16", DK="*bf16", DV="*bf16", DBIAS="*fp32",
                X="*fp32", LN_W="*fp32", LN_B="*fp32", W_A="*bf16", W_B="*bf16", W_O="*bf16", OUT="*bf16",
                MEAN="*fp32", RSTD="*fp32", DOUT="*bf16", DX="*fp32", HIDDEN="*bf16", DAB="*bf16", XN="*bf16",
                PART="*fp32", SEQ_Q="*i32", SEQ_K="*i32", WS="*bf16", WS_OFF="*i64")
FLOATS = ("scale", "bias_value")
# (rows, hidden chunk, warps, stages) of the transition's forward and backward kernels
TRANSITION_TILES = [(64, 64, 4, 2), (128, 64, 8, 2), (64, 128, 4, 2), (128, 32, 8, 3), (64, 32, 4, 3),
                    (64, 32, 8, 2), (128, 32, 8, 2), (32, 64, 4, 2), (128, 16, 8, 3), (64, 16, 4, 2)]


def compile_kernel(fn, constexprs: dict, num_warps: int, num_stages: int, maxnreg: int | None = None):
    """Compile ``fn`` for sm_90 with the given constexprs, specialised as the JIT would for a contiguous input."""
    constexprs = dict(constexprs)
    for name in UNIT_STRIDES:
        if name in fn.arg_names:
            constexprs[name] = 1
    signature, attrs = {}, {}
    for idx, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        signature[name] = POINTERS.get(name, "fp32" if name in FLOATS else "i32")
        if name in POINTERS or name.startswith("s") and name not in FLOATS or name in DIVISIBLE:
            attrs[(idx,)] = [["tt.divisibility", 16]]
    options = {"num_warps": num_warps, "num_stages": num_stages, **({"maxnreg": maxnreg} if maxnreg else {})}
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs), target=TARGET,
                          options=options)


def compile_hopper(fn, ringed: int, kept: int, stages: int, bias_kind: str, tanh: bool, head_dim: int = 128,
                   extra: dict | None = None):
    """Compile a Gluon kernel of sigmoid_attention_hopper.py for sm_90: bf16, ``kept`` rows per consumer warpgroup,
    ``ringed`` rows per ring stage."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    def descriptor(rows):
        layout = gl.NVMMASharedLayout.get_default_for([rows, head_dim], gl.bfloat16)
        return f"tensordesc<bf16[{rows}, {head_dim}],{layout!r}>"
    rows = {"fwd": dict(q_desc=kept, k_desc=ringed, v_desc=ringed),
            "dkdv": dict(q_desc=ringed, do_desc=ringed, k_desc=kept, v_desc=kept),
            "bwd": dict(q_desc=ringed, do_desc=ringed, k_desc=kept, v_desc=kept),
            "dq": dict(q_desc=kept, do_desc=kept, k_desc=ringed, v_desc=ringed)}[fn.__name__.lstrip("_")]
    types = dict(cu_q="*i32", cu_k="*i32", order="*i32", bias_ptr="*fp32", sb_s="i32", sb_h="i32", bias_value="fp32",
                 H="i32", scale="fp32", dq_acc="*fp32", locks="*i32", total_q="i32", n_q_tiles="i32",
                 **{name: descriptor(n) for name, n in rows.items()})
    signature = {name: types.get(name, "*bf16" if name.endswith("_ptr") else "constexpr") for name in fn.arg_names}
    constexprs = dict(NS=stages, BIAS_KIND=bias_kind, TANH=tanh, **(extra or {}))
    return triton.compile(GluonASTSource(fn, signature, constexprs), target=TARGET,
                          options={"num_warps": SH.NUM_WARPS})


def resources(compiled) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run([BIN / "cuobjdump", "--dump-resource-usage", cubin], capture_output=True,
                               text=True, check=True).stdout
        sass = subprocess.run([BIN / "cuobjdump", "--dump-sass", cubin], capture_output=True, text=True,
                              check=True).stdout
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    return {"regs": regs, "stack": int(re.search(r"STACK:(\d+)", usage).group(1)),
            "smem": compiled.metadata.shared, "local_ld": sass.count("LDL"), "local_st": sass.count("STL"),
            "mma": "HGMMA" if "HGMMA" in sass else ("HMMA" if "HMMA" in sass else "-"),
            "mufu": sass.count("MUFU."), "bra": sass.count(" BRA"),
            "instructions": len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/", sass, re.M)),
            "ctas_per_sm_by_regs": 65536 // (regs * 32 * compiled.metadata.num_warps),
            "ctas_per_sm_by_smem": SMEM_PER_SM // (compiled.metadata.shared + SMEM_PER_CTA)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", choices=("fwd", "dq", "dkdv", "dbias", "all", "transition", "sigmoid",
                                             "sigmoid_hopper"),
                        default="all")
    parser.add_argument("--sigmoid", default="rcp,tanh", help="--kernel sigmoid: the evaluations compiled")
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--layout", choices=("dense", "padded", "varlen"), default="dense",
                        help="--kernel sigmoid: the layout compiled")
    parser.add_argument("--maxnreg", type=int, default=None)
    parser.add_argument("--full-loops", action="store_true", help="the key loops over every key tile (no KEY_END "
                        "bound: skip_masked_keys off)")
    parser.add_argument("--mask-queries", action="store_true", help="the kernels of mask_queries=True (MASK_QUERIES: "
                        "query tiles past a row's last valid key skipped, masked queries zeroed)")
    args = parser.parse_args()
    d = args.head_dim
    common = dict(HAS_KEY_BIAS=True, SIGMOID=False, FAST_EXP=True, DOT_PREC="tf32", BLOCK_D=d,
                  GATED=True, HAS_KEY_END=not args.full_loops,   # the model's gated attention, with a pair mask
                  MASK_QUERIES=args.mask_queries)
    jobs = []   # the default backward: the forward (lse, p unsplit), dQ (exact delta), dK/dV, dbias
    if args.kernel in ("fwd", "all"):
        for c in _fwd_configs(d):
            jobs.append(("fwd", K._fwd, dict(common, STORE_LSE=True, **c.kwargs), c.num_warps,
                         c.num_stages, c.maxnreg))
    if args.kernel in ("dq", "all"):
        for c in _dq_configs(d):
            jobs.append((f"dq r{c.kwargs['ROWS']}", K._bwd_dq, dict(common, SPLIT_DS=True, **c.kwargs),
                         c.num_warps, c.num_stages, c.maxnreg))
    if args.kernel in ("dkdv", "all"):
        for c in _dkdv_configs(d):
            name = f"dkdv p{c.kwargs['PREFETCH']}"     # p: loads ahead (0, 1 q/dO, 2 +bias)
            jobs.append((name, K._bwd_dkdv, dict(common, SPLIT_DS=True, **c.kwargs), c.num_warps, c.num_stages))
    if args.kernel in ("dbias", "all"):
        block = 64 if d <= 64 else 32
        tiles = [(block, block, 4, 1), (block, block, 4, 2), (block, block, 4, 3), (block, block, 8, 2)]
        if d <= 32:   # wider tiles: fewer q, k, v, dO bytes per score
            tiles += [(128, 64, 8, 2), (64, 128, 8, 2), (128, 128, 8, 2)]
        for bj, bk, warps, stages in tiles:
            jobs.append(("dbias", K._bwd_dbias, dict(common, BLOCK_J=bj, BLOCK_K=bk), warps, stages))
    if args.kernel == "transition":     # BLOCK_J, BLOCK_K columns: rows and hidden chunk
        for m, hc, warps, stages in TRANSITION_TILES:
            flags = dict(C=128, HID=512, DOT_PREC="tf32", BLOCK_M=m, BLOCK_J=m, BLOCK_K=hc, BLOCK_C=128, BLOCK_HC=hc)
            jobs.append(("transition fwd", TK._transition_fwd, dict(flags, STORE_STATS=True), warps, stages))
            jobs.append(("transition bwd", TK._transition_bwd, flags, warps, stages))
    if args.kernel == "sigmoid":       # BLOCK_J, BLOCK_K columns: queries and keys of each kernel's tile
        t = DEFAULT_TILES[d]
        for variant in args.sigmoid.split(","):
            flags = dict(LAYOUT=args.layout, CAUSAL=False, BIAS_KIND="keys", SIGMOID=variant, ASM=True,
                         DOT_PREC="tf32", HEAD_DIM=d)
            tiles = dict(fwd=(t.fwd_block_m, t.fwd_block_n, t.fwd_warps, t.fwd_stages),
                         dkdv=(t.dkdv_block_m, t.dkdv_block_n, t.dkdv_warps, t.dkdv_stages),
                         dq=(t.dq_block_m, t.dq_block_n, t.dq_warps, t.dq_stages))
            for kernel, fn, extra in (("fwd", SK._fwd, {}), ("dkdv", SK._bwd_dkdv, dict(STORE_DS=False)),
                                      ("dkdv", SK._bwd_dkdv, dict(STORE_DS=True)), ("dq", SK._bwd_dq, {})):
                m, n, warps, stages = tiles[kernel]
                name = f"{kernel}{' +dS' if extra.get('STORE_DS') else ''} {variant}"
                jobs.append((name, fn, dict(flags, **extra, BLOCK_M=m, BLOCK_N=n, BLOCK_J=m, BLOCK_K=n), warps,
                             stages, (t.fwd_registers or None) if kernel == "fwd" and args.layout != "dense" else None))
        jobs.append(("dq from dS", SK._bwd_dq_scores, dict(LAYOUT=args.layout, CAUSAL=False, DOT_PREC="tf32",
                                                          HEAD_DIM=d,
                                                          BLOCK_M=t.dqs_block_m, BLOCK_N=t.dqs_block_n,
                                                          BLOCK_J=t.dqs_block_m, BLOCK_K=t.dqs_block_n),
                     t.dqs_warps, t.dqs_stages))
    if args.kernel == "sigmoid_hopper":   # warps: the default partition's (two more warpgroups' worth run beside)
        d = d if d in SH.HEAD_DIMS else 128
        t = DEFAULT_TILES[d]
        for variant in args.sigmoid.split(","):
            backward = (t.hopper_bwd_block, t.hopper_bwd_block, t.hopper_bwd_stages)
            for name, fn, ringed, kept, stages, extra in (
                    ("fwd", SH._fwd, 128, 64, t.hopper_fwd_stages, None),
                    ("fwd packed", SH._fwd, 64, 64, t.hopper_fwd_stages, None),
                    ("dkdv", SH._bwd, *backward, {"DQ": 0}), ("dq", SH._dq, *backward, None),
                    ("bwd", SH._bwd, *backward, {"DQ": 1}), ("bwd pairs", SH._bwd, *backward, {"DQ": 2})):
                jobs.append((f"hopper {name} {variant}", fn, dict(BLOCK_J=kept, BLOCK_K=ringed, ringed=ringed,
                                                                  kept=kept, stages=stages, tanh=variant == "tanh",
                                                                  head_dim=d, extra=extra), SH.NUM_WARPS, stages))
    print(f"{'kernel':14s}{'BJ':>5s}{'BK':>5s}{'warps':>6s}{'stages':>7s}{'regs':>6s}{'CTA:reg':>8s}{':smem':>6s}"
          f"{'stack':>6s}{'LDL':>5s}{'STL':>5s}{'smem':>8s}  mma  {'MUFU':>5s}{'BRA':>5s}{'instr':>6s}")
    for name, fn, flags, warps, stages, *cap in jobs:   # cap: the launch's maxnreg, where it sets one
        if name.startswith("hopper"):
            compiled = compile_hopper(fn, flags["ringed"], flags["kept"], stages, "keys", flags["tanh"],
                                      flags["head_dim"], flags["extra"])
        else:
            compiled = compile_kernel(fn, {k: v for k, v in flags.items() if k in fn.arg_names}, warps, stages,
                                      cap[0] if cap and cap[0] else args.maxnreg)
        r = resources(compiled)
        print(f"{name:14s}{flags['BLOCK_J']:5d}{flags['BLOCK_K']:5d}{warps:6d}{stages:7d}{r['regs']:6d}"
              f"{r['ctas_per_sm_by_regs']:8d}{r['ctas_per_sm_by_smem']:6d}{r['stack']:6d}{r['local_ld']:5d}"
              f"{r['local_st']:5d}{r['smem']:8d}  "
              f"{r['mma']:5s}{r['mufu']:5d}{r['bra']:5d}{r['instructions']:6d}", flush=True)


if __name__ == "__main__":
    main()
