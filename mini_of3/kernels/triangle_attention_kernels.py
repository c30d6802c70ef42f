"""Triton kernels of the fused triangle attention (AF3 SI Alg 14/15, the attention with a pair bias).

B*I*H independent attentions of J queries over K = J keys; all rows i of one (b, h) share one bias [J, K]. Scores are
kept raw, t = q.k + bias / scale + key term, and enter the base-2 exponent as t * scale * log2(e). Row statistics
lse (base 2) and delta are [B, H, I, J] float32. The key term comes from KEY_BIAS [B, I, K]: the caller's bool mask
(softmax; 0 or -inf, read in the kernels, no copy) or a float32 key bias built on the host (sigmoid: -inf at masked
keys plus beta_i / scale). KEY_END [B, I] int32 (HAS_KEY_END) is one past the last valid key of each row: key tiles
past it hold only masked keys, which add exactly zero to every sum, so the loops stop there (a padded entry's rows
cost its real keys; a row with no valid key runs no key tile at all); the dbias kernel, whose loop runs over rows,
takes the same bounds per batch element. MASK_QUERIES: the row's mask holds for its queries too (query j of row i
is masked exactly when key j is: the model's pair mask token_i & token_k); a masked query's output is 0 and its lse
+inf (as a row with no valid key), so the backward's p is 0 there and it adds nothing to any gradient (sigmoid, which
keeps no lse, reads its dO as 0 instead); query tiles from KEY_END on hold only masked queries and run no key loop,
and the dK/dV loop over query tiles and the dbias loop over rows stop there too. J_BUCKET (the next power of two of
J) is unused by the kernels: it is the autotuning key.

The default path, in launch order (triangle_attention_host.py):
    _fwd         grid: one program per (query tile, head, row i, batch), query tile fastest.
                 reads q, k, v, bias, key term (GATED: g); writes o (GATED: sigmoid(g) * o) and, when a backward
                 follows (softmax), lse.
    _bwd_dq      grid: one program per (query tile, head, ROWS rows i, batch); ROWS rows share each bias tile load.
                 reads q, k, v, bias, key term, dO, and for softmax o and lse; writes dq and, for softmax, the exact
                 delta = rowsum(p * dP) / rowsum(p), which _bwd_dbias and _bwd_dkdv read.
    (GATED: before it, _gate_bwd: one program per (BLOCK_J query rows, head, row i, batch); reads the gated output,
                 its gradient and g; writes dg, the attention's own dO = dout * sigmoid(g) that the three backward
                 kernels read, and delta0 = rowsum(dout * out), which _bwd_dq reads instead of o.)
    _bwd_dbias   grid: one program per (key tile, query tile, head, batch, chunk of rows i), key tile fastest.
                 reads q, k, v, dO, bias, key term, lse, delta; writes dbias, or (when the tiles alone cannot fill
                 the GPU) one float32 partial per chunk of rows:
    _sum_chunks  (only then) grid: one program per 1024 elements of dbias; reads the partials, writes dbias, the
                 chunks added in order.
    _bwd_dkdv    grid: persistent, two programs per SM; each takes the rows (b, i, h) pid, pid + programs, ... in turn.
                 reads q, k, v, bias, key term, dO, lse, delta; writes dk, dv.
p is computed once in the forward and recomputed once in each of the three backward kernels. No atomics: every
output element is written by one program, every sum is taken in a fixed order, so results repeat bitwise.
"""
from __future__ import annotations

import triton
import triton.language as tl

from mini_of3.kernels.primitives import dot, exp2, sigmoid2


@triton.jit
def _load_tile(ptr, offs_rows, offs_d, stride_row, stride_d, n_rows):
    return tl.load(ptr + offs_rows[:, None] * stride_row + offs_d[None, :] * stride_d,
                   mask=offs_rows[:, None] < n_rows, other=0.0)


@triton.jit
def _key_mask(KEY_BIAS, m_base, offs_k, sm_k, J, HAS_KEY_BIAS: tl.constexpr):
    """The additive key term [BK] of the raw scores, -inf past the end: from the caller's bool mask (softmax: 0 or
    -inf) or from a float32 key bias built on the host (0 or -inf, plus beta / scale for sigmoid)."""
    if HAS_KEY_BIAS:
        if KEY_BIAS.dtype.element_ty == tl.float32:
            return tl.load(KEY_BIAS + m_base + offs_k * sm_k, mask=offs_k < J, other=float("-inf"))
        else:
            keep = tl.load(KEY_BIAS + m_base + offs_k * sm_k, mask=offs_k < J, other=0)
            return tl.where(keep != 0, 0.0, float("-inf"))
    else:
        return tl.where(offs_k < J, 0.0, float("-inf"))


@triton.jit
def _key_end(KEY_END, b64, i, I, J, HAS_KEY_END: tl.constexpr):
    """One past the last valid key of row i (J without KEY_END): key tiles from there on are skipped."""
    if HAS_KEY_END:
        return tl.load(KEY_END + b64 * I + i)
    else:
        return J


@triton.jit
def _key_loop_end(key_end, j0, MASK_QUERIES: tl.constexpr):
    """The end of the key loop of a query tile starting at j0: the row's key end, or (MASK_QUERIES) 0 when the tile
    starts at or past it, all its queries masked."""
    if MASK_QUERIES:
        return tl.where(j0 < key_end, key_end, 0)
    else:
        return key_end


@triton.jit
def _query_end(key_end, J, MASK_QUERIES: tl.constexpr):
    """One past the last query of a row whose rows of q, dO, o, g are read (MASK_QUERIES: the queries from the row's
    key end on are masked, read as 0 and never from memory; else J)."""
    if MASK_QUERIES:
        return key_end
    else:
        return J


