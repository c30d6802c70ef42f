"""Sigmoid-attention forward written in Gluon for Hopper (sm_90): a lab probe for issues 41 and 42, not shipped code.

Targets Triton 3.6.0 (`triton.experimental.gluon`; the API differs in other Triton versions) and torch 2.11. The
question it answers: does a kernel with TMA loads, asynchronous wgmma and warp specialization (FlashAttention-3's
Hopper design) beat the Triton forward of `mini_of3.kernels.sigmoid_attention` (526 TFLOP/s at B = 1, T = 16384,
D = 128 with tanh on the H100, 12e9ef2), as issue 41's varlen bar (~730 TFLOP/s) and issue 42 would need?

    q, k, v, o  bf16 packed [total, H, D] with cu_seqlens [S + 1] (a dense [B, T, H, D] batch is the packed one with
                cu_seqlens 0, T, 2T, ...); o_i = sum_k sigmoid(q_i.k_k / sqrt(D) - log(L)) v_k over its sequence's
                L keys, as `sigmoid_attention` with its default bias.

One program per (block of queries, head, sequence), as the Triton kernel. The 2-D TMA view [total, H * D] gives each
head's [rows, D] tiles at column h * D; a key tile that runs past its sequence reads the next one's tokens (or zeros
past the end), which the last tile masks in registers; query rows past the sequence are not stored.

- `sig_fwd_pipelined`: one warpgroup; K/V tiles arrive by TMA into an NS-deep shared ring, one mbarrier per slot;
  S = Q K^T and O += P V by wgmma (P from registers); the slot is refilled as soon as its P V has retired.
- `sig_fwd_ws2`: two consumer warpgroups (the default partition and a 4-warp worker, BM queries each) read one K/V
  ring that a one-warp producer partition fills; "empty" waits for both consumers. While one warpgroup evaluates its
  sigmoids (MUFU) the other's wgmma can run: left to the warp schedulers, or (PINGPONG) enforced by two "turn"
  mbarriers as FlashAttention-3 does with named barriers (which Gluon 3.6 does not expose).

Both kernels optionally take FlashAttention-3's intra-warpgroup overlap (OVERLAP: S of the next key tile issued to
the tensor cores before this tile's sigmoids are evaluated).

Each runs with the sigmoid as TritonSigmoid's `tanh.approx` ("tanh") or as `1 / (1 + 2^-z)` by ex2.approx and
rcp.approx ("rcp", the default of `sigmoid_attention`), at the tilings of VARIANTS.

    python tools/lab/gluon_sigmoid_fwd.py      # compile every variant for sm_90 (no GPU needed): regs, spills, smem;
                                               # with a CUDA GPU also: error against float64 (one head) and against
                                               # the Triton kernel, and ms / TFLOP/s beside it, dense and packed
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import triton
from gluon_common import (alloc_rings, alloc_tile, compile_sm90, load_ring_pair, load_tile, mma_layout,
                          shared_layout)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

HEAD_D = 128
NUM_WARPS = 4                                 # the default partition: one consumer warpgroup


# ---- pieces shared by the kernels -----------------------------------------------------------------------------


@gluon.jit
def sequence(cu_ptr, BM: gl.constexpr, NWG: gl.constexpr = 1, WG: gl.constexpr = 0):
    """-> (first token of the program's sequence, its length L, head h, first query m0 of warpgroup WG)."""
    seq = gl.program_id(2)
    start = gl.load(cu_ptr + seq)
    length = gl.load(cu_ptr + seq + 1) - start
    m0 = (gl.program_id(0) * NWG + WG) * BM
    return start, length, gl.program_id(1), m0


@gluon.jit
def coefficients(length, scale, TANH: gl.constexpr):
    """(mul, add): z = s * mul + add is the argument of _sigmoid for the raw score s, bias b = -log(L)."""
    bias = -gl.log(gl.maximum(length, 1).to(gl.float32))
    if TANH:
        return scale * 0.5, bias * 0.5
    else:
        return scale * 1.4426950408889634, bias * 1.4426950408889634


@gluon.jit
def sigmoid(z, TANH: gl.constexpr):
    """tanh: 0.5 + 0.5 tanh.approx(z) with z = x / 2 (TritonSigmoid's); else 1 / (1 + 2^-z) with z = x log2(e)."""
    if TANH:
        t = gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [z], dtype=gl.float32, is_pure=True, pack=1)
        return 0.5 + 0.5 * t
    else:
        return gl.inline_asm_elementwise(
            "{ .reg .f32 e; neg.f32 e, $1; ex2.approx.ftz.f32 e, e; add.f32 e, e, 0f3F800000; "
            "rcp.approx.ftz.f32 $0, e; }", "=f,f", [z], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _tile(acc, q_smem, k_slot, v_slot, n0, length, mul, add, BM: gl.constexpr, BN: gl.constexpr,
          s_layout: gl.constexpr, o_layout: gl.constexpr, TANH: gl.constexpr, MASKED: gl.constexpr):
    """acc [BM, D] + sigmoid(Q K^T) V over one key tile (MASKED: keys >= length contribute nothing)."""
    s = gl.zeros([BM, BN], gl.float32, s_layout)
    s = warpgroup_mma(q_smem, k_slot.permute((1, 0)), s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    p = sigmoid(s * mul + add, TANH)
    if MASKED:
        cols = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        p = gl.where(cols[None, :] < length, p, 0.0)
    p_op = gl.convert_layout(p.to(gl.bfloat16), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    acc = warpgroup_mma(p_op, v_slot, acc, is_async=True)
    return warpgroup_mma_wait(0, deps=(acc, ))


@gluon.jit
def store_rows(ptr, value, start, length, r0, h, H, ROWS: gl.constexpr, D: gl.constexpr, layout: gl.constexpr):
    """Rows r0 .. r0 + ROWS of head h of a packed [total, H, D] bf16 tensor from ``value`` [ROWS, D], those < L."""
    rows = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))                          # [ROWS]
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, layout))                                  # [D]
    ptrs = ptr + ((start + rows[:, None]).to(gl.int64) * H + h) * D + cols[None, :]
    gl.store(ptrs, value.to(gl.bfloat16), mask=rows[:, None] < length)


