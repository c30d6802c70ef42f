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
    mask_queries: bool = False,
) -> torch.Tensor:
    """Triangle attention around the starting node (AF3 SI Alg 14, the attention part), one row i at a time.

    o[b, i, j, h] = sum_k p[b, i, h, j, k] * v[b, i, k, h], with scores
    s = scale * q[b, i, j, h] . k[b, i, k, h] + bias[b, h, j, k] over the keys k where mask[b, i, k] is True, and
    p = softmax_k(s) (activation="softmax") or p = sigmoid(s + beta_i) (activation="sigmoid"), where
    beta_i = -log(number of valid keys in row i) unless ``sigmoid_bias`` is given.
    A row with no valid key gives zeros. ``mask_queries``: the mask holds for the queries too (query j of row i is
    masked exactly when mask[b, i, j] is False): p of a masked query is 0, so its output is 0 and every gradient
    through it is 0.

    Args:
        q, k, v: [B, I, J, H, D]
        bias: [B, H, J, K] (K == J), shared by every row i
        mask: [B, I, K] bool, True = attend; None = all keys valid
        mask_queries: also mask the queries (a pair mask token_i & token_k, whose valid queries are the valid keys)
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
    if mask_queries:
        probs = probs * mask[:, :, None, :, None]                   # [B, I, 1, J, 1]: masked queries' p = 0
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


def sigmoid_bias_table(sigmoid_bias: torch.Tensor, n_sequences: int, n_heads: int) -> torch.Tensor:
    """A ``sigmoid_bias`` tensor as a [S, H] view (no copy): [S] or [S, 1] per sequence, [H] or [1, H] per head,
    or [S, H]. A 1-D tensor is ambiguous when S == H; then it must be given as [S, 1] or [1, H]."""
    S, H = n_sequences, n_heads
    shape = tuple(sigmoid_bias.shape)
    if sigmoid_bias.dim() == 1:
        if S == H and shape == (S,):
            raise ValueError(f"sigmoid_bias of shape {shape} is ambiguous with {S} sequences and {H} heads: give it "
                             f"as [S, 1] = ({S}, 1) per sequence or [1, H] = (1, {H}) per head")
        if shape == (S,):
            return sigmoid_bias[:, None].expand(S, H)
        if shape == (H,):
            return sigmoid_bias[None, :].expand(S, H)
    elif sigmoid_bias.dim() == 2 and shape in ((S, 1), (1, H), (S, H)):
        return sigmoid_bias.expand(S, H)
    raise ValueError(f"sigmoid_bias must be a float, [S] = ({S},), [H] = ({H},), [S, 1], [1, H] or [S, H] = "
                     f"({S}, {H}), got shape {shape}")


def sigmoid_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    seq_lens_q: torch.Tensor | None = None,
    seq_lens_k: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    sigmoid_bias: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Sigmoid attention, one sequence at a time: o_i = sum_k sigmoid(scale q_i . k_k + b) v_k over the keys k that
    query i sees, b = -log(number of keys of the sequence) unless ``sigmoid_bias`` is given (a float, or a tensor
    per sequence and/or head, see :func:`sigmoid_bias_table`). Causal: query i of a sequence with Lq queries and Lk
    keys sees the keys k <= i + Lk - Lq (bottom-right). A query that sees no key, and every padded row, gives zeros.
    Scores, sigmoid and products run in float32 for 16-bit inputs (float64 for float64).

    Layouts:
        dense: q [B, Tq, H, D], k, v [B, Tk, H, D]
        padded: the same with ``seq_lens_q`` / ``seq_lens_k`` [B] (valid rows first, trailing padding)
        packed varlen: q [total_q, H, D], k, v [total_k, H, D] with ``cu_seqlens_q`` / ``cu_seqlens_k`` [S + 1]
    Returns:
        o: q's shape and dtype
    """
    H, D = q.shape[-2:]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    stat = _stat_dtype(q.dtype)
    if cu_seqlens_q is not None:
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        spans = [(q[cq[s]:cq[s + 1]], k[ck[s]:ck[s + 1]], v[ck[s]:ck[s + 1]]) for s in range(len(cq) - 1)]
    else:
        B, Tq, Tk = q.shape[0], q.shape[1], k.shape[1]
        lq = seq_lens_q.tolist() if seq_lens_q is not None else [Tq] * B
        lk = seq_lens_k.tolist() if seq_lens_k is not None else [Tk] * B
        spans = [(q[b, :lq[b]], k[b, :lk[b]], v[b, :lk[b]]) for b in range(B)]
    if isinstance(sigmoid_bias, torch.Tensor):
        table = sigmoid_bias_table(sigmoid_bias, len(spans), H).to(device=q.device, dtype=stat)       # [S, H]
    outs = []
    for s, (qs, ks, vs) in enumerate(spans):                      # qs [Lq, H, D], ks, vs [Lk, H, D]
        Lq, Lk = qs.shape[0], ks.shape[0]
        if sigmoid_bias is None:
            bias = torch.full((H,), -math.log(max(Lk, 1)), dtype=stat, device=q.device)
        elif isinstance(sigmoid_bias, torch.Tensor):
            bias = table[s]
        else:
            bias = torch.full((H,), float(sigmoid_bias), dtype=stat, device=q.device)
        scores = torch.einsum("qhd,khd->hqk", qs.to(stat), ks.to(stat)) * scale + bias[:, None, None]
        p = torch.sigmoid(scores)                                                             # [H, Lq, Lk]
        if causal:
            rows = torch.arange(Lq, device=q.device)[:, None]
            seen = torch.arange(Lk, device=q.device)[None, :] <= rows + (Lk - Lq)
            p = p * seen
        outs.append(torch.einsum("hqk,khd->qhd", p, vs.to(stat)).to(q.dtype))
    if cu_seqlens_q is not None:
        return torch.cat(outs) if outs else q.new_zeros(q.shape)
    padded = [torch.cat([o, o.new_zeros(q.shape[1] - o.shape[0], H, D)]) for o in outs]
    return torch.stack(padded) if padded else q.new_zeros(q.shape)
