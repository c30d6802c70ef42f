"""Triton kernels of the fused SwiGLU transition (AF3 SI Alg 11): LayerNorm, two projections to the hidden width, the
SwiGLU, the projection back, in one pass over the rows.

Rows are the M = prod(leading dims) vectors of the input [M, C] (contiguous); a program takes BLOCK_M rows (grid:
row tiles). The hidden width HID = n C is walked in chunks of BLOCK_HC channels, so the hidden activations never
leave the chip in the forward. The compute dtype (bf16 under autocast, else the input's) is the element type of the
weights the launcher passes (cast once on the host); statistics, SwiGLU and every accumulator are float32.

The default path, in launch order (transition_host.py):
    _transition_fwd   grid: one program per BLOCK_M rows.
                reads x, norm weights, W_a, W_b, W_out; writes the output [M, C] and, for a backward, the
                LayerNorm statistics (mean, rstd [M]).
backward:
    _transition_bwd   grid: one program per BLOCK_M rows.
                reads x, its statistics, dout, the weights; recomputes the LayerNorm and both projections;
                writes dx, the hidden activation h = silu(a) b [M, HID] and d(a | b) [M, 2 HID] (the weight
                GEMMs' operands), the normalised x in the compute dtype [M, C], and per-program partial sums of the
                norm weight and bias gradients.
    (cuBLAS)    the W_out gradient dout^T h and the W_a, W_b gradients d(a | b)^T x as GEMMs.
No atomics: every element is written by one program; the reductions over rows are cuBLAS GEMMs or per-program
partials that torch sums in a fixed order afterwards.
"""
from __future__ import annotations

import triton
import triton.language as tl

from mini_of3.kernels.primitives import dot


@triton.jit
def _rows_tile(X, rows, in_rows, offs_c, in_c, C: tl.constexpr):
    """Rows ``rows`` of a contiguous [M, C] tensor as float32 [BM, BC] (0 outside)."""
    ptrs = X + rows.to(tl.int64)[:, None] * C + offs_c[None, :]
    return tl.load(ptrs, mask=in_rows[:, None] & in_c[None, :], other=0.0).to(tl.float32)


@triton.jit
def _chunk_t(W, ch, in_ch, offs_c, in_c, C: tl.constexpr):
    """Rows ``ch`` of a [HID, C] weight, transposed: [BC, BHC] (0 outside), the right operand of x @ W^T."""
    return tl.load(W + ch[None, :] * C + offs_c[:, None], mask=in_ch[None, :] & in_c[:, None], other=0.0)


@triton.jit
def _chunk(W, ch, in_ch, offs_c, in_c, C: tl.constexpr):
    """Rows ``ch`` of a [HID, C] weight: [BHC, BC] (0 outside), the right operand of d(a) @ W."""
    return tl.load(W + ch[:, None] * C + offs_c[None, :], mask=in_ch[:, None] & in_c[None, :], other=0.0)


@triton.jit
def _out_chunk_t(W_O, ch, in_ch, offs_c, in_c, HID: tl.constexpr):
    """Columns ``ch`` of the [C, HID] output weight, transposed: [BHC, BC], the right operand of h @ W_out^T."""
    return tl.load(W_O + offs_c[None, :] * HID + ch[:, None], mask=in_ch[:, None] & in_c[None, :], other=0.0)


@triton.jit
def _out_chunk(W_O, ch, in_ch, offs_c, in_c, HID: tl.constexpr):
    """Columns ``ch`` of the [C, HID] output weight: [BC, BHC], the right operand of dout @ W_out."""
    return tl.load(W_O + offs_c[:, None] * HID + ch[None, :], mask=in_c[:, None] & in_ch[None, :], other=0.0)


@triton.jit
def _layer_norm(x, in_c, LN_W, LN_B, offs_c, eps, C: tl.constexpr):
    """xhat = (x - mean) * rstd over the C channels (0 outside), the affine output xhat w + beta, mean and rstd."""
    mean = tl.sum(x, axis=1) / C
    xc = tl.where(in_c[None, :], x - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=1) / C + eps)
    xhat = xc * rstd[:, None]
    w = tl.load(LN_W + offs_c, mask=in_c, other=0.0)
    beta = tl.load(LN_B + offs_c, mask=in_c, other=0.0)
    return xhat, xhat * w[None, :] + beta[None, :], mean, rstd


