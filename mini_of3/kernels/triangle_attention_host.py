"""The host side of the fused triangle attention: tiles, the autotune cache and the launchers.

    forward(q, k, v, bias, key_bias, sigmoid, scale, residuals, fast_exp, gate=None, mask_queries=False) -> o, lse
    backward(do, q, k, v, bias, key_bias, o, lse, sigmoid, scale, split_ds, fast_exp, gate=None, grads=None,
             mask_queries=False) -> dq, dk, dv, dbias

``mask_queries``: the key term's mask holds for the queries too (the kernels' MASK_QUERIES); the caller passes it
only with a mask.

Tiles (``TriAttnTiles``) are autotuned on the GPU, per kernel and shape bucket, and fixed under the interpreter, with
``MINI_OF3_AUTOTUNE=0`` or inside ``with tri_attn_tiles(...)``. The kernels and their launch order:
triangle_attention_kernels.py.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch
import triton

from mini_of3.kernels import triangle_attention_kernels as K
from mini_of3.kernels.host import (TileOverride, allocate, cdiv, dot_precision, interpreting, launch, num_sms,
                                   persistent_programs)


# ---------------------------------------------------------------------------------------------------------------
# tiles


@dataclass(frozen=True, kw_only=True)
class TriAttnTiles:
    """Tiles and launch parameters of the four kernels, in launch order; fixed tiles make runs reproducible. The
    defaults are the fastest fixed set measured on the H200 at D <= 32 (N = 768, D = 32: 9.87 ms of device time
    per forward + backward). ``fast_exp``: on CUDA, the exponentials and reciprocals of every kernel through the
    approximate ex2.approx.ftz / rcp.approx.ftz instructions (no subnormal fix-up; off under the interpreter, which
    cannot run them)."""
    fwd_block_j: int = 64
    fwd_block_k: int = 64
    fwd_warps: int = 4
    fwd_stages: int = 2
    dq_block_j: int = 64
    dq_block_k: int = 32
    dq_warps: int = 4
    dq_stages: int = 3
    dq_rows: int = 2                  # rows i per dQ program (1 or 2): two share each bias tile load
    dbias_block_j: int = 64
    dbias_block_k: int = 64
    dbias_warps: int = 4
    dbias_stages: int = 3
    dbias_chunks: int | None = None   # None: as many chunks of rows as it takes to fill the GPU
    dkdv_block_j: int = 64
    dkdv_block_k: int = 64
    dkdv_warps: int = 4
    dkdv_stages: int = 1
    dkdv_prefetch: int = 2            # what the dK/dV kernel loads one query tile ahead: 0 nothing, 1 q and dO,
                                      # 2 also the bias tile
    fast_exp: bool = True
    skip_masked_keys: bool = True     # stop every key loop at the row's last valid key (exact: the rest adds 0)


tri_attn_tiles = TileOverride("tri_attn_tiles", TriAttnTiles)
"""``with tri_attn_tiles(fwd_block_j=16, ...)``: these tiles (any TriAttnTiles field) instead of the defaults, and
no autotuning (``with tri_attn_tiles():``: the fixed defaults of the head dim)."""


def default_tiles(head_dim: int) -> TriAttnTiles:
    """The fixed tiles of a head dim: used under the interpreter, with MINI_OF3_AUTOTUNE=0, and as the base of
    ``tri_attn_tiles``."""
    if interpreting():   # small tiles, so that the tests' small N span several of them
        return TriAttnTiles(fwd_block_j=32, fwd_block_k=32, fwd_stages=1, dq_block_j=32, dq_stages=1,
                            dbias_block_j=32, dbias_block_k=32, dbias_stages=1, dkdv_block_j=32, dkdv_block_k=32,
                            dkdv_prefetch=0)
    if head_dim == 16:   # 128-row forward query tiles: 1.50 against 1.69 ms at N = 768 (at D = 32 they are slower)
        return TriAttnTiles(fwd_block_j=128, fwd_stages=3)
    if head_dim <= 32:
        return TriAttnTiles()
    if head_dim == 64:
        return TriAttnTiles(fwd_block_k=32, dq_stages=2, dq_rows=1, dbias_stages=1, dkdv_block_j=32, dkdv_stages=2,
                            dkdv_prefetch=0)
    return TriAttnTiles(fwd_block_j=32, fwd_block_k=32, dq_block_j=32, dq_stages=2, dq_rows=1, dbias_block_j=32,
                        dbias_block_k=32, dbias_stages=1, dkdv_block_j=32, dkdv_block_k=32, dkdv_stages=2,
                        dkdv_prefetch=0)


@tri_attn_tiles.cached
def tiles(head_dim: int) -> TriAttnTiles:
    """The tiles of a call: the head dim's defaults with any ``tri_attn_tiles`` override on top."""
    return tri_attn_tiles.apply(default_tiles(head_dim))