@triton.jit
def _query_valid(KEY_BIAS, m_base, offs_j, sm_k, J, HAS_KEY_BIAS: tl.constexpr):
    """Whether each query j [BJ] of a row is unmasked (MASK_QUERIES): its key term is not -inf (holes included)."""
    return _key_mask(KEY_BIAS, m_base, offs_j, sm_k, J, HAS_KEY_BIAS) > float("-inf")


@triton.jit
def _load_dout(do_row, offs_j, offs_d, sd_j, sd_d, J, KEY_BIAS, m_base, sm_k, HAS_KEY_BIAS: tl.constexpr,
               ZERO_MASKED: tl.constexpr):
    """dO [BJ, D] of one query tile; ZERO_MASKED (sigmoid under MASK_QUERIES: no lse marks the masked queries) reads
    0 at masked queries, whose output is the constant 0, so that dP, dS and their terms of dV are 0 there."""
    if ZERO_MASKED:
        keep = _query_valid(KEY_BIAS, m_base, offs_j, sm_k, J, HAS_KEY_BIAS)            # False past J too
        return tl.load(do_row + offs_j[:, None] * sd_j + offs_d[None, :] * sd_d, mask=keep[:, None], other=0.0)
    else:
        return _load_tile(do_row, offs_j, offs_d, sd_j, sd_d, J)


@triton.jit
def _base2(scale):
    """scale * log2(e): the factor that turns raw scores t into the base-2 exponents the kernels use."""
    return scale * 1.4426950408889634


@triton.jit
def _dot_split(p, x, SPLIT: tl.constexpr, DOT_PREC: tl.constexpr):
    """p @ x with p (float32) rounded to x's dtype for the tensor cores; SPLIT adds the product of the rounding
    residual (p = hi + lo), which removes that rounding's error at the cost of one more MMA."""
    p_hi = p.to(x.dtype)
    out = dot(p_hi, x, DOT_PREC)
    if SPLIT:
        p_lo = (p - p_hi.to(tl.float32)).to(x.dtype)
        out += dot(p_lo, x, DOT_PREC)
    return out


