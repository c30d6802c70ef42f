"""Triton kernels of the fused triangle attention (AF3 SI Alg 14/15, the attention with a pair bias).

The problem is B*I*H independent attentions of J queries over K = J keys, all rows i of one (b, h) sharing one bias
tile set [J, K]. Layouts (DESIGN.md): q, k, v, o [B, I, J, H, D] with any strides; bias [B, H, J, K]; the key bias
[B, I, K] float32 (the mask as 0 / -inf plus, for sigmoid, beta_i / scale: one 4-byte load per key, built on the host);
row statistics lse and delta [B, H, I, J] float32, the log-sum-exp kept in base 2. Scores are kept raw,
t = q.k + (bias / scale) + key bias, and enter the base-2 exponent as t * scale * log2(e).

Kernels:
    _fwd            one program per (query tile jb, head h, row i, batch b); online softmax or plain sigmoid.
    _delta          delta = rowsum(dO * O) in float32, with O = o + o_lo (the forward's rounding residual, kept as int8
                    in units of |o| * LO_UNIT / 127, or in o's dtype when LO_UNIT = 0), so the bf16 rounding of the
                    output does not leak into dS.
    _bwd_dqkv       a persistent grid over the rows (b, i, h): per row, an outer loop over key tiles (dK, dV in
                    registers) and an inner loop over query tiles; dQ is accumulated in a float32 scratch row owned by
                    the program only (read-modify-write in program order), so the three gradients need no atomics and
                    repeat bitwise.
    _bwd_dbias      one program per (key tile, query tile, h, b, chunk of rows): the bias tile stays in registers and
                    dS is summed over the rows i of the chunk in order; chunks (only when the grid would otherwise
                    be too small to fill the GPU) are summed afterwards, in order, by _sum_chunks.
    _bwd_dq         (with _bwd_dqkv's COMPUTE_DQ off; LaunchConfig.separate_dq) dQ alone, one program per query tile
                    and row, dQ in registers: one more recomputation, a lighter dk/dv kernel and no dQ scratch.
J_BUCKET (the next power of two of J) is unused by the kernels: it is the autotuning key.
Probabilities are recomputed once in _bwd_dqkv for three gradients and once in _bwd_dbias for the fourth.
"""
from __future__ import annotations

import triton
import triton.language as tl

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
def _base2(scale):
    """scale * log2(e): the factor that turns raw scores t into the base-2 exponents the kernels use."""
    return scale * 1.4426950408889634


@triton.jit
def _exp2(x, FAST: tl.constexpr):
    """2^x. FAST (GPU only) issues the special-function unit's ex2 directly, without the subnormal fix-up."""
    if FAST:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(x)


@triton.jit
def _sigmoid2(x2, FAST: tl.constexpr):
    """sigmoid(x) from x2 = x * log2(e): 1 / (1 + 2^-x2); 0 at x2 = -inf (masked keys)."""
    denominator = 1.0 + _exp2(-x2, FAST)
    if FAST:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [denominator], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return 1.0 / denominator


@triton.jit
def _dot(a, b, DOT_PREC: tl.constexpr, acc=None):
    """a @ b (+ acc) accumulated in float32. DOT_PREC "upcast" (the interpreter, whose bf16 dot is wrong in triton
    3.9) multiplies the same values in float32, which is exact for 16-bit operands."""
    if DOT_PREC == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc=acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc=acc, input_precision=DOT_PREC)


