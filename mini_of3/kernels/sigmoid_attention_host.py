"""The launch layer of sigmoid attention: tiles per head dim, their override, and the launchers.

    forward(q, k, v, seq_q, seq_k, bias, layout, max_q, max_k, causal, scale, bias_value) -> o
    backward(do, q, k, v, seq_q, seq_k, bias, layout, max_q, max_k, causal, scale, bias_value) -> dq, dk, dv

layout is "dense" (seq_q, seq_k None), "padded" (lengths [B]) or "varlen" (cu_seqlens [S + 1]); bias is a float32
[S, H] table or None, bias_value a float or None (both None: b = -log(valid keys)). The kernels and their launch
order: sigmoid_attention_kernels.py.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from mini_of3.kernels import sigmoid_attention_kernels as K
from mini_of3.kernels.host import TileOverride, allocate, interpreting, launch

try:        # Gluon (triton.experimental.gluon) is in Triton 3.6 and later; older Triton runs the Triton kernels only
    from mini_of3.kernels import sigmoid_attention_hopper as hopper
except ImportError:
    hopper = None

SIGMOID_VARIANTS = ("exact", "rcp", "tanh")

# ---------------------------------------------------------------------------------------------------------------
# tiles


@dataclass(frozen=True)
class Tiles:
    """Launch configuration of the kernels (BLOCK_M: queries, BLOCK_N: keys; dqs: _bwd_dq_scores), the sigmoid's
    evaluation (sigmoid_attention_kernels.py: "exact", "rcp", "tanh"), the bytes of dS^T workspace the
    backward may take to read dq from stored scores (0: it recomputes them) and the forward's registers per thread
    at most in the padded and packed layouts (0: the compiler's choice; dense calls never cap: under a cap ptxas
    takes more registers than it chooses alone, at the same occupancy). hopper=1 (the default): calls that
    sigmoid_attention_hopper applies to (sm_90, 16-bit, D = 128, no causal mask, dense or packed) run on its Gluon
    kernels (0: the Triton kernels), the forward only where the longest sequence has hopper_fwd_min_keys keys or
    more (H100: the Triton forward is faster at 4096 keys, the Gluon one at 16384 and on a packed batch up to 16000),
    with the forward's key tile (0: 128 dense, 64 packed), its ring's stages, the backward's tile (rows kept and rows
    ringed alike) and stages, and whether the backward is one kernel (hopper_bwd_fused=1: dQ added over the key
    blocks in a fixed order, sigmoid_attention_hopper._bwd; 2: the same with the two warpgroups' dQ tiles summed
    before) or two (0)."""
    fwd_block_m: int
    fwd_block_n: int
    fwd_warps: int
    fwd_stages: int
    dkdv_block_m: int
    dkdv_block_n: int
    dkdv_warps: int
    dkdv_stages: int
    dq_block_m: int
    dq_block_n: int
    dq_warps: int
    dq_stages: int
    sigmoid: str
    scores_budget: int = 0
    dqs_block_m: int = 64
    dqs_block_n: int = 64
    dqs_warps: int = 4
    dqs_stages: int = 3
    fwd_registers: int = 0
    hopper: int = 1
    hopper_fwd_min_keys: int = 8192
    hopper_fwd_block_n: int = 0
    hopper_fwd_stages: int = 3
    hopper_bwd_block: int = 64
    hopper_bwd_stages: int = 2
    hopper_bwd_fused: int = 0


# 16-bit inputs on the GPU, per head dim: the fastest of `python -m mini_of3.bench sigmoid --sweep` on an H100 at
# B = 4, T = 4096, H = 16 (D = 128: forward 1.11 ms, forward+backward 4.98; D = 64: 0.83 and 2.88); D = 32 not swept.
# D = 128 takes dq from stored scores within 2 GiB (H100, B = 1, T = 16384, tanh: forward+backward 17.86 -> 16.00 ms;
# at D = 64 it measured slower, 9.22 -> 10.82: sigmoid_scores_430e16f_h100.json). Triton 3.6 compiles the packed
# varlen forward to more registers than the dense one, which costs CTAs per SM that shared memory would allow: at
# D = 128 184 against 128 registers, two CTAs instead of three (at most 168: three, no spills); at D = 64 91 against
# 82, five instead of six (at most 80: six, no spills). tools/lab/kernel_resources.py --kernel sigmoid --layout.
DEFAULT_TILES = {
    32: Tiles(128, 64, 8, 3, 64, 128, 8, 3, 128, 64, 8, 3, "rcp"),
    64: Tiles(64, 32, 4, 3, 32, 64, 4, 3, 64, 64, 4, 3, "rcp", fwd_registers=80),
    128: Tiles(64, 32, 4, 3, 32, 64, 4, 3, 64, 32, 4, 3, "rcp", 2 << 30, 128, 64, 8, 3, fwd_registers=168),
}
# float32 inputs (a checking path: 3xTF32 products, exact sigmoid; small tiles fit shared memory at D = 128)
FLOAT32_TILES = Tiles(32, 32, 4, 1, 32, 32, 4, 1, 32, 32, 4, 1, "exact")
# the CPU interpreter: small, unequal blocks, so that tests of a few dozen tokens cross several of each; "rcp" as on
# the GPU, which the interpreter (no PTX) evaluates exactly, as "exact"
INTERPRETER_TILES = Tiles(32, 16, 4, 1, 16, 32, 4, 1, 16, 16, 4, 1, "rcp", 0, 32, 16, 4, 1)

sigmoid_tiles = TileOverride("sigmoid_tiles", Tiles)
"""``with sigmoid_tiles(fwd_block_n=128, sigmoid="rcp"):`` these fields (any Tiles field) instead of the defaults, for
every call meanwhile, backward included; the benchmark's sweep tunes this way."""


