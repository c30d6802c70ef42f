"""Plain PyTorch references for mini_of3's kernels: any device, any dtype; in float64 they are the tests' oracle.

Half-precision inputs keep their statistics (scores, softmax, sigmoid) in float32, as the kernels do, so that the
``backend="torch"`` path of the model is a fair eager baseline. In float64 everything stays in float64.
"""
from __future__ import annotations

import math

import torch


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def triangle_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    activation: str = "softmax",
    scale: float | None = None,
    sigmoid_bias: float | None = None,
) -> torch.Tensor:
    """Triangle attention around the starting node (AF3 SI Alg 14, the attention part), one row i at a time.

    o[b, i, j, h] = sum_k p[b, i, h, j, k] * v[b, i, k, h], with scores
    s = scale * q[b, i, j, h] . k[b, i, k, h] + bias[b, h, j, k] over the keys k where mask[b, i, k] is True, and
    p = softmax_k(s) (activation="softmax") or p = sigmoid(s + beta_i) (activation="sigmoid"), where
    beta_i = -log(number of valid keys in row i) unless ``sigmoid_bias`` is given.
    A row with no valid key gives zeros.

    Args:
        q, k, v: [B, I, J, H, D]
        bias: [B, H, J, K] (K == J), shared by every row i
        mask: [B, I, K] bool, True = attend; None = all keys valid
    Returns:
        o: [B, I, J, H, D] in q's dtype
    """
    B, I, J, H, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    stat = _stat_dtype(q.dtype)
    if mask is None:
        mask = torch.ones(B, I, J, dtype=torch.bool, device=q.device)
    scores = torch.einsum("bijhd,bikhd->bihjk", q, k).to(stat) * scale + bias.to(stat)[:, None]  # [B, I, H, J, K]
    key_valid = mask[:, :, None, None, :]                                                         # [B, I, 1, 1, K]
    if activation == "softmax":
        scores = scores.masked_fill(~key_valid, torch.finfo(stat).min)
        probs = torch.softmax(scores, dim=-1) * key_valid          # a fully masked row gives all zeros, no NaN
    elif activation == "sigmoid":
        if sigmoid_bias is None:
            n_valid = mask.sum(-1).clamp(min=1).to(stat)            # [B, I]
            beta = -torch.log(n_valid)[:, :, None, None, None]
        else:
            beta = float(sigmoid_bias)
        probs = torch.sigmoid(scores + beta) * key_valid
    else:
        raise ValueError(f"activation must be 'softmax' or 'sigmoid', got {activation!r}")
    return torch.einsum("bihjk,bikhd->bijhd", probs.to(v.dtype), v)


def triangle_multiplication_reference(
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
    """Triangle multiplicative update, outgoing (AF3 SI Alg 12) or incoming (Alg 13), line by line.

    x = LayerNorm(z); a, b = sigmoid(x g_in^T) * (x p_in^T) (first h channels a, last h b), times the pair mask;
    outgoing t_ijc = sum_k a_ikc b_jkc, incoming t_ijc = sum_k a_kic b_kjc; out = sigmoid(x g_out^T) *
    (LayerNorm(t) p_out^T). Computed in z's dtype (the weights cast to it); float64 z makes it the tests' oracle.

    Args:
        z: [B, N, N, C]; mask: [B, N, N] (bool or float, 1 = keep) or None
        p_in_weight, g_in_weight: [2 h, C]; p_out_weight: [C, h]; g_out_weight: [C, C]
    Returns:
        [B, N, N, C] in z's dtype
    """
    if direction not in ("outgoing", "incoming"):
        raise ValueError(f"direction must be 'outgoing' or 'incoming', got {direction!r}")
    w = {name: t.to(z.dtype) for name, t in dict(
        norm_in_weight=norm_in_weight, norm_in_bias=norm_in_bias, p_in_weight=p_in_weight, g_in_weight=g_in_weight,
        norm_out_weight=norm_out_weight, norm_out_bias=norm_out_bias, p_out_weight=p_out_weight,
        g_out_weight=g_out_weight).items()}
    h = w["p_in_weight"].shape[0] // 2
    x = torch.nn.functional.layer_norm(z, z.shape[-1:], w["norm_in_weight"], w["norm_in_bias"], eps)
    ab = torch.sigmoid(x @ w["g_in_weight"].T) * (x @ w["p_in_weight"].T)                 # [B, N, N, 2 h]
    if mask is not None:
        ab = ab * mask[..., None].to(ab.dtype)
    a, b = ab[..., :h], ab[..., h:]
    if direction == "outgoing":
        t = torch.einsum("bikc,bjkc->bijc", a, b)                                         # [B, N, N, h]
    else:
        t = torch.einsum("bkic,bkjc->bijc", a, b)
    t = torch.nn.functional.layer_norm(t, (h,), w["norm_out_weight"], w["norm_out_bias"], eps)
    return torch.sigmoid(x @ w["g_out_weight"].T) * (t @ w["p_out_weight"].T)


def transition_reference(
    x: torch.Tensor,
    *,
    norm_weight: torch.Tensor,
    norm_bias: torch.Tensor,
    a_weight: torch.Tensor,
    b_weight: torch.Tensor,
    out_weight: torch.Tensor,
    eps: float = 1e-5,
) -> torch.Tensor:
    """SwiGLU transition (AF3 SI Alg 11), line by line: x = LayerNorm(x); out = (silu(x W_a^T) * (x W_b^T)) W_out^T.
    Computed in x's dtype (the weights cast to it), or under autocast as autocast runs it; float64 x makes it the
    tests' oracle.

    Args:
        x: [..., C]; a_weight, b_weight: [n C, C]; out_weight: [C, n C]
    Returns:
        [..., C]
    """
    x = torch.nn.functional.layer_norm(x, x.shape[-1:], norm_weight.to(x.dtype), norm_bias.to(x.dtype), eps)
    a = torch.nn.functional.linear(x, a_weight.to(x.dtype))
    b = torch.nn.functional.linear(x, b_weight.to(x.dtype))
    return torch.nn.functional.linear(torch.nn.functional.silu(a) * b, out_weight.to(x.dtype))