@triton.jit
def _dot_split(p, x, SPLIT: tl.constexpr, DOT_PREC: tl.constexpr, TRANS_P: tl.constexpr = False):
    """p @ x (or p^T @ x) with p (float32) rounded to x's dtype for the tensor cores; SPLIT adds the product of the
    rounding residual (p = hi + lo), which removes that rounding's error at the cost of one more MMA. (tf32 for p
    instead, rounded to nearest: as accurate as the split and 0.5 ms slower per kernel at N = 768; NOTES.md, run 15.)"""
    p_hi = p.to(x.dtype)
    if TRANS_P:
        out = _dot(tl.trans(p_hi), x, DOT_PREC)
    else:
        out = _dot(p_hi, x, DOT_PREC)
    if SPLIT:
        p_lo = (p - p_hi.to(tl.float32)).to(x.dtype)
        if TRANS_P:
            out += _dot(tl.trans(p_lo), x, DOT_PREC)
        else:
            out += _dot(p_lo, x, DOT_PREC)
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
    along its columns. Rows i share it: a program of ROWS rows loads it once for all of them (the bias stream is the
    forward's largest)."""
    bias = tl.load(bias_rows + offs_cols[None, :] * s_col, mask=(offs_rows[:, None] < J) & (offs_cols[None, :] < J),
                   other=0.0)
    return bias.to(tl.float32) * (1.0 / scale)


@triton.jit
def _key_tile_scores(q, k_base, v_base, bias_t, key_mask, offs_k, offs_d, sk_j, sk_d, sv_j, sv_d, J,
                     DOT_PREC: tl.constexpr):
    """k, v [BK, D] of one key tile of one row and its raw scores t = q.k + bias / scale + key term [BJ, BK]; the
    forward and the dQ kernel share it, so both see the same t."""
    k = _load_tile(k_base, offs_k, offs_d, sk_j, sk_d, J)                                      # [BK, D]
    v = _load_tile(v_base, offs_k, offs_d, sv_j, sv_d, J)                                      # [BK, D]
    t = _dot(q, tl.trans(k), DOT_PREC, acc=bias_t + key_mask[None, :])
    return k, v, t


@triton.jit
def _fwd_row_step(q, k_base, v_base, bias_t, key_mask, m_run, l_run, acc, offs_k, offs_d,
                  sk_j, sk_d, sv_j, sv_d, J, scale2,
                  SIGMOID: tl.constexpr, SPLIT_P: tl.constexpr, FAST_EXP: tl.constexpr, DOT_PREC: tl.constexpr):
    """One key tile of one row: the online softmax update of (m_run, l_run, acc) (base 2: the score is t * scale2,
    applied inside the exponent's FMA), or for sigmoid acc += sigmoid(t) v (m_run, l_run unused)."""
    k, v, t = _key_tile_scores(q, k_base, v_base, bias_t, key_mask, offs_k, offs_d, sk_j, sk_d, sv_j, sv_d, J,
                               DOT_PREC)                                                   # t: [BJ, BK]
    if SIGMOID:
        acc += _dot_split(_sigmoid2(t * scale2, FAST_EXP), v, SPLIT_P, DOT_PREC)
    else:
        m_new = tl.maximum(m_run, tl.max(t, 1) * scale2)     # scale2 > 0: max(t) * scale2 = max(t * scale2)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = _exp2(t * scale2 - m_safe[:, None], FAST_EXP)
        alpha = _exp2(m_run - m_safe, FAST_EXP)
        l_run = l_run * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot_split(p, v, SPLIT_P, DOT_PREC)
        m_run = m_new
    return m_run, l_run, acc


@triton.jit
def _fwd_row_store(acc, m_run, l_run, O, O_LO, LSE, o_base, lse_base, offs_j, offs_d, so_j, so_d, J_store,
                   SIGMOID: tl.constexpr, STORE_LSE: tl.constexpr, STORE_LO: tl.constexpr, LO_UNIT: tl.constexpr):
    """Normalise and store one row's output (and for a backward its lse, base 2, and the output's rounding residual);
    J_store is J, or 0 for a row past the end that must not be stored."""
    if not SIGMOID:
        has_key = l_run > 0.0
        acc = acc / tl.where(has_key, l_run, 1.0)[:, None]
    o_ptrs = o_base + offs_j[:, None] * so_j + offs_d[None, :] * so_d
    in_o = offs_j[:, None] < J_store
    o = acc.to(O.dtype.element_ty)
    tl.store(O + o_ptrs, o, mask=in_o)
    if STORE_LO:   # the rounding residual of o, so that the fused backward's delta = rowsum(dO * O) is exact
        if LO_UNIT > 0:
            tl.store(O_LO + o_ptrs, _residual_to_int8(acc, o.to(tl.float32), LO_UNIT), mask=in_o)
        else:          # LO_UNIT 0: the residual in o's own dtype
            tl.store(O_LO + o_ptrs, (acc - o.to(tl.float32)).to(O.dtype.element_ty), mask=in_o)
    if STORE_LSE:
        lse = tl.where(has_key, m_run + tl.log2(tl.where(has_key, l_run, 1.0)), float("inf"))
        tl.store(LSE + lse_base + offs_j, lse, mask=offs_j < J_store)


@triton.jit
def _fwd(Q, K, V, BIAS, KEY_BIAS, O, O_LO, LSE,
         sq_b, sq_i, sq_j, sq_h, sq_d, sk_b, sk_i, sk_j, sk_h, sk_d, sv_b, sv_i, sv_j, sv_h, sv_d,
         sb_b, sb_h, sb_j, sb_k, sm_b, sm_i, sm_k,
         so_b, so_i, so_j, so_h, so_d,
         B, I, J, H, scale, J_BUCKET,
         HAS_KEY_BIAS: tl.constexpr, SIGMOID: tl.constexpr, STORE_LSE: tl.constexpr, STORE_LO: tl.constexpr,
         LO_UNIT: tl.constexpr,
         SPLIT_P: tl.constexpr, FAST_EXP: tl.constexpr,
         DOT_PREC: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
         ROWS: tl.constexpr = 1):
    # ROWS (1 or 2) rows i per program share each bias tile load; a second row past the end (odd I) is computed on
    # row I - 1 and not stored.
    jb, h, i0, b64 = _query_tile_program(J, H, I, BLOCK_J, ROWS)
    i1 = tl.minimum(i0 + 1, I - 1)

    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    offs_d = tl.arange(0, BLOCK_D)
    offs_kt = tl.arange(0, BLOCK_K)
    q_base = Q + b64 * sq_b + h * sq_h
    k_base = K + b64 * sk_b + h * sk_h
    v_base = V + b64 * sv_b + h * sv_h
    bias_base = BIAS + b64 * sb_b + h * sb_h + offs_j[:, None] * sb_j
    q0 = _load_tile(q_base + i0 * sq_i, offs_j, offs_d, sq_j, sq_d, J)                         # [BJ, D]
    scale2 = _base2(scale)
    m0 = tl.full([BLOCK_J], float("-inf"), dtype=tl.float32)
    l0 = tl.zeros([BLOCK_J], dtype=tl.float32)
    acc0 = tl.zeros([BLOCK_J, BLOCK_D], dtype=tl.float32)
    # small loads (the key mask here, row statistics in the backward) are issued one iteration ahead by hand: the
    # software pipeliner leaves them on the critical path (NOTES.md, session 2: the mask cost ~1 ms at N = 768)
    mask_next0 = _key_mask(KEY_BIAS, b64 * sm_b + i0 * sm_i, offs_kt, sm_k, J, HAS_KEY_BIAS)
    if ROWS == 2:
        q1 = _load_tile(q_base + i1 * sq_i, offs_j, offs_d, sq_j, sq_d, J)
        m1 = tl.full([BLOCK_J], float("-inf"), dtype=tl.float32)
        l1 = tl.zeros([BLOCK_J], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_J, BLOCK_D], dtype=tl.float32)
        mask_next1 = _key_mask(KEY_BIAS, b64 * sm_b + i1 * sm_i, offs_kt, sm_k, J, HAS_KEY_BIAS)
    for k0 in range(0, J, BLOCK_K):
        offs_k = k0 + offs_kt
        bias_t = _bias_tile(bias_base, offs_j, offs_k, sb_k, J, scale)                         # [BJ, BK]
        mask0 = mask_next0                                                                     # [BK]
        mask_next0 = _key_mask(KEY_BIAS, b64 * sm_b + i0 * sm_i, offs_k + BLOCK_K, sm_k, J, HAS_KEY_BIAS)
        m0, l0, acc0 = _fwd_row_step(q0, k_base + i0 * sk_i, v_base + i0 * sv_i, bias_t, mask0, m0, l0, acc0,
                                     offs_k, offs_d, sk_j, sk_d, sv_j, sv_d, J, scale2,
                                     SIGMOID, SPLIT_P, FAST_EXP, DOT_PREC)
        if ROWS == 2:
            mask1 = mask_next1
            mask_next1 = _key_mask(KEY_BIAS, b64 * sm_b + i1 * sm_i, offs_k + BLOCK_K, sm_k, J, HAS_KEY_BIAS)
            m1, l1, acc1 = _fwd_row_step(q1, k_base + i1 * sk_i, v_base + i1 * sv_i, bias_t, mask1, m1, l1, acc1,
                                         offs_k, offs_d, sk_j, sk_d, sv_j, sv_d, J, scale2,
                                         SIGMOID, SPLIT_P, FAST_EXP, DOT_PREC)
    o_base = b64 * so_b + h * so_h
    lse_base = (b64 * H + h) * I * J
    _fwd_row_store(acc0, m0, l0, O, O_LO, LSE, o_base + i0 * so_i, lse_base + i0 * J, offs_j, offs_d, so_j, so_d,
                   J, SIGMOID, STORE_LSE, STORE_LO, LO_UNIT)
    if ROWS == 2:
        _fwd_row_store(acc1, m1, l1, O, O_LO, LSE, o_base + i1 * so_i, lse_base + i1 * J, offs_j, offs_d, so_j,
                       so_d, tl.where(i0 + 1 < I, J, 0), SIGMOID, STORE_LSE, STORE_LO, LO_UNIT)