@sigmoid_tiles.cached
def current_tiles(head_dim: int, dtype: torch.dtype) -> Tiles:
    """The tiles a call with this head dim and dtype launches with now."""
    if interpreting():
        base = INTERPRETER_TILES if dtype != torch.float32 else dataclasses.replace(INTERPRETER_TILES,
                                                                                   sigmoid="exact")
    else:
        base = FLOAT32_TILES if dtype == torch.float32 else DEFAULT_TILES[head_dim]
    tiles = sigmoid_tiles.apply(base)
    if tiles.sigmoid not in SIGMOID_VARIANTS:
        raise ValueError(f"sigmoid_tiles: sigmoid must be one of {SIGMOID_VARIANTS}, got {tiles.sigmoid!r}")
    return tiles


# ---------------------------------------------------------------------------------------------------------------
# launch layer


def _token_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(sequence, token, head) strides; a packed [total, H, D] tensor has no sequence stride."""
    return tuple(t.stride()[:3]) if t.dim() == 4 else (0, *t.stride()[:2])


def _common_args(q: torch.Tensor, k: torch.Tensor, seq_q, seq_k, bias, layout: str, causal: bool,
                 bias_value: float | None, tiles: Tiles):
    """(number of sequences, bias arguments, flags) shared by the three kernels."""
    n_seq = seq_q.numel() - 1 if layout == "varlen" else q.shape[0]
    bias_args = (bias, *bias.stride()) if bias is not None else (q, 0, 0)
    kind = "tensor" if bias is not None else ("scalar" if bias_value is not None else "keys")
    flags = dict(LAYOUT=layout, CAUSAL=causal, BIAS_KIND=kind, SIGMOID=tiles.sigmoid,
                 ASM=q.is_cuda and not interpreting(), DOT_PREC=_dot_precision(q.dtype), HEAD_DIM=q.shape[-1])
    return n_seq, bias_args, flags


def _dot_precision(dtype: torch.dtype) -> str:
    if interpreting():
        return "upcast"
    return "tf32x3" if dtype == torch.float32 else "tf32"    # 16-bit inputs ignore it


def _lengths(q: torch.Tensor, k: torch.Tensor, layout: str) -> tuple[int, int]:
    """Tq, Tk of the padded/dense layouts (unused by varlen)."""
    return (0, 0) if layout == "varlen" else (q.shape[1], k.shape[1])


def gluon_takes(q, k, layout: str, max_k: int, causal: bool, tiles: Tiles) -> tuple[bool, bool]:
    """Whether the forward and the backward of this call run sigmoid_attention_hopper's Gluon kernels."""
    both = hopper is not None and hopper.applies(q, k, layout, causal, tiles)
    return both and max_k >= tiles.hopper_fwd_min_keys, both