@triton.jit
def _transition_fwd(X, LN_W, LN_B, W_A, W_B, W_O, OUT, MEAN, RSTD, M, eps,
                    C: tl.constexpr, HID: tl.constexpr, STORE_STATS: tl.constexpr, DOT_PREC: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HC: tl.constexpr):
    """AF3 SI Alg 11 for BLOCK_M rows: x = LayerNorm(x); out = (silu(x W_a^T) * (x W_b^T)) W_out^T, the hidden
    activation made and consumed BLOCK_HC channels at a time."""
    pid = tl.program_id(0)
    cdt = W_A.dtype.element_ty
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    in_rows = rows < M
    offs_c = tl.arange(0, BLOCK_C)
    in_c = offs_c < C
    _, xn, mean, rstd = _layer_norm(_rows_tile(X, rows, in_rows, offs_c, in_c, C), in_c, LN_W, LN_B, offs_c, eps, C)
    xn = xn.to(cdt)                                                                # [BM, BC]
    acc = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    for h0 in range(0, HID, BLOCK_HC):
        ch = h0 + tl.arange(0, BLOCK_HC)
        in_ch = ch < HID
        a = dot(xn, _chunk_t(W_A, ch, in_ch, offs_c, in_c, C), DOT_PREC)          # [BM, BHC]
        b = dot(xn, _chunk_t(W_B, ch, in_ch, offs_c, in_c, C), DOT_PREC)          # [BM, BHC]
        hidden = (a * tl.sigmoid(a) * b).to(cdt)
        acc = dot(hidden, _out_chunk_t(W_O, ch, in_ch, offs_c, in_c, HID), DOT_PREC, acc=acc)   # [BM, BC]
    out_ptrs = OUT + rows.to(tl.int64)[:, None] * C + offs_c[None, :]
    tl.store(out_ptrs, acc.to(OUT.dtype.element_ty), mask=in_rows[:, None] & in_c[None, :])
    if STORE_STATS:
        tl.store(MEAN + rows, mean, mask=in_rows)
        tl.store(RSTD + rows, rstd, mask=in_rows)


@triton.jit
def _transition_bwd(X, DOUT, LN_W, LN_B, W_A, W_B, W_O, MEAN, RSTD, DX, HIDDEN, DAB, XN, PART, M,
                    C: tl.constexpr, HID: tl.constexpr, DOT_PREC: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_HC: tl.constexpr):
    """The backward of AF3 SI Alg 11 for BLOCK_M rows, a and b recomputed from x and its statistics:
    dh = dout W_out, da = dh b silu'(a), db = dh silu(a), d(xn) = da W_a + db W_b, then the LayerNorm's backward.
    Writes dx, h and d(a | b) for the weight GEMMs, the normalised x, and this program's sums of d(xn) xhat and
    d(xn) (the norm weight and bias gradients)."""
    pid = tl.program_id(0)
    cdt = W_A.dtype.element_ty
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    in_rows = rows < M
    rows64 = rows.to(tl.int64)
    offs_c = tl.arange(0, BLOCK_C)
    in_c = offs_c < C
    inside = in_rows[:, None] & in_c[None, :]
    x = _rows_tile(X, rows, in_rows, offs_c, in_c, C)
    mean = tl.load(MEAN + rows, mask=in_rows, other=0.0)
    rstd = tl.load(RSTD + rows, mask=in_rows, other=0.0)
    xhat = tl.where(in_c[None, :], (x - mean[:, None]) * rstd[:, None], 0.0)        # [BM, BC]
    w = tl.load(LN_W + offs_c, mask=in_c, other=0.0)
    beta = tl.load(LN_B + offs_c, mask=in_c, other=0.0)
    xn = (xhat * w[None, :] + beta[None, :]).to(cdt)
    tl.store(XN + rows64[:, None] * C + offs_c[None, :], xn, mask=inside)
    dout = _rows_tile(DOUT, rows, in_rows, offs_c, in_c, C).to(cdt)                # [BM, BC]
    dxn = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    for h0 in range(0, HID, BLOCK_HC):
        ch = h0 + tl.arange(0, BLOCK_HC)
        in_ch = ch < HID
        a = dot(xn, _chunk_t(W_A, ch, in_ch, offs_c, in_c, C), DOT_PREC)          # [BM, BHC]
        b = dot(xn, _chunk_t(W_B, ch, in_ch, offs_c, in_c, C), DOT_PREC)
        dh = dot(dout, _out_chunk(W_O, ch, in_ch, offs_c, in_c, HID), DOT_PREC)    # [BM, BHC]
        sig = tl.sigmoid(a)
        silu = a * sig
        keep = in_rows[:, None] & in_ch[None, :]
        tl.store(HIDDEN + rows64[:, None] * HID + ch[None, :], (silu * b).to(cdt), mask=keep)
        da = (dh * b * sig * (1.0 + a * (1.0 - sig))).to(cdt)
        db = (dh * silu).to(cdt)
        tl.store(DAB + rows64[:, None] * (2 * HID) + ch[None, :], da, mask=keep)
        tl.store(DAB + rows64[:, None] * (2 * HID) + HID + ch[None, :], db, mask=keep)
        dxn = dot(da, _chunk(W_A, ch, in_ch, offs_c, in_c, C), DOT_PREC, acc=dxn)   # [BM, BC]
        dxn = dot(db, _chunk(W_B, ch, in_ch, offs_c, in_c, C), DOT_PREC, acc=dxn)
    dxn = tl.where(inside, dxn, 0.0)
    g = dxn * w[None, :]
    dx = rstd[:, None] * (g - (tl.sum(g, axis=1) / C)[:, None] - xhat * (tl.sum(g * xhat, axis=1) / C)[:, None])
    tl.store(DX + rows64[:, None] * C + offs_c[None, :], dx.to(DX.dtype.element_ty), mask=inside)
    tl.store(PART + pid * 2 * BLOCK_C + offs_c, tl.sum(dxn * xhat, axis=0))
    tl.store(PART + pid * 2 * BLOCK_C + BLOCK_C + offs_c, tl.sum(dxn, axis=0))
