"""Fused SwiGLU transition (AF3 SI Alg 11): the public function, its checks, the launchers and the autograd-wired
custom ops.

    transition(x, *, norm_weight, norm_bias, a_weight, b_weight, out_weight, eps=1e-5, backend="auto") -> [..., C]

out = (silu(x' W_a^T) * (x' W_b^T)) W_out^T with x' = LayerNorm(x): the semantics of
``mini_of3.model.transition.Transition``. On the pair track (C = 128, n = 4, N^2 rows) the eager version writes and
reads four hidden tensors of N^2 x 512 values per call; here the forward is one Triton kernel (kernels in
transition_kernels.py) whose hidden activations stay on the chip, and the backward one kernel that recomputes them
and writes only the operands of the three weight GEMMs (cuBLAS). The forward keeps only the LayerNorm statistics for
the backward (8 bytes a row).

Precision (16-bit compute dtype, i.e. bf16 autocast): the three projections run on the tensor cores with float32
accumulation; the normalised x, the hidden activation h and the output are rounded to bf16 once each (the eager
version under autocast also rounds a, b and silu(a)); LayerNorm statistics, the SwiGLU and its gradient are float32.
Gradients: no atomics; output and all gradients repeat bitwise for a given device.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from mini_of3.kernels import transition_kernels as K
from mini_of3.kernels.launch import TileOverride, _dot_precision, _new, cdiv, eager_function, pow2, stacked
from mini_of3.kernels.launcher import interpreting, launch
from mini_of3.kernels.reference import transition_reference
from mini_of3.kernels.triangle_multiplication import _weight_grad

BACKENDS = ("auto", "triton", "torch")
MAX_CHANNELS = 256          # the widest C whose tiles fit one sm_90 multiprocessor (``_tiles``)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_inputs(x, weights: dict, backend: str) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError(f"transition: x must be a [..., C] tensor with at least two axes, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dtype not in (*SUPPORTED_DTYPES, torch.float64):
        raise TypeError(f"transition: x dtype must be float16, bfloat16 or float32, got {x.dtype}")
    C = x.shape[-1]
    hid = weights["a_weight"].shape[0] if weights["a_weight"].dim() == 2 else -1
    expected = {"norm_weight": (C,), "norm_bias": (C,), "a_weight": (hid, C), "b_weight": (hid, C),
                "out_weight": (C, hid)}
    for name, shape in expected.items():
        w = weights[name]
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"transition: {name} must be a torch.Tensor, got {type(w).__name__}")
        if tuple(w.shape) != shape or hid < 1:
            raise ValueError(f"transition: {name} must be {shape} for x of shape {tuple(x.shape)} and a_weight of "
                             f"shape {tuple(weights['a_weight'].shape)}, got {tuple(w.shape)}")
        if not w.is_floating_point():
            raise TypeError(f"transition: {name} must be floating point, got {w.dtype}")
    devices = {x.device, *(w.device for w in weights.values())}
    if len(devices) > 1:
        raise ValueError(f"transition: all inputs must be on one device, got {sorted(map(str, devices))}")
    if backend not in BACKENDS:
        raise ValueError(f"transition: backend must be one of {BACKENDS}, got {backend!r}")
    if x.numel() == 0:
        raise ValueError(f"transition: every dimension must be >= 1, got x of shape {tuple(x.shape)}")


def kernel_takes(x: torch.Tensor, hidden: int) -> bool:
    """Whether backend="auto" runs the Triton kernel on x: a CUDA tensor of a 16- or 32-bit float dtype, with
    C <= MAX_CHANNELS channels, C and the hidden width multiples of 16."""
    C = x.shape[-1]
    return x.is_cuda and x.dtype in SUPPORTED_DTYPES and C <= MAX_CHANNELS and C % 16 == 0 and hidden % 16 == 0


def _resolve_backend(backend: str, x: torch.Tensor, hidden: int) -> str:
    if backend == "auto":
        return "triton" if kernel_takes(x, hidden) else "torch"
    if backend == "triton":
        C = x.shape[-1]
        if C % 16 or hidden % 16:
            raise ValueError(f"transition: the Triton kernel needs the channels C and the hidden width to be "
                             f"multiples of 16 (tensor-core tiles), got C={C}, hidden={hidden}")
        if C > MAX_CHANNELS:
            raise ValueError(f"transition: the Triton kernel takes C <= {MAX_CHANNELS} channels (its [rows, C] "
                             f"tiles stay on the chip), got C={C}; use backend='torch'")
        if not x.is_cuda and not interpreting():
            raise ValueError("transition: backend='triton' needs CUDA tensors, or CPU tensors with "
                             "TRITON_INTERPRET=1 set before mini_of3 is imported")
        if x.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"transition: the Triton kernel takes float16, bfloat16 or float32 x, got {x.dtype}")
    return backend


# ---------------------------------------------------------------------------------------------------------------
# tiles and launchers


@dataclass(frozen=True, kw_only=True)
class TransitionTiles:
    """Rows per program (``*_m``), hidden channels per chunk (``*_hc``), warps and pipeline stages of the two
    kernels. The defaults are the fastest of the sweep at C = 128, N = 768 (H100, `benchmarks/explore_transition.py
    --sweep 768`: forward 0.77 ms, forward+backward 4.18 against 6.47 with 64 rows and 32-channel chunks on 8 warps
    in the backward). Under the interpreter small ones, so that the tests' sizes span several tiles and chunks."""
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
    memory of an sm_90 multiprocessor up to C = 256 (`benchmarks/kernel_resources.py`); any ``transition_tiles``
    override on top; chunks no wider than the hidden width."""
    if interpreting():
        tiles = TransitionTiles(fwd_m=16, fwd_hc=16, fwd_stages=1, bwd_m=16, bwd_hc=16, bwd_warps=4, bwd_stages=1)
    elif C > 128:
        tiles = TransitionTiles(fwd_m=32, fwd_hc=32, bwd_m=32, bwd_hc=32)
    else:
        tiles = TransitionTiles()
    tiles = transition_tiles.apply(tiles)
    hc = pow2(hidden)
    return replace(tiles, fwd_hc=min(tiles.fwd_hc, hc), bwd_hc=min(tiles.bwd_hc, hc))


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
    out = _new((M, C), out_dtype, dev)
    stats = _new((2, M) if store_stats else (2, 0), torch.float32, dev)
    launch(
        K._transition_fwd, (cdiv(M, tiles.fwd_m),),
        rows, ln_w.float().contiguous(), ln_b.float().contiguous(), w_ab[:hid], w_ab[hid:], wo, out,
        stats[0] if store_stats else out, stats[1] if store_stats else out, M, eps,
        C=C, HID=hid, STORE_STATS=store_stats, DOT_PREC=_dot_precision(cdt), BLOCK_M=tiles.fwd_m,
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
    dx = _new((M, C), x.dtype, dev)
    hidden = _new((M, hid), cdt, dev)
    dab = _new((M, 2 * hid), cdt, dev)
    xn = _new((M, C), cdt, dev)
    grid = (cdiv(M, tiles.bwd_m),)
    block_c = pow2(C)
    part = _new((grid[0], 2, block_c), torch.float32, dev)
    launch(
        K._transition_bwd, grid,
        rows, dout_rows, ln_w.float().contiguous(), ln_b.float().contiguous(), w_ab[:hid], w_ab[hid:], wo, stats[0],
        stats[1], dx,
        hidden, dab, xn, part, M, C=C, HID=hid, DOT_PREC=_dot_precision(cdt), BLOCK_M=tiles.bwd_m,
        BLOCK_C=block_c, BLOCK_HC=tiles.bwd_hc, num_warps=tiles.bwd_warps, num_stages=tiles.bwd_stages)
    d_ln = part.sum(0)                                                             # [2, pow2(C)]
    d_o = _weight_grad(dout_rows.mT[None], hidden[None], w_o.dtype)               # [C, hid]
    del hidden
    d_ab = _weight_grad(dab.mT[None], xn[None], torch.float32)                     # [2 hid, C]
    return dx.view(x.shape), d_ln, d_ab, d_o


def weight_grads(weights, d_ln, d_ab, d_o):
    """The five weight gradients (norm weight, norm bias, W_a, W_b, W_out), each in its weight's dtype, from the
    backward's whole buffers: views of them where the dtype already matches (no copy kernels)."""
    ln_w, ln_b, w_a, w_b, _w_o = weights
    C, hid = ln_w.shape[0], w_a.shape[0]
    return (d_ln[0, :C].to(ln_w.dtype), d_ln[1, :C].to(ln_b.dtype), d_ab[:hid].to(w_a.dtype),
            d_ab[hid:].to(w_b.dtype), d_o)