def forward(q, k, v, seq_q, seq_k, bias, layout: str, max_q: int, max_k: int, causal: bool, scale: float,
            bias_value: float | None) -> torch.Tensor:
    """o (q's shape, contiguous) by _fwd (or sigmoid_attention_hopper's, where it applies)."""
    tiles = current_tiles(q.shape[-1], q.dtype)
    if gluon_takes(q, k, layout, max_k, causal, tiles)[0]:
        return hopper.forward(q, k, v, seq_q, seq_k, bias, layout, max_q, max_k, scale, bias_value, tiles)
    o = allocate(q.shape, q.dtype, q.device)
    n_seq, (bias_ptr, sb_s, sb_h), flags = _common_args(q, k, seq_q, seq_k, bias, layout, causal, bias_value, tiles)
    grid = (triton_cdiv(max_q, tiles.fwd_block_m), q.shape[-2], n_seq)
    if min(grid) == 0:
        return o
    launch(K._fwd, grid, q, k, v, o, _or(seq_q, q), _or(seq_k, q), bias_ptr,
           *_token_strides(q), *_token_strides(k), *_token_strides(v), *_token_strides(o), sb_s, sb_h,
           _float(bias_value), *_lengths(q, k, layout), scale, **flags,
           BLOCK_M=tiles.fwd_block_m, BLOCK_N=tiles.fwd_block_n, num_warps=tiles.fwd_warps,
           num_stages=tiles.fwd_stages, maxnreg=(tiles.fwd_registers or None) if layout != "dense" else None)
    return o


