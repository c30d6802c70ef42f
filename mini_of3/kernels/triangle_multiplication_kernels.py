"""Triton kernels of the fused triangle multiplicative update (AF3 SI Alg 12 outgoing, Alg 13 incoming).

Rows are pairs ij of one batch element b: pair = i * N + j, NN = N * N; a projection program takes BLOCK_M pairs of
one b (grid: (pair tiles, B)); the output kernels are persistent (grid: (programs,)), each program taking tiles of
BLOCK_P pairs p, p + programs, ... of all B * cdiv(NN, BLOCK_P), the next ones loading while one is computed.
Channels-first tensors are [B, channels, N, N] (the contraction's layout); pair-major ones are [B, N, N, C]
contiguous. The compute dtype (bf16 under autocast, else the input's) is the element type of the weights the launcher
passes (cast once on the host); every statistic and every epilogue is float32. FAST_GATES (GPU only) computes the
sigmoid gates with approximate special-function instructions.

The default path, in launch order (triangle_multiplication_host.py):
    _tri_mul_proj_fwd   grid: (pair tiles of BLOCK_M, B).
                reads z, the mask, norm_in, p_in, g_in, g_out; LayerNorm over C, the projections as tl.dot, the
                gate and the mask: writes a, b channels-first ([2, B * h, N, N]), g_out's pre-activation
                [B, N, N, C] and the LayerNorm statistics (mean, rstd [B, NN]).
    (cuBLAS)    t = a @ b^T (outgoing) or a^T @ b (incoming) on [B * h, N, N] views: [B * h, N, N].
    _tri_mul_out_fwd    grid: persistent, out_fwd_per_sm programs per SM over the B * cdiv(NN, BLOCK_P) pair tiles.
                reads t ([h, BLOCK_P] tiles, coalesced along pairs), norm_out, p_out, the g_out pre-activation;
                LayerNorm over h, p_out, the gate: writes the output [B, N, N, C] and the statistics of t.
backward:
    _tri_mul_out_bwd    grid: persistent, out_bwd_per_sm programs per SM over the pair tiles.
                reads t, its statistics, norm_out, p_out, the g_out pre-activation, dout; writes dt
                channels-first, dy = dout * sigmoid(g) [B, N, N, C], d(g_out pre-activation) channels-first into
                the last C rows of the projections' gradient buffer [B, 4 h + C, N, N], the affine LayerNorm output
                of t channels-first (the operand of the p_out weight GEMM), and per-program partial sums of the
                norm_out weight and bias gradients.
    (cuBLAS)    da, db from dt, a, b (transposed operands, no copies); the p_out weight gradient dy^T @ ta^T.
    _tri_mul_proj_bwd   grid: (pair tiles of BLOCK_M, B).
                reads z, its statistics, the mask, the weights, da, db, d(g_out pre-activation); recomputes the
                LayerNorm and the projections; writes dz, d(projections) channels-first into the first 4 h rows
                of that buffer, the normalised z in the compute dtype [B, N, N, C] (the weight GEMMs' operand) and
                per-program partial sums of the norm_in weight and bias gradients.
    (cuBLAS)    the p_in, g_in and g_out weight gradients as one GEMM over the materialised operands.
No atomics: every element is written by one program; the reductions over pairs are cuBLAS GEMMs or per-program
partials that torch sums in a fixed order afterwards.
"""
from __future__ import annotations

import triton
import triton.language as tl

from mini_of3.kernels.primitives import dot, sigmoid2