# ---------------------------------------------------------------------------------------------------------------
# autotuning: candidate lists, the per-key cache, the launch


def _autotune_enabled() -> bool:
    return not tri_attn_tiles.active and not interpreting() and os.environ.get("MINI_OF3_AUTOTUNE", "1") != "0"


def _configs(blocks, *names: str) -> list[triton.Config]:
    """triton.Configs from (BLOCK_J, BLOCK_K, warps, stages, *the values of ``names``) tuples."""
    return [triton.Config({"BLOCK_J": bj, "BLOCK_K": bk, **dict(zip(names, rest))}, num_warps=w, num_stages=s)
            for bj, bk, w, s, *rest in blocks]


@functools.cache
def _fwd_configs(head_dim: int) -> list[triton.Config]:
    """The forward's candidates. Short lists (the autotuner compiles each); 8 warps lost everywhere."""
    if head_dim == 64:
        return _configs([(64, 32, 4, 2), (64, 64, 4, 2), (32, 64, 4, 2), (32, 32, 4, 2)])
    if head_dim == 128:
        return _configs([(32, 32, 4, 2), (64, 32, 4, 2), (32, 64, 4, 2)])
    blocks = [(64, 32, 4, 3), (64, 64, 4, 2), (128, 64, 4, 3), (128, 32, 4, 3)]
    return _configs(blocks)


@functools.cache
def _dq_configs(head_dim: int) -> list[triton.Config]:
    """The dQ kernel's candidates, with ROWS rows per program: two rows were 0.6 ms faster than one at N = 768,
    D = 32 on contiguous inputs; in the model's layouts one row of 64 x 64 tiles was fastest (2.12 ms against the
    other candidates' best 2.18, H200)."""
    if head_dim == 64:
        blocks = [(64, 32, 4, 2, 1), (64, 64, 4, 2, 1), (32, 64, 4, 2, 1), (32, 32, 4, 2, 1), (64, 32, 4, 2, 2)]
    elif head_dim == 128:
        blocks = [(32, 32, 4, 2, 1), (64, 32, 4, 2, 1), (32, 64, 4, 2, 1)]
    else:
        blocks = [(64, 32, 4, 3, 2), (64, 64, 4, 2, 2), (64, 32, 4, 2, 2), (128, 32, 4, 3, 2), (64, 32, 4, 3, 1),
                  (64, 64, 4, 2, 1)]
    return _configs(blocks, "ROWS")


@functools.cache
def _dkdv_configs(head_dim: int) -> list[triton.Config]:
    """The dK/dV kernel's candidates, with PREFETCH (what it loads one query tile ahead; one pipeline stage only,
    for the registers: q and dO (1), and the bias tile (2, 64x64 only))."""
    if head_dim == 64:
        blocks = [(32, 64, 4, 2), (64, 32, 4, 2), (32, 32, 4, 2), (64, 64, 4, 2)]
    elif head_dim == 128:
        blocks = [(32, 32, 4, 2), (32, 64, 4, 2), (64, 32, 4, 2)]
    else:
        blocks = [(64, 64, 4, 1), (64, 64, 4, 2), (32, 64, 4, 1), (32, 64, 4, 2), (64, 128, 8, 1), (32, 32, 4, 2)]
    ahead = [b for b in blocks if b[3] == 1]
    levels = ((0, blocks), (1, ahead), (2, [b for b in ahead if b[:2] == (64, 64)]))
    return _configs([(*b, prefetch) for prefetch, chosen in levels for b in chosen], "PREFETCH")


@functools.cache
def _dbias_configs() -> list[triton.Config]:
    return [triton.Config({}, num_warps=w, num_stages=s) for w, s in ((4, 1), (4, 2), (4, 3), (8, 1), (8, 2))]


_tuned: dict[str, object] = {}


def _tuned_kernel(name: str, kernel, configs, extra_key: tuple[str, ...] = ()):
    if name not in _tuned:
        key = ["J_BUCKET", "BLOCK_D", "HAS_KEY_BIAS", "SIGMOID", *extra_key]   # + the dtypes of the tensors
        try:   # the chosen configs persist in Triton's cache across processes (triton >= 3.2)
            _tuned[name] = triton.autotune(configs=configs, key=key, cache_results=True)(kernel)
        except TypeError:
            _tuned[name] = triton.autotune(configs=configs, key=key)(kernel)
    return _tuned[name]