@triton.jit
def _residual_to_int8(acc, o, LO_UNIT: tl.constexpr):
    """The rounding residual acc - o as int8 in units of |o| * LO_UNIT / 127. LO_UNIT bounds |acc - o| / |o| (2^-7 for
    bf16, 2^-10 for fp16: one ulp, so that truncating conversions fit too); the stored residual is then exact to
    |o| * LO_UNIT / 254, 2^-15 of o in bf16: a quarter of the memory of a residual in o's dtype, and as good for
    delta."""
    unit = tl.abs(o) * (LO_UNIT / 127.0)
    steps = tl.where(unit > 0.0, tl.fdiv(acc - o, tl.where(unit > 0.0, unit, 1.0)), 0.0)   # approximate division
    return tl.minimum(tl.maximum(tl.floor(steps + 0.5), -127.0), 127.0).to(tl.int8)


@triton.jit
def _delta(O, O_LO, DO, DELTA,
           so_b, so_i, so_j, so_h, so_d, sd_b, sd_i, sd_j, sd_h, sd_d,
           I, J, H, HAS_LO: tl.constexpr, LO_UNIT: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_D: tl.constexpr):
    jb, h, i64, b64 = _query_tile_program(J, H, I, BLOCK_J)
    offs_j = jb * BLOCK_J + tl.arange(0, BLOCK_J)
    offs_d = tl.arange(0, BLOCK_D)
    o_base = b64 * so_b + i64 * so_i + h * so_h
    o = _load_tile(O + o_base, offs_j, offs_d, so_j, so_d, J).to(tl.float32)
    if HAS_LO:
        lo = _load_tile(O_LO + o_base, offs_j, offs_d, so_j, so_d, J).to(tl.float32)
        if LO_UNIT > 0:
            lo = lo * (tl.abs(o) * (LO_UNIT / 127.0))
        o += lo
    do = _load_tile(DO + b64 * sd_b + i64 * sd_i + h * sd_h, offs_j, offs_d, sd_j, sd_d, J).to(tl.float32)
    tl.store(DELTA + ((b64 * H + h) * I + i64) * J + offs_j, tl.sum(o * do, 1), mask=offs_j < J)


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
        p = _sigmoid2(t * scale2, FAST_EXP)
        ds = dp * p * (1.0 - p)
    else:
        p = _exp2(t * scale2 - lse, FAST_EXP)
        ds = p * (dp - delta)
    return p, ds


