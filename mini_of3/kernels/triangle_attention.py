"""Fused triangle attention: the public function, its checks, and the autograd-wired custom ops.

    triangle_attention(q, k, v, bias, mask=None, *, activation="softmax", scale=None, sigmoid_bias=None,
                       backend="auto", split_ds=False, mask_queries=False) -> o
    gated_triangle_attention(qkvg, bias, mask=None, *, activation="softmax", scale=None, sigmoid_bias=None,
                             backend="auto", split_ds=False, mask_queries=False) -> sigmoid(g) * o
    kernel_takes(q) -> bool      whether backend="auto" runs the Triton kernel on q
    kernel_head_dim(D) -> int    the head dim the kernel runs D at (q, k, v zero-padded to it)

q, k, v: [B, I, J, H, D] (any strides; the ending node passes transposed views), bias: [B, H, J, K] float32 or the
input dtype, mask: [B, I, K] bool (True = attend). Implements the attention of AF3 SI Alg 14 (starting node) and,
on transposed views, Alg 15 (ending node); with I = 1 it is attention with pair bias (Alg 24). The gated form takes
q, k, v and the gate g packed as one projection's output, [B, I, J, 4, H, D], applies the gate in the forward
kernel's epilogue and writes the four gradients into one buffer, the gradient of that projection's output.
``mask_queries=True`` says that the mask holds for the queries too (the model's pair mask token_i & token_k): masked
queries give 0 and no gradient, and the kernels skip their tiles.

The forward and backward are Triton kernels (triangle_attention_kernels.py) launched by triangle_attention_host.py;
both are registered as ``torch.library`` custom ops with fake (meta) implementations, so ``torch.compile`` treats
them as opaque. Gradients use no atomics: output and all four gradients repeat bitwise for fixed tiles.
"""
from __future__ import annotations

import math

import torch

from mini_of3.kernels.host import (allocate, check_backend, dispatch, eager_function, interpreting, needs_grad,
                                   resolve_backend)
from mini_of3.kernels.reference import triangle_attention_ref
from mini_of3.kernels.triangle_attention_host import backward, forward, tiles

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------------------------------------------
# input checks


def _check_inputs(q, k, v, bias, mask, activation, sigmoid_bias, backend, mask_queries) -> None:
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
    check_backend("triangle_attention", backend)
    if not isinstance(mask_queries, bool):
        raise TypeError(f"triangle_attention: mask_queries must be a bool, got {mask_queries!r}")
    if min(B, I, J, H) < 1:
        raise ValueError(f"triangle_attention: every dimension must be >= 1, got q of shape {tuple(q.shape)}")


def kernel_head_dim(D: int) -> int | None:
    """The head dim the Triton kernel runs a head dim ``D`` at: the smallest of SUPPORTED_HEAD_DIMS >= D (q, k and v
    zero-padded to it: zero channels add nothing to q.k and give zero output channels), None above the largest."""
    return next((d for d in SUPPORTED_HEAD_DIMS if d >= D), None)


def kernel_takes(q: torch.Tensor, pads_head_dim: bool = True) -> bool:
    """Whether backend="auto" runs the Triton kernel on q: a CUDA tensor of a 16- or 32-bit float dtype with a head
    dim the kernel runs (in SUPPORTED_HEAD_DIMS, or up to the largest when ``pads_head_dim``: the plain form pads,
    the gated form does not)."""
    D = q.shape[-1]
    fits = kernel_head_dim(D) is not None if pads_head_dim else D in SUPPORTED_HEAD_DIMS
    return q.is_cuda and q.dtype in SUPPORTED_DTYPES and fits


def _resolve_backend(backend: str, q: torch.Tensor, pads_head_dim: bool) -> str:
    backend = resolve_backend("triangle_attention", backend, kernel_takes(q, pads_head_dim), q)
    if backend == "triton":
        D = q.shape[-1]
        if pads_head_dim and kernel_head_dim(D) is None:
            raise ValueError(f"triangle_attention: head dim D must be at most {SUPPORTED_HEAD_DIMS[-1]} for the "
                             f"Triton kernel, got {D}")
        if not pads_head_dim and D not in SUPPORTED_HEAD_DIMS:
            raise ValueError(f"gated_triangle_attention: head dim D must be one of {SUPPORTED_HEAD_DIMS} for the "
                             f"Triton kernel, got {D}")
        if q.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"triangle_attention: the Triton kernel takes float16, bfloat16 or float32, got {q.dtype}")
    return backend


