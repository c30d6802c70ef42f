"""Sigmoid-attention backward (dK/dV and dQ) written in Gluon for Hopper (sm_90): a lab probe for issues 41 and 42,
not shipped code; the backward half of tools/lab/gluon_sigmoid_fwd.py.

Targets Triton 3.6.0 (`triton.experimental.gluon`) and torch 2.11. The backward is three quarters of a sigmoid-
attention step (H100, B = 1, T = 16384, D = 128, tanh: forward 4.18, forward+backward 15.33 ms) and its dK/dV kernel
the largest part. Per (key block, head, sequence), over the query tiles of the sequence (as `_bwd_dkdv`):

    S^T = K Q^T   P^T = sigmoid(S^T)   dV += P^T dO   dP^T = V dO^T   dS^T = dP^T P^T (1 - P^T) scale   dK += dS^T Q

q, k, v, do, dk, dv bf16 packed [total, H, D] with cu_seqlens [S + 1], the default bias b = -log(L). K and V of the
block stay in shared memory; Q and dO tiles arrive by TMA through the 2-D view [total, H * D] into an NS-deep ring.
All four products are wgmma; P^T and dS^T enter the second operand-A slot from registers.

- `sig_dkdv_pipelined`: one warpgroup (BN keys), the ring refilled in-line.
- `sig_dkdv_ws2`: two consumer warpgroups (BN keys each, one program 2 BN keys) sharing one Q/dO ring that a
  one-warp producer fills.
- `sig_dq_pipelined`, `sig_dq_ws2`: dQ the same way per query block (BM queries, Q and dO kept, K and V ringed):
  S = Q K^T and dP = dO V^T issued together, dQ += dS K (dS from registers); the recomputing path of `_bwd_dq`.

    python tools/lab/gluon_sigmoid_bwd.py      # compile for sm_90 (no GPU needed): regs, spills, smem; with a CUDA
                                               # GPU also: the gradients against float64 (head 0) and against the
                                               # Triton backward, and ms beside Triton's _bwd_dkdv and _bwd_dq
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
from gluon_common import alloc_rings, compile_sm90, load_ring_pair, mma_layout, shared_layout
from gluon_sigmoid_fwd import HEAD_D, NUM_WARPS, coefficients, ring_producer, sequence, sigmoid, store_rows
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


@gluon.jit
def _load_pair(a_desc, b_desc, row, col, a_smem, b_smem, bar):
    """TMA tiles [row, col] of two tensors that a warpgroup keeps for its whole loop, and wait for them."""
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(a_desc, [row, col], bar, a_smem)
    tma.async_copy_global_to_shared(b_desc, [row, col], bar, b_smem)
    mbarrier.wait(bar, 0)


@gluon.jit
def _query_tile(dk, dv, k_smem, v_smem, q_slot, do_slot, m0, length, mul, add, scale,
                BN: gl.constexpr, BM: gl.constexpr, st_layout: gl.constexpr, acc_layout: gl.constexpr,
                TANH: gl.constexpr, MASKED: gl.constexpr):
    """dk, dv [BN, D] + the contributions of one query tile [m0, m0 + BM) (MASKED: queries >= length give none)."""
    op_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    st = warpgroup_mma(k_smem, q_slot.permute((1, 0)), gl.zeros([BN, BM], gl.float32, st_layout), use_acc=False,
                       is_async=True)
    dpt = warpgroup_mma(v_smem, do_slot.permute((1, 0)), gl.zeros([BN, BM], gl.float32, st_layout), use_acc=False,
                        is_async=True)
    st, dpt = warpgroup_mma_wait(0, deps=(st, dpt))
    pt = sigmoid(st * mul + add, TANH)                                                       # [BN, BM]
    if MASKED:
        rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, st_layout))
        pt = gl.where(rows[None, :] < length, pt, 0.0)
    dst = dpt * pt * (1.0 - pt) * scale
    dv = warpgroup_mma(gl.convert_layout(pt.to(gl.bfloat16), op_a), do_slot, dv, is_async=True)
    dk = warpgroup_mma(gl.convert_layout(dst.to(gl.bfloat16), op_a), q_slot, dk, is_async=True)
    return warpgroup_mma_wait(0, deps=(dk, dv))


@gluon.jit
def _key_block(k_smem, v_smem, q_ring, do_ring, ready, empty, q_desc, do_desc, dk_ptr, dv_ptr, start, length, h, n0,
               H, scale, BN: gl.constexpr, BM: gl.constexpr, D: gl.constexpr, NS: gl.constexpr, TANH: gl.constexpr,
               SIGNAL_EMPTY: gl.constexpr):
    """One consumer warpgroup's loop over the query tiles, then its dK, dV rows. SIGNAL_EMPTY: arrive on
    empty[slot] for a producer partition; else refill the slot itself."""
    st_layout: gl.constexpr = mma_layout(BM, 4)
    acc_layout: gl.constexpr = mma_layout(D, 4)
    mul, add = coefficients(length, scale, TANH)
    dk = gl.zeros([BN, D], gl.float32, acc_layout)
    dv = gl.zeros([BN, D], gl.float32, acc_layout)
    n_tiles = gl.cdiv(length, BM)
    n_full = length // BM
    for t in range(n_tiles):
        slot = t % NS
        mbarrier.wait(ready.index(slot), (t // NS) & 1)
        if t < n_full:
            dk, dv = _query_tile(dk, dv, k_smem, v_smem, q_ring.index(slot), do_ring.index(slot), t * BM, length,
                                 mul, add, scale, BN, BM, st_layout, acc_layout, TANH, False)
        else:
            dk, dv = _query_tile(dk, dv, k_smem, v_smem, q_ring.index(slot), do_ring.index(slot), t * BM, length,
                                 mul, add, scale, BN, BM, st_layout, acc_layout, TANH, True)
        if SIGNAL_EMPTY:
            mbarrier.arrive(empty.index(slot))
        else:
            refill = t + NS
            load_ring_pair(q_desc, do_desc, start + refill * BM, h * D, ready.index(slot), q_ring.index(slot),
                      do_ring.index(slot), refill < n_tiles)
    store_rows(dk_ptr, dk, start, length, n0, h, H, BN, D, acc_layout)
    store_rows(dv_ptr, dv, start, length, n0, h, H, BN, D, acc_layout)


@gluon.jit
def _tile_pair(k_desc):
    """Two tiles a warpgroup keeps for its whole loop (K and V, or Q and dO), and their barrier."""
    k_smem = gl.allocate_shared_memory(k_desc.dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(k_desc.dtype, k_desc.block_type.shape, k_desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    return k_smem, v_smem, bar


@gluon.jit
def sig_dkdv_pipelined(q_desc, k_desc, v_desc, do_desc, dk_ptr, dv_ptr, cu_ptr, H, scale, NS: gl.constexpr,
                       TANH: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    q_ring, do_ring, ready, empty = alloc_rings(q_desc, NS, 1)
    k_smem, v_smem, kv_bar = _tile_pair(k_desc)
    start, length, h, n0 = sequence(cu_ptr, BN)
    if n0 < length:
        n_tiles = gl.cdiv(length, BM)
        for s in gl.static_range(NS):
            load_ring_pair(q_desc, do_desc, start + s * BM, h * D, ready.index(s), q_ring.index(s), do_ring.index(s),
                      s < n_tiles)
        _load_pair(k_desc, v_desc, start + n0, h * D, k_smem, v_smem, kv_bar)
        _key_block(k_smem, v_smem, q_ring, do_ring, ready, empty, q_desc, do_desc, dk_ptr, dv_ptr, start, length, h,
                   n0, H, scale, BN, BM, D, NS, TANH, False)


@gluon.jit
def _consumer_wg(k_smem, v_smem, kv_bar, q_ring, do_ring, ready, empty, q_desc, k_desc, v_desc, do_desc, dk_ptr,
                 dv_ptr, cu_ptr, H, scale, BN: gl.constexpr, BM: gl.constexpr, D: gl.constexpr, NS: gl.constexpr,
                 TANH: gl.constexpr, WG: gl.constexpr):
    """Consumer warpgroup WG of 2: keys n0 .. n0 + BN of the program's 2 BN, its own K, V and accumulators, the
    shared Q/dO ring; both walk every query tile while the program's first key is in the sequence."""
    start, length, h, n0 = sequence(cu_ptr, BN, 2, WG)
    if n0 - WG * BN < length:
        _load_pair(k_desc, v_desc, start + n0, h * D, k_smem, v_smem, kv_bar)
        _key_block(k_smem, v_smem, q_ring, do_ring, ready, empty, q_desc, do_desc, dk_ptr, dv_ptr, start, length, h,
                   n0, H, scale, BN, BM, D, NS, TANH, True)


