"""Sigmoid attention on Hopper (sm_90), written in Gluon: FlashAttention-3's design without its softmax statistics.

    applies(q, k, layout, causal, tiles) -> bool         whether a call takes this path (else the Triton kernels)
    forward(q, k, v, seq_q, seq_k, bias, layout, max_q, max_k, scale, bias_value, tiles) -> o
    backward(do, q, k, v, seq_q, seq_k, bias, layout, max_q, max_k, scale, bias_value, tiles) -> dq, dk, dv

The same function as sigmoid_attention_kernels.py (o_i = sum_k sigmoid(scale q_i.k_k + b) v_k, b per sequence and
head), for the calls that are most of the work: 16-bit inputs, D = 128, no causal mask, dense or packed varlen;
taken by default on sm_90 (Tiles.hopper; the forward from Tiles.hopper_fwd_min_keys keys on).
Every kernel runs one program per 2 x 64 rows of one head of one sequence, with three partitions:

    two consumer warpgroups (4 warps, 240 registers each): 64 rows each, their accumulators in registers, every
        product an asynchronous wgmma from shared memory (P or dS enters as operand A from registers)
    one producer warp (24 registers): TMA loads of the tiles both consumers walk, into an NS-deep ring of shared
        memory; a "ready" mbarrier per slot (the bytes landed) and an "empty" one (both consumers are done with it)

The kernels (one program: 128 rows; tiles through the ring: BLOCK rows each):
    _fwd    queries kept, K/V ringed; S of tile t + 1 is issued to the tensor cores before the sigmoids of tile t
            (FlashAttention-3's intra-warpgroup overlap), then O += P V
    _bwd    keys kept, Q/dO ringed: S^T = K Q^T and dP^T = V dO^T together, dV += P^T dO, dK += dS^T Q (DQ = 0)
    _dq     queries kept, K/V ringed: S = Q K^T and dP = dO V^T together, dQ += dS K (recomputed: no workspace)
    _bwd with DQ = 1 or 2 (Tiles.hopper_bwd_fused): both in one kernel: dS^T goes to shared memory and dS K of each
            query tile is added to a float32 dQ by atomic adds in a fixed order: warpgroup c of the tile's
            contributors (key blocks in order) spins on the tile's counter until it reads 128 c, adds, and each
            thread adds 1 with release semantics. Programs start in grid order, so the one waited for is resident
            or done. DQ = 2: the two warpgroups put their dQ tiles in shared memory and each adds half the rows of
            the sum (4 bytes of reduction per score instead of 8), four columns per instruction.
Every output row is written by one program (or, _bwd's dQ, summed in a fixed order), so o and the gradients repeat
bit for bit.

Tensors are read through TMA on their 2-D view [tokens, H * D]; a dense batch is the packed one with equal lengths.
A tile that runs past its sequence reads the next sequence's tokens (or zeros past the tensor), which the last tile
of each loop masks; a loop walks at least one tile, so an empty sequence gives zeros without a branch. Sequences
are launched longest first (an argsort on the device), so the short ones fill the last wave.

Gluon is Triton's layout-explicit language (triton.experimental.gluon); these kernels compile with Triton 3.6 (the
GPU image) and 3.9; the CPU interpreter cannot run them: tests/kernels/test_sm90_compile.py compiles them for sm_90
offline, tests/kernels/test_sigmoid_attention_gpu.py checks them against float64 and the Triton kernels.
"""
from __future__ import annotations

import functools

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from mini_of3.kernels.host import allocate, interpreting

HEAD_DIMS = (128, )                             # D = 64: our Triton kernels are faster (H100)
NUM_WARPS = 4                                  # the default partition: consumer warpgroup 0; the workers
                                               # (warp_specialize): consumer warpgroup 1 (4 warps, 240 registers),
                                               # the producer (1 warp, 24 registers)
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared     # 3.9 / 3.6 name


# ---------------------------------------------------------------------------------------------------------------
# pieces shared by the kernels