_chosen: dict[tuple, triton.Config] = {}


def _launch_tuned(name: str, kernel, configs: list[triton.Config], fixed: triton.Config, grid, args: tuple,
                  j_bucket: int, constexprs: dict, extra_key: tuple[str, ...] = ()) -> None:
    """Launch ``kernel`` with ``fixed`` (under the interpreter, MINI_OF3_AUTOTUNE=0 or a ``tri_attn_tiles``
    override), else with the autotuned config of this key (the autotuner's: J_BUCKET, D, the flags, the dtypes).
    The first call of a key runs Triton's autotuner over ``configs`` (its choice cached on disk across processes);
    later calls launch the chosen config directly: the autotuner's own per-call work (it rebuilds a dict of ~50
    arguments to find its key) costs ~25 µs per launch on a 2-core CPU, a tenth of a small call's host time.
    ``grid`` is a tuple or a function of the config's block sizes."""
    if not _autotune_enabled():
        config = fixed
    else:
        key = (name, j_bucket, constexprs["BLOCK_D"], constexprs["HAS_KEY_BIAS"], constexprs["SIGMOID"],
               *(constexprs[k] for k in extra_key), *(a.dtype for a in args if isinstance(a, torch.Tensor)))
        config = _chosen.get(key)
        if config is None:
            tuned = _tuned_kernel(name, kernel, configs, extra_key)
            tuned[grid](*args, j_bucket, **constexprs)
            _chosen[key] = tuned.best_config
            return
    launch_grid = grid(config.kwargs) if callable(grid) else grid
    launch(kernel, launch_grid, *args, j_bucket, **constexprs, **config.all_kwargs())


def autotuned_configs() -> dict[str, dict[str, str]]:
    """What the autotuner chose so far, per kernel and key (for benchmark records)."""
    return {name: {str(key): str(config) for key, config in getattr(kernel, "cache", {}).items()}
            for name, kernel in _tuned.items()}


# ---------------------------------------------------------------------------------------------------------------
# the launchers


def _bucket(n: int) -> int:
    return 1 << max(4, (n - 1).bit_length())


def _key_bias_args(key_bias: torch.Tensor | None, fallback: torch.Tensor) -> tuple:
    """(pointer, strides) for the kernels; any tensor stands in for an absent key term (never read)."""
    if key_bias is None:
        return fallback, (0, 0, 0)
    return key_bias, key_bias.stride()


def _key_end(key_bias: torch.Tensor | None, config: TriAttnTiles) -> torch.Tensor | None:
    """One past the last valid key of each row, [B, I] int32 (0 for a row with no valid key), from the bool mask or
    the -inf of a float key bias; None without a key term or with ``skip_masked_keys`` off. On the device, without
    a host sync (CUDA graphs keep it)."""
    if key_bias is None or not config.skip_masked_keys:
        return None
    valid = key_bias if key_bias.dtype == torch.bool else key_bias > float("-inf")          # [B, I, K]
    positions = torch.arange(1, valid.shape[-1] + 1, dtype=torch.int32, device=valid.device)
    return torch.where(valid, positions, 0).amax(-1).to(torch.int32).contiguous()


def _batch_bounds(key_end: torch.Tensor) -> torch.Tensor:
    """[B, 2] int32 for the dbias kernel: one past the last row with a valid key, one past the last valid key of
    any row, per batch element."""
    B, I = key_end.shape
    rows = torch.arange(1, I + 1, dtype=torch.int32, device=key_end.device)
    return torch.stack([torch.where(key_end > 0, rows, 0).amax(-1), key_end.amax(-1)], -1).to(torch.int32)