@gluon.jit
def sig_dkdv_ws2(q_desc, k_desc, v_desc, do_desc, dk_ptr, dv_ptr, cu_ptr, H, scale, NS: gl.constexpr,
                 TANH: gl.constexpr, PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                 num_warps: gl.constexpr):
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    q_ring, do_ring, ready, empty = alloc_rings(q_desc, NS, 2)
    k0, v0, bar0 = _tile_pair(k_desc)
    k1, v1, bar1 = _tile_pair(k_desc)
    gl.warp_specialize([
        (_consumer_wg, (k0, v0, bar0, q_ring, do_ring, ready, empty, q_desc, k_desc, v_desc, do_desc, dk_ptr, dv_ptr,
                        cu_ptr, H, scale, BN, BM, D, NS, TANH, 0)),
        (_consumer_wg, (k1, v1, bar1, q_ring, do_ring, ready, empty, q_desc, k_desc, v_desc, do_desc, dk_ptr, dv_ptr,
                        cu_ptr, H, scale, BN, BM, D, NS, TANH, 1)),
        (ring_producer, (q_desc, do_desc, q_ring, do_ring, ready, empty, cu_ptr, BN, BM, D, NS)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# ---- dQ: per query block, over the key tiles (K and V through the ring) ---------------------------------------


@gluon.jit
def _key_tile(dq, q_smem, do_smem, k_slot, v_slot, n0, length, mul, add, scale, BM: gl.constexpr, BN: gl.constexpr,
              s_layout: gl.constexpr, acc_layout: gl.constexpr, TANH: gl.constexpr, MASKED: gl.constexpr):
    """dq [BM, D] + dS K over one key tile [n0, n0 + BN) (MASKED: keys >= length give nothing)."""
    s = warpgroup_mma(q_smem, k_slot.permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout), use_acc=False,
                      is_async=True)
    dp = warpgroup_mma(do_smem, v_slot.permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout), use_acc=False,
                       is_async=True)
    s, dp = warpgroup_mma_wait(0, deps=(s, dp))
    p = sigmoid(s * mul + add, TANH)
    ds = dp * p * (1.0 - p) * scale
    if MASKED:
        cols = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, s_layout))
        ds = gl.where(cols[None, :] < length, ds, 0.0)
    op_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    dq = warpgroup_mma(gl.convert_layout(ds.to(gl.bfloat16), op_a), k_slot, dq, is_async=True)
    return warpgroup_mma_wait(0, deps=(dq, ))


