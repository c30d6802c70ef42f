"""Fused SwiGLU transition (AF3 SI Alg 11): the public function, its checks and the autograd-wired custom ops.

    transition(x, *, norm_weight, norm_bias, a_weight, b_weight, out_weight, eps=1e-5, backend="auto") -> [..., C]
    kernel_takes(x, hidden) -> bool      whether backend="auto" runs the Triton kernel on x

out = (silu(x' W_a^T) * (x' W_b^T)) W_out^T with x' = LayerNorm(x): the semantics of
``mini_of3.model.transition.Transition``. On the pair track (C = 128, n = 4, N^2 rows) the eager version writes and
reads four hidden tensors of N^2 x 512 values per call; here the forward is one Triton kernel (launchers in
transition_host.py, kernels in transition_kernels.py) whose hidden activations stay on the chip, and the backward one kernel that recomputes them
and writes only the operands of the three weight GEMMs (cuBLAS). The forward keeps only the LayerNorm statistics for
the backward (8 bytes a row).

Precision (16-bit compute dtype, i.e. bf16 autocast): the three projections run on the tensor cores with float32
accumulation; the normalised x, the hidden activation h and the output are rounded to bf16 once each (the eager
version under autocast also rounds a, b and silu(a)); LayerNorm statistics, the SwiGLU and its gradient are float32.
Gradients: no atomics; output and all gradients repeat bitwise for a given device.
"""
from __future__ import annotations

import torch

from mini_of3.kernels.host import (check_backend, compute_dtype, dispatch, eager_function, needs_grad, pow2,
                                   resolve_backend)
from mini_of3.kernels.reference import transition_reference
from mini_of3.kernels.transition_host import backward, forward, weight_grads

MAX_CHANNELS = 256          # the widest C whose tiles fit one sm_90 multiprocessor (transition_host.py)
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
    check_backend("transition", backend)
    if x.numel() == 0:
        raise ValueError(f"transition: every dimension must be >= 1, got x of shape {tuple(x.shape)}")


def kernel_takes(x: torch.Tensor, hidden: int) -> bool:
    """Whether backend="auto" runs the Triton kernel on x: a CUDA tensor of a 16- or 32-bit float dtype, with
    C <= MAX_CHANNELS channels, C and the hidden width multiples of 16."""
    C = x.shape[-1]
    return x.is_cuda and x.dtype in SUPPORTED_DTYPES and C <= MAX_CHANNELS and C % 16 == 0 and hidden % 16 == 0


def _resolve_backend(backend: str, x: torch.Tensor, hidden: int) -> str:
    backend = resolve_backend("transition", backend, kernel_takes(x, hidden), x)
    if backend == "triton":
        C = x.shape[-1]
        if C % 16 or hidden % 16:
            raise ValueError(f"transition: the Triton kernel needs the channels C and the hidden width to be "
                             f"multiples of 16 (tensor-core tiles), got C={C}, hidden={hidden}")
        if C > MAX_CHANNELS:
            raise ValueError(f"transition: the Triton kernel takes C <= {MAX_CHANNELS} channels (its [rows, C] "
                             f"tiles stay on the chip), got C={C}; use backend='torch'")
        if x.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"transition: the Triton kernel takes float16, bfloat16 or float32 x, got {x.dtype}")
    return backend


# ---------------------------------------------------------------------------------------------------------------
# custom ops (opaque to torch.compile), autograd and the eager path


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
    dtype = compute_dtype(x)                  # computed and returned in, as the eager version under autocast
    grad = needs_grad(x, *weights.values())
    inputs = (x, norm_weight, norm_bias, a_weight, b_weight, out_weight, float(eps), dtype, dtype, grad)
    return dispatch(_fwd_op, _EagerTransition, forward, inputs, grad)[0]