@gluon.constexpr_function
def mma_layout(block_n, num_warps):
    """wgmma accumulator layout for [rows, block_n] fp32, warps stacked along the rows."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, block_n, 16])


@gluon.jit
def _sequence(cu_q, cu_k, order, ROWS: gl.constexpr, WG: gl.constexpr):
    """-> (sequence, first query, Lq, first key, Lk, head, first row of warpgroup WG of the program's 2 x ROWS)."""
    seq = gl.load(order + gl.program_id(2))
    start_q = gl.load(cu_q + seq)
    start_k = gl.load(cu_k + seq)
    len_q = gl.load(cu_q + seq + 1) - start_q
    len_k = gl.load(cu_k + seq + 1) - start_k
    return seq, start_q, len_q, start_k, len_k, gl.program_id(1), (gl.program_id(0) * 2 + WG) * ROWS


@gluon.jit
def _coefficients(seq, h, len_k, bias_ptr, sb_s, sb_h, bias_value, scale, BIAS_KIND: gl.constexpr,
                  TANH: gl.constexpr):
    """(mul, add): the sigmoid's argument is s * mul + add for the raw score s (b as in the Triton kernels)."""
    if BIAS_KIND == "tensor":
        bias = gl.load(bias_ptr + seq * sb_s + h * sb_h)
    elif BIAS_KIND == "scalar":
        bias = bias_value
    else:
        bias = -gl.log(gl.maximum(len_k, 1).to(gl.float32))
    unit = 0.5 if TANH else 1.4426950408889634
    return scale * unit, bias * unit


@gluon.jit
def _sigmoid(z, TANH: gl.constexpr):
    """TANH: 0.5 + 0.5 tanh.approx(z), z = x / 2 (TritonSigmoid's); else 1 / (1 + 2^-z), z = x log2(e) ("rcp")."""
    if TANH:
        t = gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [z], dtype=gl.float32, is_pure=True, pack=1)
        return 0.5 + 0.5 * t
    else:
        return gl.inline_asm_elementwise(
            "{ .reg .f32 e; neg.f32 e, $1; ex2.approx.ftz.f32 e, e; add.f32 e, e, 0f3F800000; "
            "rcp.approx.ftz.f32 $0, e; }", "=f,f", [z], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _below(values, first, length, AXIS: gl.constexpr, layout: gl.constexpr, N: gl.constexpr):
    """values with the entries whose index first + i along AXIS is >= length set to 0."""
    index = first + gl.arange(0, N, layout=gl.SliceLayout(1 - AXIS, layout))
    if AXIS == 0:
        return gl.where(index[:, None] < length, values, 0.0)
    else:
        return gl.where(index[None, :] < length, values, 0.0)


@gluon.jit
def _store_rows(ptr, value, start, length, r0, h, H, ROWS: gl.constexpr, D: gl.constexpr, layout: gl.constexpr):
    """Rows r0 .. r0 + ROWS (those < length) of head h of the sequence at ``start`` of a [tokens, H, D] tensor."""
    rows = r0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    ptrs = ptr + ((start + rows[:, None]).to(gl.int64) * H + h) * D + cols[None, :]
    gl.store(ptrs, value.to(ptr.dtype.element_ty), mask=rows[:, None] < length)


@gluon.jit
def _load_kept(a_desc, b_desc, row, col, a_smem, b_smem, bar):
    """The two tiles a consumer keeps for its whole loop (Q, or K and V, or Q and dO), waited for."""
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    _tma_load(a_desc, [row, col], bar, a_smem)
    _tma_load(b_desc, [row, col], bar, b_smem)
    mbarrier.wait(bar, 0)


@gluon.jit
def _alloc_kept(desc):
    """Shared memory for two kept tiles of ``desc``'s block and the barrier of their load."""
    a = gl.allocate_shared_memory(desc.dtype, desc.block_type.shape, desc.layout)
    b = gl.allocate_shared_memory(desc.dtype, desc.block_type.shape, desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    return a, b, bar


@gluon.jit
def ring_barriers(NS: gl.constexpr, CONSUMERS: gl.constexpr):
    """'ready' and 'empty' mbarriers [NS, 1] of a ring: a slot is ready once its bytes landed (the producer's
    expect), empty once all CONSUMERS have arrived."""
    ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NS):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=CONSUMERS)
    return ready, empty


@gluon.jit
def alloc_ring(desc, NS: gl.constexpr, CONSUMERS: gl.constexpr = 2):
    """Two rings [NS, *block] of ``desc`` (K and V, or Q and dO) with their ring_barriers."""
    a = gl.allocate_shared_memory(desc.dtype, [NS] + desc.block_type.shape, desc.layout)
    b = gl.allocate_shared_memory(desc.dtype, [NS] + desc.block_type.shape, desc.layout)
    ready, empty = ring_barriers(NS, CONSUMERS)
    return a, b, ready, empty


@gluon.jit
def _ring_tiles(length, TILE: gl.constexpr):
    """Tiles a loop walks over ``length`` ringed rows: at least one (an empty sequence: one masked tile)."""
    return gl.maximum(gl.cdiv(length, TILE), 1)