@triton.jit
def _pair_offsets(rows, N, s_i, s_j):
    """Offsets of pairs ij = i * N + j in a tensor with strides s_i, s_j (any layout of [., N, N, .])."""
    return (rows // N).to(tl.int64) * s_i + (rows % N).to(tl.int64) * s_j


@triton.jit
def _normalized_z(Z, b, rows, in_rows, offs_c, in_c, N, sz_b, sz_i, sz_j, sz_c, C: tl.constexpr):
    """z of BLOCK_M pairs as float32 [BM, BC] (0 outside), its mean and variance over the C channels."""
    ptrs = Z + b * sz_b + _pair_offsets(rows, N, sz_i, sz_j)[:, None] + offs_c[None, :] * sz_c
    z = tl.load(ptrs, mask=in_rows[:, None] & in_c[None, :], other=0.0).to(tl.float32)
    mean = tl.sum(z, axis=1) / C
    zc = tl.where(in_c[None, :], z - mean[:, None], 0.0)
    var = tl.sum(zc * zc, axis=1) / C
    return zc, mean, var


@triton.jit
def _pair_mask(MASK, b, rows, in_rows, N, sm_b, sm_i, sm_j, HAS_MASK: tl.constexpr):
    """The pair mask of BLOCK_M pairs as float32 [BM] (bool or float masks; 1 without a mask)."""
    if HAS_MASK:
        m = tl.load(MASK + b * sm_b + _pair_offsets(rows, N, sm_i, sm_j), mask=in_rows, other=0)
        return m.to(tl.float32)
    else:
        return tl.full(rows.shape, 1.0, dtype=tl.float32)


@triton.jit
def _weight_t(W, rows_w, in_w, offs_c, in_c, C: tl.constexpr):
    """Rows ``rows_w`` of a [*, C] weight, transposed: [BC, len(rows_w)] (0 outside), the right operand of x @ W^T."""
    return tl.load(W + rows_w[None, :] * C + offs_c[:, None], mask=in_w[None, :] & in_c[:, None], other=0.0)


@triton.jit
def _gate(x, FAST: tl.constexpr):
    """sigmoid(x), float32; FAST (GPU only) with the special-function unit's approximate ex2 and reciprocal, without
    the full-range division's fix-ups (about a fifth of an output kernel's instructions, offline SASS)."""
    if FAST:
        return sigmoid2(x * 1.4426950408889634, True)
    else:
        return tl.sigmoid(x)


# ---------------------------------------------------------------------------------------------------------------
# forward


@triton.jit
def _tri_mul_proj_fwd(Z, MASK, LN_W, LN_B, W_P, W_G, W_GO, AB, GPRE, MEAN, RSTD,
              sz_b, sz_i, sz_j, sz_c, sm_b, sm_i, sm_j, N, NN, AB_PART, eps,
              C: tl.constexpr, H: tl.constexpr, HAS_MASK: tl.constexpr, DOT_PREC: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HC: tl.constexpr, FAST_GATES: tl.constexpr = False):
    """AF3 SI Alg 12/13 lines 1-4 for BLOCK_M pairs: x = LayerNorm(z); a, b = (x p^T) * sigmoid(x g^T) * mask,
    stored channels-first; g_out's pre-activation x g_out^T stored pair-major; the LayerNorm statistics."""
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    cdt = W_P.dtype.element_ty
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)                                   # pairs ij
    in_rows = rows < NN
    offs_c = tl.arange(0, BLOCK_C)
    in_c = offs_c < C
    zc, mean, var = _normalized_z(Z, b, rows, in_rows, offs_c, in_c, N, sz_b, sz_i, sz_j, sz_c, C)
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(LN_W + offs_c, mask=in_c, other=0.0)
    beta = tl.load(LN_B + offs_c, mask=in_c, other=0.0)
    x = (zc * rstd[:, None] * w[None, :] + beta[None, :]).to(cdt)                # [BM, BC]
    m = _pair_mask(MASK, b, rows, in_rows, N, sm_b, sm_i, sm_j, HAS_MASK)         # [BM]
    for part in tl.static_range(2):                                                # a (rows 0..h-1), b (h..2h-1)
        for c0 in range(0, H, BLOCK_HC):
            ch = c0 + tl.arange(0, BLOCK_HC)
            in_ch = ch < H
            p = dot(x, _weight_t(W_P, part * H + ch, in_ch, offs_c, in_c, C), DOT_PREC)   # [BM, BHC]
            g = dot(x, _weight_t(W_G, part * H + ch, in_ch, offs_c, in_c, C), DOT_PREC)
            ab = p * _gate(g, FAST_GATES) * m[:, None]
            ptrs = AB + part * AB_PART + (b * H + ch)[None, :] * NN + rows[:, None]
            tl.store(ptrs, ab.to(cdt), mask=in_rows[:, None] & in_ch[None, :])
    gpre = dot(x, _weight_t(W_GO, offs_c, in_c, offs_c, in_c, C), DOT_PREC)      # [BM, BC]
    tl.store(GPRE + (b * NN + rows)[:, None] * C + offs_c[None, :], gpre.to(cdt),
             mask=in_rows[:, None] & in_c[None, :])
    tl.store(MEAN + b * NN + rows, mean, mask=in_rows)
    tl.store(RSTD + b * NN + rows, rstd, mask=in_rows)