@gluon.jit
def _alloc(q_desc, k_desc, NS: gl.constexpr, N_CONSUMERS: gl.constexpr = 1):
    """Shared memory: Q [BM, D] and its barrier, the K/V rings [NS, BN, D] with 'ready' and 'empty' per slot."""
    q_smem, q_bar = alloc_tile(q_desc)
    k_ring, v_ring, ready, empty = alloc_rings(k_desc, NS, N_CONSUMERS)
    return q_smem, k_ring, v_ring, q_bar, ready, empty


@gluon.jit
def _consume(q_smem, k_ring, v_ring, ready, empty, k_desc, v_desc, o_ptr, start, length, h, m0, H, scale,
             BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, NS: gl.constexpr, TANH: gl.constexpr,
             SIGNAL_EMPTY: gl.constexpr, num_warps: gl.constexpr):
    """One consumer warpgroup's key loop over the ring, then its output rows. SIGNAL_EMPTY: arrive on empty[slot]
    for a producer partition; else refill the slot itself."""
    s_layout: gl.constexpr = mma_layout(BN, num_warps)
    o_layout: gl.constexpr = mma_layout(D, num_warps)
    mul, add = coefficients(length, scale, TANH)
    acc = gl.zeros([BM, D], gl.float32, o_layout)
    n_tiles = gl.cdiv(length, BN)
    n_full = length // BN
    for t in range(n_tiles):
        slot = t % NS
        mbarrier.wait(ready.index(slot), (t // NS) & 1)
        if t < n_full:
            acc = _tile(acc, q_smem, k_ring.index(slot), v_ring.index(slot), t * BN, length, mul, add, BM, BN,
                        s_layout, o_layout, TANH, False)
        else:
            acc = _tile(acc, q_smem, k_ring.index(slot), v_ring.index(slot), t * BN, length, mul, add, BM, BN,
                        s_layout, o_layout, TANH, True)
        if SIGNAL_EMPTY:
            mbarrier.arrive(empty.index(slot))
        else:
            refill = t + NS
            load_ring_pair(k_desc, v_desc, start + refill * BN, h * D, ready.index(slot), k_ring.index(slot),
                     v_ring.index(slot), refill < n_tiles)
    store_rows(o_ptr, acc, start, length, m0, h, H, BM, D, o_layout)


@gluon.jit
def _release(slot, t, n_tiles, k_desc, v_desc, k_ring, v_ring, ready, empty, start, h, D: gl.constexpr,
             NS: gl.constexpr, BN: gl.constexpr, SIGNAL_EMPTY: gl.constexpr):
    """Tile t's slot is free: tell the producer (SIGNAL_EMPTY), or refill it with tile t + NS."""
    if SIGNAL_EMPTY:
        mbarrier.arrive(empty.index(slot))
    else:
        refill = t + NS
        load_ring_pair(k_desc, v_desc, start + refill * BN, h * D, ready.index(slot), k_ring.index(slot),
                 v_ring.index(slot), refill < n_tiles)


@gluon.jit
def _consume_overlap(q_smem, k_ring, v_ring, ready, empty, k_desc, v_desc, o_ptr, start, length, h, m0, H, scale,
                     BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, NS: gl.constexpr, TANH: gl.constexpr,
                     SIGNAL_EMPTY: gl.constexpr, num_warps: gl.constexpr):
    """_consume with FlashAttention-3's intra-warpgroup overlap: S of tile t + 1 is issued to the tensor cores
    before the sigmoids of tile t are evaluated, so the two run at once. Every tile but the last runs unmasked."""
    s_layout: gl.constexpr = mma_layout(BN, num_warps)
    o_layout: gl.constexpr = mma_layout(D, num_warps)
    mul, add = coefficients(length, scale, TANH)
    acc = gl.zeros([BM, D], gl.float32, o_layout)
    n_tiles = gl.cdiv(length, BN)
    mbarrier.wait(ready.index(0), 0)
    s = warpgroup_mma(q_smem, k_ring.index(0).permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout),
                      use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    for t in range(n_tiles - 1):
        slot = t % NS
        nxt = (t + 1) % NS
        mbarrier.wait(ready.index(nxt), ((t + 1) // NS) & 1)
        s_next = warpgroup_mma(q_smem, k_ring.index(nxt).permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout),
                               use_acc=False, is_async=True)
        p = sigmoid(s * mul + add, TANH)
        p_op = gl.convert_layout(p.to(gl.bfloat16), gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                                         k_width=2))
        acc = warpgroup_mma(p_op, v_ring.index(slot), acc, is_async=True)
        s, acc = warpgroup_mma_wait(0, deps=(s_next, acc))
        _release(slot, t, n_tiles, k_desc, v_desc, k_ring, v_ring, ready, empty, start, h, D, NS, BN, SIGNAL_EMPTY)
    last = n_tiles - 1
    p = sigmoid(s * mul + add, TANH)
    cols = last * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
    p = gl.where(cols[None, :] < length, p, 0.0)
    p_op = gl.convert_layout(p.to(gl.bfloat16), gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    acc = warpgroup_mma(p_op, v_ring.index(last % NS), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(acc, ))
    if SIGNAL_EMPTY:
        mbarrier.arrive(empty.index(last % NS))
    store_rows(o_ptr, acc, start, length, m0, h, H, BM, D, o_layout)


@gluon.jit
def _consume_pingpong(q_smem, k_ring, v_ring, ready, empty, turn, o_ptr, start, length, h, m0, H, scale,
                      BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, NS: gl.constexpr, TANH: gl.constexpr,
                      WG: gl.constexpr):
    """A consumer of sig_fwd_ws2 taking turns with the other on the tensor cores (FlashAttention-3's ping-pong,
    with mbarriers for its named barriers): warpgroup WG waits for turn[WG], issues S = Q K^T, hands the turn to the
    other and evaluates its sigmoids while the other's product runs. Warpgroup 0 has the first turn: waiting on a
    fresh barrier for parity 1 passes at once."""
    s_layout: gl.constexpr = mma_layout(BN, 4)
    o_layout: gl.constexpr = mma_layout(D, 4)
    mul, add = coefficients(length, scale, TANH)
    acc = gl.zeros([BM, D], gl.float32, o_layout)
    n_tiles = gl.cdiv(length, BN)
    n_full = length // BN
    for t in range(n_tiles):
        slot = t % NS
        mbarrier.wait(ready.index(slot), (t // NS) & 1)
        mbarrier.wait(turn.index(WG), (t & 1) ^ (1 - WG))
        s = warpgroup_mma(q_smem, k_ring.index(slot).permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout),
                          use_acc=False, is_async=True)
        mbarrier.arrive(turn.index(1 - WG))
        s = warpgroup_mma_wait(0, deps=(s, ))
        p = sigmoid(s * mul + add, TANH)
        if t >= n_full:
            cols = t * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
            p = gl.where(cols[None, :] < length, p, 0.0)
        p_op = gl.convert_layout(p.to(gl.bfloat16), gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                                         k_width=2))
        acc = warpgroup_mma(p_op, v_ring.index(slot), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(empty.index(slot))
    store_rows(o_ptr, acc, start, length, m0, h, H, BM, D, o_layout)


# ---- kernel 1: one warpgroup, the TMA ring refilled in-line ----------------------------------------------------


@gluon.jit
def sig_fwd_pipelined(q_desc, k_desc, v_desc, o_ptr, cu_ptr, H, scale, NS: gl.constexpr, TANH: gl.constexpr,
                      OVERLAP: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    q_smem, k_ring, v_ring, q_bar, ready, empty = _alloc(q_desc, k_desc, NS)
    start, length, h, m0 = sequence(cu_ptr, BM)
    if m0 < length:
        n_tiles = gl.cdiv(length, BN)
        for s in gl.static_range(NS):
            load_ring_pair(k_desc, v_desc, start + s * BN, h * D, ready.index(s), k_ring.index(s), v_ring.index(s),
                     s < n_tiles)
        load_tile(q_desc, start + m0, h * D, q_smem, q_bar)
        if OVERLAP:
            _consume_overlap(q_smem, k_ring, v_ring, ready, empty, k_desc, v_desc, o_ptr, start, length, h, m0, H,
                             scale, BM, BN, D, NS, TANH, False, num_warps)
        else:
            _consume(q_smem, k_ring, v_ring, ready, empty, k_desc, v_desc, o_ptr, start, length, h, m0, H, scale,
                     BM, BN, D, NS, TANH, False, num_warps)


# ---- kernel 2: two consumer warpgroups sharing one K/V ring, one producer warp ---------------------------------


@gluon.jit
def ring_producer(a_desc, b_desc, a_ring, b_ring, ready, empty, cu_ptr, OWN: gl.constexpr, TILE: gl.constexpr,
                  D: gl.constexpr, NS: gl.constexpr):
    """One warp of a two-consumer program (OWN rows each): wait until both consumers have released a slot, then TMA
    the next TILE rows of the two ringed tensors (K and V, or Q and dO) into it."""
    start, length, h, first = sequence(cu_ptr, OWN, 2, 0)
    if first < length:
        for t in range(gl.cdiv(length, TILE)):
            slot = t % NS
            mbarrier.wait(empty.index(slot), ((t // NS) & 1) ^ 1)     # parity 1 on a fresh barrier passes at once
            load_ring_pair(a_desc, b_desc, start + t * TILE, h * D, ready.index(slot), a_ring.index(slot),
                           b_ring.index(slot), True)


@gluon.jit
def _consumer_wg(q_smem, q_bar, k_ring, v_ring, ready, empty, q_desc, k_desc, v_desc, o_ptr, cu_ptr, H, scale,
                 BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, NS: gl.constexpr, TANH: gl.constexpr,
                 OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, turn, WG: gl.constexpr):
    """Consumer warpgroup WG of 2: its own Q tile (queries m0 .. m0 + BM) and accumulator, the shared ring. Both
    walk every key tile while the program's first query is in the sequence (the producer fills the ring for both)."""
    start, length, h, m0 = sequence(cu_ptr, BM, 2, WG)
    first = m0 - WG * BM
    if first < length:
        load_tile(q_desc, start + m0, h * D, q_smem, q_bar)
        if PINGPONG:
            _consume_pingpong(q_smem, k_ring, v_ring, ready, empty, turn, o_ptr, start, length, h, m0, H, scale,
                              BM, BN, D, NS, TANH, WG)
        elif OVERLAP:
            _consume_overlap(q_smem, k_ring, v_ring, ready, empty, k_desc, v_desc, o_ptr, start, length, h, m0, H,
                             scale, BM, BN, D, NS, TANH, True, 4)
        else:
            _consume(q_smem, k_ring, v_ring, ready, empty, k_desc, v_desc, o_ptr, start, length, h, m0, H, scale,
                     BM, BN, D, NS, TANH, True, 4)


@gluon.jit
def sig_fwd_ws2(q_desc, k_desc, v_desc, o_ptr, cu_ptr, H, scale, NS: gl.constexpr, TANH: gl.constexpr,
                OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    q0, k_ring, v_ring, bar0, ready, empty = _alloc(q_desc, k_desc, NS, 2)
    q1 = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    bar1 = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar1, count=1)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for w in gl.static_range(2):
        mbarrier.init(turn.index(w), count=1)
    gl.warp_specialize([
        (_consumer_wg, (q0, bar0, k_ring, v_ring, ready, empty, q_desc, k_desc, v_desc, o_ptr, cu_ptr, H, scale,
                        BM, BN, D, NS, TANH, OVERLAP, PINGPONG, turn, 0)),
        (_consumer_wg, (q1, bar1, k_ring, v_ring, ready, empty, q_desc, k_desc, v_desc, o_ptr, cu_ptr, H, scale,
                        BM, BN, D, NS, TANH, OVERLAP, PINGPONG, turn, 1)),
        (ring_producer, (k_desc, v_desc, k_ring, v_ring, ready, empty, cu_ptr, BM, BN, D, NS)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# ---- host side -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One kernel at one tiling: BM queries per consumer warpgroup, BN keys per stage, NS stages."""
    kernel: object
    bm: int
    bn: int
    ns: int
    tanh: bool
    overlap: bool = False                    # S of the next tile issued before this tile's sigmoids
    extra: tuple = ()                        # further constexprs, (name, value) pairs
    n_wg: int = 1                            # consumer warpgroups per program (queries per program: n_wg * bm)

    @property
    def name(self) -> str:
        return (f"{self.kernel.fn.__name__} {self.bm}x{self.bn} s{self.ns} {'tanh' if self.tanh else 'rcp'}"
                f"{' overlap' if self.overlap else ''}{' pingpong' if dict(self.extra).get('PINGPONG') else ''}")


WS2 = (("PRODUCER_REGS", 24), ("CONSUMER_REGS", 240), ("PINGPONG", False))
PINGPONG = (("PRODUCER_REGS", 24), ("CONSUMER_REGS", 240), ("PINGPONG", True))
VARIANTS = [                                 # shared memory: 64 x 64 x 2 stages leaves room for two CTAs per SM
    Variant(sig_fwd_pipelined, 64, 64, 2, True),
    Variant(sig_fwd_pipelined, 64, 64, 3, True),
    Variant(sig_fwd_pipelined, 64, 64, 2, True, True),
    Variant(sig_fwd_pipelined, 64, 128, 2, True, True),
    Variant(sig_fwd_ws2, 64, 64, 2, True, False, WS2, 2),
    Variant(sig_fwd_ws2, 64, 128, 2, True, False, WS2, 2),
    Variant(sig_fwd_ws2, 64, 64, 3, True, True, WS2, 2),
    Variant(sig_fwd_ws2, 64, 128, 2, True, True, WS2, 2),
    Variant(sig_fwd_ws2, 64, 128, 3, True, True, WS2, 2),
    Variant(sig_fwd_ws2, 64, 128, 2, False, True, WS2, 2),
    Variant(sig_fwd_ws2, 64, 128, 2, True, False, PINGPONG, 2),
    Variant(sig_fwd_ws2, 64, 64, 3, True, False, PINGPONG, 2),
]


def _signature(v: Variant) -> tuple[dict, dict]:
    types = {
        "q_desc": f"tensordesc<bf16[{v.bm}, {HEAD_D}],{shared_layout([v.bm, HEAD_D])!r}>",
        "k_desc": f"tensordesc<bf16[{v.bn}, {HEAD_D}],{shared_layout([v.bn, HEAD_D])!r}>",
        "v_desc": f"tensordesc<bf16[{v.bn}, {HEAD_D}],{shared_layout([v.bn, HEAD_D])!r}>",
        "o_ptr": "*bf16", "cu_ptr": "*i32", "H": "i32", "scale": "fp32",
    }
    constexprs = {"NS": v.ns, "TANH": v.tanh, "OVERLAP": v.overlap, "num_warps": NUM_WARPS, **dict(v.extra)}
    sig = {name: types.get(name, "constexpr") for name in v.kernel.arg_names}
    return sig, constexprs


def compile_offline(v: Variant) -> dict:
    """Compile for sm_90 without a GPU; -> regs, spills, shared bytes and a few PTX counts."""
    compiled, ptx, regs, spills = compile_sm90(v.kernel, *_signature(v), NUM_WARPS)
    return {"kernel": v.name, "regs": regs, "spill_bytes": spills, "smem": compiled.metadata.shared,
            "wgmma": ptx.count("wgmma.mma_async"), "setmaxnreg": ptx.count("setmaxnreg"),
            "tma": ptx.count("cp.async.bulk.tensor"), "mufu": len(re.findall(r"(tanh|ex2|rcp)\.approx", ptx))}


def gluon_launcher(v: Variant, q, k, v_, cu, max_len: int):
    """-> a function launching the variant on packed q, k, v bf16 [total, H, D] with cu_seqlens ``cu`` into o
    (returned); the TMA descriptors are built once, here, so a call is one launch."""
    total, H, D = q.shape
    o = torch.zeros_like(q)
    q_desc = TensorDescriptor.from_tensor(q.view(total, H * D), [v.bm, D], shared_layout([v.bm, D]))
    k_desc, v_desc = (TensorDescriptor.from_tensor(x.view(total, H * D), [v.bn, D], shared_layout([v.bn, D]))
                      for x in (k, v_))
    grid = (triton.cdiv(max_len, v.n_wg * v.bm), H, cu.numel() - 1)

    def launch():
        v.kernel[grid](q_desc, k_desc, v_desc, o, cu, H, 1.0 / math.sqrt(D), NS=v.ns, TANH=v.tanh,
                       OVERLAP=v.overlap, num_warps=NUM_WARPS, **dict(v.extra))
        return o
    return launch


def run_gpu(shape_name: str, variants: list[Variant]) -> None:
    """``variants`` beside mini_of3's Triton forward (tanh and rcp) on one benchmark shape of `bench sigmoid`:
    norm-relative error of o against float64 on head 0 and against the Triton forward of the same evaluation on all
    heads, ms and TFLOP/s over real tokens, the Triton and Gluon calls interleaved over rounds."""
    from mini_of3.bench.common import median_ms
    from mini_of3.bench.sigmoid import float64_reference, make_packed, parse_shape
    from mini_of3.kernels import sigmoid_attention
    from mini_of3.kernels.sigmoid_attention_host import sigmoid_tiles

    shape = parse_shape(shape_name, 16, (500, 16000))
    inputs = make_packed(shape, torch.device("cuda"), 0)
    q, k, v, cu, T = inputs["q"], inputs["k"], inputs["v"], inputs["cu"], shape.T
    ref = float64_reference(inputs, shape, 1)[0][:, 0]                                  # o of head 0, [total, D]

    def triton_fwd(evaluation):
        def call():
            with sigmoid_tiles(sigmoid=evaluation), torch.no_grad():
                return sigmoid_attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=T, max_seqlen_k=T)
        return call
    rows = [("triton tanh", triton_fwd("tanh"), None), ("triton rcp", triton_fwd("rcp"), None)]
    baseline = {"tanh": rows[0][1](), "rcp": rows[1][1]()}
    for variant in variants:
        try:
            rows.append((variant.name, gluon_launcher(variant, q, k, v, cu, T), "tanh" if variant.tanh else "rcp"))
        except Exception as e:  # a probe: report and go on to the next kernel
            print(f"{variant.name:34s} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
    times = {name: [] for name, _, _ in rows}
    errors = {}
    for name, fn, evaluation in rows:
        try:
            o = fn()
            torch.cuda.synchronize()
            err64 = ((o[:, 0].double() - ref).norm() / ref.norm()).item()
            err_triton = ((o.float() - baseline[evaluation].float()).norm()
                          / baseline[evaluation].float().norm()).item() if evaluation else 0.0
            errors[name] = (err64, err_triton)
        except Exception as e:  # a probe: report and go on to the next kernel
            print(f"{name:34s} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
    live = [(name, fn) for name, fn, _ in rows if name in errors]
    for _ in range(3):                                   # interleaved rounds: the card's drift falls on all alike
        for name, fn in live:
            times[name].append(median_ms(lambda r: fn(), warmup=3, reps=10))
    print(f"{shape_name}: B={shape.B} T<={T} H=16 D={shape.D}, {shape.flops_fwd() / 1e12:.2f} TFLOP forward")
    for name, _ in live:
        ms = sorted(times[name])[1]
        err64, err_triton = errors[name]
        print(f"  {name:34s} {ms:8.3f} ms  {shape.flops_fwd() / ms / 1e9:6.0f} TFLOP/s  err o {err64:.2e} (head 0 "
              f"vs float64)  {err_triton:.1e} (vs triton, same sigmoid)", flush=True)


def main() -> None:
    print(f"triton {triton.__version__}, torch {torch.__version__}; offline compile for sm_90, D={HEAD_D}")
    for variant in VARIANTS:
        try:
            r = compile_offline(variant)
            print(f"{r['kernel']:34s} regs {r['regs']}  spill stores {r['spill_bytes']} B  smem {r['smem']} B  "
                  f"wgmma {r['wgmma']}  tma {r['tma']}  setmaxnreg {r['setmaxnreg']}  sfu {r['mufu']}", flush=True)
        except Exception as e:  # a probe: report and go on to the next kernel
            print(f"{variant.name:34s} compile FAILED: {type(e).__name__}: {str(e)[:2000]}", flush=True)
    if torch.cuda.is_available():   # the ping-pong kernels last: a hang in their turn-taking loses only their rows
        pingpong = [v for v in VARIANTS if dict(v.extra).get("PINGPONG")]
        for shape_name in ("b1t16384d128", "varlen16d128"):
            run_gpu(shape_name, [v for v in VARIANTS if v not in pingpong])
        run_gpu("b1t16384d128", pingpong)


if __name__ == "__main__":
    main()