@triton.jit
def _query_tile_program(J, H, I, BLOCK_J: tl.constexpr, ROWS: tl.constexpr = 1):
    """(query tile, head, first row, batch) of this program, query tile fastest, then head, then the group of ROWS
    rows: the programs in flight share rows i (their k and v are read from HBM once) and the bias of every head
    stays in L2."""
    pid = tl.program_id(0)
    n_jb = tl.cdiv(J, BLOCK_J)
    n_groups = tl.cdiv(I, ROWS)
    jb = pid % n_jb
    h = (pid // n_jb) % H
    i = (pid // (n_jb * H)) % n_groups * ROWS
    b = pid // (n_jb * H * n_groups)
    return jb, h, i.to(tl.int64), b.to(tl.int64)


@triton.jit
def _bias_tile(bias_rows, offs_rows, offs_cols, s_col, J, scale):
    """A bias tile in raw-score units (bias / scale), float32, 0 outside: [BJ, BK] for the forward-shaped kernels,
    [BK, BJ] (rows: keys) for the transposed dK/dV tiles; bias_rows: the pointers of its rows, s_col the stride
    along its columns."""
    bias = tl.load(bias_rows + offs_cols[None, :] * s_col, mask=(offs_rows[:, None] < J) & (offs_cols[None, :] < J),
                   other=0.0)
    return bias.to(tl.float32) * (1.0 / scale)


@triton.jit
def _key_tile_scores(q, k_base, v_base, bias_t, key_mask, offs_k, offs_d, sk_j, sk_d, sv_j, sv_d, J,
                     DOT_PREC: tl.constexpr):
    """k, v [BK, D] of one key tile of one row and its raw scores t = q.k + bias / scale + key term [BJ, BK]; the
    forward, the dQ and the dbias kernels share it, so all see the same t."""
    k = _load_tile(k_base, offs_k, offs_d, sk_j, sk_d, J)                                      # [BK, D]
    v = _load_tile(v_base, offs_k, offs_d, sv_j, sv_d, J)                                      # [BK, D]
    t = dot(q, tl.trans(k), DOT_PREC, acc=bias_t + key_mask[None, :])
    return k, v, t


@triton.jit
def _row_stats(LSE, DELTA, row_base, offs_j, in_j, SIGMOID: tl.constexpr):
    """The forward's log-sum-exp (base 2) and delta = rowsum(dO * O) of one query tile; unused by sigmoid."""
    if SIGMOID:
        lse = tl.zeros(offs_j.shape, dtype=tl.float32)
        delta = lse
    else:
        lse = tl.load(LSE + row_base + offs_j, mask=in_j, other=float("inf"))
        delta = tl.load(DELTA + row_base + offs_j, mask=in_j, other=0.0)
    return lse, delta


@triton.jit
def _probs_and_dscores(t, scale2, dp, lse, delta, SIGMOID: tl.constexpr, FAST_EXP: tl.constexpr):
    """p and dS = dL/d(score) of one tile from the raw scores t (base-2 score t * scale2; -inf at masked keys) and
    dP = dO . v; lse (base 2) and delta come broadcast to the tile's shape (row statistics of the queries)."""
    if SIGMOID:
        p = sigmoid2(t * scale2, FAST_EXP)
        ds = dp * p * (1.0 - p)
    else:
        p = exp2(t * scale2 - lse, FAST_EXP)
        ds = p * (dp - delta)
    return p, ds


# ---------------------------------------------------------------------------------------------------------------
# forward


@triton.jit
def _fwd(Q, K, V, BIAS, KEY_BIAS, KEY_END, O, LSE, G,
         sq_b, sq_i, sq_j, sq_h, sq_d, sk_b, sk_i, sk_j, sk_h, sk_d, sv_b, sv_i, sv_j, sv_h, sv_d,
         sb_b, sb_h, sb_j, sb_k, sm_b, sm_i, sm_k,
         so_b, so_i, so_j, so_h, so_d,
         B, I, J, H, scale, J_BUCKET,
         HAS_KEY_BIAS: tl.constexpr, SIGMOID: tl.constexpr, STORE_LSE: tl.constexpr, FAST_EXP: tl.constexpr,
         DOT_PREC: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
         GATED: tl.constexpr = False, HAS_KEY_END: tl.constexpr = False, MASK_QUERIES: tl.constexpr = False):
    """o of one query tile of one row: online softmax in base 2 (the score t * scale2 applied inside the exponent's
    FMA), or for sigmoid o = sum_k sigmoid(t) v; for a backward (STORE_LSE) also the base-2 log-sum-exp. GATED
    stores sigmoid(g) * o instead (AF3 SI Alg 14 line 6), g [B, I, J, H, D] with q's strides (one projection).
    MASK_QUERIES: masked queries get o = 0 and lse = +inf; a tile past the row's last valid key runs no key tile."""
    jb, h, i, b64 = _query_tile_program(J, H, I, BLOCK_J)
    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    offs_d = tl.arange(0, BLOCK_D)
    offs_kt = tl.arange(0, BLOCK_K)
    k_row = K + b64 * sk_b + i * sk_i + h * sk_h
    v_row = V + b64 * sv_b + i * sv_i + h * sv_h
    bias_rows = BIAS + b64 * sb_b + h * sb_h + offs_j[:, None] * sb_j
    m_base = b64 * sm_b + i * sm_i
    key_end = _key_end(KEY_END, b64, i, I, J, HAS_KEY_END)
    q_end = _query_end(key_end, J, MASK_QUERIES)
    q = _load_tile(Q + b64 * sq_b + i * sq_i + h * sq_h, offs_j, offs_d, sq_j, sq_d, q_end)  # [BJ, D]
    scale2 = _base2(scale)
    m_run = tl.full([BLOCK_J], float("-inf"), dtype=tl.float32)
    l_run = tl.zeros([BLOCK_J], dtype=tl.float32)
    acc = tl.zeros([BLOCK_J, BLOCK_D], dtype=tl.float32)
    # small loads (the key mask here, row statistics in the backward) are issued one iteration ahead by hand: the
    # software pipeliner leaves them on the critical path
    mask_next = _key_mask(KEY_BIAS, m_base, offs_kt, sm_k, J, HAS_KEY_BIAS)
    for k0 in range(0, _key_loop_end(key_end, jb * BLOCK_J, MASK_QUERIES), BLOCK_K):
        offs_k = k0 + offs_kt
        bias_t = _bias_tile(bias_rows, offs_j, offs_k, sb_k, J, scale)                          # [BJ, BK]
        key_mask = mask_next                                                                    # [BK]
        mask_next = _key_mask(KEY_BIAS, m_base, offs_k + BLOCK_K, sm_k, J, HAS_KEY_BIAS)
        k, v, t = _key_tile_scores(q, k_row, v_row, bias_t, key_mask, offs_k, offs_d, sk_j, sk_d, sv_j, sv_d, J,
                                   DOT_PREC)                                                    # t: [BJ, BK]
        if SIGMOID:
            acc += dot(sigmoid2(t * scale2, FAST_EXP).to(v.dtype), v, DOT_PREC)
        else:
            m_new = tl.maximum(m_run, tl.max(t, 1) * scale2)     # scale2 > 0: max(t) * scale2 = max(t * scale2)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = exp2(t * scale2 - m_safe[:, None], FAST_EXP)
            alpha = exp2(m_run - m_safe, FAST_EXP)
            l_run = l_run * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, DOT_PREC)
            m_run = m_new
    if not SIGMOID:
        has_key = l_run > 0.0
        acc = acc / tl.where(has_key, l_run, 1.0)[:, None]
    if MASK_QUERIES:
        valid = _query_valid(KEY_BIAS, m_base, offs_j, sm_k, J, HAS_KEY_BIAS)
        acc = tl.where(valid[:, None], acc, 0.0)
        if not SIGMOID:
            has_key = has_key & valid
    if GATED:
        g = _load_tile(G + b64 * sq_b + i * sq_i + h * sq_h, offs_j, offs_d, sq_j, sq_d, q_end)  # [BJ, D]
        acc = acc * tl.sigmoid(g.to(tl.float32))
    o_ptrs = O + b64 * so_b + i * so_i + h * so_h + offs_j[:, None] * so_j + offs_d[None, :] * so_d
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=offs_j[:, None] < J)
    if STORE_LSE:
        lse = tl.where(has_key, m_run + tl.log2(tl.where(has_key, l_run, 1.0)), float("inf"))
        tl.store(LSE + ((b64 * H + h) * I + i) * J + offs_j, lse, mask=offs_j < J)


# ---------------------------------------------------------------------------------------------------------------
# backward: dQ (and the exact delta), dbias, dK and dV