@gluon.jit
def _producer(a_desc, b_desc, a_ring, b_ring, ready, empty, cu_q, cu_k, order, OWN: gl.constexpr,
              KEYS_RINGED: gl.constexpr, NS: gl.constexpr):
    """The producer warp: while the program's first own row is in its sequence, TMA every ringed tile (keys when
    KEYS_RINGED, else queries) into the next slot both consumers have released."""
    seq, start_q, len_q, start_k, len_k, h, first = _sequence(cu_q, cu_k, order, OWN, 0)
    TILE: gl.constexpr = a_desc.block_type.shape[0]
    D: gl.constexpr = a_desc.block_type.shape[1]
    if KEYS_RINGED:
        own, ringed, ring_start = len_q, len_k, start_k
    else:
        own, ringed, ring_start = len_k, len_q, start_q
    if first < own:
        for t in range(_ring_tiles(ringed, TILE)):
            slot = t % NS
            mbarrier.wait(empty.index(slot), ((t // NS) & 1) ^ 1)     # parity 1 of a fresh barrier passes at once
            mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            _tma_load(a_desc, [ring_start + t * TILE, h * D], ready.index(slot), a_ring.index(slot))
            _tma_load(b_desc, [ring_start + t * TILE, h * D], ready.index(slot), b_ring.index(slot))


# ---------------------------------------------------------------------------------------------------------------
# forward


@gluon.jit
def _fwd_consumer(q_kept, bar_kept, k_ring, v_ring, ready, empty, q_desc, o_ptr, cu_q, cu_k, order, bias_ptr, sb_s,
                  sb_h, bias_value, H, scale, BN: gl.constexpr, NS: gl.constexpr, BIAS_KIND: gl.constexpr,
                  TANH: gl.constexpr, WG: gl.constexpr):
    """Consumer WG: o of its BM queries = sum over the key tiles of sigmoid(Q K^T) V, S of the next tile in flight
    while this tile's sigmoids are evaluated."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    s_layout: gl.constexpr = mma_layout(BN, 4)
    o_layout: gl.constexpr = mma_layout(D, 4)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    seq, start_q, len_q, start_k, len_k, h, m0 = _sequence(cu_q, cu_k, order, BM, WG)
    q_smem = q_kept.index(WG)
    if m0 - WG * BM < len_q:
        mbarrier.expect(bar_kept.index(WG), q_desc.block_type.nbytes)
        _tma_load(q_desc, [start_q + m0, h * D], bar_kept.index(WG), q_smem)
        mbarrier.wait(bar_kept.index(WG), 0)
        mul, add = _coefficients(seq, h, len_k, bias_ptr, sb_s, sb_h, bias_value, scale, BIAS_KIND, TANH)
        acc = gl.zeros([BM, D], gl.float32, o_layout)
        n_tiles = _ring_tiles(len_k, BN)
        mbarrier.wait(ready.index(0), 0)
        s = warpgroup_mma(q_smem, k_ring.index(0).permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout),
                          use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s, ))
        for t in range(n_tiles - 1):
            slot = t % NS
            nxt = (t + 1) % NS
            mbarrier.wait(ready.index(nxt), ((t + 1) // NS) & 1)
            s_next = warpgroup_mma(q_smem, k_ring.index(nxt).permute((1, 0)),
                                   gl.zeros([BM, BN], gl.float32, s_layout), use_acc=False, is_async=True)
            p = _sigmoid(s * mul + add, TANH)
            acc = warpgroup_mma(gl.convert_layout(p.to(q_desc.dtype), p_layout), v_ring.index(slot), acc,
                                is_async=True)
            s, acc = warpgroup_mma_wait(0, deps=(s_next, acc))
            mbarrier.arrive(empty.index(slot))
        last = n_tiles - 1
        p = _below(_sigmoid(s * mul + add, TANH), last * BN, len_k, 1, s_layout, BN)
        acc = warpgroup_mma(gl.convert_layout(p.to(q_desc.dtype), p_layout), v_ring.index(last % NS), acc,
                            is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(empty.index(last % NS))
        _store_rows(o_ptr, acc, start_q, len_q, m0, h, H, BM, D, o_layout)


@gluon.jit
def _fwd(q_desc, k_desc, v_desc, o_ptr, cu_q, cu_k, order, bias_ptr, sb_s, sb_h, bias_value, H, scale,
         NS: gl.constexpr, BIAS_KIND: gl.constexpr, TANH: gl.constexpr):
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    q_kept = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    bar_kept = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for w in gl.static_range(2):
        mbarrier.init(bar_kept.index(w), count=1)
    k_ring, v_ring, ready, empty = alloc_ring(k_desc, NS)
    gl.warp_specialize([
        (_fwd_consumer, (q_kept, bar_kept, k_ring, v_ring, ready, empty, q_desc, o_ptr, cu_q, cu_k, order, bias_ptr,
                         sb_s, sb_h, bias_value, H, scale, BN, NS, BIAS_KIND, TANH, 0)),
        (_fwd_consumer, (q_kept, bar_kept, k_ring, v_ring, ready, empty, q_desc, o_ptr, cu_q, cu_k, order, bias_ptr,
                         sb_s, sb_h, bias_value, H, scale, BN, NS, BIAS_KIND, TANH, 1)),
        (_producer, (k_desc, v_desc, k_ring, v_ring, ready, empty, cu_q, cu_k, order, BM, True, NS)),
    ], [4, 1], [240, 24])


# ---------------------------------------------------------------------------------------------------------------
# backward: dK and dV per key block (DQ = 0), and in the one-kernel backward (DQ = 1, 2) dQ added over the key
# blocks in a fixed order


@gluon.jit
def _wait_turn(lock_ptr, expected):
    """Each thread of the warpgroup spins until the counter at lock_ptr reaches ``expected`` (acquire: what the
    earlier contributors added before their release is visible after it); returns the value it saw."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    ptrs = lock_ptr + gl.zeros([128], gl.int32, layout)
    return gl.inline_asm_elementwise(
        "{ .reg .pred p; SPIN: ld.acquire.gpu.global.s32 $0, [$1]; setp.lt.s32 p, $0, $2; @p bra SPIN; }",
        "=r,l,r", [ptrs, gl.zeros([128], gl.int32, layout) + expected], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _pass_turn(lock_ptr, count):
    """Each thread adds ``count`` (1, or 0 for a warpgroup that adds nothing) to the counter, after its own dQ
    additions (release)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    gl.atomic_add(lock_ptr + gl.zeros([128], gl.int32, layout), gl.zeros([128], gl.int32, layout) + count,
                  sem="release", scope="gpu")


@gluon.jit
def _add_pairs(ptrs, values, keep):
    """float32 atomic adds of ``values`` at ``ptrs`` where ``keep``, two neighbouring columns per instruction
    (red.global.add.v2.f32: the wgmma layout gives each thread pairs of columns; one L2 operation per 8 bytes)."""
    return gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $6, 0; @p red.global.gpu.relaxed.add.v2.f32 [$2], {$4, $5}; "
        "mov.b32 $0, 0; mov.b32 $1, 0; }",
        "=r,=r,l,l,f,f,r,r", [ptrs.to(gl.int64, bitcast=True), values, keep.to(gl.int32)], dtype=gl.int32,
        is_pure=False, pack=2)


@gluon.jit
def _add_quads(ptrs, values, keep):
    """float32 atomic adds of ``values`` at ``ptrs`` where ``keep``, four neighbouring columns per instruction
    (red.global.add.v4.f32) from a layout that gives each thread runs of 4 columns."""
    return gl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $12, 0; @p red.global.gpu.relaxed.add.v4.f32 [$4], {$8, $9, $10, $11}; "
        "mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0; }",
        "=r,=r,=r,=r,l,l,l,l,f,f,f,f,r,r,r,r", [ptrs.to(gl.int64, bitcast=True), values, keep.to(gl.int32)],
        dtype=gl.int32, is_pure=False, pack=4)


@gluon.jit
def _add_pair_sum(dq, part, parts, parts_ready, parts_free, t, m0, len_q, dq_acc, D: gl.constexpr, COLS: gl.constexpr,
                  WG: gl.constexpr, LAST_PART: gl.constexpr, MASKED: gl.constexpr):
    """DQ = 2: this warpgroup's dQ columns [part COLS, (part + 1) COLS) into its shared [BM, D] buffer; after the
    last part, once both warpgroups' buffers are full, add rows [WG BM / 2, (WG + 1) BM / 2) of their sum (in the
    order warpgroup 0 + warpgroup 1) to dQ, four columns per instruction."""
    if part == 0:
        mbarrier.wait(parts_free, (t & 1) ^ 1)          # both have read tile t - 1's buffers (a fresh barrier passes)
    parts.index(WG).slice(part * COLS, COLS, dim=1).store(dq)
    if LAST_PART:
        mbarrier.arrive(parts_ready)
        mbarrier.wait(parts_ready, t & 1)
        BM: gl.constexpr = parts.shape[1]
        ROWS: gl.constexpr = BM // 2
        sum_layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
        total = (parts.index(0).slice(WG * ROWS, ROWS, dim=0).load(sum_layout)
                 + parts.index(1).slice(WG * ROWS, ROWS, dim=0).load(sum_layout))
        mbarrier.arrive(parts_free)
        rows = m0 + WG * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, sum_layout))
        cols = gl.arange(0, D, layout=gl.SliceLayout(0, sum_layout))
        keep = (rows[:, None] < len_q) & (cols[None, :] >= 0) if MASKED else gl.full([ROWS, D], 1, gl.int1,
                                                                                      sum_layout)
        _add_quads(dq_acc + rows[:, None] * D + cols[None, :], total, keep)


@gluon.jit
def _bwd_tile(dk, dv, k_smem, v_smem, ds_smem, q_slot, do_slot, dq_acc, lock_ptr, expected, count, n0, len_k, m0,
              len_q, mul, add, scale, BN: gl.constexpr, BM: gl.constexpr, st_layout: gl.constexpr,
              acc_layout: gl.constexpr, TANH: gl.constexpr, MASKED: gl.constexpr, parts, parts_ready, parts_free,
              t, WG: gl.constexpr, DQ: gl.constexpr, PARTS: gl.constexpr = 4):
    """dk, dv [BN, D] + the query tile [m0, m0 + BM)'s contributions (MASKED: queries >= Lq give none); DQ > 0:
    its dQ contribution dS K [BM, D] added to the float32 rows dq_acc + m0 * D once the previous contributor to the
    tile has passed the turn, in PARTS products of D / PARTS columns (one [BM, D] accumulator beside dK and dV
    spills); DQ = 2 through the two warpgroups' sum (_add_pair_sum)."""
    op_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    st = warpgroup_mma(k_smem, q_slot.permute((1, 0)), gl.zeros([BN, BM], gl.float32, st_layout), use_acc=False,
                       is_async=True)
    dpt = warpgroup_mma(v_smem, do_slot.permute((1, 0)), gl.zeros([BN, BM], gl.float32, st_layout), use_acc=False,
                        is_async=True)
    if DQ:
        _wait_turn(lock_ptr, expected)                                       # while the two products run
    st, dpt = warpgroup_mma_wait(0, deps=(st, dpt))
    pt = _sigmoid(st * mul + add, TANH)                                                      # [BN, BM]
    if MASKED:
        pt = _below(pt, m0, len_q, 1, st_layout, BM)
    dst = dpt * pt * (1.0 - pt) * scale
    if DQ:                                  # keys past the sequence add nothing to dQ (their dK rows are not stored)
        dst = _below(dst, n0, len_k, 0, st_layout, BN).to(q_slot.dtype)
        ds_smem.store(dst)
        fence_async_shared()
    dv = warpgroup_mma(gl.convert_layout(pt.to(q_slot.dtype), op_a), do_slot, dv, is_async=True)
    dk = warpgroup_mma(gl.convert_layout(dst.to(q_slot.dtype), op_a), q_slot, dk, is_async=True)
    dk, dv = warpgroup_mma_wait(0, deps=(dk, dv))
    if DQ:
        _dq_contribution(k_smem, ds_smem, dq_acc, lock_ptr, count, m0, len_q, BM, MASKED, parts, parts_ready,
                         parts_free, t, WG, DQ, PARTS)
    return dk, dv


@gluon.jit
def _dq_contribution(k_smem, ds_smem, dq_acc, lock_ptr, count, m0, len_q, BM: gl.constexpr, MASKED: gl.constexpr,
                     parts, parts_ready, parts_free, t, WG: gl.constexpr, DQ: gl.constexpr, PARTS: gl.constexpr):
    """dS K of the query tile (dS^T in ds_smem) added to dQ, then the turn passed (see _bwd_tile)."""
    D: gl.constexpr = k_smem.shape[1]
    COLS: gl.constexpr = D // PARTS
    part_layout: gl.constexpr = mma_layout(COLS, 4)
    rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, part_layout))
    cols = gl.arange(0, COLS, layout=gl.SliceLayout(0, part_layout))
    for part in gl.static_range(PARTS):
        dq = warpgroup_mma(ds_smem.permute((1, 0)), k_smem.slice(part * COLS, COLS, dim=1),
                           gl.zeros([BM, COLS], gl.float32, part_layout), use_acc=False, is_async=True)
        dq = warpgroup_mma_wait(0, deps=(dq, ))
        if DQ == 2:
            _add_pair_sum(dq, part, parts, parts_ready, parts_free, t, m0, len_q, dq_acc, D, COLS, WG,
                          part == PARTS - 1, MASKED)
        else:
            ptrs = dq_acc + rows[:, None] * D + part * COLS + cols[None, :]
            if MASKED:  # rows past the sequence; a warpgroup past its keys adds dS = 0 in full tiles (x + 0 = x)
                _add_pairs(ptrs, dq, (rows[:, None] < len_q) & (count > 0) & (cols[None, :] >= 0))
            else:
                _add_pairs(ptrs, dq, gl.full([BM, COLS], 1, gl.int1, part_layout))
    _pass_turn(lock_ptr, count)


@gluon.jit
def _bwd_consumer(k_kept, v_kept, ds_kept, bar_kept, q_ring, do_ring, ready, empty, k_desc, v_desc, dk_ptr, dv_ptr,
                  dq_acc, locks, total_q, n_q_tiles, cu_q, cu_k, order, bias_ptr, sb_s, sb_h, bias_value, H, scale,
                  parts, parts_ready, parts_free, BM: gl.constexpr, NS: gl.constexpr, BIAS_KIND: gl.constexpr,
                  TANH: gl.constexpr, DQ: gl.constexpr, WG: gl.constexpr):
    """Consumer WG: dK, dV of its BN keys over every query tile of the sequence, and (DQ = 1) their dQ
    contributions: this warpgroup is contributor c = 2 program + WG of each query tile, which waits until the
    counter of the tile reads 128 c (every thread of contributors 0 .. c - 1 has added its rows and passed the
    turn). DQ = 2: the program is contributor c = program (both warpgroups add half the rows of their sum; the
    counter reads 256 c)."""
    BN: gl.constexpr = k_desc.block_type.shape[0]
    D: gl.constexpr = k_desc.block_type.shape[1]
    st_layout: gl.constexpr = mma_layout(BM, 4)
    acc_layout: gl.constexpr = mma_layout(D, 4)
    seq, start_q, len_q, start_k, len_k, h, n0 = _sequence(cu_q, cu_k, order, BN, WG)
    k_smem = k_kept.index(WG)
    v_smem = v_kept.index(WG)
    ds_smem = ds_kept.index(WG)
    if n0 - WG * BN < len_k:
        _load_kept(k_desc, v_desc, start_k + n0, h * D, k_smem, v_smem, bar_kept.index(WG))
        mul, add = _coefficients(seq, h, len_k, bias_ptr, sb_s, sb_h, bias_value, scale, BIAS_KIND, TANH)
        if DQ == 2:
            count = 1
            expected = gl.program_id(0) * 256
        else:
            count = (n0 < len_k).to(gl.int32)              # 0: the second warpgroup past the sequence's keys
            expected = (gl.program_id(0) * 2 + WG) * 128 * count
        dq_rows = dq_acc + (h.to(gl.int64) * total_q + start_q) * D              # [H, total_q, D] float32
        lock_row = locks + (seq * H + h) * n_q_tiles
        dk = gl.zeros([BN, D], gl.float32, acc_layout)
        dv = gl.zeros([BN, D], gl.float32, acc_layout)
        n_tiles = _ring_tiles(len_q, BM)
        for t in range(n_tiles - 1):
            slot = t % NS
            mbarrier.wait(ready.index(slot), (t // NS) & 1)
            dk, dv = _bwd_tile(dk, dv, k_smem, v_smem, ds_smem, q_ring.index(slot), do_ring.index(slot), dq_rows,
                               lock_row + t, expected, count, n0, len_k, t * BM, len_q, mul, add, scale, BN, BM,
                               st_layout, acc_layout, TANH, False, parts, parts_ready, parts_free, t, WG, DQ)
            mbarrier.arrive(empty.index(slot))
        last = n_tiles - 1
        mbarrier.wait(ready.index(last % NS), (last // NS) & 1)
        dk, dv = _bwd_tile(dk, dv, k_smem, v_smem, ds_smem, q_ring.index(last % NS), do_ring.index(last % NS),
                           dq_rows, lock_row + last, expected, count, n0, len_k, last * BM, len_q, mul, add, scale,
                           BN, BM, st_layout, acc_layout, TANH, True, parts, parts_ready, parts_free, last, WG, DQ)
        mbarrier.arrive(empty.index(last % NS))
        _store_rows(dk_ptr, dk, start_k, len_k, n0, h, H, BN, D, acc_layout)
        _store_rows(dv_ptr, dv, start_k, len_k, n0, h, H, BN, D, acc_layout)


@gluon.jit
def _bwd(q_desc, k_desc, v_desc, do_desc, dk_ptr, dv_ptr, dq_acc, locks, total_q, n_q_tiles, cu_q, cu_k, order,
         bias_ptr, sb_s, sb_h, bias_value, H, scale, NS: gl.constexpr, BIAS_KIND: gl.constexpr, TANH: gl.constexpr,
         DQ: gl.constexpr):
    """dK, dV (DQ = 0: the two-kernel backward's first; dq_acc, locks, total_q and n_q_tiles unused) and, DQ = 1
    or 2, the float32 dQ [H, tokens, D] from zeros (locks: zeros [sequences, H, n_q_tiles])."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    D: gl.constexpr = k_desc.block_type.shape[1]
    parts = gl.allocate_shared_memory(gl.float32, [2 if DQ == 2 else 1, BM, D if DQ == 2 else 4],
                                      gl.SwizzledSharedLayout(2, 1, 8, [1, 0]))
    parts_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    parts_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(parts_ready, count=2)
    mbarrier.init(parts_free, count=2)
    k_kept = gl.allocate_shared_memory(k_desc.dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    v_kept = gl.allocate_shared_memory(k_desc.dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    ds_kept = gl.allocate_shared_memory(k_desc.dtype, [2, BN, BM] if DQ else [2, 8, 8],
                                        gl.NVMMASharedLayout.get_default_for([BN, BM] if DQ else [8, 8],
                                                                             k_desc.dtype))
    bar_kept = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for w in gl.static_range(2):
        mbarrier.init(bar_kept.index(w), count=1)
    q_ring, do_ring, ready, empty = alloc_ring(q_desc, NS)
    gl.warp_specialize([
        (_bwd_consumer, (k_kept, v_kept, ds_kept, bar_kept, q_ring, do_ring, ready, empty, k_desc, v_desc, dk_ptr,
                         dv_ptr, dq_acc, locks, total_q, n_q_tiles, cu_q, cu_k, order, bias_ptr, sb_s, sb_h,
                         bias_value, H, scale, parts, parts_ready, parts_free, BM, NS, BIAS_KIND, TANH, DQ, 0)),
        (_bwd_consumer, (k_kept, v_kept, ds_kept, bar_kept, q_ring, do_ring, ready, empty, k_desc, v_desc, dk_ptr,
                         dv_ptr, dq_acc, locks, total_q, n_q_tiles, cu_q, cu_k, order, bias_ptr, sb_s, sb_h,
                         bias_value, H, scale, parts, parts_ready, parts_free, BM, NS, BIAS_KIND, TANH, DQ, 1)),
        (_producer, (q_desc, do_desc, q_ring, do_ring, ready, empty, cu_q, cu_k, order, BN, False, NS)),
    ], [4, 1], [240, 24])


# ---------------------------------------------------------------------------------------------------------------
# backward: dQ per query block


@gluon.jit
def _dq_tile(dq, q_smem, do_smem, k_slot, v_slot, n0, len_k, mul, add, scale, BM: gl.constexpr, BN: gl.constexpr,
             s_layout: gl.constexpr, acc_layout: gl.constexpr, TANH: gl.constexpr, MASKED: gl.constexpr):
    """dq [BM, D] + dS K over the key tile [n0, n0 + BN) (MASKED: keys >= Lk give nothing)."""
    s = warpgroup_mma(q_smem, k_slot.permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout), use_acc=False,
                      is_async=True)
    dp = warpgroup_mma(do_smem, v_slot.permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout), use_acc=False,
                       is_async=True)
    s, dp = warpgroup_mma_wait(0, deps=(s, dp))
    p = _sigmoid(s * mul + add, TANH)
    ds = dp * p * (1.0 - p) * scale
    if MASKED:
        ds = _below(ds, n0, len_k, 1, s_layout, BN)
    op_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    dq = warpgroup_mma(gl.convert_layout(ds.to(k_slot.dtype), op_a), k_slot, dq, is_async=True)
    return warpgroup_mma_wait(0, deps=(dq, ))


@gluon.jit
def _dq_consumer(q_kept, do_kept, bar_kept, k_ring, v_ring, ready, empty, q_desc, do_desc, dq_ptr, cu_q, cu_k, order,
                 bias_ptr, sb_s, sb_h, bias_value, H, scale, BN: gl.constexpr, NS: gl.constexpr,
                 BIAS_KIND: gl.constexpr, TANH: gl.constexpr, WG: gl.constexpr):
    """Consumer WG: dQ of its BM queries over every key tile of the sequence."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    s_layout: gl.constexpr = mma_layout(BN, 4)
    acc_layout: gl.constexpr = mma_layout(D, 4)
    seq, start_q, len_q, start_k, len_k, h, m0 = _sequence(cu_q, cu_k, order, BM, WG)
    q_smem = q_kept.index(WG)
    do_smem = do_kept.index(WG)
    if m0 - WG * BM < len_q:
        _load_kept(q_desc, do_desc, start_q + m0, h * D, q_smem, do_smem, bar_kept.index(WG))
        mul, add = _coefficients(seq, h, len_k, bias_ptr, sb_s, sb_h, bias_value, scale, BIAS_KIND, TANH)
        dq = gl.zeros([BM, D], gl.float32, acc_layout)
        n_tiles = _ring_tiles(len_k, BN)
        for t in range(n_tiles - 1):
            slot = t % NS
            mbarrier.wait(ready.index(slot), (t // NS) & 1)
            dq = _dq_tile(dq, q_smem, do_smem, k_ring.index(slot), v_ring.index(slot), t * BN, len_k, mul, add,
                          scale, BM, BN, s_layout, acc_layout, TANH, False)
            mbarrier.arrive(empty.index(slot))
        last = n_tiles - 1
        mbarrier.wait(ready.index(last % NS), (last // NS) & 1)
        dq = _dq_tile(dq, q_smem, do_smem, k_ring.index(last % NS), v_ring.index(last % NS), last * BN, len_k, mul,
                      add, scale, BM, BN, s_layout, acc_layout, TANH, True)
        mbarrier.arrive(empty.index(last % NS))
        _store_rows(dq_ptr, dq, start_q, len_q, m0, h, H, BM, D, acc_layout)


@gluon.jit
def _dq(q_desc, k_desc, v_desc, do_desc, dq_ptr, cu_q, cu_k, order, bias_ptr, sb_s, sb_h, bias_value, H, scale,
        NS: gl.constexpr, BIAS_KIND: gl.constexpr, TANH: gl.constexpr):
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    q_kept = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    do_kept = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    bar_kept = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for w in gl.static_range(2):
        mbarrier.init(bar_kept.index(w), count=1)
    k_ring, v_ring, ready, empty = alloc_ring(k_desc, NS)
    gl.warp_specialize([
        (_dq_consumer, (q_kept, do_kept, bar_kept, k_ring, v_ring, ready, empty, q_desc, do_desc, dq_ptr, cu_q, cu_k,
                        order, bias_ptr, sb_s, sb_h, bias_value, H, scale, BN, NS, BIAS_KIND, TANH, 0)),
        (_dq_consumer, (q_kept, do_kept, bar_kept, k_ring, v_ring, ready, empty, q_desc, do_desc, dq_ptr, cu_q, cu_k,
                        order, bias_ptr, sb_s, sb_h, bias_value, H, scale, BN, NS, BIAS_KIND, TANH, 1)),
        (_producer, (k_desc, v_desc, k_ring, v_ring, ready, empty, cu_q, cu_k, order, BM, True, NS)),
    ], [4, 1], [240, 24])


# ---------------------------------------------------------------------------------------------------------------
# host side


def launch(kernel, grid: tuple, *args, **kwargs) -> None:
    """``kernel[grid](...)`` through Gluon's JIT, the launch the GPU tests have run; host.launch (the compiled kernel
    called directly) is the alternative tools/lab/sigmoid_kernels_gpu.py times against it."""
    kernel[grid](*args, **kwargs)


@functools.cache
def _is_sm90(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) == (9, 0)


def applies(q: torch.Tensor, k: torch.Tensor, layout: str, causal: bool, tiles) -> bool:
    """Whether a call runs on these kernels: Tiles.hopper on, an sm_90 GPU, 16-bit inputs at D = 128, no
    causal mask, the dense or packed layout, some queries and keys, the "rcp" or "tanh" evaluation (else: the Triton
    kernels)."""
    return bool(tiles.hopper and q.is_cuda and not interpreting() and q.dtype in (torch.bfloat16, torch.float16)
                and q.shape[-1] in HEAD_DIMS and not causal and layout in ("dense", "varlen")
                and q.numel() > 0 and k.numel() > 0 and tiles.sigmoid in ("rcp", "tanh")
                and _is_sm90(q.device.index if q.device.index is not None else torch.cuda.current_device()))


def sequence_tables(q: torch.Tensor, k: torch.Tensor, seq_q, seq_k, layout: str
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cu_seqlens of the queries, of the keys, the sequences in launch order: most scores first), int32 on q's
    device; a dense [B, T, H, D] batch is B packed sequences of T tokens. No host synchronisation."""
    if layout == "dense":
        B, Tq, Tk = q.shape[0], q.shape[1], k.shape[1]
        steps = torch.arange(B + 1, dtype=torch.int32, device=q.device)
        return steps * Tq, steps * Tk, steps[:B]
    scores = (seq_q[1:] - seq_q[:-1]).long() * (seq_k[1:] - seq_k[:-1]).long()
    return seq_q, seq_k, torch.argsort(scores, descending=True, stable=True).to(torch.int32)


def _descriptor(t: torch.Tensor, rows: int) -> TensorDescriptor:
    """TMA descriptor of [rows, D] tiles of t [..., H, D] through its 2-D view [tokens, H * D] (made contiguous and
    16-byte aligned first where it is not)."""
    t = t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.contiguous()
    block = [rows, t.shape[-1]]
    dtype = gl.bfloat16 if t.dtype == torch.bfloat16 else gl.float16
    return TensorDescriptor.from_tensor(t.view(-1, t.shape[-2] * t.shape[-1]), block,
                                        gl.NVMMASharedLayout.get_default_for(block, dtype))


def _bias_args(bias, bias_value, q: torch.Tensor) -> tuple:
    """(bias table pointer, its two strides, the scalar, BIAS_KIND) as the Triton kernels take them."""
    kind = "tensor" if bias is not None else ("scalar" if bias_value is not None else "keys")
    table = bias if bias is not None else q
    strides = bias.stride() if bias is not None else (0, 0)
    return (table, *strides, 0.0 if bias_value is None else float(bias_value)), kind


def _grid(max_rows: int, rows_per_warpgroup: int, H: int, n_seq: int) -> tuple[int, int, int]:
    return triton.cdiv(max_rows, 2 * rows_per_warpgroup), H, n_seq


def forward(q, k, v, seq_q, seq_k, bias, layout: str, max_q: int, max_k: int, scale: float,
            bias_value: float | None, tiles) -> torch.Tensor:
    """o (q's shape, contiguous) by _fwd."""
    o = allocate(q.shape, q.dtype, q.device)
    cu_q, cu_k, order = sequence_tables(q, k, seq_q, seq_k, layout)
    block_n = tiles.hopper_fwd_block_n or (128 if layout == "dense" else 64)
    bias_args, kind = _bias_args(bias, bias_value, q)
    H = q.shape[-2]
    launch(_fwd, _grid(max_q, 64, H, order.numel()), _descriptor(q, 64), _descriptor(k, block_n),
           _descriptor(v, block_n), o, cu_q, cu_k, order, *bias_args, H, scale, NS=tiles.hopper_fwd_stages,
           BIAS_KIND=kind, TANH=tiles.sigmoid == "tanh", num_warps=NUM_WARPS)
    return o


def backward(do, q, k, v, seq_q, seq_k, bias, layout: str, max_q: int, max_k: int, scale: float,
             bias_value: float | None, tiles) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv (the inputs' shapes, contiguous) by _bwd (DQ = 0: dk, dv), then _dq; or (Tiles.hopper_bwd_fused
    1, or 2 with the two warpgroups' dQ tiles summed first) by _bwd alone into a float32 dq [H, tokens, D], cast
    after."""
    dq = allocate(q.shape, q.dtype, q.device)
    dk = allocate(k.shape, k.dtype, k.device)
    dv = allocate(v.shape, v.dtype, v.device)
    cu_q, cu_k, order = sequence_tables(q, k, seq_q, seq_k, layout)
    block = tiles.hopper_bwd_block
    bias_args, kind = _bias_args(bias, bias_value, q)
    H, n_seq = q.shape[-2], order.numel()
    q_desc, k_desc, v_desc, do_desc = (_descriptor(t, block) for t in (q, k, v, do))
    flags = dict(NS=tiles.hopper_bwd_stages, BIAS_KIND=kind, TANH=tiles.sigmoid == "tanh", num_warps=NUM_WARPS)
    grid = _grid(max_k, block, H, n_seq)
    if tiles.hopper_bwd_fused:
        D = q.shape[-1]
        total_q = q.numel() // (H * D)
        n_q_tiles = max(triton.cdiv(max_q, block), 1)
        dq_acc = torch.zeros(H, total_q, D, dtype=torch.float32, device=q.device)
        locks = torch.zeros(n_seq * H * n_q_tiles, dtype=torch.int32, device=q.device)
        launch(_bwd, grid, q_desc, k_desc, v_desc, do_desc, dk, dv, dq_acc, locks, total_q, n_q_tiles, cu_q, cu_k,
               order, *bias_args, H, scale, DQ=tiles.hopper_bwd_fused, **flags)
        dq.view(total_q, H, D).copy_(dq_acc.transpose(0, 1))
        return dq, dk, dv
    launch(_bwd, grid, q_desc, k_desc, v_desc, do_desc, dk, dv, dk, order, 0, 1, cu_q, cu_k, order, *bias_args, H,
           scale, DQ=0, **flags)
    launch(_dq, _grid(max_q, block, H, n_seq), q_desc, k_desc, v_desc, do_desc, dq, cu_q, cu_k, order, *bias_args,
           H, scale, **flags)
    return dq, dk, dv