@triton.jit
def _kv_tile_step(k, v, dk, dv, q, do, bias_t, key_mask, lse, delta, scale2, SIGMOID: tl.constexpr,
                  SPLIT_DS: tl.constexpr, FAST_EXP: tl.constexpr, DOT_PREC: tl.constexpr):
    """One (key tile, query tile) step of one row i for dK, dV, computed transposed, [key, query] (as
    FlashAttention-2's backward): p^T and dS^T are the A operands of dV += p^T dO and dK += dS^T q straight from
    registers. q, do [BJ, D] are the query tile's; bias_t [BK, BJ] is the bias tile in raw-score units (shared by
    the rows of a program), key_mask [BK] and lse, delta [BJ] this row's. Returns dk, dv and dS^T (for the fused
    dQ)."""
    tt = _dot(k, tl.trans(q), DOT_PREC, acc=bias_t + key_mask[:, None])                    # [BK, BJ]
    dpt = _dot(v, tl.trans(do), DOT_PREC)                                                  # [BK, BJ]
    pt, dst = _probs_and_dscores(tt, scale2, dpt, lse[None, :], delta[None, :], SIGMOID, FAST_EXP)
    dv += _dot_split(pt, do, False, DOT_PREC)    # [BK, D]; p's rounding shows only in dv, as its own output's
    dk += _dot_split(dst, q, SPLIT_DS, DOT_PREC)                                           # [BK, D]
    return dk, dv, dst


@triton.jit
def _bwd_dqkv(Q, K, V, BIAS, KEY_BIAS, DO, LSE, DELTA, DQ_ACC, DQ, DK, DV,
              sq_b, sq_i, sq_j, sq_h, sq_d, sk_b, sk_i, sk_j, sk_h, sk_d, sv_b, sv_i, sv_j, sv_h, sv_d,
              sb_b, sb_h, sb_j, sb_k, sm_b, sm_i, sm_k, sd_b, sd_i, sd_j, sd_h, sd_d,
              sg_b, sg_i, sg_j, sg_h, sg_d,
              B, I, J, H, scale, J_BUCKET,
              HAS_KEY_BIAS: tl.constexpr, SIGMOID: tl.constexpr, SPLIT_DS: tl.constexpr,
              FAST_EXP: tl.constexpr, DOT_PREC: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_D: tl.constexpr):
    # The fused backward (separate_dq off): dQ, dK and dV from one recomputation of p; only dQ += dS k needs a
    # transpose of dS. A persistent grid: each program owns one float32 dQ scratch row [J, D] and takes the rows
    # (b, i, h) pid, pid + programs, ... in turn. The scratch (programs x J x D x 4 bytes, 26 MB at N = 768) stays in
    # L2 and is independent of the problem size; every row is still computed by one program in a fixed order
    # (bitwise).
    for item in range(tl.program_id(0), B * I * H, tl.num_programs(0)):
        h = item % H
        i = (item // H) % I
        b = item // (H * I)
        b64 = b.to(tl.int64)
        i64 = i.to(tl.int64)
        offs_d = tl.arange(0, BLOCK_D)
        offs_jt = tl.arange(0, BLOCK_J)
        offs_kt = tl.arange(0, BLOCK_K)
        q_base = Q + b64 * sq_b + i64 * sq_i + h * sq_h
        do_base = DO + b64 * sd_b + i64 * sd_i + h * sd_h
        k_base = K + b64 * sk_b + i64 * sk_i + h * sk_h
        v_base = V + b64 * sv_b + i64 * sv_i + h * sv_h
        bias_base = BIAS + b64 * sb_b + h * sb_h
        m_base = b64 * sm_b + i64 * sm_i
        row_base = ((b64 * H + h) * I + i64) * J                      # into LSE, DELTA [B, H, I, J]
        acc_base = DQ_ACC + tl.program_id(0).to(tl.int64) * J * BLOCK_D  # this program's dQ scratch row [J, D]
        g_base = b64 * sg_b + i64 * sg_i + h * sg_h                   # into DQ, DK, DV (same layout)
        scale2 = _base2(scale)

        key_mask_next = _key_mask(KEY_BIAS, m_base, offs_kt, sm_k, J, HAS_KEY_BIAS)
        for k0 in range(0, J, BLOCK_K):
            tl.debug_barrier()   # every thread sees the dQ row as the last key tile left it
            offs_k = k0 + offs_kt
            key_mask = key_mask_next
            key_mask_next = _key_mask(KEY_BIAS, m_base, offs_k + BLOCK_K, sm_k, J, HAS_KEY_BIAS)
            k = _load_tile(k_base, offs_k, offs_d, sk_j, sk_d, J)                                   # [BK, D]
            v = _load_tile(v_base, offs_k, offs_d, sv_j, sv_d, J)                                   # [BK, D]
            dk = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)
            dv = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)
            # rows of dQ this key tile reads back / keeps in the scratch / writes out (the last key tile writes out)
            rows_read = tl.where(k0 > 0, J, 0)
            rows_keep = tl.where(k0 + BLOCK_K < J, J, 0)
            rows_out = J - rows_keep
            lse_next, delta_next = _row_stats(LSE, DELTA, row_base, offs_jt, offs_jt < J, SIGMOID)
            for j0 in range(0, J, BLOCK_J):
                offs_j = j0 + offs_jt
                lse, delta = lse_next, delta_next
                lse_next, delta_next = _row_stats(LSE, DELTA, row_base, offs_j + BLOCK_J, offs_j + BLOCK_J < J,
                                                  SIGMOID)
                bias_t = _bias_tile(bias_base + offs_k[:, None] * sb_k, offs_k, offs_j, sb_j, J, scale)  # [BK, BJ]
                q = _load_tile(q_base, offs_j, offs_d, sq_j, sq_d, J)                              # [BJ, D]
                do = _load_tile(do_base, offs_j, offs_d, sd_j, sd_d, J)                            # [BJ, D]
                dk, dv, dst = _kv_tile_step(k, v, dk, dv, q, do, bias_t, key_mask, lse, delta, scale2, SIGMOID,
                                            SPLIT_DS, FAST_EXP, DOT_PREC)
                acc_ptrs = acc_base + offs_j[:, None] * BLOCK_D + offs_d[None, :]
                dq = tl.load(acc_ptrs, mask=offs_j[:, None] < rows_read, other=0.0)
                dq += _dot_split(dst, k, SPLIT_DS, DOT_PREC, TRANS_P=True)                          # [BJ, D]
                tl.store(acc_ptrs, dq, mask=offs_j[:, None] < rows_keep)
                g_ptrs = g_base + offs_j[:, None] * sg_j + offs_d[None, :] * sg_d
                tl.store(DQ + g_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=offs_j[:, None] < rows_out)
            g_ptrs = g_base + offs_k[:, None] * sg_j + offs_d[None, :] * sg_d
            tl.store(DK + g_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=offs_k[:, None] < J)
            tl.store(DV + g_ptrs, dv.to(DV.dtype.element_ty), mask=offs_k[:, None] < J)