@gluon.jit
def _query_block(q_smem, do_smem, k_ring, v_ring, ready, empty, k_desc, v_desc, dq_ptr, start, length, h, m0, H,
                 scale, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, NS: gl.constexpr, TANH: gl.constexpr,
                 SIGNAL_EMPTY: gl.constexpr):
    """One consumer warpgroup's loop over the key tiles, then its dQ rows."""
    s_layout: gl.constexpr = mma_layout(BN, 4)
    acc_layout: gl.constexpr = mma_layout(D, 4)
    mul, add = coefficients(length, scale, TANH)
    dq = gl.zeros([BM, D], gl.float32, acc_layout)
    n_tiles = gl.cdiv(length, BN)
    n_full = length // BN
    for t in range(n_tiles):
        slot = t % NS
        mbarrier.wait(ready.index(slot), (t // NS) & 1)
        if t < n_full:
            dq = _key_tile(dq, q_smem, do_smem, k_ring.index(slot), v_ring.index(slot), t * BN, length, mul, add,
                           scale, BM, BN, s_layout, acc_layout, TANH, False)
        else:
            dq = _key_tile(dq, q_smem, do_smem, k_ring.index(slot), v_ring.index(slot), t * BN, length, mul, add,
                           scale, BM, BN, s_layout, acc_layout, TANH, True)
        if SIGNAL_EMPTY:
            mbarrier.arrive(empty.index(slot))
        else:
            refill = t + NS
            load_ring_pair(k_desc, v_desc, start + refill * BN, h * D, ready.index(slot), k_ring.index(slot),
                     v_ring.index(slot), refill < n_tiles)
    store_rows(dq_ptr, dq, start, length, m0, h, H, BM, D, acc_layout)


@gluon.jit
def sig_dq_pipelined(q_desc, k_desc, v_desc, do_desc, dq_ptr, cu_ptr, H, scale, NS: gl.constexpr,
                     TANH: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    k_ring, v_ring, ready, empty = alloc_rings(k_desc, NS, 1)
    q_smem, do_smem, qdo_bar = _tile_pair(q_desc)
    start, length, h, m0 = sequence(cu_ptr, BM)
    if m0 < length:
        n_tiles = gl.cdiv(length, BN)
        for s in gl.static_range(NS):
            load_ring_pair(k_desc, v_desc, start + s * BN, h * D, ready.index(s), k_ring.index(s), v_ring.index(s),
                     s < n_tiles)
        _load_pair(q_desc, do_desc, start + m0, h * D, q_smem, do_smem, qdo_bar)
        _query_block(q_smem, do_smem, k_ring, v_ring, ready, empty, k_desc, v_desc, dq_ptr, start, length, h, m0, H,
                     scale, BM, BN, D, NS, TANH, False)


@gluon.jit
def _dq_consumer_wg(q_smem, do_smem, qdo_bar, k_ring, v_ring, ready, empty, q_desc, k_desc, v_desc, do_desc, dq_ptr,
                    cu_ptr, H, scale, BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, NS: gl.constexpr,
                    TANH: gl.constexpr, WG: gl.constexpr):
    start, length, h, m0 = sequence(cu_ptr, BM, 2, WG)
    if m0 - WG * BM < length:
        _load_pair(q_desc, do_desc, start + m0, h * D, q_smem, do_smem, qdo_bar)
        _query_block(q_smem, do_smem, k_ring, v_ring, ready, empty, k_desc, v_desc, dq_ptr, start, length, h, m0, H,
                     scale, BM, BN, D, NS, TANH, True)


@gluon.jit
def sig_dq_ws2(q_desc, k_desc, v_desc, do_desc, dq_ptr, cu_ptr, H, scale, NS: gl.constexpr, TANH: gl.constexpr,
               PRODUCER_REGS: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr):
    BM: gl.constexpr = q_desc.block_type.shape[0]
    D: gl.constexpr = q_desc.block_type.shape[1]
    BN: gl.constexpr = k_desc.block_type.shape[0]
    k_ring, v_ring, ready, empty = alloc_rings(k_desc, NS, 2)
    q0, do0, bar0 = _tile_pair(q_desc)
    q1, do1, bar1 = _tile_pair(q_desc)
    gl.warp_specialize([
        (_dq_consumer_wg, (q0, do0, bar0, k_ring, v_ring, ready, empty, q_desc, k_desc, v_desc, do_desc, dq_ptr,
                           cu_ptr, H, scale, BM, BN, D, NS, TANH, 0)),
        (_dq_consumer_wg, (q1, do1, bar1, k_ring, v_ring, ready, empty, q_desc, k_desc, v_desc, do_desc, dq_ptr,
                           cu_ptr, H, scale, BM, BN, D, NS, TANH, 1)),
        (ring_producer, (k_desc, v_desc, k_ring, v_ring, ready, empty, cu_ptr, BM, BN, D, NS)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# ---- host side -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One kernel at one tiling: BN keys and BM queries per tile (the dK/dV kernels own BN keys per consumer
    warpgroup and ring BM-query tiles; the dQ kernels own BM queries and ring BN-key tiles), NS stages."""
    kernel: object
    bn: int
    bm: int
    ns: int
    tanh: bool = True
    extra: tuple = ()
    n_wg: int = 1

    @property
    def computes_dq(self) -> bool:
        return "dq_ptr" in self.kernel.arg_names

    @property
    def name(self) -> str:
        return f"{self.kernel.fn.__name__} {self.bn}x{self.bm} s{self.ns} {'tanh' if self.tanh else 'rcp'}"


WS2 = (("PRODUCER_REGS", 24), ("CONSUMER_REGS", 240))
VARIANTS = [
    Variant(sig_dkdv_pipelined, 64, 64, 2),
    Variant(sig_dkdv_pipelined, 64, 32, 3),
    Variant(sig_dkdv_ws2, 64, 64, 2, True, WS2, 2),
    Variant(sig_dkdv_ws2, 64, 32, 3, True, WS2, 2),
    Variant(sig_dq_pipelined, 64, 64, 2),
    Variant(sig_dq_pipelined, 32, 64, 3),
    Variant(sig_dq_ws2, 64, 64, 2, True, WS2, 2),
    Variant(sig_dq_ws2, 32, 64, 3, True, WS2, 2),
]


def _signature(v: Variant) -> tuple[dict, dict]:
    qd = f"tensordesc<bf16[{v.bm}, {HEAD_D}],{shared_layout([v.bm, HEAD_D])!r}>"
    kd = f"tensordesc<bf16[{v.bn}, {HEAD_D}],{shared_layout([v.bn, HEAD_D])!r}>"
    types = {"q_desc": qd, "do_desc": qd, "k_desc": kd, "v_desc": kd, "dk_ptr": "*bf16", "dv_ptr": "*bf16",
             "dq_ptr": "*bf16", "cu_ptr": "*i32", "H": "i32", "scale": "fp32"}
    constexprs = {"NS": v.ns, "TANH": v.tanh, "num_warps": NUM_WARPS, **dict(v.extra)}
    return {name: types.get(name, "constexpr") for name in v.kernel.arg_names}, constexprs


def compile_offline(v: Variant) -> dict:
    compiled, ptx, regs, spills = compile_sm90(v.kernel, *_signature(v), NUM_WARPS)
    return {"kernel": v.name, "regs": regs, "spill_bytes": spills, "smem": compiled.metadata.shared,
            "wgmma": ptx.count("wgmma.mma_async"), "setmaxnreg": ptx.count("setmaxnreg")}


def gluon_launcher(v: Variant, q, k, v_, do, cu, max_len: int):
    """-> a function launching the variant into its outputs ((dq,) or (dk, dv)), returned; descriptors built once,
    here, so a call is one launch."""
    total, H, D = q.shape
    q_desc, do_desc = (TensorDescriptor.from_tensor(x.view(total, H * D), [v.bm, D], shared_layout([v.bm, D]))
                       for x in (q, do))
    k_desc, v_desc = (TensorDescriptor.from_tensor(x.view(total, H * D), [v.bn, D], shared_layout([v.bn, D]))
                      for x in (k, v_))
    outputs = (torch.zeros_like(q),) if v.computes_dq else (torch.zeros_like(k), torch.zeros_like(v_))
    own = v.bm if v.computes_dq else v.bn
    grid = (triton.cdiv(max_len, v.n_wg * own), H, cu.numel() - 1)

    def launch():
        v.kernel[grid](q_desc, k_desc, v_desc, do_desc, *outputs, cu, H, 1.0 / math.sqrt(D), NS=v.ns, TANH=v.tanh,
                       num_warps=NUM_WARPS, **dict(v.extra))
        return outputs
    return launch


def run_gpu(shape_name: str) -> None:
    """The variants beside mini_of3's Triton backward (recomputing dq, tanh): their gradients against float64 on
    head 0 and against Triton's on all heads; ms of each Gluon kernel beside the device ms of Triton's kernel for
    the same gradients (_bwd_dkdv, _bwd_dq; torch.profiler)."""
    from mini_of3.bench.common import device_ms_by_kernel, median_ms
    from mini_of3.bench.sigmoid import float64_reference, make_packed, parse_shape
    from mini_of3.kernels import sigmoid_attention
    from mini_of3.kernels.sigmoid_attention_host import sigmoid_tiles

    shape = parse_shape(shape_name, 16, (500, 16000))
    inputs = make_packed(shape, torch.device("cuda"), 0)
    q, k, v, do, cu = (inputs[n] for n in ("q", "k", "v", "do", "cu"))
    T = shape.T
    _, ref_dq, ref_dk, ref_dv = float64_reference(inputs, shape, 1)                    # head 0, float64
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]

    def triton_backward(r=0):
        with sigmoid_tiles(sigmoid="tanh", scores_budget=0):
            o = sigmoid_attention(*leaves, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=T, max_seqlen_k=T)
            return torch.autograd.grad(o, leaves, do)
    tq, tk, tv = triton_backward()
    by_kernel, _ = device_ms_by_kernel(triton_backward, iters=5)
    triton_ms = {kind: sum(ms for name, (ms, _) in by_kernel.items() if name.startswith(kernel))
                 for kind, kernel in (("dkdv", "_bwd_dkdv"), ("dq", "_bwd_dq"))}
    print(f"{shape_name}: Triton (tanh, recomputing; profiler) _bwd_dkdv {triton_ms['dkdv']:.3f} ms, _bwd_dq "
          f"{triton_ms['dq']:.3f} ms", flush=True)
    for variant in VARIANTS:
        try:
            fn = gluon_launcher(variant, q, k, v, do, cu, T)
            outputs = fn()
            torch.cuda.synchronize()
            checks = ((("dq", outputs[0], ref_dq, tq),) if variant.computes_dq else
                      (("dk", outputs[0], ref_dk, tk), ("dv", outputs[1], ref_dv, tv)))
            errors = "  ".join(f"{n} {((g[:, 0].double() - r[:, 0]).norm() / r[:, 0].norm()).item():.2e} vs float64, "
                               f"{((g.float() - t.float()).norm() / t.float().norm()).item():.1e} vs Triton"
                               for n, g, r, t in checks)
            ms = median_ms(lambda r: fn(), warmup=3, reps=10)
            base = triton_ms["dq" if variant.computes_dq else "dkdv"]
            print(f"  {variant.name:34s} {ms:8.3f} ms ({ms / base:.2f}x Triton's)  {errors}", flush=True)
        except Exception as e:  # a probe: report and go on to the next kernel
            print(f"  {variant.name:34s} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)


def main() -> None:
    print(f"triton {triton.__version__}, torch {torch.__version__}; offline compile for sm_90, D={HEAD_D}")
    for variant in VARIANTS:
        try:
            r = compile_offline(variant)
            print(f"{r['kernel']:34s} regs {r['regs']}  spill stores {r['spill_bytes']} B  smem {r['smem']} B  "
                  f"wgmma {r['wgmma']}  setmaxnreg {r['setmaxnreg']}", flush=True)
        except Exception as e:  # a probe: report and go on to the next kernel
            print(f"{variant.name:34s} compile FAILED: {type(e).__name__}: {str(e)[:2000]}", flush=True)
    if torch.cuda.is_available():
        for shape_name in ("b1t16384d128", "varlen16d128"):
            run_gpu(shape_name)


if __name__ == "__main__":
    main()