def forward(q, k, v, bias, key_bias, sigmoid: bool, scale: float, residuals: bool, fast_exp: bool, gate=None,
            mask_queries: bool = False):
    """o [B, I, J, H, D] (given the gate g, with q's strides: sigmoid(g) * o), and for a backward (``residuals``,
    softmax) lse [B, H, I, J] (else an empty tensor); ``mask_queries``: o = 0 and lse = +inf at masked queries."""
    B, I, J, H, D = q.shape
    config = tiles(D)
    o = allocate((B, I, J, H, D), q.dtype, q.device)
    store_lse = residuals and not sigmoid
    lse = allocate((B, H, I, J), torch.float32, q.device) if store_lse else o.new_empty(0, dtype=torch.float32)
    kb_arg, kb_strides = _key_bias_args(key_bias, q)
    key_end = _key_end(key_bias, config)
    _check_gate(gate, q)
    args = (q, k, v, bias, kb_arg, q if key_end is None else key_end, o, lse if lse.numel() else o,
            q if gate is None else gate,
            *q.stride(), *k.stride(), *v.stride(), *bias.stride(), *kb_strides, *o.stride(), B, I, J, H, scale)
    flags = dict(HAS_KEY_BIAS=key_bias is not None, SIGMOID=sigmoid, STORE_LSE=store_lse, FAST_EXP=fast_exp,
                 DOT_PREC=dot_precision(q.dtype), BLOCK_D=D, GATED=gate is not None, HAS_KEY_END=key_end is not None,
                 MASK_QUERIES=mask_queries)
    fixed = triton.Config({"BLOCK_J": config.fwd_block_j, "BLOCK_K": config.fwd_block_k},
                          num_warps=config.fwd_warps, num_stages=config.fwd_stages)
    _launch_tuned("fwd", K._fwd, _fwd_configs(D), fixed, lambda meta: (B * I * H * cdiv(J, meta["BLOCK_J"]),),
                  args, _bucket(J), flags, ("GATED",))
    return o, lse


def _check_gate(gate, q) -> None:
    """The kernels read the gate with q's strides: both must be views of one projection (or alike)."""
    if gate is not None and (gate.shape != q.shape or gate.stride() != q.stride() or gate.dtype != q.dtype):
        raise ValueError(f"triangle attention: the gate must have q's shape, strides and dtype, got "
                         f"{tuple(gate.shape)} {gate.stride()} {gate.dtype} against {tuple(q.shape)} {q.stride()} "
                         f"{q.dtype}")


def backward(do, q, k, v, bias, key_bias, o, lse, sigmoid: bool, scale: float, split_ds: bool, fast_exp: bool,
             gate=None, grads=None, mask_queries: bool = False):
    """dq, dk, dv [B, I, J, H, D] and dbias [B, H, J, K] (in the bias's dtype): _bwd_dq, _bwd_dbias, _bwd_dkdv.
    ``mask_queries`` as the forward's: masked queries (o = 0 there) add nothing, their dq is 0.

    Given the gate g (the forward's ``gate``), o is the gated output and do its gradient; dg is written too, so
    ``grads`` must then hold the four outputs (dq, dk, dv, dg), views of one buffer with dq's strides alike (the
    gradient of the packed projection; nothing is stacked afterwards). Without a gate ``grads`` may be None."""
    B, I, J, H, D = q.shape
    config = tiles(D)
    device = q.device
    kb_arg, kb_strides = _key_bias_args(key_bias, q)
    key_end = _key_end(key_bias, config)
    ke_arg = q if key_end is None else key_end
    _check_gate(gate, q)
    if grads is None and gate is not None:
        raise ValueError("triangle attention: a gated backward writes dg, so it needs grads = (dq, dk, dv, dg)")
    if grads is not None and len({t.stride() for t in grads}) != 1:
        raise ValueError(f"triangle attention: dq, dk, dv, dg must share strides, got {[t.stride() for t in grads]}")
    if sigmoid:   # no row statistics: any float32 tensor stands in (never read)
        delta = lse = q.new_empty(1, dtype=torch.float32)
    else:         # written by the dQ kernel, exactly, for the dbias and dK/dV kernels
        delta = allocate((B, H, I, J), torch.float32, device)
    dq = allocate((B, I, J, H, D), q.dtype, device) if grads is None else grads[0]
    do_attn, delta0 = do, delta
    if gate is not None:      # the gate's backward: dg, the attention's own dO (o's strides) and delta0
        do_attn = allocate(o.shape, o.dtype, device)
        delta0 = allocate((B, H, I, J), torch.float32, device) if not sigmoid else delta
        block_j = 32 if interpreting() else 64
        launch(K._gate_bwd, (B * I * H * cdiv(J, block_j),),
            do, o, gate, grads[3], do_attn, delta0, ke_arg, *do.stride(), *o.stride(), *gate.stride(),
            *grads[3].stride(), I, J, H, SIGMOID=sigmoid, BLOCK_J=block_j, BLOCK_D=D,
            HAS_KEY_END=key_end is not None, MASK_QUERIES=mask_queries, num_warps=4)
    dq_args = (q, k, v, bias, kb_arg, ke_arg, do_attn, o, lse, delta, dq, delta0,
               *q.stride(), *k.stride(), *v.stride(), *bias.stride(), *kb_strides, *do_attn.stride(), *o.stride(),
               *dq.stride(), B, I, J, H, scale)
    dq_fixed = triton.Config({"BLOCK_J": config.dq_block_j, "BLOCK_K": config.dq_block_k, "ROWS": config.dq_rows},
                             num_warps=config.dq_warps, num_stages=config.dq_stages)
    flags = dict(HAS_KEY_BIAS=key_bias is not None, SIGMOID=sigmoid, DOT_PREC=dot_precision(q.dtype), BLOCK_D=D,
                 FAST_EXP=fast_exp, HAS_KEY_END=key_end is not None, MASK_QUERIES=mask_queries)
    _launch_tuned("dq", K._bwd_dq, _dq_configs(D), dq_fixed,
                  lambda meta: (B * cdiv(I, meta["ROWS"]) * H * cdiv(J, meta["BLOCK_J"]),), dq_args,
                  _bucket(J), dict(flags, SPLIT_DS=split_ds, GATED=gate is not None), ("SPLIT_DS", "GATED"))

    # the dbias and dK/dV kernels see the attention's own dO
    common = (q, k, v, bias, kb_arg, ke_arg, do_attn, lse, delta)
    strides = (*q.stride(), *k.stride(), *v.stride(), *bias.stride(), *kb_strides, *do_attn.stride())
    bounds = q if key_end is None else _batch_bounds(key_end)
    dbias = _dbias((*common[:5], bounds, *common[6:]), strides, flags, q, bias, scale, config)

    # dk, dv after dbias, so that the dbias chunk partials are freed before they are allocated
    dk = allocate((B, I, J, H, D), q.dtype, device) if grads is None else grads[1]
    dv = allocate((B, I, J, H, D), q.dtype, device) if grads is None else grads[2]
    dkdv_fixed = triton.Config({"BLOCK_J": config.dkdv_block_j, "BLOCK_K": config.dkdv_block_k,
                                "PREFETCH": config.dkdv_prefetch},
                               num_warps=config.dkdv_warps, num_stages=config.dkdv_stages)
    programs = persistent_programs(B * I * H, 2, device, balanced=True)     # each takes whole rows (b, i, h)
    _launch_tuned("dkdv", K._bwd_dkdv, _dkdv_configs(D), dkdv_fixed, (programs,),
                  (*common, dk, dv, *strides, *dk.stride(), B, I, J, H, scale), _bucket(J),
                  dict(flags, SPLIT_DS=split_ds), ("SPLIT_DS",))
    return dq, dk, dv, dbias