@triton.jit
def _bwd_dkdv(Q, K, V, BIAS, KEY_BIAS, DO, LSE, DELTA, DK, DV,
              sq_b, sq_i, sq_j, sq_h, sq_d, sk_b, sk_i, sk_j, sk_h, sk_d, sv_b, sv_i, sv_j, sv_h, sv_d,
              sb_b, sb_h, sb_j, sb_k, sm_b, sm_i, sm_k, sd_b, sd_i, sd_j, sd_h, sd_d,
              sg_b, sg_i, sg_j, sg_h, sg_d,
              B, I, J, H, scale, J_BUCKET,
              HAS_KEY_BIAS: tl.constexpr, SIGMOID: tl.constexpr, SPLIT_DS: tl.constexpr,
              FAST_EXP: tl.constexpr, DOT_PREC: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr,
              BLOCK_D: tl.constexpr, ROWS: tl.constexpr = 1, PREFETCH: tl.constexpr = 0):
    """dK and dV (dQ comes from _bwd_dq): a persistent grid whose programs take the items (b, group of ROWS rows i,
    h) pid, pid + programs, ... in turn; for each key tile a loop over query tiles accumulates dK, dV of each row in
    registers. ROWS = 2 rows share each bias tile load (a second row past the end, odd I, is row I - 1 again and is
    not stored). PREFETCH 1: the next query tile's q and dO (of the first row) are loaded one step ahead, as the
    row statistics are (ncu, run 13: a third of the stall cycles wait on global loads at one pipeline stage); 2:
    its bias tile too (32 more registers at 64x64: a little spill)."""
    n_groups = tl.cdiv(I, ROWS)
    for item in range(tl.program_id(0), B * n_groups * H, tl.num_programs(0)):
        h = item % H
        i0 = ((item // H) % n_groups * ROWS).to(tl.int64)
        i1 = tl.minimum(i0 + 1, I - 1)
        b64 = (item // (H * n_groups)).to(tl.int64)
        offs_d = tl.arange(0, BLOCK_D)
        offs_jt = tl.arange(0, BLOCK_J)
        offs_kt = tl.arange(0, BLOCK_K)
        q_base = Q + b64 * sq_b + h * sq_h                              # + i * sq_i (and so on): row i's
        do_base = DO + b64 * sd_b + h * sd_h
        q_row0, do_row0 = q_base + i0 * sq_i, do_base + i0 * sd_i      # the first row's q, dO
        k_base = K + b64 * sk_b + h * sk_h
        v_base = V + b64 * sv_b + h * sv_h
        bias_base = BIAS + b64 * sb_b + h * sb_h
        row_base = (b64 * H + h) * I * J                                # + i * J: into LSE, DELTA [B, H, I, J]
        g_base = b64 * sg_b + h * sg_h                                  # + i * sg_i: into DK, DV
        scale2 = _base2(scale)

        mask_next0 = _key_mask(KEY_BIAS, b64 * sm_b + i0 * sm_i, offs_kt, sm_k, J, HAS_KEY_BIAS)
        if ROWS == 2:
            mask_next1 = _key_mask(KEY_BIAS, b64 * sm_b + i1 * sm_i, offs_kt, sm_k, J, HAS_KEY_BIAS)
        for k0 in range(0, J, BLOCK_K):
            offs_k = k0 + offs_kt
            mask0 = mask_next0                                                                      # [BK]
            mask_next0 = _key_mask(KEY_BIAS, b64 * sm_b + i0 * sm_i, offs_k + BLOCK_K, sm_k, J, HAS_KEY_BIAS)
            k_0 = _load_tile(k_base + i0 * sk_i, offs_k, offs_d, sk_j, sk_d, J)                     # [BK, D]
            v_0 = _load_tile(v_base + i0 * sv_i, offs_k, offs_d, sv_j, sv_d, J)                     # [BK, D]
            dk0 = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)
            dv0 = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)
            lse_next0, delta_next0 = _row_stats(LSE, DELTA, row_base + i0 * J, offs_jt, offs_jt < J, SIGMOID)
            bias_rows = bias_base + offs_k[:, None] * sb_k                  # this key tile's rows of the bias
            if PREFETCH == 2:
                bias_next = _bias_tile(bias_rows, offs_k, offs_jt, sb_j, J, scale)
            if PREFETCH >= 1:
                q_next0 = _load_tile(q_row0, offs_jt, offs_d, sq_j, sq_d, J)                           # [BJ, D]
                do_next0 = _load_tile(do_row0, offs_jt, offs_d, sd_j, sd_d, J)                         # [BJ, D]
            if ROWS == 2:
                mask1 = mask_next1
                mask_next1 = _key_mask(KEY_BIAS, b64 * sm_b + i1 * sm_i, offs_k + BLOCK_K, sm_k, J, HAS_KEY_BIAS)
                k_1 = _load_tile(k_base + i1 * sk_i, offs_k, offs_d, sk_j, sk_d, J)
                v_1 = _load_tile(v_base + i1 * sv_i, offs_k, offs_d, sv_j, sv_d, J)
                dk1 = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)
                dv1 = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)
                lse_next1, delta_next1 = _row_stats(LSE, DELTA, row_base + i1 * J, offs_jt, offs_jt < J, SIGMOID)
            for j0 in range(0, J, BLOCK_J):
                offs_j = j0 + offs_jt
                # the row statistics of the next query tile are loaded one step ahead (as the key mask)
                lse0, delta0 = lse_next0, delta_next0
                lse_next0, delta_next0 = _row_stats(LSE, DELTA, row_base + i0 * J, offs_j + BLOCK_J,
                                                    offs_j + BLOCK_J < J, SIGMOID)
                if PREFETCH == 2:
                    bias_t = bias_next                                                              # [BK, BJ]
                    bias_next = _bias_tile(bias_rows, offs_k, offs_j + BLOCK_J, sb_j, J, scale)
                else:
                    bias_t = _bias_tile(bias_rows, offs_k, offs_j, sb_j, J, scale)
                if PREFETCH >= 1:
                    q0, do0 = q_next0, do_next0
                    q_next0 = _load_tile(q_row0, offs_j + BLOCK_J, offs_d, sq_j, sq_d, J)
                    do_next0 = _load_tile(do_row0, offs_j + BLOCK_J, offs_d, sd_j, sd_d, J)
                else:
                    q0 = _load_tile(q_row0, offs_j, offs_d, sq_j, sq_d, J)                             # [BJ, D]
                    do0 = _load_tile(do_row0, offs_j, offs_d, sd_j, sd_d, J)                           # [BJ, D]
                dk0, dv0, _ = _kv_tile_step(k_0, v_0, dk0, dv0, q0, do0, bias_t, mask0, lse0, delta0, scale2,
                                            SIGMOID, SPLIT_DS, FAST_EXP, DOT_PREC)
                if ROWS == 2:
                    lse1, delta1 = lse_next1, delta_next1
                    lse_next1, delta_next1 = _row_stats(LSE, DELTA, row_base + i1 * J, offs_j + BLOCK_J,
                                                        offs_j + BLOCK_J < J, SIGMOID)
                    q1 = _load_tile(q_base + i1 * sq_i, offs_j, offs_d, sq_j, sq_d, J)
                    do1 = _load_tile(do_base + i1 * sd_i, offs_j, offs_d, sd_j, sd_d, J)
                    dk1, dv1, _ = _kv_tile_step(k_1, v_1, dk1, dv1, q1, do1, bias_t, mask1, lse1, delta1, scale2,
                                                SIGMOID, SPLIT_DS, FAST_EXP, DOT_PREC)
            g_ptrs = g_base + offs_k[:, None] * sg_j + offs_d[None, :] * sg_d
            tl.store(DK + g_ptrs + i0 * sg_i, (dk0 * scale).to(DK.dtype.element_ty), mask=offs_k[:, None] < J)
            tl.store(DV + g_ptrs + i0 * sg_i, dv0.to(DV.dtype.element_ty), mask=offs_k[:, None] < J)
            if ROWS == 2:
                rows_1 = tl.where(i0 + 1 < I, J, 0)                      # 0: row I - 1 again, not stored
                tl.store(DK + g_ptrs + i1 * sg_i, (dk1 * scale).to(DK.dtype.element_ty),
                         mask=offs_k[:, None] < rows_1)
                tl.store(DV + g_ptrs + i1 * sg_i, dv1.to(DV.dtype.element_ty), mask=offs_k[:, None] < rows_1)


