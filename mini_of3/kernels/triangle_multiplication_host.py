"""The host side of the fused triangle multiplicative update: tiles and the launchers.

    forward(z, mask, ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out, outgoing, eps, compute_dtype,
            out_dtype) -> out, ab, t, gpre, stats_in, stats_out, w_in, w_po
    backward(dout, z, mask, <the eight weights>, ab, t, gpre, stats_in, stats_out, w_in, w_po, outgoing, eps)
        -> dz, d_ln_in, d_pg, d_ln_out, d_p_out
    weight_grads(weights, d_ln_in, d_pg, d_ln_out, d_p_out) -> the eight weight gradients

Tiles (``TriMulTiles``) are fixed, or set inside ``with tri_mul_tiles(...)``. The kernels and their launch order:
triangle_multiplication_kernels.py.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from mini_of3.kernels import triangle_multiplication_kernels as K
from mini_of3.kernels.host import (TileOverride, allocate, cdiv, dot_precision, interpreting, launch,
                                   persistent_programs, pow2, stacked, weight_grad)


# ---------------------------------------------------------------------------------------------------------------
# tiles


@dataclass(frozen=True, kw_only=True)
class TriMulTiles:
    """Launch tiles of the four Triton kernels, in launch order: pairs per program (``*_m``) or per tile of a
    persistent program (``*_p``), hidden channels per chunk of the projection kernels (``*_hc``), warps and pipeline
    stages per program, persistent programs per SM (``*_per_sm``; 0: one program per tile); ``fast_gates``: every
    kernel's sigmoid gates with the approximate ex2 and reciprocal instructions (GPU only; off under the interpreter,
    which cannot run them). The defaults are the fastest of the tile sweeps at C = h = 128, bf16 (docs/kernels.md):
    the projection kernels' on the H200 (forward + backward 3.97 ms at N = 768), the persistent output kernels' on
    the H100 (backward 3.31 against 3.53 ms at N = 768 with one program per tile)."""
    proj_fwd_m: int = 64
    proj_fwd_hc: int = 32
    proj_fwd_warps: int = 4
    proj_fwd_stages: int = 3
    out_fwd_p: int = 64
    out_fwd_warps: int = 4
    out_fwd_stages: int = 2
    out_fwd_per_sm: int = 2
    out_bwd_p: int = 64
    out_bwd_warps: int = 8
    out_bwd_stages: int = 3
    out_bwd_per_sm: int = 1
    proj_bwd_m: int = 128
    proj_bwd_hc: int = 32
    proj_bwd_warps: int = 8
    proj_bwd_stages: int = 3
    fast_gates: bool = False


tri_mul_tiles = TileOverride("tri_mul_tiles", TriMulTiles)
"""``with tri_mul_tiles(proj_fwd_m=128, ...)``: these tiles (any TriMulTiles field) instead of the defaults."""


@tri_mul_tiles.cached
def _tiles(C: int, hidden: int) -> TriMulTiles:
    """The tiles of one call: small under the interpreter, so that the tests' small N span several tiles and chunks;
    else the fixed defaults (fewer pairs per output program for a wide hidden dim, whose [pairs, h] tile is held
    whole), with any ``tri_mul_tiles`` override on top."""
    if interpreting():
        tiles = TriMulTiles(proj_fwd_m=32, proj_fwd_hc=16, proj_fwd_warps=4, proj_fwd_stages=1, out_fwd_p=32,
                            out_bwd_p=32, out_bwd_warps=4, proj_bwd_m=32, proj_bwd_hc=16, proj_bwd_warps=4,
                            proj_bwd_stages=1)
    elif hidden > 128:
        tiles = TriMulTiles(out_fwd_p=32, out_bwd_p=32)
    else:
        tiles = TriMulTiles()
    tiles = tri_mul_tiles.apply(tiles)
    hc = pow2(hidden)
    return replace(tiles, proj_fwd_hc=min(tiles.proj_fwd_hc, hc), proj_bwd_hc=min(tiles.proj_bwd_hc, hc),
                   fast_gates=tiles.fast_gates and not interpreting())


# ---------------------------------------------------------------------------------------------------------------
# the launchers


def forward(z, mask, ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out, outgoing: bool, eps: float,
            compute_dtype: torch.dtype, out_dtype: torch.dtype):
    """out [B, N, N, C] (out_dtype) and the residuals of the backward: ab [2, B * h, N, N], t [B * h, N, N],
    g_out's pre-activation [B, N, N, C] (all compute_dtype), stats_in, stats_out [2, B, N * N] float32, and the
    projection weights in the compute dtype, (p_in | g_in | g_out) [4 h + C, C] (the rows of the input side's
    weight-gradient buffer) and p_out [C, h], so that the backward casts none again."""
    B, N, _, C = z.shape
    h, NN, dev = p_in.shape[0] // 2, N * N, z.device
    tiles = _tiles(C, h)
    cdt = compute_dtype
    w_in, w_po = stacked((p_in, g_in, g_out), cdt), stacked((p_out,), cdt)
    w_p, w_g, w_go = w_in[:2 * h], w_in[2 * h:4 * h], w_in[4 * h:]
    ab = allocate((2, B * h, N, N), cdt, dev)
    gpre = allocate((B, N, N, C), cdt, dev)
    stats_in = allocate((2, B, NN), torch.float32, dev)
    m_arg, m_strides = (mask, mask.stride()) if mask is not None else (z, (0, 0, 0))
    launch(
        K._tri_mul_proj_fwd, (cdiv(NN, tiles.proj_fwd_m), B),
        z, m_arg, ln_in_w.float().contiguous(), ln_in_b.float().contiguous(), w_p, w_g, w_go, ab, gpre, stats_in[0],
        stats_in[1], *z.stride(), *m_strides, N, NN, B * h * NN, eps,
        C=C, H=h, HAS_MASK=mask is not None, DOT_PREC=dot_precision(cdt), BLOCK_M=tiles.proj_fwd_m,
        BLOCK_C=pow2(C), BLOCK_HC=tiles.proj_fwd_hc, FAST_GATES=tiles.fast_gates, num_warps=tiles.proj_fwd_warps,
        num_stages=tiles.proj_fwd_stages)
    a, b = ab[0], ab[1]                                                   # [B * h, N, N] each
    t = torch.matmul(a, b.mT) if outgoing else torch.matmul(a.mT, b)     # [B * h, N(i), N(j)]
    out = allocate((B, N, N, C), out_dtype, dev)
    stats_out = allocate((2, B, NN), torch.float32, dev)
    n_tiles = B * cdiv(NN, tiles.out_fwd_p)
    launch(
        K._tri_mul_out_fwd, (persistent_programs(n_tiles, tiles.out_fwd_per_sm, dev),),
        t, ln_out_w.float().contiguous(), ln_out_b.float().contiguous(), w_po, gpre, out, stats_out[0], stats_out[1],
        NN, n_tiles, eps, C=C, H=h, DOT_PREC=dot_precision(cdt), BLOCK_P=tiles.out_fwd_p, BLOCK_C=pow2(C),
        BLOCK_H=pow2(h), FAST_GATES=tiles.fast_gates, num_warps=tiles.out_fwd_warps, num_stages=tiles.out_fwd_stages)
    return out, ab, t, gpre, stats_in, stats_out, w_in, w_po


def backward(dout, z, mask, ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out, ab, t, gpre, stats_in,
             stats_out, w_in, w_po, outgoing: bool, eps: float):
    """dz and the weight gradients as whole float32 buffers (``weight_grads`` slices them): the norm_in weight
    and bias rows [2, pow2(C)], d(p_in | g_in | g_out) [4 h + C, C], the norm_out rows [2, pow2(h)], and d p_out
    [C, h] in p_out's dtype."""
    B, N, _, C = z.shape
    h, NN, dev, cdt = p_in.shape[0] // 2, N * N, z.device, ab.dtype
    tiles = _tiles(C, h)
    w_p, w_g, w_go = w_in[:2 * h], w_in[2 * h:4 * h], w_in[4 * h:]
    prec = dot_precision(cdt)

    # output side: LayerNorm over h, p_out, the gate
    dt = allocate((B * h, N, N), cdt, dev)
    ta = allocate((B, h, NN), cdt, dev)
    dy = allocate((B, NN, C), cdt, dev)
    # the input side's weight-gradient operand: d(p_in, g_in) in rows 0..4h-1 (written by _tri_mul_proj_bwd),
    # d(g_out pre-activation) in the last C rows (written here), so one GEMM gives all three weight gradients
    dpg = allocate((B, 4 * h + C, NN), cdt, dev)
    n_tiles = B * cdiv(NN, tiles.out_bwd_p)
    programs = persistent_programs(n_tiles, tiles.out_bwd_per_sm, dev)
    part_out = allocate((programs, 2, pow2(h)), torch.float32, dev)
    launch(
        K._tri_mul_out_bwd, (programs,),
        t, ln_out_w.float().contiguous(), ln_out_b.float().contiguous(), w_po, gpre, dout, stats_out[0], stats_out[1],
        dt, ta, dy, dpg, part_out, *dout.stride(), N, NN, n_tiles, C=C, H=h, DOT_PREC=prec,
        BLOCK_P=tiles.out_bwd_p, BLOCK_C=pow2(C), BLOCK_H=pow2(h), FAST_GATES=tiles.fast_gates,
        num_warps=tiles.out_bwd_warps, num_stages=tiles.out_bwd_stages)
    d_ln_out = part_out.sum(0)                                                   # [2, pow2(h)]
    d_p_out = weight_grad(dy.mT, ta.mT, p_out.dtype)                            # [C, h]
    del dy, ta

    # the contraction: outgoing t = a b^T, incoming t = a^T b, per channel
    a, b = ab[0], ab[1]
    dab = allocate((2, B * h, N, N), cdt, dev)
    if outgoing:
        torch.matmul(dt, b, out=dab[0])
        torch.matmul(dt.mT, a, out=dab[1])
    else:
        torch.matmul(b, dt.mT, out=dab[0])
        torch.matmul(a, dt, out=dab[1])
    del dt

    # input side: LayerNorm over C, the projections, gates and mask
    dz = allocate(z.shape, z.dtype, dev)
    x = allocate((B, NN, C), cdt, dev)
    grid_m = (cdiv(NN, tiles.proj_bwd_m), B)
    part_in = allocate((grid_m[0] * B, 2, pow2(C)), torch.float32, dev)
    m_arg, m_strides = (mask, mask.stride()) if mask is not None else (z, (0, 0, 0))
    launch(
        K._tri_mul_proj_bwd, grid_m,
        z, m_arg, ln_in_w.float().contiguous(), ln_in_b.float().contiguous(), w_p, w_g, w_go, dab, stats_in[0],
        stats_in[1], dz, dpg, x, part_in, *z.stride(), *m_strides, N, NN, B * h * NN,
        C=C, H=h, HAS_MASK=mask is not None, DOT_PREC=prec, BLOCK_M=tiles.proj_bwd_m, BLOCK_C=pow2(C),
        BLOCK_HC=tiles.proj_bwd_hc, FAST_GATES=tiles.fast_gates, num_warps=tiles.proj_bwd_warps,
        num_stages=tiles.proj_bwd_stages)
    d_ln_in = part_in.sum(0)                                                     # [2, pow2(C)]
    d_pg = weight_grad(dpg, x, torch.float32)                                   # [4 h + C, C]
    return dz, d_ln_in, d_pg, d_ln_out, d_p_out


def weight_grads(weights, d_ln_in, d_pg, d_ln_out, d_p_out):
    """The eight weight gradients, in WEIGHT_NAMES order and each weight's dtype, from the backward's whole
    buffers: views of them where the dtype already matches (no copy kernels)."""
    ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out = weights
    C, h = ln_in_w.shape[0], p_in.shape[0] // 2
    return (d_ln_in[0, :C].to(ln_in_w.dtype), d_ln_in[1, :C].to(ln_in_b.dtype), d_pg[:2 * h].to(p_in.dtype),
            d_pg[2 * h:4 * h].to(g_in.dtype), d_ln_out[0, :h].to(ln_out_w.dtype),
            d_ln_out[1, :h].to(ln_out_b.dtype), d_p_out, d_pg[4 * h:].to(g_out.dtype))
