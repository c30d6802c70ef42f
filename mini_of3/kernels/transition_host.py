"""The host side of the fused SwiGLU transition: tiles and the launchers.

    forward(x, ln_w, ln_b, w_a, w_b, w_o, eps, compute_dtype, out_dtype, store_stats) -> out, stats, w_ab, wo
    backward(dout, x, ln_w, ln_b, w_a, w_b, w_o, stats, w_ab, wo, compute_dtype) -> dx, d_ln, d_ab, d_o
    weight_grads(weights, d_ln, d_ab, d_o) -> the five weight gradients

Tiles (``TransitionTiles``) are fixed, or set inside ``with transition_tiles(...)``. The kernels and their launch
order: transition_kernels.py.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from mini_of3.kernels import transition_kernels as K
from mini_of3.kernels.host import (TileOverride, allocate, cdiv, dot_precision, interpreting, launch, pow2, stacked,
                                   weight_grad)


# ---------------------------------------------------------------------------------------------------------------
# tiles


@dataclass(frozen=True, kw_only=True)
class TransitionTiles:
    """Rows per program (``*_m``), hidden channels per chunk (``*_hc``), warps and pipeline stages of the two
    kernels. The defaults are the fastest of the tile sweep at C = 128, N = 768 on the H100 (docs/kernels.md):
    forward 0.77 ms, forward+backward 4.18 against 6.47 with 64 rows and 32-channel chunks on 8 warps in the
    backward. Under the interpreter small ones, so that the tests' sizes span several tiles and chunks."""
    fwd_m: int = 64
    fwd_hc: int = 64
    fwd_warps: int = 4
    fwd_stages: int = 2
    bwd_m: int = 32
    bwd_hc: int = 64
    bwd_warps: int = 4
    bwd_stages: int = 2


transition_tiles = TileOverride("transition_tiles", TransitionTiles)
"""``with transition_tiles(fwd_m=128, ...)``: these tiles (any TransitionTiles field) instead of the defaults."""


@transition_tiles.cached
def _tiles(C: int, hidden: int) -> TransitionTiles:
    """The tiles of one call: small under the interpreter; else the defaults, or for C > 128 (a [rows, C] float32
    accumulator per program) 32 rows and 32-channel chunks, which keep both kernels within the registers and shared
    memory of an sm_90 multiprocessor up to C = 256 (the compiled kernels' register and shared-memory counts); any
    ``transition_tiles`` override on top; chunks no wider than the hidden width."""
    if interpreting():
        tiles = TransitionTiles(fwd_m=16, fwd_hc=16, fwd_stages=1, bwd_m=16, bwd_hc=16, bwd_warps=4, bwd_stages=1)
    elif C > 128:
        tiles = TransitionTiles(fwd_m=32, fwd_hc=32, bwd_m=32, bwd_hc=32)
    else:
        tiles = TransitionTiles()
    tiles = transition_tiles.apply(tiles)
    hc = pow2(hidden)
    return replace(tiles, fwd_hc=min(tiles.fwd_hc, hc), bwd_hc=min(tiles.bwd_hc, hc))


# ---------------------------------------------------------------------------------------------------------------
# the launchers


def forward(x, ln_w, ln_b, w_a, w_b, w_o, eps: float, compute_dtype: torch.dtype, out_dtype: torch.dtype,
            store_stats: bool):
    """out [..., C] (out_dtype), the LayerNorm statistics [2, M] float32 (mean, rstd; empty without
    ``store_stats``) and the weights in the compute dtype, (W_a | W_b) [2 hid, C] and W_out [C, hid], for the
    backward (which then casts none again)."""
    C, hid, dev = x.shape[-1], w_a.shape[0], x.device
    rows = x.reshape(-1, C).contiguous()                                           # [M, C]
    M = rows.shape[0]
    tiles = _tiles(C, hid)
    cdt = compute_dtype
    w_ab, wo = stacked((w_a, w_b), cdt), stacked((w_o,), cdt)
    out = allocate((M, C), out_dtype, dev)
    stats = allocate((2, M) if store_stats else (2, 0), torch.float32, dev)
    launch(
        K._transition_fwd, (cdiv(M, tiles.fwd_m),),
        rows, ln_w.float().contiguous(), ln_b.float().contiguous(), w_ab[:hid], w_ab[hid:], wo, out,
        stats[0] if store_stats else out, stats[1] if store_stats else out, M, eps,
        C=C, HID=hid, STORE_STATS=store_stats, DOT_PREC=dot_precision(cdt), BLOCK_M=tiles.fwd_m,
        BLOCK_C=pow2(C), BLOCK_HC=tiles.fwd_hc, num_warps=tiles.fwd_warps,
        num_stages=tiles.fwd_stages)
    return out.view(x.shape[:-1] + (C,)), stats, w_ab, wo


def backward(dout, x, ln_w, ln_b, w_a, w_b, w_o, stats, w_ab, wo, compute_dtype: torch.dtype):
    """dx and the weight gradients as whole buffers (``weight_grads`` slices them): the norm weight and bias rows
    [2, pow2(C)] and d(W_a | W_b) [2 hid, C] in float32, d W_out [C, hid] in its dtype."""
    C, hid, dev, cdt = x.shape[-1], w_a.shape[0], x.device, compute_dtype
    rows = x.reshape(-1, C).contiguous()                                           # [M, C]
    M = rows.shape[0]
    tiles = _tiles(C, hid)
    dout_rows = dout.reshape(-1, C).to(cdt).contiguous()                           # [M, C]
    dx = allocate((M, C), x.dtype, dev)
    hidden = allocate((M, hid), cdt, dev)
    dab = allocate((M, 2 * hid), cdt, dev)
    xn = allocate((M, C), cdt, dev)
    grid = (cdiv(M, tiles.bwd_m),)
    block_c = pow2(C)
    part = allocate((grid[0], 2, block_c), torch.float32, dev)
    launch(
        K._transition_bwd, grid,
        rows, dout_rows, ln_w.float().contiguous(), ln_b.float().contiguous(), w_ab[:hid], w_ab[hid:], wo, stats[0],
        stats[1], dx,
        hidden, dab, xn, part, M, C=C, HID=hid, DOT_PREC=dot_precision(cdt), BLOCK_M=tiles.bwd_m,
        BLOCK_C=block_c, BLOCK_HC=tiles.bwd_hc, num_warps=tiles.bwd_warps, num_stages=tiles.bwd_stages)
    d_ln = part.sum(0)                                                             # [2, pow2(C)]
    d_o = weight_grad(dout_rows.mT[None], hidden[None], w_o.dtype)               # [C, hid]
    del hidden
    d_ab = weight_grad(dab.mT[None], xn[None], torch.float32)                     # [2 hid, C]
    return dx.view(x.shape), d_ln, d_ab, d_o


def weight_grads(weights, d_ln, d_ab, d_o):
    """The five weight gradients (norm weight, norm bias, W_a, W_b, W_out), each in its weight's dtype, from the
    backward's whole buffers: views of them where the dtype already matches (no copy kernels)."""
    ln_w, ln_b, w_a, w_b, _w_o = weights
    C, hid = ln_w.shape[0], w_a.shape[0]
    return (d_ln[0, :C].to(ln_w.dtype), d_ln[1, :C].to(ln_b.dtype), d_ab[:hid].to(w_a.dtype),
            d_ab[hid:].to(w_b.dtype), d_o)