def backward(do, q, k, v, seq_q, seq_k, bias, layout: str, max_q: int, max_k: int, causal: bool, scale: float,
             bias_value: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv (the inputs' shapes, contiguous). Where the dS^T of at least one head fits tiles.scores_budget,
    per chunk of heads (scores_heads): _bwd_dkdv storing dS^T, then _bwd_dq_scores reading it; else, over all heads,
    _bwd_dkdv, then _bwd_dq recomputing sigma and dP. Where sigmoid_attention_hopper applies: its kernels."""
    if do.stride(-1) != 1:
        do = do.contiguous()
    tiles = current_tiles(q.shape[-1], q.dtype)
    if gluon_takes(q, k, layout, max_k, causal, tiles)[1]:
        return hopper.backward(do, q, k, v, seq_q, seq_k, bias, layout, max_q, max_k, scale, bias_value, tiles)
    n_seq, (bias_ptr, sb_s, sb_h), flags = _common_args(q, k, seq_q, seq_k, bias, layout, causal, bias_value, tiles)
    H = q.shape[-2]
    dk = allocate(k.shape, k.dtype, k.device)
    dv = allocate(v.shape, v.dtype, v.device)
    dq = allocate(q.shape, q.dtype, q.device)
    common = (_or(seq_q, q), _or(seq_k, q), bias_ptr)
    strides = (*_token_strides(q), *_token_strides(k), *_token_strides(v), *_token_strides(do))
    tail = (sb_s, sb_h, _float(bias_value), *_lengths(q, k, layout), scale)
    dkdv_tiles = dict(BLOCK_M=tiles.dkdv_block_m, BLOCK_N=tiles.dkdv_block_n, num_warps=tiles.dkdv_warps,
                      num_stages=tiles.dkdv_stages)
    if min(max_q, max_k, H, n_seq) == 0:                        # no scores: every gradient is zero
        return dq.zero_(), dk.zero_(), dv.zero_()
    n_key_blocks = triton_cdiv(max_k, tiles.dkdv_block_n)
    chunk = scores_heads(tiles, q, k, n_seq, layout, max_q, max_k)
    if chunk == 0:
        launch(K._bwd_dkdv, (n_key_blocks, H, n_seq), q, k, v, do, dk, dv, *common, q, q, *strides,
               *_token_strides(dk), *tail, 0, **flags, **dkdv_tiles, STORE_DS=False)
        grid = (triton_cdiv(max_q, tiles.dq_block_m), H, n_seq)
        launch(K._bwd_dq, grid, q, k, v, do, dq, *common, *strides, *_token_strides(dq), *tail, **flags,
               BLOCK_M=tiles.dq_block_m, BLOCK_N=tiles.dq_block_n, num_warps=tiles.dq_warps,
               num_stages=tiles.dq_stages)
        return dq, dk, dv
    workspace = allocate((chunk * scores_per_head(q, k, n_seq, layout, max_q, max_k),), q.dtype, q.device)
    offsets = _scores_offsets(seq_q, seq_k) if layout == "varlen" else q
    n_query_blocks = triton_cdiv(max_q, tiles.dqs_block_m)
    for h0 in range(0, H, chunk):
        heads = min(chunk, H - h0)
        launch(K._bwd_dkdv, (n_key_blocks, heads, n_seq), q, k, v, do, dk, dv, *common, workspace, offsets,
               *strides, *_token_strides(dk), *tail, h0, **flags, **dkdv_tiles, STORE_DS=True)
        launch(K._bwd_dq_scores, (n_query_blocks, heads, n_seq), k, dq, *common[:2], workspace, offsets,
               *_token_strides(k), *_token_strides(dq), *_lengths(q, k, layout), scale, h0, LAYOUT=layout,
               CAUSAL=causal, DOT_PREC=flags["DOT_PREC"], BLOCK_M=tiles.dqs_block_m, BLOCK_N=tiles.dqs_block_n,
               HEAD_DIM=flags["HEAD_DIM"], num_warps=tiles.dqs_warps, num_stages=tiles.dqs_stages)
    return dq, dk, dv


def _aligned(n):
    """A workspace row's length for n queries: n rounded up to 16 (int or tensor)."""
    return (n + 15) // 16 * 16


def scores_per_head(q, k, n_seq: int, layout: str, max_q: int, max_k: int) -> int:
    """Elements of one head's dS^T in the workspace (varlen: an upper bound, known without reading cu_seqlens)."""
    if layout == "varlen":
        return min(k.shape[0], n_seq * max_k) * _aligned(max_q)
    return n_seq * k.shape[1] * _aligned(q.shape[1])


def scores_heads(tiles: Tiles, q, k, n_seq: int, layout: str, max_q: int, max_k: int) -> int:
    """Heads per chunk of the backward from stored scores: as many as fit tiles.scores_budget bytes, spread evenly
    over the fewest chunks; 0 (recompute dq) where not even one fits."""
    per_head = scores_per_head(q, k, n_seq, layout, max_q, max_k) * q.element_size()
    H = q.shape[-2]
    fits = min(H, tiles.scores_budget // per_head) if per_head > 0 else H
    if fits == 0:
        return 0
    return triton_cdiv(H, triton_cdiv(H, fits))


def _scores_offsets(cu_q: torch.Tensor, cu_k: torch.Tensor) -> torch.Tensor:
    """int64 [S]: where each sequence's dS^T block [Lk, aligned(Lq)] of one head starts (exclusive prefix sums)."""
    sizes = (cu_k[1:] - cu_k[:-1]).long() * _aligned((cu_q[1:] - cu_q[:-1]).long())
    return torch.cumsum(sizes, 0) - sizes


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _or(t: torch.Tensor | None, fallback: torch.Tensor) -> torch.Tensor:
    """t, or any tensor standing in for an absent pointer argument (never read)."""
    return fallback if t is None else t


def _float(x: float | None) -> float:
    return 0.0 if x is None else float(x)
