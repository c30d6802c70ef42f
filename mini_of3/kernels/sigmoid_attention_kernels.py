"""Triton kernels of sigmoid attention over dense, padded or packed variable-length sequences.

    o_i = sum_{k valid} sigmoid(scale * q_i . k_k + b) v_k,   b one scalar per (sequence, head)

One kernel set serves the three layouts. A sequence s is (first token, length) along its tensor's token axis:
dense [B, T, H, D]: (0, T) at batch offset s * stride_b; padded: (0, SEQ[s]); packed varlen [total, H, D]: (SEQ[s],
SEQ[s+1] - SEQ[s]) with stride_b = 0. LAYOUT picks how SEQ is read; nothing else differs. Causal masking is aligned
bottom-right: query i of a sequence with Lq queries and Lk keys sees the keys k <= i + Lk - Lq.

Launch order, each kernel's grid and what it reads and writes:
    _fwd        grid (query blocks of max_seqlen_q, H, S); reads q, k, v; writes o.
    _bwd_dkdv   grid (key blocks of max_seqlen_k, Hc, S); reads q, k, v, dO; writes dk, dv (and, STORE_DS, dS^T
                into the scores workspace).
    _bwd_dq     grid (query blocks of max_seqlen_q, H, S); reads q, k, v, dO; writes dq: recomputes sigma and dP.
 or _bwd_dq_scores  grid (query blocks of max_seqlen_q, Hc, S); reads k and the workspace; writes dq.
The backward is either _bwd_dkdv + _bwd_dq over all heads (7 products per score: 4 + 3), or, when the scores
workspace fits its budget, _bwd_dkdv storing dS^T + _bwd_dq_scores per chunk of Hc heads (5 products and 4 bytes of
memory traffic per score in 16-bit: the dS^T written and read back).
Programs past their sequence's length do no work (padded layout: they write its zero rows). No statistics cross
kernels: sigmoid has no row max or normaliser, so the backward needs neither lse nor delta; dS = dP sigma (1 - sigma).
Every output element is written by one program and every sum runs in a fixed order, with no atomics: results repeat
bitwise. The atomic alternative measured slower on an H100: bf16, B = 4, T = 4096, H = 16, forward+backward 4.98 ms
at D = 128 and 2.88 ms at D = 64 with _bwd_dq, against 18.19 and 7.51 ms with dq added atomically inside _bwd_dkdv.

Where the time goes (H100, per score element; tensor cores ~4096 FLOP/clk/SM in bf16, the special-function unit
MUFU ~16 ops/clk/SM, the FP32 pipe 128 ops/clk/SM): the forward's two products cost 4 D FLOP = 0.125 clk at
D = 128 and 0.0625 clk at D = 64, while one MUFU op costs 0.0625 clk and each FP32 op 0.008 clk. So the sigmoid's
evaluation is as expensive as the matmuls, and SIGMOID selects it:
    "exact"  2^-|z| (tl.exp2) and an IEEE division: the CPU interpreter's path and the float32 inputs'.
    "rcp"    1 / (1 + 2^-z) by ex2.approx and rcp.approx (primitives.sigmoid2): 2 MUFU ops, ~3 FP32 ops; relative
             error ~1e-7. The default of 16-bit inputs on the GPU.
    "tanh"   0.5 + 0.5 tanh.approx(x / 2), as TritonSigmoid: 1 MUFU op, but tanh.approx's error (~2^-11 relative
             to tanh) is an absolute error of up to ~2.4e-4 on sigma, large against the small sigmoids that
             b = -log(n) makes typical (n = 16384: sigma ~ 6e-5). Opt-in only: ``sigmoid_tiles(sigmoid="tanh")``.
Measured on an H100 (bf16, B = 4, T = 4096, H = 16, D = 128, one tile configuration, forward+backward): "rcp" 5.31
ms, "tanh" 4.46 ms; norm-relative error of o against float64 2.35e-3 and 2.45e-3. At the same tiles, 1 / (1 + e)
on the FP32 pipe (a linear guess and 2 or 3 Newton steps after ex2.approx) takes 6.26 and 6.54 ms for the same
error as "rcp". e - e^2 + e^3 after ex2.approx where a warp vote finds all of four scores per thread below x = -5
(rcp elsewhere; relative error < 3.1e-7) took 5.33 ms forward at B = 1, T = 16384, D = 128 against rcp's 4.85 and
tanh's 4.18 (default tiles).
z = x log2(e) (x / 2 for "tanh") enters as one FMA of the raw score, scale and b folded into its two coefficients.
ASM (GPU only) issues the PTX approximations; the interpreter evaluates "rcp" and "tanh" exactly, as
"exact". Masks
cost only where needed: each loop is split into blocks with no mask at all and boundary blocks (the causal diagonal,
the last partial block), and blocks wholly past a length or above the diagonal are skipped. Masked scores are zeroed
after the sigmoid (tl.where), so no -inf ever meets an inf and nothing can become NaN; padded rows load as zeros.
"""
from __future__ import annotations