def _key_bias(mask: torch.Tensor | None, beta: torch.Tensor | None, scale: float,
              shape: tuple[int, int, int]) -> torch.Tensor | None:
    """The per-key term of the raw scores, [B, I, K], built once per call and saved for the backward: for softmax
    the caller's bool mask itself (no copy; the kernels turn it into 0 / -inf), for sigmoid float32, -inf at masked
    keys plus beta_i / scale; None when there is neither."""
    if mask is None and beta is None:
        return None
    if beta is None:
        return mask
    if mask is None:
        return (beta / scale)[:, :, None].expand(shape)                 # [B, I, K], stride 0 over keys
    key_bias = torch.where(mask, 0.0, float("-inf")).to(torch.float32)  # [B, I, K]
    return key_bias + (beta / scale)[:, :, None]


# ---------------------------------------------------------------------------------------------------------------
# custom ops (opaque to torch.compile), autograd and the eager path


def _forward(q, k, v, bias, key_bias, sigmoid, scale, residuals, split_ds, fast_exp, mask_queries):
    """o and lse (the forward op's arguments; split_ds is kept for the backward)."""
    return forward(q, k, v, bias, key_bias, sigmoid, scale, residuals, fast_exp, mask_queries=mask_queries)


@torch.library.custom_op("mini_of3::triangle_attention_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, key_bias: torch.Tensor | None,
            sigmoid: bool, scale: float, residuals: bool, split_ds: bool, fast_exp: bool, mask_queries: bool
            ) -> tuple[torch.Tensor, torch.Tensor]:
    return _forward(q, k, v, bias, key_bias, sigmoid, scale, residuals, split_ds, fast_exp, mask_queries)


@_fwd_op.register_fake
def _fwd_fake(q, k, v, bias, key_bias, sigmoid, scale, residuals, split_ds, fast_exp, mask_queries):
    B, I, J, H, D = q.shape
    lse_shape = (B, H, I, J) if residuals and not sigmoid else 0
    return q.new_empty((B, I, J, H, D)), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("mini_of3::triangle_attention_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
            key_bias: torch.Tensor | None, o: torch.Tensor, lse: torch.Tensor, sigmoid: bool, scale: float,
            split_ds: bool, fast_exp: bool, mask_queries: bool
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _backward(do, q, k, v, bias, key_bias, o, lse, sigmoid, scale, split_ds, fast_exp, mask_queries)


def _backward(do, q, k, v, bias, key_bias, o, lse, sigmoid, scale, split_ds, fast_exp, mask_queries):
    """dq, dk, dv, dbias (the backward op's arguments)."""
    return backward(do, q, k, v, bias, key_bias, o, lse, sigmoid, scale, split_ds, fast_exp,
                    mask_queries=mask_queries)


@_bwd_op.register_fake
def _bwd_fake(do, q, k, v, bias, key_bias, o, lse, sigmoid, scale, split_ds, fast_exp, mask_queries):
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape), bias.new_empty(bias.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, bias, key_bias, sigmoid, scale, residuals, split_ds, fast_exp, mask_queries = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, bias, key_bias, o, lse)
    ctx.sigmoid, ctx.scale, ctx.split_ds, ctx.fast_exp = sigmoid, scale, split_ds, fast_exp
    ctx.mask_queries = mask_queries
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)     # no zero-filled gradient for lse


def _autograd_backward(ctx, do, _dlse, backward_fn=_bwd_op):
    q, k, v, bias, key_bias, o, lse = ctx.saved_tensors
    dq, dk, dv, dbias = backward_fn(do, q, k, v, bias, key_bias, o, lse, ctx.sigmoid, ctx.scale, ctx.split_ds,
                                    ctx.fast_exp, ctx.mask_queries)
    return dq, dk, dv, dbias, None, None, None, None, None, None, None


_fwd_op.register_autograd(_autograd_backward, setup_context=_setup_context)
_EagerTriangleAttention = eager_function("_EagerTriangleAttention", _forward, _setup_context, _autograd_backward,
                                         _backward)


def _gated_forward(qkvg, bias, key_bias, sigmoid, scale, residuals, split_ds, fast_exp, mask_queries):
    """sigmoid(g) * o [B, I, J, H, D] and lse, from the packed qkvg [B, I, J, 4, H, D]."""
    q, k, v, g = qkvg.unbind(3)
    return forward(q, k, v, bias, key_bias, sigmoid, scale, residuals, fast_exp, gate=g, mask_queries=mask_queries)


def _gated_backward(dout, qkvg, bias, key_bias, out, lse, sigmoid, scale, split_ds, fast_exp, mask_queries):
    """d(qkvg) [B, I, J, 4, H, D] (dq, dk, dv, dg written in place by the kernels) and dbias."""
    dqkvg = allocate(qkvg.shape, qkvg.dtype, qkvg.device)
    q, k, v, g = qkvg.unbind(3)
    _, _, _, dbias = backward(dout, q, k, v, bias, key_bias, out, lse, sigmoid, scale, split_ds, fast_exp,
                              gate=g, grads=dqkvg.unbind(3), mask_queries=mask_queries)
    return dqkvg, dbias


