"""Triangle multiplicative update backends (AF3 SI Alg 12/13) with cuEquivariance's argument names.

    triangle_multiplication(z, mask, *, direction, norm_in_weight, norm_in_bias, p_in_weight, g_in_weight,
                            norm_out_weight, norm_out_bias, p_out_weight, g_out_weight, eps) -> [B, N, N, C]

    tri_mul_backend(kernels) -> update      the function for the choice's ``tri_mul_backend``

``torch`` is the plain PyTorch version below, ``mini_of3`` our fused Triton kernel
(``mini_of3.kernels.triangle_multiplication``; CUDA, or CPU under TRITON_INTERPRET=1, else it raises a ValueError
at the call, as the ``mini_of3`` attention backend does), ``auto`` the kernel where it takes the call and the torch
version elsewhere (``mini_of3.model.kernel_choice``), ``cueq`` cuEquivariance's fused
``triangle_multiplicative_update`` (imported only when chosen).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from mini_of3.kernels import triangle_multiplication
from mini_of3.kernels.triangle_multiplication import kernel_takes
from mini_of3.model.kernel_choice import KernelChoice, runs_kernel
from mini_of3.model.norm import layer_norm
from mini_of3.model.projections import linear_channels_first
from mini_of3.model.tri_attn_backends import import_anchor


def triangle_multiplication_torch(
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
) -> torch.Tensor:
    """Triangle multiplicative update, outgoing (AF3 SI Alg 12) or incoming (Alg 13), in plain PyTorch.

    Channels first, so that no step copies a permuted tensor: one GEMM, W @ x^T, writes the projections as
    [B, 4 h, N, N] (:func:`linear_channels_first`); the contraction is then one batched matrix product per channel
    (a_c b_c^T, outgoing, or a_c^T b_c, incoming) on the tensor cores, in the projections' dtype with float32
    accumulation; the second layer norm runs over the channel axis of [B, h, N * N] (a coalesced reduction), in
    float32; and the output projection reads that transposed (a GEMM operand, not a copy).

    Parameters
    ----------
    z : [B, N, N, C] pair representation
    mask : [B, N, N] pair mask (1 = keep) or None
    p_in_weight, g_in_weight : [2 * C_hidden, C]; the first C_hidden rows make a, the last C_hidden rows make b
    p_out_weight : [C, C_hidden]; g_out_weight : [C, C]

    Returns
    -------
    [B, N, N, C]; the update for pair ij is g_ij * p_out(LayerNorm(sum_k a_ik b_jk)) (outgoing) or with
    sum_k a_ki b_kj (incoming).
    """
    if direction not in ("outgoing", "incoming"):
        raise ValueError(f"direction must be 'outgoing' or 'incoming', got {direction!r}")
    B, N, _, C = z.shape
    h2 = p_in_weight.shape[0]                                                      # 2 h: a and b
    x = layer_norm(z, norm_in_weight, norm_in_bias, eps)                          # [B, N, N, C]
    pg = linear_channels_first(x, torch.cat([p_in_weight, g_in_weight]))         # [B, 4 h, N, N]
    ab = pg[:, :h2] * torch.sigmoid(pg[:, h2:])                                   # [B, 2 h, N, N]
    if mask is not None:
        ab = ab * mask[:, None].to(ab.dtype)
    a, b = ab.split(h2 // 2, dim=1)                                               # [B, h, N, N] each
    t = a @ b.mT if direction == "outgoing" else a.mT @ b                         # [B, h, N(i), N(j)]
    t = t.reshape(B, h2 // 2, N * N)
    wide = torch.promote_types(t.dtype, torch.float32)
    var, mean = torch.var_mean(t.to(wide), dim=1, unbiased=False, keepdim=True)  # [B, 1, N N]
    t = (t - mean) * torch.rsqrt(var + eps)
    t = t * norm_out_weight.to(wide)[:, None] + norm_out_bias.to(wide)[:, None]   # [B, h, N N]
    out = torch.matmul(t.mT.to(p_out_weight.dtype), p_out_weight.mT)              # [B, N N, C]
    g = torch.sigmoid(F.linear(x, g_out_weight))                                  # [B, N, N, C]
    return g * out.view(B, N, N, C)


def _ours(backend: str) -> Callable:
    def update(z, mask=None, **weights):
        if runs_kernel(backend, kernel_takes(z, weights["p_in_weight"].shape[0] // 2)):
            return triangle_multiplication(z, mask, backend="triton", **weights)
        return triangle_multiplication_torch(z, mask, **weights)
    return update


def _cueq(fn) -> Callable:
    def update(z, mask=None, **weights):
        return fn(z, mask=None if mask is None else mask.to(z.dtype), **weights)
    return update


def tri_mul_backend(kernels: KernelChoice) -> Callable:
    """The triangle multiplication function for ``kernels.tri_mul_backend`` (imports cueq now if chosen)."""
    if kernels.tri_mul_backend == "cueq":
        return _cueq(import_anchor("cueq", "cuequivariance_torch", "triangle_multiplicative_update"))
    return _ours(kernels.tri_mul_backend)