import triton
import triton.language as tl

from mini_of3.kernels.primitives import dot, sigmoid2

LOG2E = tl.constexpr(1.4426950408889634)


# ---------------------------------------------------------------------------------------------------------------
# device helpers


@triton.jit
def _span(SEQ, s, T, LAYOUT: tl.constexpr):
    """(first token, length) of sequence s along the token axis: dense (0, T), padded (0, SEQ[s]), varlen
    (SEQ[s], SEQ[s+1] - SEQ[s])."""
    if LAYOUT == "varlen":
        start = tl.load(SEQ + s)
        length = tl.load(SEQ + s + 1) - start
    elif LAYOUT == "padded":
        start = s * 0
        length = tl.load(SEQ + s)
    else:
        start = s * 0
        length = s * 0 + T
    return start, length


@triton.jit
def _base(PTR, s, start, h, s_b, s_t, s_h):
    """Pointer to token 0 of sequence s, head h (64-bit offset)."""
    return PTR + (tl.cast(s, tl.int64) * s_b + tl.cast(start, tl.int64) * s_t + tl.cast(h, tl.int64) * s_h)


@triton.jit
def _coefficients(BIAS, s, h, sb_s, sb_h, bias_value, Lk, scale, BIAS_KIND: tl.constexpr, SIGMOID: tl.constexpr):
    """(mul, add) with which the raw score q.k becomes the argument of _sigmoid in one FMA: z = x log2(e) (x / 2 for
    "tanh"), x = scale q.k + b. b: -log(max(Lk, 1)) ("keys"), bias_value ("scalar") or BIAS[s, h] ("tensor")."""
    if BIAS_KIND == "keys":
        bias = -tl.log(tl.maximum(Lk, 1).to(tl.float32))
    elif BIAS_KIND == "scalar":
        bias = bias_value
    else:
        bias = tl.load(BIAS + tl.cast(s, tl.int64) * sb_s + h * sb_h)
    if SIGMOID == "tanh":
        return scale * 0.5, bias * 0.5
    else:
        return scale * LOG2E, bias * LOG2E


@triton.jit
def _sigmoid(z, SIGMOID: tl.constexpr, ASM: tl.constexpr):
    """sigmoid of the argument z that _coefficients prepared (see the module docstring for the variants)."""
    if SIGMOID == "tanh":
        if ASM:
            t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [z], dtype=tl.float32,
                                          is_pure=True, pack=1)
            return 0.5 + 0.5 * t
        else:        # sigmoid(2 z), exactly
            e = tl.exp2(tl.abs(z) * -2.0 * LOG2E)
            r = 1.0 / (1.0 + e)
            return tl.where(z >= 0, r, e * r)
    elif SIGMOID == "rcp" and ASM:
        return sigmoid2(z, True)                 # 1 / (1 + 2^-z); 2^-z = +inf for z < -128: rcp gives 0
    else:            # "exact", and "rcp" in the interpreter
        e = tl.exp2(-tl.abs(z))
        r = 1.0 / (1.0 + e)
        return tl.where(z >= 0, r, e * r)