@triton.jit
def _gate_bwd(DOUT, OUT, G, DG, DO, DELTA0, KEY_END,
              sd_b, sd_i, sd_j, sd_h, sd_d, so_b, so_i, so_j, so_h, so_d, sq_b, sq_i, sq_j, sq_h, sq_d,
              sg_b, sg_i, sg_j, sg_h, sg_d, I, J, H,
              SIGMOID: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_D: tl.constexpr, HAS_KEY_END: tl.constexpr = False,
              MASK_QUERIES: tl.constexpr = False):
    """The gate's backward (out = sigmoid(g) o): dg = dout out (1 - sigmoid(g)) (dq's strides), the attention's
    dO = dout sigmoid(g) (o's strides) and, for softmax, delta0 = rowsum(dO o) = rowsum(dout out) [B, H, I, J].
    MASK_QUERIES: the queries from the row's key end on (masked, out = 0) are not read; they get 0 everywhere."""
    jb, h, i, b64 = _query_tile_program(J, H, I, BLOCK_J)
    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    offs_d = tl.arange(0, BLOCK_D)
    q_end = _query_end(_key_end(KEY_END, b64, i, I, J, HAS_KEY_END), J, MASK_QUERIES)
    dout = _load_tile(DOUT + b64 * sd_b + i * sd_i + h * sd_h, offs_j, offs_d, sd_j, sd_d, q_end).to(tl.float32)
    o_base = b64 * so_b + i * so_i + h * so_h
    out = _load_tile(OUT + o_base, offs_j, offs_d, so_j, so_d, q_end).to(tl.float32)
    gate = tl.sigmoid(_load_tile(G + b64 * sq_b + i * sq_i + h * sq_h, offs_j, offs_d, sq_j, sq_d,
                                 q_end).to(tl.float32))
    inside = offs_j[:, None] < J
    tl.store(DO + o_base + offs_j[:, None] * so_j + offs_d[None, :] * so_d, (dout * gate).to(DO.dtype.element_ty),
             mask=inside)
    tl.store(DG + b64 * sg_b + i * sg_i + h * sg_h + offs_j[:, None] * sg_j + offs_d[None, :] * sg_d,
             (dout * out * (1.0 - gate)).to(DG.dtype.element_ty), mask=inside)
    if not SIGMOID:
        tl.store(DELTA0 + ((b64 * H + h) * I + i) * J + offs_j, tl.sum(dout * out, 1), mask=offs_j < J)



@triton.jit
def _dq_row_start(Q, DO, O, LSE, DELTA0, KEY_BIAS, q_base, do_base, o_base, row_base, m_base, offs_j, offs_d, sq_j,
                  sq_d, sd_j, sd_d, so_j, so_d, sm_k, J, q_end, SIGMOID: tl.constexpr, GATED: tl.constexpr,
                  HAS_KEY_BIAS: tl.constexpr, MASK_QUERIES: tl.constexpr):
    """q, dO [BJ, D] and lse, delta0 [BJ] of one row; delta0 = rowsum(dO * o) from the rounded output o (softmax;
    sigmoid needs neither statistic), or (GATED) as _gate_bwd left it in DELTA0 (a buffer of its own: an autotuning
    run, which repeats the kernel, must not read the delta a previous run wrote). q, dO, o are read up to q_end
    (MASK_QUERIES: the row's key end; 0 past it). MASK_QUERIES: a masked query's o is 0, so its delta0 is too."""
    q = _load_tile(Q + q_base, offs_j, offs_d, sq_j, sq_d, q_end)                          # [BJ, D]
    do = _load_dout(DO + do_base, offs_j, offs_d, sd_j, sd_d, q_end, KEY_BIAS, m_base, sm_k, HAS_KEY_BIAS,
                    MASK_QUERIES and SIGMOID)                                              # [BJ, D]
    if SIGMOID:
        lse = tl.zeros(offs_j.shape, dtype=tl.float32)
        delta = lse
    else:
        lse = tl.load(LSE + row_base + offs_j, mask=offs_j < J, other=float("inf"))
        if GATED:
            delta = tl.load(DELTA0 + row_base + offs_j, mask=offs_j < J, other=0.0)
        else:
            o = _load_tile(O + o_base, offs_j, offs_d, so_j, so_d, q_end)                  # [BJ, D]
            delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)                        # delta0 [BJ]
    return q, do, lse, delta


@triton.jit
def _dq_row_step(q, do, k_base, v_base, bias_t, key_mask, lse, delta, dq, p_dp, p_sum, pk, offs_k, offs_d,
                 sk_j, sk_d, sv_j, sv_d, J, scale2, SIGMOID: tl.constexpr, SPLIT_DS: tl.constexpr,
                 FAST_EXP: tl.constexpr, DOT_PREC: tl.constexpr):
    """One key tile of one row of _bwd_dq: dq += dS k, and for softmax the sums of p * dP, p and p k."""
    k, v, t = _key_tile_scores(q, k_base, v_base, bias_t, key_mask, offs_k, offs_d, sk_j, sk_d, sv_j, sv_d, J,
                               DOT_PREC)                                                   # t: [BJ, BK]
    dp = dot(do, tl.trans(v), DOT_PREC)                                                   # [BJ, BK]
    p, ds = _probs_and_dscores(t, scale2, dp, lse[:, None], delta[:, None], SIGMOID, FAST_EXP)
    dq += _dot_split(ds, k, SPLIT_DS, DOT_PREC)                                            # [BJ, D]
    if not SIGMOID:
        p_dp += tl.sum(p * dp, 1)
        p_sum += tl.sum(p, 1)
        pk = dot(p.to(k.dtype), k, DOT_PREC, acc=pk)                                      # [BJ, D]
    return dq, p_dp, p_sum, pk


@triton.jit
def _dq_row_store(dq, delta0, p_dp, p_sum, pk, DQ, DELTA, g_base, row_base, offs_j, offs_d, sg_j, sg_d, J, scale,
                  SIGMOID: tl.constexpr):
    in_j = offs_j < J        # J: 0 for a row past the end
    if not SIGMOID:
        # delta = E_p[dP] with p as this backward recomputes it: its sum over keys misses 1 by the rounding of lse
        # (an ulp of |score|, 1e-3 at scores of 1e4); normalising keeps sum_k dS = 0 there as well
        delta_exact = p_dp / tl.where(p_sum > 0.0, p_sum, 1.0)
        dq -= (delta_exact - delta0)[:, None] * pk
        tl.store(DELTA + row_base + offs_j, delta_exact, mask=in_j)
    g_ptrs = g_base + offs_j[:, None] * sg_j + offs_d[None, :] * sg_d
    tl.store(DQ + g_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=in_j[:, None])