@triton.jit
def _t_tile(T, b, rows, in_rows, offs_h, in_h, NN, H: tl.constexpr):
    """t of BLOCK_P pairs from the channels-first [B * h, NN] tensor as float32 [BP, BH] (0 outside); the pair axis
    is the contiguous one, so the load is coalesced along pairs."""
    ptrs = T + (b * H + offs_h)[None, :] * NN + rows[:, None]
    return tl.load(ptrs, mask=in_rows[:, None] & in_h[None, :], other=0.0).to(tl.float32)


@triton.jit
def _tile_rows(tile, tiles_per_b, NN, BLOCK_P: tl.constexpr):
    """Batch element, pairs and their bounds of tile ``tile`` of a persistent program (tiles of one b in order)."""
    b = (tile // tiles_per_b).to(tl.int64)
    rows = (tile % tiles_per_b) * BLOCK_P + tl.arange(0, BLOCK_P)
    return b, rows, rows < NN


@triton.jit
def _tri_mul_out_fwd(T, LN_W, LN_B, W_PO, GPRE, OUT, MEAN, RSTD, NN, n_tiles, eps,
             C: tl.constexpr, H: tl.constexpr, DOT_PREC: tl.constexpr,
             BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, FAST_GATES: tl.constexpr = False):
    """AF3 SI Alg 12/13 lines 4-5 for BLOCK_P pairs: out = sigmoid(g) * (LayerNorm_h(t) p_out^T), pair-major.
    Persistent: program p takes the tiles p, p + programs, ... of all n_tiles (B * cdiv(NN, BLOCK_P)); the loop's
    pipeline stages load the next tiles while one is computed, and p_out stays loaded."""
    cdt = W_PO.dtype.element_ty
    offs_h = tl.arange(0, BLOCK_H)
    in_h = offs_h < H
    offs_c = tl.arange(0, BLOCK_C)
    in_c = offs_c < C
    w = tl.load(LN_W + offs_h, mask=in_h, other=0.0)
    beta = tl.load(LN_B + offs_h, mask=in_h, other=0.0)
    w_po_t = _weight_t(W_PO, offs_c, in_c, offs_h, in_h, H)                      # [BH, BC] = p_out^T
    tiles_per_b = tl.cdiv(NN, BLOCK_P)
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        b, rows, in_rows = _tile_rows(tile, tiles_per_b, NN, BLOCK_P)
        t = _t_tile(T, b, rows, in_rows, offs_h, in_h, NN, H)                     # [BP, BH]
        mean = tl.sum(t, axis=1) / H
        tc = tl.where(in_h[None, :], t - mean[:, None], 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(tc * tc, axis=1) / H + eps)
        ta = tc * rstd[:, None] * w[None, :] + beta[None, :]
        y = dot(ta.to(cdt), w_po_t, DOT_PREC)                                    # [BP, BC]
        io = (b * NN + rows)[:, None] * C + offs_c[None, :]
        io_mask = in_rows[:, None] & in_c[None, :]
        g = tl.load(GPRE + io, mask=io_mask, other=0.0).to(tl.float32)
        tl.store(OUT + io, (_gate(g, FAST_GATES) * y).to(OUT.dtype.element_ty), mask=io_mask)
        tl.store(MEAN + b * NN + rows, mean, mask=in_rows)
        tl.store(RSTD + b * NN + rows, rstd, mask=in_rows)


# ---------------------------------------------------------------------------------------------------------------
# backward


@triton.jit
def _tri_mul_out_bwd(T, LN_W, LN_B, W_PO, GPRE, DOUT, MEAN, RSTD, DT, TA, DY, DPG, PART,
             sd_b, sd_i, sd_j, sd_c, N, NN, n_tiles,
             C: tl.constexpr, H: tl.constexpr, DOT_PREC: tl.constexpr,
             BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_H: tl.constexpr, FAST_GATES: tl.constexpr = False):
    """The backward of _tri_mul_out_fwd for BLOCK_P pairs: d(g pre-activation) channels-first into the last C rows
    of DPG [B, 4 h + C, NN], dy = dout * sigmoid(g) and the affine LayerNorm output ta (operands of the weight
    GEMMs), dt channels-first; per program, the partial sums of the norm_out gradients over its tiles. Persistent as
    _tri_mul_out_fwd."""
    pid = tl.program_id(0)
    cdt = W_PO.dtype.element_ty
    offs_h = tl.arange(0, BLOCK_H)
    in_h = offs_h < H
    offs_c = tl.arange(0, BLOCK_C)
    in_c = offs_c < C
    w = tl.load(LN_W + offs_h, mask=in_h, other=0.0)
    beta = tl.load(LN_B + offs_h, mask=in_h, other=0.0)
    w_po_t = _weight_t(W_PO, offs_c, in_c, offs_h, in_h, H)                        # [BH, BC] = p_out^T
    d_ln_w = tl.zeros([BLOCK_H], dtype=tl.float32)
    d_ln_b = tl.zeros([BLOCK_H], dtype=tl.float32)
    tiles_per_b = tl.cdiv(NN, BLOCK_P)
    for tile in tl.range(pid, n_tiles, tl.num_programs(0)):
        b, rows, in_rows = _tile_rows(tile, tiles_per_b, NN, BLOCK_P)
        t = _t_tile(T, b, rows, in_rows, offs_h, in_h, NN, H)                     # [BP, BH]
        mean = tl.load(MEAN + b * NN + rows, mask=in_rows, other=0.0)
        rstd = tl.load(RSTD + b * NN + rows, mask=in_rows, other=0.0)
        tn = tl.where(in_h[None, :], (t - mean[:, None]) * rstd[:, None], 0.0)
        ta = (tn * w[None, :] + beta[None, :]).to(cdt)                             # [BP, BH]
        y = dot(ta, w_po_t, DOT_PREC)                                             # [BP, BC]
        io = (b * NN + rows)[:, None] * C + offs_c[None, :]
        io_mask = in_rows[:, None] & in_c[None, :]
        g = _gate(tl.load(GPRE + io, mask=io_mask, other=0.0).to(tl.float32), FAST_GATES)
        dout_ptrs = DOUT + b * sd_b + _pair_offsets(rows, N, sd_i, sd_j)[:, None] + offs_c[None, :] * sd_c
        dout = tl.load(dout_ptrs, mask=io_mask, other=0.0).to(tl.float32)
        dy = (dout * g).to(cdt)
        dgpre_ptrs = DPG + b * (4 * H + C) * NN + (4 * H + offs_c)[None, :] * NN + rows[:, None]
        tl.store(dgpre_ptrs, (dout * y * g * (1.0 - g)).to(cdt), mask=io_mask)
        tl.store(DY + io, dy, mask=io_mask)
        tl.store(TA + (b * H + offs_h)[None, :] * NN + rows[:, None], ta, mask=in_rows[:, None] & in_h[None, :])
        dta = dot(dy, tl.trans(w_po_t), DOT_PREC)                                 # [BP, BH]
        d_ln_w += tl.sum(dta * tn, axis=0)                                         # norm_out weight
        d_ln_b += tl.sum(dta, axis=0)                                              # norm_out bias
        dtn = dta * w[None, :]
        mean_dtn = tl.sum(dtn, axis=1) / H
        mean_dtn_tn = tl.sum(dtn * tn, axis=1) / H
        dt = rstd[:, None] * (dtn - mean_dtn[:, None] - tn * mean_dtn_tn[:, None])
        tl.store(DT + (b * H + offs_h)[None, :] * NN + rows[:, None], dt.to(cdt),
                 mask=in_rows[:, None] & in_h[None, :])
    part = PART + pid * 2 * BLOCK_H + offs_h
    tl.store(part, d_ln_w)
    tl.store(part + BLOCK_H, d_ln_b)


@triton.jit
def _tri_mul_proj_bwd(Z, MASK, LN_W, LN_B, W_P, W_G, W_GO, DAB, MEAN, RSTD, DZ, DPG, X, PART,
              sz_b, sz_i, sz_j, sz_c, sm_b, sm_i, sm_j, N, NN, AB_PART,
              C: tl.constexpr, H: tl.constexpr, HAS_MASK: tl.constexpr, DOT_PREC: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HC: tl.constexpr, FAST_GATES: tl.constexpr = False):
    """The backward of _tri_mul_proj_fwd for BLOCK_M pairs: recomputes x and the projections; writes d(projections)
    channels-first into DPG [B, 4 h + C, NN] (rows: p_in's 2 h, then g_in's 2 h; the last C rows hold d(g_out
    pre-activation), read here), x in the compute dtype, dz, and partials of the norm_in gradients."""
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    cdt = W_P.dtype.element_ty
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    in_rows = rows < NN
    offs_c = tl.arange(0, BLOCK_C)
    in_c = offs_c < C
    ptrs = Z + b * sz_b + _pair_offsets(rows, N, sz_i, sz_j)[:, None] + offs_c[None, :] * sz_c
    z = tl.load(ptrs, mask=in_rows[:, None] & in_c[None, :], other=0.0).to(tl.float32)
    mean = tl.load(MEAN + b * NN + rows, mask=in_rows, other=0.0)
    rstd = tl.load(RSTD + b * NN + rows, mask=in_rows, other=0.0)
    xhat = tl.where(in_c[None, :], (z - mean[:, None]) * rstd[:, None], 0.0)      # [BM, BC]
    w = tl.load(LN_W + offs_c, mask=in_c, other=0.0)
    beta = tl.load(LN_B + offs_c, mask=in_c, other=0.0)
    x = (xhat * w[None, :] + beta[None, :]).to(cdt)
    io = (b * NN + rows)[:, None] * C + offs_c[None, :]
    io_mask = in_rows[:, None] & in_c[None, :]
    tl.store(X + io, x, mask=io_mask)
    m = _pair_mask(MASK, b, rows, in_rows, N, sm_b, sm_i, sm_j, HAS_MASK)
    dpg_b = DPG + b * (4 * H + C) * NN
    dgpre = tl.load(dpg_b + (4 * H + offs_c)[None, :] * NN + rows[:, None], mask=io_mask, other=0.0)   # [BM, BC]
    w_go = tl.load(W_GO + offs_c[:, None] * C + offs_c[None, :], mask=in_c[:, None] & in_c[None, :], other=0.0)
    dx = dot(dgpre, w_go, DOT_PREC)                                               # [BM, BC]
    for part in tl.static_range(2):
        for c0 in range(0, H, BLOCK_HC):
            ch = c0 + tl.arange(0, BLOCK_HC)
            in_ch = ch < H
            w_p_t = _weight_t(W_P, part * H + ch, in_ch, offs_c, in_c, C)         # [BC, BHC]
            w_g_t = _weight_t(W_G, part * H + ch, in_ch, offs_c, in_c, C)
            p = dot(x, w_p_t, DOT_PREC)                                           # [BM, BHC]
            s = _gate(dot(x, w_g_t, DOT_PREC), FAST_GATES)
            cf_mask = in_rows[:, None] & in_ch[None, :]
            dab = tl.load(DAB + part * AB_PART + (b * H + ch)[None, :] * NN + rows[:, None], mask=cf_mask,
                          other=0.0).to(tl.float32) * m[:, None]
            dp = (dab * s).to(cdt)
            dg = (dab * p * s * (1.0 - s)).to(cdt)
            tl.store(dpg_b + (part * H + ch)[None, :] * NN + rows[:, None], dp, mask=cf_mask)
            tl.store(dpg_b + (2 * H + part * H + ch)[None, :] * NN + rows[:, None], dg, mask=cf_mask)
            dx = dot(dp, tl.trans(w_p_t), DOT_PREC, acc=dx)
            dx = dot(dg, tl.trans(w_g_t), DOT_PREC, acc=dx)
    part_ptr = PART + (b * tl.num_programs(0) + pid) * 2 * BLOCK_C + offs_c
    tl.store(part_ptr, tl.sum(dx * xhat, axis=0))                                  # norm_in weight
    tl.store(part_ptr + BLOCK_C, tl.sum(dx, axis=0))                               # norm_in bias
    dxhat = dx * w[None, :]
    mean_d = tl.sum(dxhat, axis=1) / C
    mean_dx = tl.sum(dxhat * xhat, axis=1) / C
    dz = rstd[:, None] * (dxhat - mean_d[:, None] - xhat * mean_dx[:, None])
    tl.store(DZ + io, dz.to(DZ.dtype.element_ty), mask=io_mask)
