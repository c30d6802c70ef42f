"""Fused triangle multiplicative update (AF3 SI Alg 12 outgoing, Alg 13 incoming): the public function, its checks
and the autograd-wired custom ops.

    triangle_multiplication(z, mask=None, *, direction="outgoing", norm_in_weight, norm_in_bias, p_in_weight,
                            g_in_weight, norm_out_weight, norm_out_bias, p_out_weight, g_out_weight, eps=1e-5,
                            backend="auto") -> [B, N, N, C]
    kernel_takes(z, hidden) -> bool      whether backend="auto" runs the Triton kernel on z

The semantics of ``mini_of3.model.tri_mul_backends.triangle_multiplication_torch`` (cuEquivariance's argument names).
Structure (launchers: triangle_multiplication_host.py; kernels and launch order: triangle_multiplication_kernels.py):
two Triton kernels around one cuBLAS contraction forward,
their mirrors around two cuBLAS contractions backward. The contraction itself stays in cuBLAS: it is 2 N^3 h FLOPs
(116 GFLOP at N = 768, h = 128), which cuBLAS runs near the tensor cores' peak on [B * h, N, N] operands, outgoing
t_c = a_c b_c^T and incoming t_c = a_c^T b_c as transposed operands of the same batched GEMM (no copies). Everything
around it is memory-bound, so the Triton kernels fuse each side into one pass over the pair tensor: LayerNorm, the
four projections, gates and mask before (one read of z); LayerNorm over h, the output projection and gate after (one
read of t). The forward keeps a, b, t and g_out's pre-activation in the compute dtype for the backward (the
projections are recomputed from z there, cheaper than keeping the four of them).

Precision (16-bit compute dtype, i.e. bf16 autocast): the projections, the contraction and the output projection run
on the tensor cores with float32 accumulation; a, b, t, the normalised t and the output are rounded to bf16 once each,
as in the eager version under autocast; LayerNorm statistics, gates and their gradients are float32. Gradients: no
atomics. The weight gradients (sums over the N * N pairs) are cuBLAS GEMMs over operands materialised in the compute
dtype; the LayerNorm affine gradients are per-program float32 partials summed by torch in a fixed order. Output and
all gradients repeat bitwise for a given device.
"""
from __future__ import annotations

import torch

from mini_of3.kernels.host import (check_backend, compute_dtype, dispatch, eager_function, needs_grad, pow2,
                                   resolve_backend)
from mini_of3.kernels.reference import triangle_multiplication_reference
from mini_of3.kernels.triangle_multiplication_host import backward, forward, weight_grads

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
WEIGHT_NAMES = ("norm_in_weight", "norm_in_bias", "p_in_weight", "g_in_weight", "norm_out_weight", "norm_out_bias",
                "p_out_weight", "g_out_weight")


# ---------------------------------------------------------------------------------------------------------------
# input checks


def _check_inputs(z, mask, direction, weights: dict, backend: str) -> None:
    if not isinstance(z, torch.Tensor) or z.dim() != 4 or z.shape[1] != z.shape[2]:
        raise ValueError(f"triangle_multiplication: z must be a [B, N, N, C] tensor, got "
                         f"{tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__}")
    B, N, _, C = z.shape
    if z.dtype not in (*SUPPORTED_DTYPES, torch.float64):
        raise TypeError(f"triangle_multiplication: z dtype must be float16, bfloat16 or float32, got {z.dtype}")
    h2 = weights["p_in_weight"].shape[0] if weights["p_in_weight"].dim() == 2 else -1
    expected = {"norm_in_weight": (C,), "norm_in_bias": (C,), "p_in_weight": (h2, C), "g_in_weight": (h2, C),
                "norm_out_weight": (h2 // 2,), "norm_out_bias": (h2 // 2,), "p_out_weight": (C, h2 // 2),
                "g_out_weight": (C, C)}
    for name, shape in expected.items():
        w = weights[name]
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"triangle_multiplication: {name} must be a torch.Tensor, got {type(w).__name__}")
        if tuple(w.shape) != shape or h2 < 2 or h2 % 2:
            raise ValueError(f"triangle_multiplication: {name} must be {shape} for z of shape {tuple(z.shape)} and "
                             f"p_in_weight of shape {tuple(weights['p_in_weight'].shape)} (2 h rows), got "
                             f"{tuple(w.shape)}")
        if not w.is_floating_point():
            raise TypeError(f"triangle_multiplication: {name} must be floating point, got {w.dtype}")
    devices = {z.device, *(w.device for w in weights.values())}
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"triangle_multiplication: mask must be a tensor or None, got {type(mask).__name__}")
        if tuple(mask.shape) != (B, N, N):
            raise ValueError(f"triangle_multiplication: mask must be [B, N, N] = {(B, N, N)}, got "
                             f"{tuple(mask.shape)}")
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise TypeError(f"triangle_multiplication: mask must be bool or floating point, got {mask.dtype}")
        devices.add(mask.device)
    if len(devices) > 1:
        raise ValueError(f"triangle_multiplication: all inputs must be on one device, got {sorted(map(str, devices))}")
    if direction not in ("outgoing", "incoming"):
        raise ValueError(f"triangle_multiplication: direction must be 'outgoing' or 'incoming', got {direction!r}")
    check_backend("triangle_multiplication", backend)
    if min(B, N) < 1:
        raise ValueError(f"triangle_multiplication: every dimension must be >= 1, got z of shape {tuple(z.shape)}")


