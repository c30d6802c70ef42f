"""Triangle multiplicative update backends (AF3 SI Alg 12/13) with cuEquivariance's argument names.

    triangle_multiplication(z, mask, *, direction, norm_in_weight, norm_in_bias, p_in_weight, g_in_weight,
                            norm_out_weight, norm_out_bias, p_out_weight, g_out_weight, eps) -> [B, N, N, C]

``torch`` is the plain PyTorch version below, ``cueq`` cuEquivariance's fused ``triangle_multiplicative_update``
(imported only when chosen), ``auto`` the torch version. ``mini_of3`` (our fused kernel) joins the list once
``mini_of3.kernels`` exports ``triangle_multiplication``; until then the config rejects it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from mini_of3.model.tri_attn_backends import import_anchor

TRI_MUL_BACKENDS = ("auto", "torch", "cueq")


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
    x = F.layer_norm(z, z.shape[-1:], norm_in_weight, norm_in_bias, eps)        # [B, N, N, C]
    ab = F.linear(x, p_in_weight) * torch.sigmoid(F.linear(x, g_in_weight))       # [B, N, N, 2h]
    if mask is not None:
        ab = ab * mask[..., None].to(ab.dtype)
    wide = torch.float32 if ab.dtype in (torch.float16, torch.bfloat16) else ab.dtype
    a, b = ab.to(wide).chunk(2, dim=-1)                   # sums over k of N products: at least fp32
    if direction == "outgoing":
        t = torch.einsum("bikc,bjkc->bijc", a, b)          # [B, N, N, h]
    else:
        t = torch.einsum("bkic,bkjc->bijc", a, b)
    t = F.layer_norm(t, t.shape[-1:], norm_out_weight.to(wide), norm_out_bias.to(wide), eps)
    g = torch.sigmoid(F.linear(x, g_out_weight))                                  # [B, N, N, C]
    return g * F.linear(t.to(p_out_weight.dtype), p_out_weight)


def _cueq(fn) -> Callable:
    def update(z, mask=None, **weights):
        return fn(z, mask=None if mask is None else mask.to(z.dtype), **weights)
    return update


def tri_mul_backend(name: str) -> Callable:
    """The triangle multiplication function for ``model.tri_mul_backend`` = ``name`` (imports cueq now if chosen)."""
    if name not in TRI_MUL_BACKENDS:
        raise ValueError(f"tri_mul_backend must be one of {TRI_MUL_BACKENDS}, got {name!r}")
    if name in ("auto", "torch"):
        return triangle_multiplication_torch
    return _cueq(import_anchor("cueq", "cuequivariance_torch", "triangle_multiplicative_update"))