@torch.library.custom_op("mini_of3::gated_triangle_attention_fwd", mutates_args=())
def _gated_fwd_op(qkvg: torch.Tensor, bias: torch.Tensor, key_bias: torch.Tensor | None, sigmoid: bool,
                  scale: float, residuals: bool, split_ds: bool, fast_exp: bool, mask_queries: bool
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    return _gated_forward(qkvg, bias, key_bias, sigmoid, scale, residuals, split_ds, fast_exp, mask_queries)


@_gated_fwd_op.register_fake
def _gated_fwd_fake(qkvg, bias, key_bias, sigmoid, scale, residuals, split_ds, fast_exp, mask_queries):
    B, I, J, _, H, D = qkvg.shape
    lse_shape = (B, H, I, J) if residuals and not sigmoid else 0
    return qkvg.new_empty((B, I, J, H, D)), qkvg.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("mini_of3::gated_triangle_attention_bwd", mutates_args=())
def _gated_bwd_op(dout: torch.Tensor, qkvg: torch.Tensor, bias: torch.Tensor, key_bias: torch.Tensor | None,
                  out: torch.Tensor, lse: torch.Tensor, sigmoid: bool, scale: float, split_ds: bool, fast_exp: bool,
                  mask_queries: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return _gated_backward(dout, qkvg, bias, key_bias, out, lse, sigmoid, scale, split_ds, fast_exp, mask_queries)


@_gated_bwd_op.register_fake
def _gated_bwd_fake(dout, qkvg, bias, key_bias, out, lse, sigmoid, scale, split_ds, fast_exp, mask_queries):
    return qkvg.new_empty(qkvg.shape), bias.new_empty(bias.shape)


def _gated_setup_context(ctx, inputs, output):
    qkvg, bias, key_bias, sigmoid, scale, residuals, split_ds, fast_exp, mask_queries = inputs
    out, lse = output
    ctx.save_for_backward(qkvg, bias, key_bias, out, lse)
    ctx.sigmoid, ctx.scale, ctx.split_ds, ctx.fast_exp = sigmoid, scale, split_ds, fast_exp
    ctx.mask_queries = mask_queries
    ctx.mark_non_differentiable(lse)
    ctx.set_materialize_grads(False)


def _gated_autograd_backward(ctx, dout, _dlse, backward_fn=_gated_bwd_op):
    qkvg, bias, key_bias, out, lse = ctx.saved_tensors
    dqkvg, dbias = backward_fn(dout, qkvg, bias, key_bias, out, lse, ctx.sigmoid, ctx.scale, ctx.split_ds,
                               ctx.fast_exp, ctx.mask_queries)
    return dqkvg, dbias, None, None, None, None, None, None, None


_gated_fwd_op.register_autograd(_gated_autograd_backward, setup_context=_gated_setup_context)
_EagerGatedTriangleAttention = eager_function("_EagerGatedTriangleAttention", _gated_forward, _gated_setup_context,
                                              _gated_autograd_backward, _gated_backward)


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
    split_ds: bool = False,
    mask_queries: bool = False,
) -> torch.Tensor:
    """Fused triangle attention (AF3 SI Alg 14/15; Alg 24 with I = 1), softmax or sigmoid.

    Args:
        q, k, v: [B, I, J, H, D], any strides (no copies are made); the Triton kernel runs D in {16, 32, 64, 128}
            as it is and any other D up to 128 zero-padded to the next of them (AF3's single attention: D = 24)
        bias: [B, H, J, K] float32 or the input dtype, shared by every row i; its gradient has its dtype
        mask: [B, I, K] bool, True = attend; a row with no valid key gives output 0 and zero gradients
        activation: "softmax", or "sigmoid" (o = sum_k sigmoid(s_ijk + beta_i) v_ik, no normaliser)
        scale: score scale, default 1/sqrt(D)
        sigmoid_bias: beta for activation="sigmoid"; default -log(number of valid keys of row i)
        backend: "triton", "torch" (the reference in the input dtype) or "auto" (triton where ``kernel_takes``,
            else torch)
        split_ds: for 16-bit inputs, the backward splits dS into bf16 hi + lo parts before its products with k and
            q (dq, dk errors 1.7e-3 at N = 256, D = 32) instead of rounding it once (2.4e-3, as cuEquivariance's;
            ~1.2 ms less per backward at N = 768)
        mask_queries: the mask holds for the queries too: the row attention's queries j range over the same
            positions as its keys k, and query j of row i is masked exactly when mask[b, i, j] is False (the
            model's pair mask token_i & token_k). A masked query's output is exactly 0 and every gradient through
            it is 0 (its dq is 0; it adds nothing to dk, dv, dbias); the kernels skip its work (query tiles past a
            row's last valid key cost nothing). With mask=None it changes nothing; False: every query computed
    Returns:
        o: [B, I, J, H, D] in the input dtype, contiguous
    """
    _check_inputs(q, k, v, bias, mask, activation, sigmoid_bias, backend, mask_queries)
    if _resolve_backend(backend, q, pads_head_dim=True) == "torch":
        return triangle_attention_ref(q, k, v, bias, mask, activation=activation, scale=scale,
                                      sigmoid_bias=sigmoid_bias, mask_queries=mask_queries)
    D = q.shape[-1]
    if (padded := kernel_head_dim(D)) != D:
        pad = (0, padded - D)                                           # [B, I, J, H, D] -> [B, I, J, H, padded]
        o = triangle_attention(*(torch.nn.functional.pad(t, pad) for t in (q, k, v)), bias, mask,
                               activation=activation, scale=1.0 / math.sqrt(D) if scale is None else scale,
                               sigmoid_bias=sigmoid_bias, backend="triton", split_ds=split_ds,
                               mask_queries=mask_queries)
        return o[..., :D].contiguous()
    grad = needs_grad(q, k, v, bias)
    inputs = (q, k, v, bias, *_kernel_arguments(q, mask, activation, scale, sigmoid_bias, split_ds, grad,
                                                 mask_queries))
    o, _ = dispatch(_fwd_op, _EagerTriangleAttention, _forward, inputs, grad)
    return o


def gated_triangle_attention(
    qkvg: torch.Tensor,
    bias: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    activation: str = "softmax",
    scale: float | None = None,
    sigmoid_bias: float | None = None,
    backend: str = "auto",
    split_ds: bool = False,
    mask_queries: bool = False,
) -> torch.Tensor:
    """Gated triangle attention: sigmoid(g) * triangle_attention(q, k, v, bias, mask) (AF3 SI Alg 14 lines 5-6).

    Args:
        qkvg: [B, I, J, 4, H, D], q, k, v and the gate g along dim 3 (one projection's output, any strides); its
            gradient comes back as one tensor of that shape, written by the kernels in place
        bias, mask, activation, scale, sigmoid_bias, backend, split_ds: as :func:`triangle_attention`
        mask_queries: as :func:`triangle_attention`; a masked query's output sigmoid(g) * 0 is 0, and its dg is 0
    Returns:
        sigmoid(g) * o: [B, I, J, H, D] in the input dtype, contiguous
    """
    if not isinstance(qkvg, torch.Tensor) or qkvg.dim() != 6 or qkvg.shape[3] != 4:
        raise ValueError(f"gated_triangle_attention: qkvg must be [B, I, J, 4, H, D], got "
                         f"{tuple(qkvg.shape) if isinstance(qkvg, torch.Tensor) else type(qkvg).__name__}")
    q, k, v, g = qkvg.unbind(3)
    _check_inputs(q, k, v, bias, mask, activation, sigmoid_bias, backend, mask_queries)
    if _resolve_backend(backend, q, pads_head_dim=False) == "torch":
        return torch.sigmoid(g) * triangle_attention_ref(q, k, v, bias, mask, activation=activation, scale=scale,
                                                         sigmoid_bias=sigmoid_bias, mask_queries=mask_queries)
    grad = needs_grad(qkvg, bias)
    inputs = (qkvg, bias, *_kernel_arguments(q, mask, activation, scale, sigmoid_bias, split_ds, grad,
                                              mask_queries))
    out, _ = dispatch(_gated_fwd_op, _EagerGatedTriangleAttention, _gated_forward, inputs, grad)
    return out


def _kernel_arguments(q: torch.Tensor, mask: torch.Tensor | None, activation: str, scale: float | None,
                      sigmoid_bias: float | None, split_ds: bool, residuals: bool, mask_queries: bool) -> tuple:
    """The forward op's arguments after the tensors: (key_bias, sigmoid, scale, residuals, split_ds, fast_exp,
    mask_queries); ``residuals``: whether a backward will follow (the forward then keeps lse); ``mask_queries``
    only with a mask (without one every query is valid)."""
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
    split_ds = split_ds and q.dtype != torch.float32       # float32 dS goes into float32 products unrounded
    # taken here, at the forward, for its backward too; the interpreter cannot run PTX
    fast_exp = tiles(D).fast_exp and q.is_cuda and not interpreting()
    key_bias = _key_bias(mask, beta, scale, (B, I, J))      # once, for the forward and its backward
    return key_bias, sigmoid, scale, residuals, split_ds, fast_exp, mask_queries and mask is not None