def kernel_takes(z: torch.Tensor, hidden: int) -> bool:
    """Whether backend="auto" runs the Triton kernel on z: a CUDA tensor of a 16- or 32-bit float dtype, the pair
    channels C and the hidden channels multiples of 16."""
    return z.is_cuda and z.dtype in SUPPORTED_DTYPES and z.shape[-1] % 16 == 0 and hidden % 16 == 0


def _resolve_backend(backend: str, z: torch.Tensor, hidden: int) -> str:
    backend = resolve_backend("triangle_multiplication", backend, kernel_takes(z, hidden), z)
    if backend == "triton":
        C = z.shape[-1]
        if C % 16 or hidden % 16:
            raise ValueError(f"triangle_multiplication: the Triton kernel needs the pair channels C and the hidden "
                             f"channels h to be multiples of 16 (tensor-core tiles), got C={C}, h={hidden}")
        if z.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"triangle_multiplication: the Triton kernel takes float16, bfloat16 or float32 z, got "
                            f"{z.dtype}")
    return backend


# ---------------------------------------------------------------------------------------------------------------
# custom ops (opaque to torch.compile), autograd and the eager path


@torch.library.custom_op("mini_of3::triangle_multiplication_fwd", mutates_args=())
def _fwd_op(z: torch.Tensor, mask: torch.Tensor | None, ln_in_w: torch.Tensor, ln_in_b: torch.Tensor,
            p_in: torch.Tensor, g_in: torch.Tensor, ln_out_w: torch.Tensor, ln_out_b: torch.Tensor,
            p_out: torch.Tensor, g_out: torch.Tensor, outgoing: bool, eps: float, compute_dtype: torch.dtype,
            out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                             torch.Tensor, torch.Tensor, torch.Tensor]:
    return forward(z, mask, ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out, outgoing, eps,
                   compute_dtype, out_dtype)


@_fwd_op.register_fake
def _fwd_fake(z, mask, ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out, outgoing, eps,
              compute_dtype, out_dtype):
    B, N, _, C = z.shape
    h = p_in.shape[0] // 2
    return (z.new_empty((B, N, N, C), dtype=out_dtype), z.new_empty((2, B * h, N, N), dtype=compute_dtype),
            z.new_empty((B * h, N, N), dtype=compute_dtype), z.new_empty((B, N, N, C), dtype=compute_dtype),
            z.new_empty((2, B, N * N), dtype=torch.float32), z.new_empty((2, B, N * N), dtype=torch.float32),
            z.new_empty((4 * h + C, C), dtype=compute_dtype), z.new_empty((C, h), dtype=compute_dtype))


