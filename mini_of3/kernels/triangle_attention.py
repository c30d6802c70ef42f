"""Fused triangle attention: the public function, its checks, launch configs, and the autograd-wired custom ops.

    triangle_attention(q, k, v, bias, mask=None, *, activation="softmax", scale=None, sigmoid_bias=None,
                       backend="auto") -> o

q, k, v: [B, I, J, H, D] (any strides; the ending node passes transposed views), bias: [B, H, J, K] float32 or the
input dtype, mask: [B, I, K] bool (True = attend). Implements the attention of AF3 SI Alg 14 (starting node) and,
on transposed views, Alg 15 (ending node); with I = 1 it is attention with pair bias (Alg 24).

The forward and backward are Triton kernels (tri_attn_kernels.py); both are registered as ``torch.library``
custom ops with fake (meta) implementations, so ``torch.compile`` treats them as opaque. Gradients use no atomics:
output and all four gradients repeat bitwise for a fixed launch configuration.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
from dataclasses import dataclass, replace

import torch
import triton

from mini_of3.kernels import tri_attn_kernels as K
from mini_of3.kernels.reference import triangle_attention_ref

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BACKENDS = ("auto", "triton", "torch")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ---------------------------------------------------------------------------------------------------------------
# input checks


def _check_inputs(q, k, v, bias, mask, activation, sigmoid_bias, backend) -> None:
    for name, t in (("q", q), ("k", k), ("v", v), ("bias", bias)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"triangle_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 5:
        raise ValueError(f"triangle_attention: q must be [B, I, J, H, D], got shape {tuple(q.shape)}")
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"triangle_attention: q, k, v must have one shape, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    B, I, J, H, D = q.shape
    if bias.shape != (B, H, J, J):
        raise ValueError(f"triangle_attention: bias must be [B, H, J, K] = {(B, H, J, J)} for q of shape "
                         f"{tuple(q.shape)}, got {tuple(bias.shape)}")
    if q.dtype not in SUPPORTED_DTYPES and q.dtype != torch.float64:
        raise TypeError(f"triangle_attention: q dtype must be float16, bfloat16 or float32, got {q.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"triangle_attention: q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if bias.dtype not in (torch.float32, q.dtype):
        raise TypeError(f"triangle_attention: bias dtype must be float32 or the input dtype {q.dtype}, "
                        f"got {bias.dtype}")
    devices = {t.device for t in (q, k, v, bias)}
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"triangle_attention: mask must be a bool tensor or None, got {type(mask).__name__}")
        if mask.dtype != torch.bool:
            raise TypeError(f"triangle_attention: mask must be bool (True = attend), got {mask.dtype}")
        if mask.shape != (B, I, J):
            raise ValueError(f"triangle_attention: mask must be [B, I, K] = {(B, I, J)}, got {tuple(mask.shape)}")
        devices.add(mask.device)
    if len(devices) > 1:
        raise ValueError(f"triangle_attention: all inputs must be on one device, got {sorted(map(str, devices))}")
    if activation not in ("softmax", "sigmoid"):
        raise ValueError(f"triangle_attention: activation must be 'softmax' or 'sigmoid', got {activation!r}")
    if sigmoid_bias is not None and activation != "sigmoid":
        raise ValueError("triangle_attention: sigmoid_bias is only used with activation='sigmoid'")
    if backend not in BACKENDS:
        raise ValueError(f"triangle_attention: backend must be one of {BACKENDS}, got {backend!r}")
    if min(B, I, J, H) < 1:
        raise ValueError(f"triangle_attention: every dimension must be >= 1, got q of shape {tuple(q.shape)}")


def _resolve_backend(backend: str, q: torch.Tensor) -> str:
    if backend == "auto":
        return "triton" if q.is_cuda else "torch"
    if backend == "triton":
        if not q.is_cuda and not _interpreting():
            raise ValueError("triangle_attention: backend='triton' needs CUDA tensors, or CPU tensors with "
                             "TRITON_INTERPRET=1 set before mini_of3 is imported")
        D = q.shape[-1]
        if D not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"triangle_attention: head dim D must be one of {SUPPORTED_HEAD_DIMS} for the Triton "
                             f"kernel, got {D}")
        if q.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"triangle_attention: the Triton kernel takes float16, bfloat16 or float32, got {q.dtype}")
    return backend


# ---------------------------------------------------------------------------------------------------------------
# launch configurations: autotuned on the GPU (cached per shape bucket), fixed under the interpreter or on request


@dataclass(frozen=True)
class LaunchConfig:
    """Block sizes and launch parameters of the three main kernels; a fixed config makes runs reproducible."""
    fwd_block_j: int = 64
    fwd_block_k: int = 64
    fwd_warps: int = 4
    fwd_stages: int = 2
    bwd_block_j: int = 64
    bwd_block_k: int = 64
    bwd_warps: int = 4
    bwd_stages: int = 1
    dbias_block: int = 64             # the dbias kernel's query tile (and key tile, unless dbias_block_k is given)
    dbias_warps: int = 4
    dbias_stages: int = 1
    dbias_chunks: int | None = None   # None: as many chunks of rows as it takes to fill the GPU
    split_p: bool | None = None       # hi+lo split of p in the forward's p @ v (None: MINI_OF3_SPLIT_P, default: on
                                      # when the forward keeps residuals for a backward, off for inference)
    split_ds: bool | None = None      # hi+lo split of dS in dS @ k and dS^T @ q (None: MINI_OF3_SPLIT_DS, default on)
    fast_exp: bool | None = None      # ex2.approx.ftz / rcp.approx through inline PTX (None: on for CUDA)
    residual: str | None = None       # (fused backward only) the output's rounding residual kept for the backward:
                                      # "int8" (a quarter of o's bytes) or "input" (o's dtype); None:
                                      # MINI_OF3_RESIDUAL, default int8
    separate_dq: bool | None = None   # dQ in its own kernel (_bwd_dq, launched with the fwd_* block sizes, which also
                                      # makes the exact delta: no residual is stored) and a dK/dV kernel without it;
                                      # False: the fused dq/dk/dv kernel with a residual. None: MINI_OF3_SEPARATE_DQ,
                                      # default on. Like the splits, chosen at the forward call for its backward
    key_mask: str | None = None       # how a softmax call's mask reaches the kernels: "bool", the caller's mask itself
                                      # (no copy, 1 byte per key) or "float", a float32 key bias built per call (4
                                      # bytes per key, 2.25 MiB at N = 768). None: MINI_OF3_KEY_MASK, default bool
    fwd_rows: int = 1                 # rows i per program of the forward (1 or 2): two rows share each bias tile
                                      # load (the bias is re-read for every row i)
    dq_block_j: int = 64              # the dQ kernel (separate_dq): forward-shaped, its own tiles
    dq_block_k: int = 32
    dq_warps: int = 4
    dq_stages: int = 3
    dq_rows: int = 1                  # rows i per dQ program (1 or 2)
    bwd_rows: int = 1                 # rows i per item of the dK/dV kernel (1 or 2; the fused one takes 1)
    bwd_prefetch: int = 0             # the dK/dV kernel loads the next query tile's q and dO one step ahead (1),
                                      # and its bias tile too (2)
    dbias_block_k: int | None = None  # the dbias kernel's key tile (None: dbias_block): wider tiles read fewer
                                      # q, k, v, dO bytes per score (the kernel re-reads them for every row i)


def default_config(head_dim: int) -> LaunchConfig:
    """A good fixed configuration for each head dim (used under the interpreter and with MINI_OF3_AUTOTUNE=0);
    the D <= 32 one is the fastest fixed set measured on the H200 (NOTES.md)."""
    if _interpreting():
        return LaunchConfig(32, 32, 4, 1, 32, 32, 4, 1, 32, 4, 1, dq_block_j=32, dq_stages=1, dq_rows=2)
    if head_dim == 16:   # the forward's 128-row query tiles pay at D = 16 only (NOTES.md, run 11)
        return LaunchConfig(128, 64, 4, 3, 64, 64, 4, 1, 64, 4, 3, dq_rows=2, bwd_prefetch=2)
    if head_dim <= 32:   # two rows per program pay in the dQ kernel, not in the forward (NOTES.md, runs 8, 9);
        # dK/dV 64x64 w4 beat 64x128 w8 once it had a kernel of its own (run 11); q, dO (run 14) and the bias tile
        # (run 15) one query tile ahead
        return LaunchConfig(64, 64, 4, 2, 64, 64, 4, 1, 64, 4, 3, dq_rows=2, bwd_prefetch=2)
    if head_dim == 64:
        return LaunchConfig(64, 32, 4, 2, 32, 64, 4, 2, 64, 4, 1, dq_stages=2)
    return LaunchConfig(32, 32, 4, 2, 32, 32, 4, 2, 32, 4, 1, dq_block_j=32, dq_stages=2)


_override: LaunchConfig | None = None


@contextlib.contextmanager
def launch_config(config: LaunchConfig | None = None, **changes):
    """Run with a fixed launch configuration: ``with launch_config(fwd_block_j=16): ...`` (no autotuning inside)."""
    global _override
    previous = _override
    base = config if config is not None else (previous or default_config(32))
    _override = replace(base, **changes)
    try:
        yield _override
    finally:
        _override = previous


def _autotune_enabled() -> bool:
    return _override is None and not _interpreting() and os.environ.get("MINI_OF3_AUTOTUNE", "1") != "0"


@functools.cache
def _fwd_configs(head_dim: int, kernel: str = "fwd") -> list[triton.Config]:
    """Forward-shaped launches of the forward or ("dq") the dQ kernel: BLOCK_J, BLOCK_K, warps, stages, rows per
    program. Short lists (the autotuner compiles each): at D = 32 the forward was fastest with one row per program,
    the dQ kernel with two; 8 warps and 32-row query tiles lost everywhere (NOTES.md, run 8)."""
    if kernel == "dq":
        blocks = [(64, 32, 4, 3, 2), (64, 64, 4, 2, 2), (64, 32, 4, 2, 2), (128, 32, 4, 3, 2), (64, 32, 4, 3, 1)]
    else:
        blocks = [(64, 32, 4, 3, 1), (64, 64, 4, 2, 1), (128, 64, 4, 3, 1), (128, 32, 4, 3, 1), (64, 32, 4, 3, 2)]
    if head_dim == 64:
        blocks = [(64, 32, 4, 2, 1), (64, 64, 4, 2, 1), (32, 64, 4, 2, 1), (32, 32, 4, 2, 1), (64, 32, 4, 2, 2)]
    elif head_dim == 128:
        blocks = [(32, 32, 4, 2, 1), (64, 32, 4, 2, 1), (32, 64, 4, 2, 1)]
    return [triton.Config({"BLOCK_J": bj, "BLOCK_K": bk, "ROWS": rows}, num_warps=w, num_stages=s)
            for bj, bk, w, s, rows in blocks]


@functools.cache
def _bwd_configs(head_dim: int, kernel: str = "dkdv") -> list[triton.Config]:
    """Launches of the dK/dV kernel (BLOCK_J, BLOCK_K, warps, stages, rows per item, PREFETCH: what it loads one
    query tile ahead) or ("dqkv") the fused one (one row per item, nothing ahead)."""
    blocks = [(64, 64, 4, 1, 1), (64, 64, 4, 2, 1), (32, 64, 4, 1, 1), (32, 64, 4, 2, 1), (64, 128, 8, 1, 1),
              (32, 32, 4, 2, 1)]
    if head_dim <= 32 and kernel == "dkdv":   # two rows fit the registers only with 32-row query tiles (NOTES.md)
        blocks += [(32, 64, 4, 1, 2)]
    if head_dim == 64:
        blocks = [(32, 64, 4, 2, 1), (64, 32, 4, 2, 1), (32, 32, 4, 2, 1), (64, 64, 4, 2, 1)]
    elif head_dim == 128:
        blocks = [(32, 32, 4, 2, 1), (32, 64, 4, 2, 1), (64, 32, 4, 2, 1)]
    # loads one query tile ahead (one stage only: registers): q and dO (1), and the bias tile (2, 64x64 only)
    ahead = [(bj, bk, w, s, rows) for bj, bk, w, s, rows in blocks if s == 1 and rows == 1] if kernel == "dkdv" else []
    levels = ((0, blocks), (1, ahead), (2, [b for b in ahead if b[:2] == (64, 64)]))
    return [triton.Config({"BLOCK_J": bj, "BLOCK_K": bk, **({"ROWS": rows, "PREFETCH": pre} if kernel == "dkdv"
                                                           else {})}, num_warps=w, num_stages=s)
            for pre, chosen in levels for bj, bk, w, s, rows in chosen]


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


def _launch(name: str, kernel, configs: list[triton.Config], fixed: triton.Config, grid, args: tuple,
            j_bucket: int, constexprs: dict, extra_key: tuple[str, ...] = ()) -> None:
    """Launch ``kernel`` with ``fixed`` (under the interpreter, MINI_OF3_AUTOTUNE=0 or a ``launch_config``), else with
    the autotuned config of this key (the autotuner's: J_BUCKET, D, the flags, the dtypes). The first call of a key
    runs Triton's autotuner over ``configs`` (its choice cached on disk across processes); later calls launch the
    chosen config directly: the autotuner's own per-call work (it rebuilds a dict of ~50 arguments to find its key)
    costs ~25 µs per launch on a 2-core CPU, a tenth of a small call's host time. ``grid`` is a tuple or a function
    of the config's block sizes."""
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
    kernel[launch_grid](*args, j_bucket, **constexprs, **config.all_kwargs())


def _fixed_fwd(config: LaunchConfig, kernel: str = "fwd") -> triton.Config:
    """The fixed forward-shaped launch of the forward or ("dq") the dQ kernel of a LaunchConfig."""
    if kernel == "dq":
        return triton.Config({"BLOCK_J": config.dq_block_j, "BLOCK_K": config.dq_block_k, "ROWS": config.dq_rows},
                             num_warps=config.dq_warps, num_stages=config.dq_stages)
    return triton.Config({"BLOCK_J": config.fwd_block_j, "BLOCK_K": config.fwd_block_k, "ROWS": config.fwd_rows},
                         num_warps=config.fwd_warps, num_stages=config.fwd_stages)


def _query_tile_grid(B: int, I: int, J: int, H: int):
    """One program per (query tile, head, group of ROWS rows, batch), the order of _query_tile_program."""
    return lambda meta: (B * triton.cdiv(I, meta["ROWS"]) * H * triton.cdiv(J, meta["BLOCK_J"]),)


def autotuned_configs() -> dict[str, dict[str, str]]:
    """What the autotuner chose so far, per kernel and key (for benchmark records)."""
    return {name: {str(key): str(config) for key, config in getattr(kernel, "cache", {}).items()}
            for name, kernel in _tuned.items()}


def _bucket(n: int) -> int:
    return 1 << max(4, (n - 1).bit_length())


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4


def _new(shape, dtype, device) -> torch.Tensor:
    """Output allocation; MINI_OF3_POISON=1 fills with NaN (-128 for the int8 residual, a value the kernel never
    writes) so that a test sees any element a kernel did not write."""
    if os.environ.get("MINI_OF3_POISON", "0") == "1":
        return torch.full(shape, -128 if dtype == torch.int8 else float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def _dot_precision(dtype: torch.dtype) -> str:
    if _interpreting():
        return "upcast"
    return "ieee" if dtype == torch.float32 else "tf32"


def _use_fast_exp(config: LaunchConfig, device: torch.device) -> bool:
    """Inline-PTX exp2 on the GPU (the interpreter cannot run PTX); MINI_OF3_FAST_EXP=0 turns it off."""
    if device.type != "cuda" or _interpreting():
        return False
    if config.fast_exp is not None:
        return config.fast_exp
    return os.environ.get("MINI_OF3_FAST_EXP", "1") != "0"


def _use_split(config: LaunchConfig, dtype: torch.dtype, which: str, training: bool = True) -> bool:
    """hi + lo split of the float32 p ("p", the forward's p @ v) or dS ("ds", dS @ k and dS^T @ q) before the
    16-bit matmuls; env MINI_OF3_SPLIT_P / MINI_OF3_SPLIT_DS = 0 or 1 forces one. By default dS is split (dq, dk
    sum dS with cancellation) and p only for the fused backward (``training``): there p's rounding in the forward
    would reach every gradient through delta = rowsum(dO * o) (dbias error 1e-4 instead of 1e-6); the separate dQ
    kernel makes delta from p * dP itself. Unsplit, the output error is 2.0e-3 instead of 1.7e-3 (bf16, NOTES.md)
    and the forward ~15 % faster (35 % with two rows per program).
    The backward's p^T @ dO is not split: that rounding shows only in dv, at the size of dv's own output rounding."""
    if dtype == torch.float32:
        return False
    chosen = config.split_p if which == "p" else config.split_ds
    if chosen is not None:
        return chosen
    env = os.environ.get(f"MINI_OF3_SPLIT_{which.upper()}", "")
    return env != "0" if env else training


# ---------------------------------------------------------------------------------------------------------------
# forward and backward launchers


def _residual_dtype(config: LaunchConfig, dtype: torch.dtype) -> torch.dtype:
    """int8 (default) or the input dtype, for the output's rounding residual (config.residual, MINI_OF3_RESIDUAL)."""
    choice = config.residual or os.environ.get("MINI_OF3_RESIDUAL", "int8")
    if choice not in ("int8", "input"):
        raise ValueError(f"residual must be 'int8' or 'input', got {choice!r}")
    return torch.int8 if choice == "int8" else dtype


def _lo_unit(residual: torch.Tensor, dtype: torch.dtype) -> float:
    """For an int8 residual, a bound on |acc - o| / |o| (one ulp: 2^-7 bf16, 2^-10 fp16; see _residual_to_int8);
    0 for a residual in o's own dtype."""
    if residual.dtype != torch.int8:
        return 0.0
    return 2.0 ** -10 if dtype == torch.float16 else 2.0 ** -7


def _keeps_lo(residuals: bool, sigmoid: bool, fused_backward: bool, dtype: torch.dtype) -> bool:
    """Whether the forward stores the output's rounding residual: only for the fused backward (the separate dQ
    kernel makes the exact delta itself), for softmax, 16-bit inputs, and when a backward follows."""
    return residuals and not sigmoid and fused_backward and dtype != torch.float32


def _key_bias(mask: torch.Tensor | None, beta: torch.Tensor | None, scale: float,
              shape: tuple[int, int, int], bool_mask: bool) -> torch.Tensor | None:
    """The per-key term of the raw scores, [B, I, K]: the caller's bool mask itself (softmax, ``bool_mask``: no
    memory; the kernels turn it into 0 / -inf and load it one key tile ahead, which keeps its 1-byte loads off the
    critical path), or float32: -inf at masked keys, plus beta_i / scale for sigmoid; None when there is neither.
    Saved for the backward."""
    if mask is None and beta is None:
        return None
    if beta is None and bool_mask:
        return mask
    if mask is None:
        return (beta / scale)[:, :, None].expand(shape)                 # [B, I, K], stride 0 over keys
    key_bias = torch.where(mask, 0.0, float("-inf")).to(torch.float32)  # [B, I, K]
    return key_bias if beta is None else key_bias + (beta / scale)[:, :, None]


def _key_bias_args(key_bias: torch.Tensor | None, fallback: torch.Tensor) -> tuple:
    """(pointer, strides) for the kernels; any tensor stands in for an absent key bias (never read)."""
    if key_bias is None:
        return fallback, (0, 0, 0)
    return key_bias, key_bias.stride()


def _forward(q, k, v, bias, key_bias, sigmoid: bool, scale: float, residuals: bool, split_p: bool, store_lo: bool):
    """o, and for a backward (``residuals``, softmax) lse and, with ``store_lo`` (the fused backward), the output's
    rounding residual o_lo (else an empty tensor)."""
    B, I, J, H, D = q.shape
    config = _override or default_config(D)
    o = _new((B, I, J, H, D), q.dtype, q.device)
    store_residuals = residuals and not sigmoid
    residual_dtype = _residual_dtype(config, q.dtype)
    o_lo = _new((B, I, J, H, D), residual_dtype, q.device) if _keeps_lo(residuals, sigmoid, store_lo, q.dtype) else \
        o.new_empty(0, dtype=residual_dtype)
    lse = _new((B, H, I, J), torch.float32, q.device) if store_residuals else o.new_empty(0, dtype=torch.float32)
    kb_arg, kb_strides = _key_bias_args(key_bias, q)
    args = (q, k, v, bias, kb_arg, o, o_lo if o_lo.numel() else o,
            lse if lse.numel() else o,
            *q.stride(), *k.stride(), *v.stride(), *bias.stride(), *kb_strides, *o.stride(), B, I, J, H, scale)
    flags = dict(HAS_KEY_BIAS=key_bias is not None, SIGMOID=sigmoid, STORE_LSE=store_residuals,
                 STORE_LO=o_lo.numel() > 0, LO_UNIT=_lo_unit(o_lo, q.dtype), SPLIT_P=split_p,
                 FAST_EXP=_use_fast_exp(config, q.device), DOT_PREC=_dot_precision(q.dtype), BLOCK_D=D)
    _launch("fwd", K._fwd, _fwd_configs(D), _fixed_fwd(config), _query_tile_grid(B, I, J, H), args, _bucket(J),
            flags, ("SPLIT_P",))
    return o, o_lo, lse


def _backward(do, q, k, v, bias, key_bias, o, o_lo, lse, sigmoid: bool, scale: float, split_ds: bool,
              separate_dq: bool):
    B, I, J, H, D = q.shape
    config = _override or default_config(D)
    device = q.device
    kb_arg, kb_strides = _key_bias_args(key_bias, q)
    dot_prec = _dot_precision(q.dtype)

    if sigmoid:
        delta = lse = q.new_empty(1, dtype=torch.float32)
    else:
        delta = _new((B, H, I, J), torch.float32, device)
        if not separate_dq:   # the fused kernel takes delta = rowsum(dO * (o + o_lo)) from here
            block_j = 64 if D <= 64 else 32
            K._delta[(B * I * H * triton.cdiv(J, block_j),)](
                o, o_lo if o_lo.numel() else o, do, delta, *o.stride(), *do.stride(), I, J, H,
                HAS_LO=o_lo.numel() > 0, LO_UNIT=_lo_unit(o_lo, q.dtype), BLOCK_J=block_j, BLOCK_D=D, num_warps=4)

    common = (q, k, v, bias, kb_arg, do, lse, delta)
    strides = (*q.stride(), *k.stride(), *v.stride(), *bias.stride(), *kb_strides, *do.stride())
    flags = dict(HAS_KEY_BIAS=key_bias is not None, SIGMOID=sigmoid, DOT_PREC=dot_prec, BLOCK_D=D,
                 FAST_EXP=_use_fast_exp(config, device))
    if separate_dq:
        # dQ first: for softmax its kernel also writes the exact delta that the dbias and dK/dV kernels read
        dq = _new((B, I, J, H, D), q.dtype, device)
        dq_args = (q, k, v, bias, kb_arg, do, o, lse, delta, dq, *strides, *o.stride(), *dq.stride(),
                   B, I, J, H, scale)
        _launch("dq", K._bwd_dq, _fwd_configs(D, "dq"), _fixed_fwd(config, "dq"), _query_tile_grid(B, I, J, H), dq_args,
                _bucket(J), dict(flags, SPLIT_DS=split_ds, COMPUTE_DELTA=not sigmoid), ("SPLIT_DS",))
    # dbias = sum over rows i of dS. Rows are split into chunks so that the grid holds at least ~16 programs per SM
    # (whole waves: at N = 768 the 576 tiles alone fill 2.2 waves, a quarter of the last one idle); the chunk
    # partials (B*H*J*K float32 each) are summed afterwards in order. They are freed before dk and dv are allocated,
    # so partials of at most dk's and dv's bytes leave the call's peak where it is (at N = 256, D = 16 the 33
    # chunks that fill the GPU would take 33 MiB against dk's and dv's 16: run 12 measured 51 MiB of peak there).
    if _autotune_enabled():
        block_j = block_k = 64 if D <= 64 else 32
    else:
        block_j, block_k = config.dbias_block, config.dbias_block_k or config.dbias_block
    tiles = B * H * triton.cdiv(J, block_j) * triton.cdiv(J, block_k)
    max_chunks = max(1, 2 * q.numel() * q.element_size() // (B * H * J * J * 4))
    chunks = config.dbias_chunks if (config.dbias_chunks and not _autotune_enabled()) else \
        max(1, min(I, max_chunks, math.ceil(16 * _num_sms(device) / tiles)))
    rows_per_chunk = math.ceil(I / chunks)
    chunks = math.ceil(I / rows_per_chunk)
    dbias = _new((B, H, J, J), bias.dtype, device)
    part = dbias[None] if chunks == 1 else torch.empty((chunks, B, H, J, J), dtype=torch.float32, device=device)
    dbias_args = (*common, part, *strides, *part.stride(), B, I, J, H, scale, rows_per_chunk)
    grid = (tiles * chunks,)
    _launch("dbias", K._bwd_dbias, _dbias_configs(),
            triton.Config({}, num_warps=config.dbias_warps, num_stages=config.dbias_stages), grid, dbias_args,
            _bucket(J), dict(flags, BLOCK_J=block_j, BLOCK_K=block_k))
    if chunks > 1:
        n = dbias.numel()
        K._sum_chunks[(triton.cdiv(n, 1024),)](part, dbias, chunks, n, BLOCK=1024, num_warps=4)
    del part, dbias_args     # the partials' memory goes back before dq, dk, dv are allocated (36 MiB at N = 768)

    # dk, dv (and the fused path's dq) after dbias, so that the chunk partials are freed before they are allocated
    if not separate_dq:
        dq = _new((B, I, J, H, D), q.dtype, device)
    dk = _new((B, I, J, H, D), q.dtype, device)
    dv = _new((B, I, J, H, D), q.dtype, device)
    tail = (*strides, *dk.stride(), B, I, J, H, scale)
    fixed = {"BLOCK_J": config.bwd_block_j, "BLOCK_K": config.bwd_block_k}
    launch = dict(num_warps=config.bwd_warps, num_stages=config.bwd_stages)
    if separate_dq:
        dkdv_fixed = triton.Config({**fixed, "ROWS": config.bwd_rows, "PREFETCH": config.bwd_prefetch}, **launch)
        _launch("dkdv", K._bwd_dkdv, _bwd_configs(D, "dkdv"), dkdv_fixed,
                lambda meta: (_persistent_programs(B * triton.cdiv(I, meta["ROWS"]) * H, device),),
                (*common, dk, dv, *tail), _bucket(J), dict(flags, SPLIT_DS=split_ds), ("SPLIT_DS",))
    else:
        programs = _persistent_programs(B * I * H, device)
        dq_acc = torch.empty((programs, J, D), dtype=torch.float32, device=device)   # a dQ scratch row per program
        _launch("dqkv", K._bwd_dqkv, _bwd_configs(D, "dqkv"), triton.Config(fixed, **launch), (programs,),
                (*common, dq_acc, dq, dk, dv, *tail), _bucket(J), dict(flags, SPLIT_DS=split_ds), ("SPLIT_DS",))
    return dq, dk, dv, dbias


def _persistent_programs(items: int, device: torch.device) -> int:
    """Programs of a persistent grid over ``items``, two per SM and balanced: each takes the same number of items
    (at most one less)."""
    per_program = math.ceil(items / (2 * _num_sms(device)))
    return math.ceil(items / per_program)


# ---------------------------------------------------------------------------------------------------------------
# custom ops (opaque to torch.compile) and autograd


@torch.library.custom_op("mini_of3::triangle_attention_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, key_bias: torch.Tensor | None,
            sigmoid: bool, scale: float, residuals: bool, split_p: bool, split_ds: bool, separate_dq: bool
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, bias, key_bias, sigmoid, scale, residuals, split_p, not separate_dq)


@_fwd_op.register_fake
def _fwd_fake(q, k, v, bias, key_bias, sigmoid, scale, residuals, split_p, split_ds, separate_dq):
    B, I, J, H, D = q.shape
    keep = residuals and not sigmoid
    o = q.new_empty((B, I, J, H, D))
    o_lo = q.new_empty((B, I, J, H, D) if _keeps_lo(residuals, sigmoid, not separate_dq, q.dtype) else 0,
                       dtype=_residual_dtype(_override or default_config(D), q.dtype))
    lse = q.new_empty((B, H, I, J), dtype=torch.float32) if keep else q.new_empty(0, dtype=torch.float32)
    return o, o_lo, lse


@torch.library.custom_op("mini_of3::triangle_attention_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
            key_bias: torch.Tensor | None, o: torch.Tensor, o_lo: torch.Tensor, lse: torch.Tensor, sigmoid: bool,
            scale: float, split_ds: bool, separate_dq: bool
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(do, q, k, v, bias, key_bias, o, o_lo, lse, sigmoid, scale, split_ds, separate_dq)


@_bwd_op.register_fake
def _bwd_fake(do, q, k, v, bias, key_bias, o, o_lo, lse, sigmoid, scale, split_ds, separate_dq):
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape), bias.new_empty(bias.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, bias, key_bias, sigmoid, scale, residuals, split_p, split_ds, separate_dq = inputs
    o, o_lo, lse = output
    ctx.save_for_backward(q, k, v, bias, key_bias, o, o_lo, lse)
    ctx.sigmoid, ctx.scale, ctx.split_ds, ctx.separate_dq = sigmoid, scale, split_ds, separate_dq
    ctx.mark_non_differentiable(o_lo, lse)
    ctx.set_materialize_grads(False)     # no zero-filled gradients for o_lo and lse (saves one o-sized tensor)


def _autograd_backward(ctx, do, _do_lo, _dlse, backward=_bwd_op):
    q, k, v, bias, key_bias, o, o_lo, lse = ctx.saved_tensors
    dq, dk, dv, dbias = backward(do, q, k, v, bias, key_bias, o, o_lo, lse, ctx.sigmoid, ctx.scale, ctx.split_ds,
                                 ctx.separate_dq)
    return dq, dk, dv, dbias, None, None, None, None, None, None, None


_fwd_op.register_autograd(_autograd_backward, setup_context=_setup_context)


class _EagerTriangleAttention(torch.autograd.Function):
    """The eager path: the custom ops' forward and backward, called without torch.library's dispatch, which costs
    ~80 µs per forward + backward on a 2-core CPU (~40 % of the host time of a call; NOTES.md, session 2) and shows at
    N <= 256, where the kernels take ~0.1 ms. Under torch.compile the custom ops are used, opaque to the compiler."""

    @staticmethod
    def forward(ctx, q, k, v, bias, key_bias, sigmoid, scale, residuals, split_p, split_ds, separate_dq):
        output = _forward(q, k, v, bias, key_bias, sigmoid, scale, residuals, split_p, not separate_dq)
        _setup_context(ctx, (q, k, v, bias, key_bias, sigmoid, scale, residuals, split_p, split_ds, separate_dq),
                       output)
        return output

    @staticmethod
    def backward(ctx, do, do_lo, dlse):
        return _autograd_backward(ctx, do, do_lo, dlse, backward=_backward)


# ---------------------------------------------------------------------------------------------------------------
# public function


def triangle_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    activation: str = "softmax",
    scale: float | None = None,
    sigmoid_bias: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Fused triangle attention (AF3 SI Alg 14/15; Alg 24 with I = 1), softmax or sigmoid.

    Args:
        q, k, v: [B, I, J, H, D], any strides (no copies are made); D in {16, 32, 64, 128} for the Triton kernel
        bias: [B, H, J, K] float32 or the input dtype, shared by every row i; its gradient has its dtype
        mask: [B, I, K] bool, True = attend; a row with no valid key gives output 0 and zero gradients
        activation: "softmax", or "sigmoid" (o = sum_k sigmoid(s_ijk + beta_i) v_ik, no normaliser)
        scale: score scale, default 1/sqrt(D)
        sigmoid_bias: beta for activation="sigmoid"; default -log(number of valid keys of row i)
        backend: "triton", "torch" (the reference in the input dtype) or "auto" (triton on CUDA, else torch)
    Returns:
        o: [B, I, J, H, D] in the input dtype, contiguous
    """
    _check_inputs(q, k, v, bias, mask, activation, sigmoid_bias, backend)
    backend = _resolve_backend(backend, q)
    if backend == "torch":
        return triangle_attention_ref(q, k, v, bias, mask, activation=activation, scale=scale,
                                      sigmoid_bias=sigmoid_bias)
    B, I, J, H, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    sigmoid = activation == "sigmoid"
    beta = None
    if sigmoid:
        if sigmoid_bias is not None:
            beta = torch.full((B, I), float(sigmoid_bias), dtype=torch.float32, device=q.device)
        elif mask is not None:
            beta = -torch.log(mask.sum(-1).clamp(min=1).to(torch.float32))      # [B, I]
        else:
            beta = torch.full((B, I), -math.log(J), dtype=torch.float32, device=q.device)
    residuals = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, bias))
    config = _override or default_config(D)
    forward = _fwd_op if torch.compiler.is_compiling() else _EagerTriangleAttention.apply
    separate_dq = config.separate_dq if config.separate_dq is not None else \
        os.environ.get("MINI_OF3_SEPARATE_DQ", "1") != "0"   # the backward's kernels are chosen here, at the forward
    # p's rounding in the forward reaches the gradients only through the fused backward's delta = rowsum(dO * o)
    split_p = _use_split(config, q.dtype, "p", residuals and not sigmoid and not separate_dq)
    split_ds = _use_split(config, q.dtype, "ds")
    key_mask = config.key_mask or os.environ.get("MINI_OF3_KEY_MASK", "bool")
    if key_mask not in ("bool", "float"):
        raise ValueError(f"key_mask / MINI_OF3_KEY_MASK must be 'bool' or 'float', got {key_mask!r}")
    bool_mask = key_mask == "bool"
    key_bias = _key_bias(mask, beta, scale, (B, I, J), bool_mask)      # once, for the forward and its backward
    if not residuals and not torch.compiler.is_compiling():   # inference: no autograd node (~10 us of host time)
        return _forward(q, k, v, bias, key_bias, sigmoid, scale, False, split_p, False)[0]
    o, _, _ = forward(q, k, v, bias, key_bias, sigmoid, scale, residuals, split_p, split_ds, separate_dq)
    return o