# ---------------------------------------------------------------------------------------------------------------
# custom ops (opaque to torch.compile) and autograd


@torch.library.custom_op("mini_of3::transition_fwd", mutates_args=())
def _fwd_op(x: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, w_a: torch.Tensor, w_b: torch.Tensor,
            w_o: torch.Tensor, eps: float, compute_dtype: torch.dtype, out_dtype: torch.dtype,
            store_stats: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return forward(x, ln_w, ln_b, w_a, w_b, w_o, eps, compute_dtype, out_dtype, store_stats)


@_fwd_op.register_fake
def _fwd_fake(x, ln_w, ln_b, w_a, w_b, w_o, eps, compute_dtype, out_dtype, store_stats):
    M, C, hid = x.numel() // x.shape[-1], x.shape[-1], w_a.shape[0]
    return (x.new_empty(x.shape, dtype=out_dtype),
            x.new_empty((2, M) if store_stats else (2, 0), dtype=torch.float32),
            x.new_empty((2 * hid, C), dtype=compute_dtype), x.new_empty((C, hid), dtype=compute_dtype))


@torch.library.custom_op("mini_of3::transition_bwd", mutates_args=())
def _bwd_op(dout: torch.Tensor, x: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, w_a: torch.Tensor,
            w_b: torch.Tensor, w_o: torch.Tensor, stats: torch.Tensor, w_ab: torch.Tensor, wo: torch.Tensor,
            compute_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return backward(dout, x, ln_w, ln_b, w_a, w_b, w_o, stats, w_ab, wo, compute_dtype)


@_bwd_op.register_fake
def _bwd_fake(dout, x, ln_w, ln_b, w_a, w_b, w_o, stats, w_ab, wo, compute_dtype):
    C, f32 = x.shape[-1], torch.float32
    return (x.new_empty(x.shape), x.new_empty((2, pow2(C)), dtype=f32),
            x.new_empty((2 * w_a.shape[0], C), dtype=f32), w_o.new_empty(w_o.shape))


def _setup_context(ctx, inputs, output):
    x, ln_w, ln_b, w_a, w_b, w_o, _eps, compute_dtype, _out_dtype, _store = inputs
    _out, *residuals = output
    ctx.save_for_backward(x, ln_w, ln_b, w_a, w_b, w_o, *residuals)
    ctx.compute_dtype = compute_dtype
    ctx.mark_non_differentiable(*residuals)
    ctx.set_materialize_grads(False)


def _autograd_backward(ctx, dout, *_residual_grads, backward_fn=_bwd_op):
    x, *weights, stats, w_ab, wo = ctx.saved_tensors
    dx, *buffers = backward_fn(dout, x, *weights, stats, w_ab, wo, ctx.compute_dtype)
    return (dx, *weight_grads(weights, *buffers), None, None, None, None)


_fwd_op.register_autograd(_autograd_backward, setup_context=_setup_context)


_EagerTransition = eager_function("_EagerTransition", forward, _setup_context, _autograd_backward, backward)


# ---------------------------------------------------------------------------------------------------------------
# public function


def transition(
    x: torch.Tensor,
    *,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    a_weight: torch.Tensor,
    b_weight: torch.Tensor,
    out_weight: torch.Tensor,
    eps: float = 1e-5,
    backend: str = "auto",
) -> torch.Tensor:
    """Fused SwiGLU transition (AF3 SI Alg 11): LayerNorm, silu(x W_a^T) * (x W_b^T), then W_out.

    Args:
        x: [..., C], any strides (copied once when its rows are not contiguous); float32, bfloat16 or float16
        norm_weight, norm_bias: [C]; a_weight, b_weight: [n C, C]; out_weight: [C, n C]
        backend: "triton" (CUDA, or CPU under TRITON_INTERPRET=1; C <= 256 and C, n C multiples of 16), "torch"
            (the plain reference of reference.py) or "auto" (triton for CUDA tensors it takes, else torch)
    Returns:
        [..., C], contiguous: in the autocast dtype under autocast (as the eager version returns), else in x's dtype.
    """
    weights = dict(norm_weight=norm_weight, norm_bias=norm_bias, a_weight=a_weight, b_weight=b_weight,
                   out_weight=out_weight)
    _check_inputs(x, weights, backend)
    if _resolve_backend(backend, x, a_weight.shape[0]) == "torch":
        return transition_reference(x, eps=eps, **weights)
    device = x.device.type
    if torch.is_autocast_enabled(device):
        compute_dtype = out_dtype = torch.get_autocast_dtype(device)
    else:
        compute_dtype = out_dtype = x.dtype
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, *weights.values()))
    inputs = (x, norm_weight, norm_bias, a_weight, b_weight, out_weight, float(eps), compute_dtype, out_dtype,
              needs_grad)
    if not needs_grad and not torch.compiler.is_compiling():   # inference: no autograd node
        return forward(*inputs)[0]
    apply = _fwd_op if torch.compiler.is_compiling() else _EagerTransition.apply
    return apply(*inputs)[0]