@torch.library.custom_op("mini_of3::triangle_multiplication_bwd", mutates_args=())
def _bwd_op(dout: torch.Tensor, z: torch.Tensor, mask: torch.Tensor | None, ln_in_w: torch.Tensor,
            ln_in_b: torch.Tensor, p_in: torch.Tensor, g_in: torch.Tensor, ln_out_w: torch.Tensor,
            ln_out_b: torch.Tensor, p_out: torch.Tensor, g_out: torch.Tensor, ab: torch.Tensor, t: torch.Tensor,
            gpre: torch.Tensor, stats_in: torch.Tensor, stats_out: torch.Tensor, w_in: torch.Tensor,
            w_po: torch.Tensor, outgoing: bool, eps: float
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return backward(dout, z, mask, ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out, ab, t, gpre,
                    stats_in, stats_out, w_in, w_po, outgoing, eps)


@_bwd_op.register_fake
def _bwd_fake(dout, z, mask, ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out, ab, t, gpre, stats_in,
              stats_out, w_in, w_po, outgoing, eps):
    C, h2, f32 = z.shape[-1], p_in.shape[0], torch.float32
    return (z.new_empty(z.shape), z.new_empty((2, pow2(C)), dtype=f32), z.new_empty((h2 * 2 + C, C), dtype=f32),
            z.new_empty((2, pow2(h2 // 2)), dtype=f32), p_out.new_empty(p_out.shape))


def _setup_context(ctx, inputs, output):
    z, mask, *weights, outgoing, eps, _compute_dtype, _out_dtype = inputs
    _out, *residuals = output
    ctx.save_for_backward(z, mask, *weights, *residuals)
    ctx.outgoing, ctx.eps = outgoing, eps
    ctx.mark_non_differentiable(*residuals)
    ctx.set_materialize_grads(False)     # no zero-filled gradients for the residuals


def _autograd_backward(ctx, dout, *_residual_grads, backward_fn=_bwd_op):
    z, mask, *rest = ctx.saved_tensors
    dz, *buffers = backward_fn(dout, z, mask, *rest, ctx.outgoing, ctx.eps)
    return dz, None, *weight_grads(rest[:8], *buffers), None, None, None, None


_fwd_op.register_autograd(_autograd_backward, setup_context=_setup_context)
_EagerTriangleMultiplication = eager_function("_EagerTriangleMultiplication", forward, _setup_context,
                                              _autograd_backward, backward)


# ---------------------------------------------------------------------------------------------------------------
# public function


def triangle_multiplication(
    z: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    direction: str = "outgoing",
    norm_in_weight: torch.Tensor,
    norm_in_bias: torch.Tensor,
    p_in_weight: torch.Tensor,
    g_in_weight: torch.Tensor,
    norm_out_weight: torch.Tensor,
    norm_out_bias: torch.Tensor,
    p_out_weight: torch.Tensor,
    g_out_weight: torch.Tensor,
    eps: float = 1e-5,
    backend: str = "auto",
) -> torch.Tensor:
    """Fused triangle multiplicative update, outgoing (AF3 SI Alg 12) or incoming (Alg 13).

    out_ij = sigmoid(x_ij g_out^T) * (LayerNorm(sum_k a_ik b_jk) p_out^T) (outgoing; incoming sums a_ki b_kj), with
    x = LayerNorm(z), a | b = (x p_in^T) * sigmoid(x g_in^T) * mask.

    Args:
        z: [B, N, N, C], any strides; float32, bfloat16 or float16
        mask: [B, N, N] pair mask (bool or float, 1 = keep), any strides, or None
        p_in_weight, g_in_weight: [2 h, C]; the first h rows make a, the last h make b
        norm_in_weight, norm_in_bias: [C]; norm_out_weight, norm_out_bias: [h]; p_out_weight: [C, h];
        g_out_weight: [C, C]
        backend: "triton" (CUDA, or CPU under TRITON_INTERPRET=1; C and h multiples of 16), "torch" (the plain
            reference of reference.py, as called) or "auto" (triton where ``kernel_takes``, else torch)
    Returns:
        [B, N, N, C], contiguous: in the autocast dtype under autocast (as the eager version returns), else in z's
        dtype. The Triton path computes in that dtype with float32 accumulation and statistics; gradients come in
        each input's dtype.
    """
    weights = dict(norm_in_weight=norm_in_weight, norm_in_bias=norm_in_bias, p_in_weight=p_in_weight,
                   g_in_weight=g_in_weight, norm_out_weight=norm_out_weight, norm_out_bias=norm_out_bias,
                   p_out_weight=p_out_weight, g_out_weight=g_out_weight)
    _check_inputs(z, mask, direction, weights, backend)
    if _resolve_backend(backend, z, p_in_weight.shape[0] // 2) == "torch":
        return triangle_multiplication_reference(z, mask, direction=direction, eps=eps, **weights)
    dtype = compute_dtype(z)                  # computed and returned in, as the eager version under autocast
    inputs = (z, mask, *(weights[name] for name in WEIGHT_NAMES), direction == "outgoing", float(eps), dtype, dtype)
    return dispatch(_fwd_op, _EagerTriangleMultiplication, forward, inputs, needs_grad(z, *weights.values()))[0]