@triton.jit
def _key_blocks(m0, Lq, Lk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """The keys a query block [m0, m0 + BLOCK_M) needs: [0, full_end) in whole blocks that need no mask, then
    [full_end, end) in blocks that do (the causal diagonal, the last partial block). Nothing past Lq."""
    if CAUSAL:
        end = tl.minimum(Lk, m0 + BLOCK_M + Lk - Lq)        # one past the last key its last row sees
        unmasked = tl.minimum(Lk, m0 + 1 + Lk - Lq)         # keys its first row sees
    else:
        end = Lk
        unmasked = Lk
    end = tl.where(m0 < Lq, tl.maximum(end, 0), 0)
    full_end = tl.minimum(tl.maximum(unmasked, 0) // BLOCK_N * BLOCK_N, end)
    return full_end, end


@triton.jit
def _query_blocks(n0, Lq, Lk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """The queries that see a key block [n0, n0 + BLOCK_N): masked blocks [start, full_start) (causal diagonal),
    unmasked [full_start, full_end), a masked tail [full_end, end) (the last partial query block). Nothing past Lk."""
    lq = tl.where(n0 < Lk, Lq, 0)
    full_end = lq // BLOCK_M * BLOCK_M
    end = (lq + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    if CAUSAL:
        first = tl.minimum(tl.maximum(n0 - (Lk - Lq), 0), lq)                 # first query seeing key n0
        start = first // BLOCK_M * BLOCK_M
        all_seen = tl.minimum(tl.maximum(n0 + BLOCK_N - 1 - (Lk - Lq), 0), lq)  # from here every key is seen
        full_start = tl.maximum(tl.minimum((all_seen + BLOCK_M - 1) // BLOCK_M * BLOCK_M, full_end), start)
    else:
        start = lq * 0
        full_start = start
    return start, full_start, full_end, end


@triton.jit
def _load_rows(base, offs, offs_d, s_t, n_rows, MASKED: tl.constexpr):
    """[len(offs), D] rows offs of a sequence; MASKED: rows >= n_rows read as 0."""
    ptrs = base + offs[:, None] * s_t + offs_d[None, :]
    if MASKED:
        return tl.load(ptrs, mask=offs[:, None] < n_rows, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _scores_seen(offs_m, offs_n, Lq, Lk, CAUSAL: tl.constexpr):
    """[BLOCK_M, BLOCK_N] True where query offs_m sees key offs_n (both valid; causal bottom-right)."""
    seen = (offs_m[:, None] < Lq) & (offs_n[None, :] < Lk)
    if CAUSAL:
        seen = seen & (offs_n[None, :] <= offs_m[:, None] + (Lk - Lq))
    return seen


@triton.jit
def _scores_seen_t(offs_n, offs_m, Lq, Lk, CAUSAL: tl.constexpr):
    """_scores_seen transposed: [BLOCK_N, BLOCK_M]."""
    seen = (offs_n[:, None] < Lk) & (offs_m[None, :] < Lq)
    if CAUSAL:
        seen = seen & (offs_n[:, None] <= offs_m[None, :] + (Lk - Lq))
    return seen


@triton.jit
def _scores_base(WS, WS_OFF, s, hc, Hc, Lq, Lk, Tq, Tk, LAYOUT: tl.constexpr):
    """(pointer to dS^T[key 0, query 0] of sequence s and workspace head hc of Hc, its row stride ld). Per sequence
    the workspace holds Hc blocks [keys, ld], ld the queries rounded up to 16 (aligned rows): dense and padded
    [Tk, ld(Tq)] at s Hc Tk ld(Tq); varlen [Lk, ld(Lq)] at Hc WS_OFF[s] (int64, exclusive prefix sums)."""
    if LAYOUT == "varlen":
        ld = (Lq + 15) // 16 * 16
        first = tl.multiple_of(tl.load(WS_OFF + s), 16) * Hc       # sums of Lk aligned(Lq): multiples of 16
        rows = Lk
    else:
        ld = (Tq + 15) // 16 * 16
        first = tl.cast(s, tl.int64) * Hc * Tk * ld
        rows = Tk
    ld = tl.multiple_of(ld, 16)
    return WS + (first + tl.cast(hc, tl.int64) * rows * ld), ld


@triton.jit
def _store_rows(base, offs, offs_d, s_t, value, n_valid, n_store):
    """Rows offs of value: rows < n_valid as computed, rows in [n_valid, n_store) as zeros (padding)."""
    value = tl.where(offs[:, None] < n_valid, value, 0.0)
    tl.store(base + offs[:, None] * s_t + offs_d[None, :], value, mask=offs[:, None] < n_store)


@triton.jit
def _store_sequence_rows(PTR, s, start, h, s_b, s_t, s_h, offs, offs_d, value, L, T, LAYOUT: tl.constexpr):
    """Rows offs of value into sequence s, head h of PTR, cast to its dtype: its L valid rows, and (padded layout)
    zeros up to T."""
    n_store = T if LAYOUT == "padded" else L
    _store_rows(_base(PTR, s, start, h, s_b, s_t, s_h), offs, offs_d, s_t, value.to(PTR.dtype.element_ty), L,
                n_store)


@triton.jit
def _query_block_program(SEQ_Q, SEQ_K, Tq, Tk, LAYOUT: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr):
    """(sequence s, its first query q_start and Lq queries, its first key k_start and Lk keys, the block's first
    query m0) of a program of a grid (query blocks, heads, sequences). Causal grids run the longest blocks (the
    last) first."""
    mb = tl.program_id(0)
    s = tl.program_id(2)
    if CAUSAL:
        mb = tl.num_programs(0) - 1 - mb
    q_start, Lq = _span(SEQ_Q, s, Tq, LAYOUT)
    k_start, Lk = _span(SEQ_K, s, Tk, LAYOUT)
    return s, q_start, Lq, k_start, Lk, mb * BLOCK_M


# ---------------------------------------------------------------------------------------------------------------
# forward


@triton.jit
def _fwd_block(acc, q, k_base, v_base, offs_m, offs_n, offs_d, sk_t, sv_t, Lq, Lk, mul, add,
               MASKED: tl.constexpr, CAUSAL: tl.constexpr, SIGMOID: tl.constexpr, ASM: tl.constexpr,
               DOT_PREC: tl.constexpr):
    """acc + sigmoid(q k^T) v over one key block [BLOCK_N] (MASKED: a boundary block)."""
    k = _load_rows(k_base, offs_n, offs_d, sk_t, Lk, MASKED)                                # [BN, D]
    v = _load_rows(v_base, offs_n, offs_d, sv_t, Lk, MASKED)                                # [BN, D]
    p = _sigmoid(dot(q, tl.trans(k), DOT_PREC) * mul + add, SIGMOID, ASM)                  # [BM, BN]
    if MASKED:
        p = tl.where(_scores_seen(offs_m, offs_n, Lq, Lk, CAUSAL), p, 0.0)
    return dot(p.to(v.dtype), v, DOT_PREC, acc)


@triton.jit
def _fwd(Q, K, V, O, SEQ_Q, SEQ_K, BIAS,
         sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, so_b, so_t, so_h, sb_s, sb_h, bias_value,
         Tq, Tk, scale,
         LAYOUT: tl.constexpr, CAUSAL: tl.constexpr, BIAS_KIND: tl.constexpr, SIGMOID: tl.constexpr,
         ASM: tl.constexpr, DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         HEAD_DIM: tl.constexpr):
    """o of one query block of one (sequence, head)."""
    h = tl.program_id(1)
    s, q_start, Lq, k_start, Lk, m0 = _query_block_program(SEQ_Q, SEQ_K, Tq, Tk, LAYOUT, CAUSAL, BLOCK_M)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_nt = tl.arange(0, BLOCK_N)
    k_base = _base(K, s, k_start, h, sk_b, sk_t, sk_h)
    v_base = _base(V, s, k_start, h, sv_b, sv_t, sv_h)
    q = _load_rows(_base(Q, s, q_start, h, sq_b, sq_t, sq_h), offs_m, offs_d, sq_t, Lq, True)  # [BM, D]
    mul, add = _coefficients(BIAS, s, h, sb_s, sb_h, bias_value, Lk, scale, BIAS_KIND, SIGMOID)
    full_end, end = _key_blocks(m0, Lq, Lk, BLOCK_M, BLOCK_N, CAUSAL)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for n0 in range(0, full_end, BLOCK_N):
        acc = _fwd_block(acc, q, k_base, v_base, offs_m, n0 + offs_nt, offs_d, sk_t, sv_t, Lq, Lk, mul, add,
                         False, CAUSAL, SIGMOID, ASM, DOT_PREC)
    for n0 in range(full_end, end, BLOCK_N):
        acc = _fwd_block(acc, q, k_base, v_base, offs_m, n0 + offs_nt, offs_d, sk_t, sv_t, Lq, Lk, mul, add,
                         True, CAUSAL, SIGMOID, ASM, DOT_PREC)
    _store_sequence_rows(O, s, q_start, h, so_b, so_t, so_h, offs_m, offs_d, acc, Lq, Tq, LAYOUT)


# ---------------------------------------------------------------------------------------------------------------
# backward


@triton.jit
def _dkdv_block(dk, dv, k, v, q_base, do_base, ds_base, ds_ld, offs_m, offs_n, offs_d, sq_t, sdo_t, Lq, Lk, mul,
                add, MASKED: tl.constexpr, CAUSAL: tl.constexpr, SIGMOID: tl.constexpr, ASM: tl.constexpr,
                DOT_PREC: tl.constexpr, STORE_DS: tl.constexpr):
    """dK, dV of one key block += the contribution of one query block [BLOCK_M], in transposed tiles [key, query]
    (sigma^T and dS^T are the A operands of their products straight from registers). STORE_DS: dS^T / scale also
    goes to the scores workspace (rows of keys, ds_ld apart), for _bwd_dq_scores."""
    q = _load_rows(q_base, offs_m, offs_d, sq_t, Lq, MASKED)                                # [BM, D]
    do = _load_rows(do_base, offs_m, offs_d, sdo_t, Lq, MASKED)                             # [BM, D]
    pt = _sigmoid(dot(k, tl.trans(q), DOT_PREC) * mul + add, SIGMOID, ASM)                 # [BN, BM]
    if MASKED:
        pt = tl.where(_scores_seen_t(offs_n, offs_m, Lq, Lk, CAUSAL), pt, 0.0)
    dpt = dot(v, tl.trans(do), DOT_PREC)                                                   # [BN, BM]
    dv = dot(pt.to(do.dtype), do, DOT_PREC, dv)
    dst = (dpt * (pt - pt * pt)).to(q.dtype)                                                # dS^T / scale
    dk = dot(dst, q, DOT_PREC, dk)
    if STORE_DS:
        ptrs = ds_base + tl.cast(offs_n, tl.int64)[:, None] * ds_ld + offs_m[None, :]
        if MASKED:
            tl.store(ptrs, dst, mask=(offs_n[:, None] < Lk) & (offs_m[None, :] < Lq))
        else:
            tl.store(ptrs, dst, mask=offs_n[:, None] < Lk)
    return dk, dv


@triton.jit
def _bwd_dkdv(Q, K, V, DO, DK, DV, SEQ_Q, SEQ_K, BIAS, WS, WS_OFF,
              sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sdo_b, sdo_t, sdo_h,
              sdk_b, sdk_t, sdk_h, sb_s, sb_h, bias_value,
              Tq, Tk, scale, h0,
              LAYOUT: tl.constexpr, CAUSAL: tl.constexpr, BIAS_KIND: tl.constexpr, SIGMOID: tl.constexpr,
              ASM: tl.constexpr, DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              HEAD_DIM: tl.constexpr, STORE_DS: tl.constexpr):
    """dk, dv of one key block of one (sequence, head h0 + program_id(1)): a loop over the query blocks that see it
    accumulates dV = sigma^T dO and dK = scale dS^T Q in registers. dk and dv share strides (sdk_*). STORE_DS: dS^T
    also goes to the scores workspace WS (_scores_base)."""
    nb = tl.program_id(0)
    hc = tl.program_id(1)
    h = h0 + hc
    s = tl.program_id(2)
    q_start, Lq = _span(SEQ_Q, s, Tq, LAYOUT)
    k_start, Lk = _span(SEQ_K, s, Tk, LAYOUT)
    if STORE_DS:
        ds_base, ds_ld = _scores_base(WS, WS_OFF, s, hc, tl.num_programs(1), Lq, Lk, Tq, Tk, LAYOUT)
    else:
        ds_base, ds_ld = WS, 0
    n0 = nb * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_mt = tl.arange(0, BLOCK_M)
    k = _load_rows(_base(K, s, k_start, h, sk_b, sk_t, sk_h), offs_n, offs_d, sk_t, Lk, True)     # [BN, D]
    v = _load_rows(_base(V, s, k_start, h, sv_b, sv_t, sv_h), offs_n, offs_d, sv_t, Lk, True)     # [BN, D]
    q_base = _base(Q, s, q_start, h, sq_b, sq_t, sq_h)
    do_base = _base(DO, s, q_start, h, sdo_b, sdo_t, sdo_h)
    mul, add = _coefficients(BIAS, s, h, sb_s, sb_h, bias_value, Lk, scale, BIAS_KIND, SIGMOID)
    start, full_start, full_end, end = _query_blocks(n0, Lq, Lk, BLOCK_M, BLOCK_N, CAUSAL)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for m0 in range(start, full_start, BLOCK_M):
        dk, dv = _dkdv_block(dk, dv, k, v, q_base, do_base, ds_base, ds_ld, m0 + offs_mt, offs_n, offs_d, sq_t,
                             sdo_t, Lq, Lk, mul, add, True, CAUSAL, SIGMOID, ASM, DOT_PREC, STORE_DS)
    for m0 in range(full_start, full_end, BLOCK_M):
        dk, dv = _dkdv_block(dk, dv, k, v, q_base, do_base, ds_base, ds_ld, m0 + offs_mt, offs_n, offs_d, sq_t,
                             sdo_t, Lq, Lk, mul, add, False, CAUSAL, SIGMOID, ASM, DOT_PREC, STORE_DS)
    for m0 in range(full_end, end, BLOCK_M):
        dk, dv = _dkdv_block(dk, dv, k, v, q_base, do_base, ds_base, ds_ld, m0 + offs_mt, offs_n, offs_d, sq_t,
                             sdo_t, Lq, Lk, mul, add, True, CAUSAL, SIGMOID, ASM, DOT_PREC, STORE_DS)
    _store_sequence_rows(DK, s, k_start, h, sdk_b, sdk_t, sdk_h, offs_n, offs_d, dk * scale, Lk, Tk, LAYOUT)
    _store_sequence_rows(DV, s, k_start, h, sdk_b, sdk_t, sdk_h, offs_n, offs_d, dv, Lk, Tk, LAYOUT)


@triton.jit
def _dq_block(dq, q, do, k_base, v_base, offs_m, offs_n, offs_d, sk_t, sv_t, Lq, Lk, mul, add,
              MASKED: tl.constexpr, CAUSAL: tl.constexpr, SIGMOID: tl.constexpr, ASM: tl.constexpr,
              DOT_PREC: tl.constexpr):
    """dQ / scale of one query block += dS k over one key block."""
    k = _load_rows(k_base, offs_n, offs_d, sk_t, Lk, MASKED)                                # [BN, D]
    v = _load_rows(v_base, offs_n, offs_d, sv_t, Lk, MASKED)                                # [BN, D]
    p = _sigmoid(dot(q, tl.trans(k), DOT_PREC) * mul + add, SIGMOID, ASM)                  # [BM, BN]
    if MASKED:
        p = tl.where(_scores_seen(offs_m, offs_n, Lq, Lk, CAUSAL), p, 0.0)
    dp = dot(do, tl.trans(v), DOT_PREC)                                                    # [BM, BN]
    ds = dp * (p - p * p)
    return dot(ds.to(k.dtype), k, DOT_PREC, dq)


@triton.jit
def _bwd_dq(Q, K, V, DO, DQ, SEQ_Q, SEQ_K, BIAS,
            sq_b, sq_t, sq_h, sk_b, sk_t, sk_h, sv_b, sv_t, sv_h, sdo_b, sdo_t, sdo_h, sdq_b, sdq_t, sdq_h,
            sb_s, sb_h, bias_value, Tq, Tk, scale,
            LAYOUT: tl.constexpr, CAUSAL: tl.constexpr, BIAS_KIND: tl.constexpr, SIGMOID: tl.constexpr,
            ASM: tl.constexpr, DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            HEAD_DIM: tl.constexpr):
    """dq of one query block of one (sequence, head): recomputes sigma and dP = dO v^T over the key blocks it sees
    and accumulates dQ = scale dS K in registers (no atomics)."""
    h = tl.program_id(1)
    s, q_start, Lq, k_start, Lk, m0 = _query_block_program(SEQ_Q, SEQ_K, Tq, Tk, LAYOUT, CAUSAL, BLOCK_M)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_nt = tl.arange(0, BLOCK_N)
    k_base = _base(K, s, k_start, h, sk_b, sk_t, sk_h)
    v_base = _base(V, s, k_start, h, sv_b, sv_t, sv_h)
    q = _load_rows(_base(Q, s, q_start, h, sq_b, sq_t, sq_h), offs_m, offs_d, sq_t, Lq, True)       # [BM, D]
    do = _load_rows(_base(DO, s, q_start, h, sdo_b, sdo_t, sdo_h), offs_m, offs_d, sdo_t, Lq, True)  # [BM, D]
    mul, add = _coefficients(BIAS, s, h, sb_s, sb_h, bias_value, Lk, scale, BIAS_KIND, SIGMOID)
    full_end, end = _key_blocks(m0, Lq, Lk, BLOCK_M, BLOCK_N, CAUSAL)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for n0 in range(0, full_end, BLOCK_N):
        dq = _dq_block(dq, q, do, k_base, v_base, offs_m, n0 + offs_nt, offs_d, sk_t, sv_t, Lq, Lk, mul, add,
                       False, CAUSAL, SIGMOID, ASM, DOT_PREC)
    for n0 in range(full_end, end, BLOCK_N):
        dq = _dq_block(dq, q, do, k_base, v_base, offs_m, n0 + offs_nt, offs_d, sk_t, sv_t, Lq, Lk, mul, add,
                       True, CAUSAL, SIGMOID, ASM, DOT_PREC)
    _store_sequence_rows(DQ, s, q_start, h, sdq_b, sdq_t, sdq_h, offs_m, offs_d, dq * scale, Lq, Tq, LAYOUT)


@triton.jit
def _dq_scores_block(dq, k_base, ds_base, ds_ld, offs_m, offs_n, offs_d, sk_t, Lq, Lk,
                     MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr):
    """dQ / scale of one query block += dS k over one key block, dS^T read from the scores workspace."""
    k = _load_rows(k_base, offs_n, offs_d, sk_t, Lk, MASKED)                                # [BN, D]
    ptrs = ds_base + tl.cast(offs_n, tl.int64)[:, None] * ds_ld + offs_m[None, :]
    if MASKED:
        dst = tl.load(ptrs, mask=_scores_seen_t(offs_n, offs_m, Lq, Lk, CAUSAL), other=0.0)   # [BN, BM]
    else:
        dst = tl.load(ptrs)
    return dot(tl.trans(dst), k, DOT_PREC, dq)


@triton.jit
def _bwd_dq_scores(K, DQ, SEQ_Q, SEQ_K, WS, WS_OFF, sk_b, sk_t, sk_h, sdq_b, sdq_t, sdq_h, Tq, Tk, scale, h0,
                   LAYOUT: tl.constexpr, CAUSAL: tl.constexpr, DOT_PREC: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    """dq of one query block of one (sequence, head h0 + program_id(1)) from the dS^T that _bwd_dkdv stored:
    dQ = scale dS K accumulated in registers over the key blocks it sees, in order. Only written scores are read:
    blocks with unseen or invalid elements (the causal diagonal, a partial key block, a partial query block) load
    under the mask of seen scores."""
    hc = tl.program_id(1)
    h = h0 + hc
    s, q_start, Lq, k_start, Lk, m0 = _query_block_program(SEQ_Q, SEQ_K, Tq, Tk, LAYOUT, CAUSAL, BLOCK_M)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_nt = tl.arange(0, BLOCK_N)
    k_base = _base(K, s, k_start, h, sk_b, sk_t, sk_h)
    ds_base, ds_ld = _scores_base(WS, WS_OFF, s, hc, tl.num_programs(1), Lq, Lk, Tq, Tk, LAYOUT)
    full_end, end = _key_blocks(m0, Lq, Lk, BLOCK_M, BLOCK_N, CAUSAL)
    full_end = tl.where(m0 + BLOCK_M <= Lq, full_end, 0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for n0 in range(0, full_end, BLOCK_N):
        dq = _dq_scores_block(dq, k_base, ds_base, ds_ld, offs_m, n0 + offs_nt, offs_d, sk_t, Lq, Lk, False, CAUSAL,
                              DOT_PREC)
    for n0 in range(full_end, end, BLOCK_N):
        dq = _dq_scores_block(dq, k_base, ds_base, ds_ld, offs_m, n0 + offs_nt, offs_d, sk_t, Lq, Lk, True, CAUSAL,
                              DOT_PREC)
    _store_sequence_rows(DQ, s, q_start, h, sdq_b, sdq_t, sdq_h, offs_m, offs_d, dq * scale, Lq, Tq, LAYOUT)