@triton.jit
def _dq_row_step(q, do, k_base, v_base, bias_t, key_mask, lse, delta, dq, p_dp, p_sum, pk, offs_k, offs_d,
                 sk_j, sk_d, sv_j, sv_d, J, scale2, SIGMOID: tl.constexpr, SPLIT_DS: tl.constexpr,
                 COMPUTE_DELTA: tl.constexpr, FAST_EXP: tl.constexpr, DOT_PREC: tl.constexpr):
    """One key tile of one row of _bwd_dq: dq += dS k, and with COMPUTE_DELTA the sums of p * dP, p and p k."""
    k, v, t = _key_tile_scores(q, k_base, v_base, bias_t, key_mask, offs_k, offs_d, sk_j, sk_d, sv_j, sv_d, J,
                               DOT_PREC)                                                   # t: [BJ, BK]
    dp = _dot(do, tl.trans(v), DOT_PREC)                                                   # [BJ, BK]
    p, ds = _probs_and_dscores(t, scale2, dp, lse[:, None], delta[:, None], SIGMOID, FAST_EXP)
    dq += _dot_split(ds, k, SPLIT_DS, DOT_PREC)                                            # [BJ, D]
    if COMPUTE_DELTA:
        p_dp += tl.sum(p * dp, 1)
        p_sum += tl.sum(p, 1)
        pk = _dot(p.to(k.dtype), k, DOT_PREC, acc=pk)                                      # [BJ, D]
    return dq, p_dp, p_sum, pk