@triton.jit
def _bwd_dq(Q, K, V, BIAS, KEY_BIAS, KEY_END, DO, O, LSE, DELTA, DQ, DELTA0,
            sq_b, sq_i, sq_j, sq_h, sq_d, sk_b, sk_i, sk_j, sk_h, sk_d, sv_b, sv_i, sv_j, sv_h, sv_d,
            sb_b, sb_h, sb_j, sb_k, sm_b, sm_i, sm_k, sd_b, sd_i, sd_j, sd_h, sd_d,
            so_b, so_i, so_j, so_h, so_d, sg_b, sg_i, sg_j, sg_h, sg_d,
            B, I, J, H, scale, J_BUCKET,
            HAS_KEY_BIAS: tl.constexpr, SIGMOID: tl.constexpr, SPLIT_DS: tl.constexpr, FAST_EXP: tl.constexpr,
            DOT_PREC: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
            ROWS: tl.constexpr = 1, GATED: tl.constexpr = False, HAS_KEY_END: tl.constexpr = False,
            MASK_QUERIES: tl.constexpr = False):
    """dQ, one program per (query tile, head, ROWS rows, batch) as the forward: a loop over key tiles recomputes p
    and dS = p (dP - delta) and accumulates dQ = dS k in registers. ROWS = 2 rows share each bias tile load; a
    second row past the end (odd I) is computed on row I - 1 and not stored.

    Softmax: delta is made here, exactly, for this kernel and the later ones. The loop runs with delta0 =
    rowsum(dO * o) from the rounded output o and also sums the exact delta = rowsum(p * dP) (= dO . sum_k p_k v_k,
    the unrounded output) and pk = sum_k p_k k_k; since dQ is linear in delta,
        dQ(delta) = dQ(delta0) - (delta - delta0) pk,
    and the correction is exact to the product of two small errors (delta - delta0 ~ 2^-9 delta, pk's rounding of p
    ~ 2^-9): the output's rounding residual need not be stored (TurboPairFormer compensates it as well).

    GATED: dO is the attention's own and delta0 is read from DELTA0, both from _gate_bwd. MASK_QUERIES: a masked
    query's p is 0 (lse +inf; sigmoid: its dO read as 0), so its dq and delta come out 0; a tile past its rows' last
    valid keys runs no key tile and stores those zeros."""
    jb, h, i0, b64 = _query_tile_program(J, H, I, BLOCK_J, ROWS)
    i1 = tl.minimum(i0 + 1, I - 1)
    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    offs_d = tl.arange(0, BLOCK_D)
    offs_kt = tl.arange(0, BLOCK_K)
    k_base = K + b64 * sk_b + h * sk_h
    v_base = V + b64 * sv_b + h * sv_h
    bias_base = BIAS + b64 * sb_b + h * sb_h + offs_j[:, None] * sb_j
    row_base = (b64 * H + h) * I * J                                 # + i * J: into LSE, DELTA [B, H, I, J]
    scale2 = _base2(scale)
    key_end0 = _key_end(KEY_END, b64, i0, I, J, HAS_KEY_END)
    q0, do0, lse0, delta0 = _dq_row_start(Q, DO, O, LSE, DELTA0, KEY_BIAS, b64 * sq_b + i0 * sq_i + h * sq_h,
                                          b64 * sd_b + i0 * sd_i + h * sd_h, b64 * so_b + i0 * so_i + h * so_h,
                                          row_base + i0 * J, b64 * sm_b + i0 * sm_i, offs_j, offs_d, sq_j, sq_d,
                                          sd_j, sd_d, so_j, so_d, sm_k, J, _query_end(key_end0, J, MASK_QUERIES),
                                          SIGMOID, GATED, HAS_KEY_BIAS, MASK_QUERIES)
    dq0 = tl.zeros([BLOCK_J, BLOCK_D], dtype=tl.float32)
    p_dp0 = tl.zeros([BLOCK_J], dtype=tl.float32)
    p_sum0 = tl.zeros([BLOCK_J], dtype=tl.float32)
    pk0 = tl.zeros([BLOCK_J, BLOCK_D], dtype=tl.float32)
    mask_next0 = _key_mask(KEY_BIAS, b64 * sm_b + i0 * sm_i, offs_kt, sm_k, J, HAS_KEY_BIAS)
    if ROWS == 2:
        key_end1 = _key_end(KEY_END, b64, i1, I, J, HAS_KEY_END)
        q1, do1, lse1, delta1 = _dq_row_start(Q, DO, O, LSE, DELTA0, KEY_BIAS, b64 * sq_b + i1 * sq_i + h * sq_h,
                                              b64 * sd_b + i1 * sd_i + h * sd_h, b64 * so_b + i1 * so_i + h * so_h,
                                              row_base + i1 * J, b64 * sm_b + i1 * sm_i, offs_j, offs_d, sq_j, sq_d,
                                              sd_j, sd_d, so_j, so_d, sm_k, J,
                                              _query_end(key_end1, J, MASK_QUERIES), SIGMOID, GATED, HAS_KEY_BIAS,
                                              MASK_QUERIES)
        dq1 = tl.zeros([BLOCK_J, BLOCK_D], dtype=tl.float32)
        p_dp1 = tl.zeros([BLOCK_J], dtype=tl.float32)
        p_sum1 = tl.zeros([BLOCK_J], dtype=tl.float32)
        pk1 = tl.zeros([BLOCK_J, BLOCK_D], dtype=tl.float32)
        mask_next1 = _key_mask(KEY_BIAS, b64 * sm_b + i1 * sm_i, offs_kt, sm_k, J, HAS_KEY_BIAS)
    key_end = _key_loop_end(key_end0, jb * BLOCK_J, MASK_QUERIES)
    if ROWS == 2:
        key_end = tl.maximum(key_end, _key_loop_end(key_end1, jb * BLOCK_J, MASK_QUERIES))
    for k0 in range(0, key_end, BLOCK_K):
        offs_k = k0 + offs_kt
        bias_t = _bias_tile(bias_base, offs_j, offs_k, sb_k, J, scale)                         # [BJ, BK]
        mask0 = mask_next0
        mask_next0 = _key_mask(KEY_BIAS, b64 * sm_b + i0 * sm_i, offs_k + BLOCK_K, sm_k, J, HAS_KEY_BIAS)
        dq0, p_dp0, p_sum0, pk0 = _dq_row_step(q0, do0, k_base + i0 * sk_i, v_base + i0 * sv_i, bias_t, mask0,
                                               lse0, delta0, dq0, p_dp0, p_sum0, pk0, offs_k, offs_d, sk_j, sk_d,
                                               sv_j, sv_d, J, scale2, SIGMOID, SPLIT_DS, FAST_EXP, DOT_PREC)
        if ROWS == 2:
            mask1 = mask_next1
            mask_next1 = _key_mask(KEY_BIAS, b64 * sm_b + i1 * sm_i, offs_k + BLOCK_K, sm_k, J, HAS_KEY_BIAS)
            dq1, p_dp1, p_sum1, pk1 = _dq_row_step(q1, do1, k_base + i1 * sk_i, v_base + i1 * sv_i, bias_t, mask1,
                                                   lse1, delta1, dq1, p_dp1, p_sum1, pk1, offs_k, offs_d, sk_j, sk_d,
                                                   sv_j, sv_d, J, scale2, SIGMOID, SPLIT_DS, FAST_EXP, DOT_PREC)
    g_base = b64 * sg_b + h * sg_h
    _dq_row_store(dq0, delta0, p_dp0, p_sum0, pk0, DQ, DELTA, g_base + i0 * sg_i, row_base + i0 * J, offs_j,
                  offs_d, sg_j, sg_d, J, scale, SIGMOID)
    if ROWS == 2:
        _dq_row_store(dq1, delta1, p_dp1, p_sum1, pk1, DQ, DELTA, g_base + i1 * sg_i, row_base + i1 * J, offs_j,
                      offs_d, sg_j, sg_d, tl.where(i0 + 1 < I, J, 0), scale, SIGMOID)