def _dbias(common: tuple, strides: tuple, flags: dict, q: torch.Tensor, bias: torch.Tensor, scale: float,
           config: TriAttnTiles) -> torch.Tensor:
    """dbias = sum over rows i of dS. Rows are split into chunks so that the grid holds at least ~16 programs per SM
    (whole waves: at N = 768 the 576 tiles alone fill 2.2 waves, a quarter of the last one idle); the chunk partials
    (B*H*J*K float32 each) are summed afterwards in order, and freed before the caller allocates dk and dv. They are
    capped at dk's and dv's bytes, so that they leave the call's peak where it is (at N = 256, D = 16 the 33 chunks
    that would fill the GPU took 33 MiB against dk's and dv's 16)."""
    B, I, J, H, D = q.shape
    device = q.device
    if _autotune_enabled():
        block_j = block_k = 64 if D <= 64 else 32
    else:
        block_j, block_k = config.dbias_block_j, config.dbias_block_k
    n_tiles = B * H * cdiv(J, block_j) * cdiv(J, block_k)
    max_chunks = max(1, 2 * q.numel() * q.element_size() // (B * H * J * J * 4))
    chunks = config.dbias_chunks if (config.dbias_chunks and not _autotune_enabled()) else \
        max(1, min(I, max_chunks, math.ceil(16 * num_sms(device) / n_tiles)))
    rows_per_chunk = math.ceil(I / chunks)
    chunks = math.ceil(I / rows_per_chunk)
    dbias = allocate((B, H, J, J), bias.dtype, device)
    part = dbias[None] if chunks == 1 else torch.empty((chunks, B, H, J, J), dtype=torch.float32, device=device)
    _launch_tuned("dbias", K._bwd_dbias, _dbias_configs(),
                  triton.Config({}, num_warps=config.dbias_warps, num_stages=config.dbias_stages), (n_tiles * chunks,),
                  (*common, part, *strides, *part.stride(), B, I, J, H, scale, rows_per_chunk), _bucket(J),
                  dict(flags, BLOCK_J=block_j, BLOCK_K=block_k))
    if chunks > 1:
        n = dbias.numel()
        launch(K._sum_chunks, (cdiv(n, 1024),), part, dbias, chunks, n, BLOCK=1024, num_warps=4)
    return dbias