@triton.jit
def _dq_row_start(Q, DO, O, LSE, DELTA, q_base, do_base, o_base, row_base, offs_j, offs_d, sq_j, sq_d, sd_j, sd_d,
                  so_j, so_d, J, SIGMOID: tl.constexpr, COMPUTE_DELTA: tl.constexpr):
    """q, dO [BJ, D] and lse, delta [BJ] of one row (delta: rowsum(dO * o) from the rounded output o when
    COMPUTE_DELTA, else the given one)."""
    in_j = offs_j < J
    q = _load_tile(Q + q_base, offs_j, offs_d, sq_j, sq_d, J)                              # [BJ, D]
    do = _load_tile(DO + do_base, offs_j, offs_d, sd_j, sd_d, J)                           # [BJ, D]
    if COMPUTE_DELTA:
        lse = tl.load(LSE + row_base + offs_j, mask=in_j, other=float("inf"))
        o = _load_tile(O + o_base, offs_j, offs_d, so_j, so_d, J)                          # [BJ, D]
        delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)                            # delta0 [BJ]
    else:
        lse, delta = _row_stats(LSE, DELTA, row_base, offs_j, in_j, SIGMOID)
    return q, do, lse, delta


@triton.jit
def _dq_row_store(dq, delta0, p_dp, p_sum, pk, DQ, DELTA, g_base, row_base, offs_j, offs_d, sg_j, sg_d, J, scale,
                  COMPUTE_DELTA: tl.constexpr):
    in_j = offs_j < J        # J: 0 for a row past the end
    if COMPUTE_DELTA:
        # delta = E_p[dP] with p as this backward recomputes it: its sum over keys misses 1 by the rounding of lse
        # (an ulp of |score|, 1e-3 at scores of 1e4); normalising keeps sum_k dS = 0 there as well
        delta_exact = p_dp / tl.where(p_sum > 0.0, p_sum, 1.0)
        dq -= (delta_exact - delta0)[:, None] * pk
        tl.store(DELTA + row_base + offs_j, delta_exact, mask=in_j)
    g_ptrs = g_base + offs_j[:, None] * sg_j + offs_d[None, :] * sg_d
    tl.store(DQ + g_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=in_j[:, None])