@triton.jit
def _dbias_row_vectors(KEY_BIAS, LSE, DELTA, b64, h, i, I, J, H, sm_b, sm_i, sm_k, offs_j, offs_k, in_j,
                       HAS_KEY_BIAS: tl.constexpr, SIGMOID: tl.constexpr):
    """The additive key term [BK] and lse, delta [BJ] of row i (row I - 1 past the end: the prefetch after the last
    row reads a valid row and drops it)."""
    i64 = tl.minimum(i, I - 1).to(tl.int64)
    key_mask = _key_mask(KEY_BIAS, b64 * sm_b + i64 * sm_i, offs_k, sm_k, J, HAS_KEY_BIAS)
    lse, delta = _row_stats(LSE, DELTA, ((b64 * H + h) * I + i64) * J, offs_j, in_j, SIGMOID)
    return key_mask, lse, delta


@triton.jit
def _bwd_dbias(Q, K, V, BIAS, KEY_BIAS, BOUNDS, DO, LSE, DELTA, DBIAS,
               sq_b, sq_i, sq_j, sq_h, sq_d, sk_b, sk_i, sk_j, sk_h, sk_d, sv_b, sv_i, sv_j, sv_h, sv_d,
               sb_b, sb_h, sb_j, sb_k, sm_b, sm_i, sm_k, sd_b, sd_i, sd_j, sd_h, sd_d,
               so_c, so_b, so_h, so_j, so_k,
               B, I, J, H, scale, rows_per_chunk, J_BUCKET,
               HAS_KEY_BIAS: tl.constexpr, SIGMOID: tl.constexpr, FAST_EXP: tl.constexpr, DOT_PREC: tl.constexpr,
               BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, HAS_KEY_END: tl.constexpr = False,
               MASK_QUERIES: tl.constexpr = False):
    """dbias of one (query tile, key tile) summed over the rows i of one chunk, in order: the bias tile stays in
    registers. Program order: key tile fastest, then query tile, head, batch, and the chunk of rows slowest, so that
    the programs in flight walk the same rows i together and read each row's q, k, v, dO from HBM once. BOUNDS [B, 2]
    int32 (HAS_KEY_END): one past the last row with a valid key and one past the last valid key of any row of the
    batch element; rows and key tiles past them add zeros and are not visited (the loop's bounds, not a branch in its
    body, so that the loads in it stay pipelined). MASK_QUERIES: so are query tiles past every row's last valid key
    (masked queries only); inside a tile a masked query's dS is 0 (p = 0, or for sigmoid dO = 0)."""
    pid = tl.program_id(0)
    n_kb = tl.cdiv(J, BLOCK_K)
    n_jb = tl.cdiv(J, BLOCK_J)
    kb = pid % n_kb
    jb = (pid // n_kb) % n_jb
    h = (pid // (n_kb * n_jb)) % H
    b = (pid // (n_kb * n_jb * H)) % B
    c = pid // (n_kb * n_jb * H * B)
    b64 = b.to(tl.int64)
    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    offs_k = kb * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_d = tl.arange(0, BLOCK_D)
    in_j = offs_j < J
    bias_t = _bias_tile(BIAS + b64 * sb_b + h * sb_h + offs_j[:, None] * sb_j, offs_j, offs_k, sb_k, J, scale)
    scale2 = _base2(scale)
    acc = tl.zeros([BLOCK_J, BLOCK_K], dtype=tl.float32)
    i_start = c * rows_per_chunk
    i_end = tl.minimum(i_start + rows_per_chunk, I)
    if HAS_KEY_END:
        key_bound = tl.load(BOUNDS + b64 * 2 + 1)
        i_end = tl.minimum(i_end, tl.load(BOUNDS + b64 * 2))
        i_end = tl.where(kb * BLOCK_K < key_bound, i_end, i_start)
        if MASK_QUERIES:
            i_end = tl.where(jb * BLOCK_J < key_bound, i_end, i_start)
    # the key mask and row statistics of row i + 1 are loaded while row i is computed (by hand; see _fwd)
    key_mask_next, lse_next, delta_next = _dbias_row_vectors(KEY_BIAS, LSE, DELTA, b64, h, i_start, I, J, H, sm_b,
                                                             sm_i, sm_k, offs_j, offs_k, in_j, HAS_KEY_BIAS, SIGMOID)
    for i in range(i_start, i_end):
        i64 = tl.cast(i, tl.int64)
        key_mask, lse, delta = key_mask_next, lse_next, delta_next
        key_mask_next, lse_next, delta_next = _dbias_row_vectors(KEY_BIAS, LSE, DELTA, b64, h, i + 1, I, J, H,
                                                                 sm_b, sm_i, sm_k, offs_j, offs_k, in_j,
                                                                 HAS_KEY_BIAS, SIGMOID)
        q = _load_tile(Q + b64 * sq_b + i64 * sq_i + h * sq_h, offs_j, offs_d, sq_j, sq_d, J)
        do = _load_dout(DO + b64 * sd_b + i64 * sd_i + h * sd_h, offs_j, offs_d, sd_j, sd_d, J, KEY_BIAS,
                        b64 * sm_b + i64 * sm_i, sm_k, HAS_KEY_BIAS, MASK_QUERIES and SIGMOID)
        k, v, t = _key_tile_scores(q, K + b64 * sk_b + i64 * sk_i + h * sk_h, V + b64 * sv_b + i64 * sv_i + h * sv_h,
                                   bias_t, key_mask, offs_k, offs_d, sk_j, sk_d, sv_j, sv_d, J, DOT_PREC)
        dp = dot(do, tl.trans(v), DOT_PREC)
        _, ds = _probs_and_dscores(t, scale2, dp, lse[:, None], delta[:, None], SIGMOID, FAST_EXP)
        acc += ds
    out_ptrs = DBIAS + c.to(tl.int64) * so_c + b64 * so_b + h * so_h + offs_j[:, None] * so_j + offs_k[None, :] * so_k
    tl.store(out_ptrs, acc.to(DBIAS.dtype.element_ty), mask=in_j[:, None] & (offs_k[None, :] < J))


@triton.jit
def _sum_chunks(PART, OUT, n_chunks, n_elem, BLOCK: tl.constexpr):
    """OUT[x] = sum_c PART[c, x], the chunks added in order (deterministic)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n_elem
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for c in range(0, n_chunks):
        acc += tl.load(PART + tl.cast(c, tl.int64) * n_elem + offs, mask=inside, other=0.0)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=inside)


@triton.jit
def _kv_tile_step(k, v, dk, dv, q, do, bias_t, key_mask, lse, delta, scale2, SIGMOID: tl.constexpr,
                  SPLIT_DS: tl.constexpr, FAST_EXP: tl.constexpr, DOT_PREC: tl.constexpr):
    """One (key tile, query tile) step of one row i for dK, dV, computed transposed, [key, query] (as
    FlashAttention-2's backward): p^T and dS^T are the A operands of dV += p^T dO and dK += dS^T q straight from
    registers. q, do [BJ, D] are the query tile's; bias_t [BK, BJ] is the bias tile in raw-score units, key_mask [BK]
    and lse, delta [BJ] this row's."""
    tt = dot(k, tl.trans(q), DOT_PREC, acc=bias_t + key_mask[:, None])                    # [BK, BJ]
    dpt = dot(v, tl.trans(do), DOT_PREC)                                                  # [BK, BJ]
    pt, dst = _probs_and_dscores(tt, scale2, dpt, lse[None, :], delta[None, :], SIGMOID, FAST_EXP)
    dv += _dot_split(pt, do, False, DOT_PREC)    # [BK, D]; p's rounding shows only in dv, as its own output's
    dk += _dot_split(dst, q, SPLIT_DS, DOT_PREC)                                           # [BK, D]
    return dk, dv


@triton.jit
def _bwd_dkdv(Q, K, V, BIAS, KEY_BIAS, KEY_END, DO, LSE, DELTA, DK, DV,
              sq_b, sq_i, sq_j, sq_h, sq_d, sk_b, sk_i, sk_j, sk_h, sk_d, sv_b, sv_i, sv_j, sv_h, sv_d,
              sb_b, sb_h, sb_j, sb_k, sm_b, sm_i, sm_k, sd_b, sd_i, sd_j, sd_h, sd_d,
              sg_b, sg_i, sg_j, sg_h, sg_d,
              B, I, J, H, scale, J_BUCKET,
              HAS_KEY_BIAS: tl.constexpr, SIGMOID: tl.constexpr, SPLIT_DS: tl.constexpr,
              FAST_EXP: tl.constexpr, DOT_PREC: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_D: tl.constexpr, PREFETCH: tl.constexpr = 0, HAS_KEY_END: tl.constexpr = False,
              MASK_QUERIES: tl.constexpr = False):
    """dK and dV: a persistent grid whose programs take the rows (b, i, h) pid, pid + programs, ... in turn; for each
    key tile a loop over query tiles accumulates dK, dV in registers. PREFETCH 1: the next query tile's q and dO are
    loaded one step ahead, as the row statistics are (with one pipeline stage they are otherwise loaded at the top
    of each step, on the critical path); 2: its bias tile too. MASK_QUERIES: the loop over query tiles stops at the
    row's last valid key (the queries past it are masked); inside, a masked query adds 0 (p = 0, or for sigmoid
    dO = 0)."""
    for item in range(tl.program_id(0), B * I * H, tl.num_programs(0)):
        h = item % H
        i = ((item // H) % I).to(tl.int64)
        b64 = (item // (H * I)).to(tl.int64)
        offs_d = tl.arange(0, BLOCK_D)
        offs_jt = tl.arange(0, BLOCK_J)
        offs_kt = tl.arange(0, BLOCK_K)
        q_row = Q + b64 * sq_b + h * sq_h + i * sq_i
        do_row = DO + b64 * sd_b + h * sd_h + i * sd_i
        k_row = K + b64 * sk_b + h * sk_h + i * sk_i
        v_row = V + b64 * sv_b + h * sv_h + i * sv_i
        bias_base = BIAS + b64 * sb_b + h * sb_h
        m_base = b64 * sm_b + i * sm_i
        row_base = ((b64 * H + h) * I + i) * J                          # into LSE, DELTA [B, H, I, J]
        scale2 = _base2(scale)

        mask_next = _key_mask(KEY_BIAS, m_base, offs_kt, sm_k, J, HAS_KEY_BIAS)
        key_end = _key_end(KEY_END, b64, i, I, J, HAS_KEY_END)
        # MASK_QUERIES: the row's queries end where its keys do; k, v and the first query tile are read up to there
        # only (a padded row reads nothing). Inside the loop q and dO are read up to J (bounding them there too
        # spills registers), the masked queries of the last tile adding 0 (p = 0, or dO read as 0)
        row_end = _query_end(key_end, J, MASK_QUERIES)
        for k0 in range(0, J, BLOCK_K):
            offs_k = k0 + offs_kt
            key_mask = mask_next                                                                    # [BK]
            mask_next = _key_mask(KEY_BIAS, m_base, offs_k + BLOCK_K, sm_k, J, HAS_KEY_BIAS)
            k = _load_tile(k_row, offs_k, offs_d, sk_j, sk_d, row_end)                              # [BK, D]
            v = _load_tile(v_row, offs_k, offs_d, sv_j, sv_d, row_end)                              # [BK, D]
            dk = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)
            dv = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)
            lse_next, delta_next = _row_stats(LSE, DELTA, row_base, offs_jt, offs_jt < J, SIGMOID)
            bias_rows = bias_base + offs_k[:, None] * sb_k                  # this key tile's rows of the bias
            if PREFETCH == 2:
                bias_next = _bias_tile(bias_rows, offs_k, offs_jt, sb_j, J, scale)
            if PREFETCH >= 1:
                q_next = _load_tile(q_row, offs_jt, offs_d, sq_j, sq_d, row_end)                     # [BJ, D]
                do_next = _load_dout(do_row, offs_jt, offs_d, sd_j, sd_d, row_end, KEY_BIAS, m_base, sm_k,
                                     HAS_KEY_BIAS, MASK_QUERIES and SIGMOID)                        # [BJ, D]
            # a key tile past the row's last valid key: dK = dV = 0, no query tile to visit
            for j0 in range(0, tl.where(k0 < key_end, row_end, 0), BLOCK_J):
                offs_j = j0 + offs_jt
                # the row statistics of the next query tile are loaded one step ahead (as the key mask)
                lse, delta = lse_next, delta_next
                lse_next, delta_next = _row_stats(LSE, DELTA, row_base, offs_j + BLOCK_J, offs_j + BLOCK_J < J,
                                                  SIGMOID)
                if PREFETCH == 2:
                    bias_t = bias_next                                                              # [BK, BJ]
                    bias_next = _bias_tile(bias_rows, offs_k, offs_j + BLOCK_J, sb_j, J, scale)
                else:
                    bias_t = _bias_tile(bias_rows, offs_k, offs_j, sb_j, J, scale)
                if PREFETCH >= 1:
                    q, do = q_next, do_next
                    q_next = _load_tile(q_row, offs_j + BLOCK_J, offs_d, sq_j, sq_d, J)
                    do_next = _load_dout(do_row, offs_j + BLOCK_J, offs_d, sd_j, sd_d, J, KEY_BIAS, m_base,
                                         sm_k, HAS_KEY_BIAS, MASK_QUERIES and SIGMOID)
                else:
                    q = _load_tile(q_row, offs_j, offs_d, sq_j, sq_d, J)                             # [BJ, D]
                    do = _load_dout(do_row, offs_j, offs_d, sd_j, sd_d, J, KEY_BIAS, m_base, sm_k,
                                    HAS_KEY_BIAS, MASK_QUERIES and SIGMOID)                         # [BJ, D]
                dk, dv = _kv_tile_step(k, v, dk, dv, q, do, bias_t, key_mask, lse, delta, scale2,
                                       SIGMOID, SPLIT_DS, FAST_EXP, DOT_PREC)
            g_ptrs = b64 * sg_b + h * sg_h + i * sg_i + offs_k[:, None] * sg_j + offs_d[None, :] * sg_d
            tl.store(DK + g_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=offs_k[:, None] < J)
            tl.store(DV + g_ptrs, dv.to(DV.dtype.element_ty), mask=offs_k[:, None] < J)