@triton.jit
def _bwd_dq(Q, K, V, BIAS, KEY_BIAS, DO, O, LSE, DELTA, DQ,
            sq_b, sq_i, sq_j, sq_h, sq_d, sk_b, sk_i, sk_j, sk_h, sk_d, sv_b, sv_i, sv_j, sv_h, sv_d,
            sb_b, sb_h, sb_j, sb_k, sm_b, sm_i, sm_k, sd_b, sd_i, sd_j, sd_h, sd_d,
            so_b, so_i, so_j, so_h, so_d, sg_b, sg_i, sg_j, sg_h, sg_d,
            B, I, J, H, scale, J_BUCKET,
            HAS_KEY_BIAS: tl.constexpr, SIGMOID: tl.constexpr, SPLIT_DS: tl.constexpr, FAST_EXP: tl.constexpr,
            DOT_PREC: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
            COMPUTE_DELTA: tl.constexpr = False, ROWS: tl.constexpr = 1):
    """dQ alone, one program per (query tile, head, ROWS rows, batch) as the forward: a loop over key tiles
    recomputes p and dS = p (dP - delta) and accumulates dQ = dS k in registers (no scratch, no transpose). With
    _bwd_dqkv(COMPUTE_DQ=False) it replaces the fused dq/dk/dv kernel at the cost of one more recomputation.

    COMPUTE_DELTA (softmax): delta is not given but made here, exactly, for this kernel and the later ones. The loop
    runs with delta0 = rowsum(dO * o) from the rounded output o and also sums the exact delta = rowsum(p * dP)
    (= dO . sum_k p_k v_k, the unrounded output) and pk = sum_k p_k k_k; since dQ is linear in delta,
        dQ(delta) = dQ(delta0) - (delta - delta0) pk,
    and the correction is exact to the product of two small errors (delta - delta0 ~ 2^-9 delta, pk's rounding of p
    ~ 2^-9): the output's rounding residual need not be stored (TurboPairFormer compensates it as well)."""
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
    q0, do0, lse0, delta0 = _dq_row_start(Q, DO, O, LSE, DELTA, b64 * sq_b + i0 * sq_i + h * sq_h,
                                          b64 * sd_b + i0 * sd_i + h * sd_h, b64 * so_b + i0 * so_i + h * so_h,
                                          row_base + i0 * J, offs_j, offs_d, sq_j, sq_d, sd_j, sd_d, so_j, so_d, J,
                                          SIGMOID, COMPUTE_DELTA)
    dq0 = tl.zeros([BLOCK_J, BLOCK_D], dtype=tl.float32)
    p_dp0 = tl.zeros([BLOCK_J], dtype=tl.float32)
    p_sum0 = tl.zeros([BLOCK_J], dtype=tl.float32)
    pk0 = tl.zeros([BLOCK_J, BLOCK_D], dtype=tl.float32)
    mask_next0 = _key_mask(KEY_BIAS, b64 * sm_b + i0 * sm_i, offs_kt, sm_k, J, HAS_KEY_BIAS)
    if ROWS == 2:
        q1, do1, lse1, delta1 = _dq_row_start(Q, DO, O, LSE, DELTA, b64 * sq_b + i1 * sq_i + h * sq_h,
                                              b64 * sd_b + i1 * sd_i + h * sd_h, b64 * so_b + i1 * so_i + h * so_h,
                                              row_base + i1 * J, offs_j, offs_d, sq_j, sq_d, sd_j, sd_d, so_j,
                                              so_d, J, SIGMOID, COMPUTE_DELTA)
        dq1 = tl.zeros([BLOCK_J, BLOCK_D], dtype=tl.float32)
        p_dp1 = tl.zeros([BLOCK_J], dtype=tl.float32)
        p_sum1 = tl.zeros([BLOCK_J], dtype=tl.float32)
        pk1 = tl.zeros([BLOCK_J, BLOCK_D], dtype=tl.float32)
        mask_next1 = _key_mask(KEY_BIAS, b64 * sm_b + i1 * sm_i, offs_kt, sm_k, J, HAS_KEY_BIAS)
    for k0 in range(0, J, BLOCK_K):
        offs_k = k0 + offs_kt
        bias_t = _bias_tile(bias_base, offs_j, offs_k, sb_k, J, scale)                         # [BJ, BK]
        mask0 = mask_next0
        mask_next0 = _key_mask(KEY_BIAS, b64 * sm_b + i0 * sm_i, offs_k + BLOCK_K, sm_k, J, HAS_KEY_BIAS)
        dq0, p_dp0, p_sum0, pk0 = _dq_row_step(q0, do0, k_base + i0 * sk_i, v_base + i0 * sv_i, bias_t, mask0,
                                               lse0, delta0, dq0, p_dp0, p_sum0, pk0, offs_k, offs_d, sk_j, sk_d,
                                               sv_j, sv_d, J, scale2, SIGMOID, SPLIT_DS, COMPUTE_DELTA, FAST_EXP,
                                               DOT_PREC)
        if ROWS == 2:
            mask1 = mask_next1
            mask_next1 = _key_mask(KEY_BIAS, b64 * sm_b + i1 * sm_i, offs_k + BLOCK_K, sm_k, J, HAS_KEY_BIAS)
            dq1, p_dp1, p_sum1, pk1 = _dq_row_step(q1, do1, k_base + i1 * sk_i, v_base + i1 * sv_i, bias_t, mask1,
                                                   lse1, delta1, dq1, p_dp1, p_sum1, pk1, offs_k, offs_d, sk_j, sk_d,
                                                   sv_j, sv_d, J, scale2, SIGMOID, SPLIT_DS, COMPUTE_DELTA, FAST_EXP,
                                                   DOT_PREC)
    g_base = b64 * sg_b + h * sg_h
    _dq_row_store(dq0, delta0, p_dp0, p_sum0, pk0, DQ, DELTA, g_base + i0 * sg_i, row_base + i0 * J, offs_j,
                  offs_d, sg_j, sg_d, J, scale, COMPUTE_DELTA)
    if ROWS == 2:
        _dq_row_store(dq1, delta1, p_dp1, p_sum1, pk1, DQ, DELTA, g_base + i1 * sg_i, row_base + i1 * J, offs_j, offs_d,
                      sg_j, sg_d, tl.where(i0 + 1 < I, J, 0), scale, COMPUTE_DELTA)


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
def _bwd_dbias(Q, K, V, BIAS, KEY_BIAS, DO, LSE, DELTA, DBIAS,
               sq_b, sq_i, sq_j, sq_h, sq_d, sk_b, sk_i, sk_j, sk_h, sk_d, sv_b, sv_i, sv_j, sv_h, sv_d,
               sb_b, sb_h, sb_j, sb_k, sm_b, sm_i, sm_k, sd_b, sd_i, sd_j, sd_h, sd_d,
               so_c, so_b, so_h, so_j, so_k,
               B, I, J, H, scale, rows_per_chunk, J_BUCKET,
               HAS_KEY_BIAS: tl.constexpr, SIGMOID: tl.constexpr, FAST_EXP: tl.constexpr, DOT_PREC: tl.constexpr,
               BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    # program order: key tile fastest, then query tile, head, batch, and the chunk of rows slowest, so that the
    # programs in flight walk the same rows i together and read each row's q, k, v, dO from HBM once.
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
    in_k = offs_k < J
    tile_mask = in_j[:, None] & in_k[None, :]
    bias = tl.load(BIAS + b64 * sb_b + h * sb_h + offs_j[:, None] * sb_j + offs_k[None, :] * sb_k,
                   mask=tile_mask, other=0.0).to(tl.float32)
    bias_t = bias * (1.0 / scale)      # the bias in raw-score units (t = q.k + bias / scale)
    scale2 = _base2(scale)
    acc = tl.zeros([BLOCK_J, BLOCK_K], dtype=tl.float32)
    i_start = c * rows_per_chunk
    i_end = tl.minimum(i_start + rows_per_chunk, I)
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
        do = _load_tile(DO + b64 * sd_b + i64 * sd_i + h * sd_h, offs_j, offs_d, sd_j, sd_d, J)
        k = _load_tile(K + b64 * sk_b + i64 * sk_i + h * sk_h, offs_k, offs_d, sk_j, sk_d, J)
        v = _load_tile(V + b64 * sv_b + i64 * sv_i + h * sv_h, offs_k, offs_d, sv_j, sv_d, J)
        t = _dot(q, tl.trans(k), DOT_PREC, acc=bias_t + key_mask[None, :])
        dp = _dot(do, tl.trans(v), DOT_PREC)
        _, ds = _probs_and_dscores(t, scale2, dp, lse[:, None], delta[:, None], SIGMOID, FAST_EXP)
        acc += ds
    out_ptrs = DBIAS + c.to(tl.int64) * so_c + b64 * so_b + h * so_h + offs_j[:, None] * so_j + offs_k[None, :] * so_k
    tl.store(out_ptrs, acc.to(DBIAS.dtype.element_ty), mask=tile_mask)


@triton.jit
def _sum_chunks(PART, OUT, n_chunks, n_elem, BLOCK: tl.constexpr):
    """OUT[x] = sum_c PART[c, x], the chunks added in order (deterministic)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n_elem
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for c in range(0, n_chunks):
        acc += tl.load(PART + tl.cast(c, tl.int64) * n_elem + offs, mask=inside, other=0.0)
    tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=inside)
