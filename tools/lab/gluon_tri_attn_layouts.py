"""Can Gluon's TMA read the triangle attention's q, k, v where the model holds them? A lab probe for issue 42.

The model passes q, k, v as [B, I, J, H, D] views of one projection's output: contiguous over (H, D) but with any
strides over (B, I, J); the ending node passes the starting node's layout with I and J swapped (a transposed view,
no copy). The other probes read [B*I*H, J, D] copies. Here a 4-D TMA descriptor per tensor has the view's own
strides, [B, I, J, H*D] with a [1, 1, rows, D] box at column h*D, so no layout is copied and keys past J come back
as zeros (TMA's bound is the J dimension itself, not the next row). The kernel is the forward probe's
`attn_fwd_rows2` (two consumer warpgroups on rows i and i + 1 of one (b, h), one bf16 bias tile for both, a
producer warp, the overlap of S of the next tile with this tile's softmax); shared-memory tiles are allocated
[1, 1, rows, D] and reshaped to [rows, D] for wgmma.

    python tools/lab/gluon_tri_attn_layouts.py   # compile for sm_90 (no GPU needed); with a CUDA GPU also the
                                                 # starting and ending layouts against float64, timed beside our
                                                 # Triton forward on the same views (CUDA graphs)
"""
from __future__ import annotations

import math

import torch
import triton
from gluon_common import compile_sm90, shared_layout
from gluon_tri_attn_fwd import _pv, _softmax_tile, _time_ms
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from mini_of3.kernels.sigmoid_attention_hopper import mma_layout, ring_barriers

HEAD_D = 32
NUM_WARPS = 4


@gluon.jit
def _coords(I, H):
    """-> (b, first row i of the pair, h): program_id(1) = (b * I / 2 + i / 2) * H + h."""
    pair = gl.program_id(1)
    h = pair % H
    bi = pair // H
    return bi // (I // 2), bi % (I // 2) * 2, h


@gluon.jit
def _producer(k_desc, v_desc, b_desc, k_ring, v_ring, b_ring, ready, empty, J, I, H, BM: gl.constexpr,
              NS: gl.constexpr):
    """One warp: per key tile, K and V of rows i and i + 1 and the [BM, BN] bias tile of (b, h)."""
    BN: gl.constexpr = k_desc.block_type.shape[2]
    D: gl.constexpr = k_desc.block_type.shape[3]
    b, i0, h = _coords(I, H)
    m0 = gl.program_id(0) * BM
    nbytes: gl.constexpr = 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes + b_desc.block_type.nbytes
    for t in range(gl.cdiv(J, BN)):
        slot = t % NS
        mbarrier.wait(empty.index(slot), ((t // NS) & 1) ^ 1)
        mbarrier.expect(ready.index(slot), nbytes)
        for r in gl.static_range(2):
            tma.async_copy_global_to_shared(k_desc, [b, i0 + r, t * BN, h * D], ready.index(slot),
                                            k_ring.index(slot * 2 + r))
            tma.async_copy_global_to_shared(v_desc, [b, i0 + r, t * BN, h * D], ready.index(slot),
                                            v_ring.index(slot * 2 + r))
        tma.async_copy_global_to_shared(b_desc, [(b * H + h) * J + m0, t * BN], ready.index(slot), b_ring.index(slot))


@gluon.jit
def _consumer(q_smem, q_bar, k_ring, v_ring, b_ring, ready, empty, q_desc, o_ptr, J, I, H, qk_scale,
              BN: gl.constexpr, NS: gl.constexpr, WG: gl.constexpr):
    """Consumer warpgroup WG: the BM queries at m0 of row i0 + WG; o to a contiguous [B, I, J, H, D]."""
    BM: gl.constexpr = q_desc.block_type.shape[2]
    D: gl.constexpr = q_desc.block_type.shape[3]
    s_layout: gl.constexpr = mma_layout(BN, 4)
    o_layout: gl.constexpr = mma_layout(D, 4)
    b, i0, h = _coords(I, H)
    i = i0 + WG
    m0 = gl.program_id(0) * BM
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b, i, m0, h * D], q_bar, q_smem)
    mbarrier.wait(q_bar, 0)
    q2 = q_smem.reshape([BM, D])
    m_i = gl.full([BM], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BM], gl.float32, gl.SliceLayout(1, s_layout))
    acc = gl.zeros([BM, D], gl.float32, o_layout)
    n_tiles = gl.cdiv(J, BN)
    mbarrier.wait(ready.index(0), 0)
    s = warpgroup_mma(q2, k_ring.index(WG).reshape([BN, D]).permute((1, 0)), gl.zeros([BM, BN], gl.float32, s_layout),
                      use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    for t in range(n_tiles - 1):
        slot = t % NS
        nxt = (t + 1) % NS
        mbarrier.wait(ready.index(nxt), ((t + 1) // NS) & 1)
        s_next = warpgroup_mma(q2, k_ring.index(nxt * 2 + WG).reshape([BN, D]).permute((1, 0)),
                               gl.zeros([BM, BN], gl.float32, s_layout), use_acc=False, is_async=True)
        p, m_i, l_i, acc = _softmax_tile(s, b_ring.index(slot), t * BN, J, qk_scale, m_i, l_i, acc, BM, BN, 0,
                                         s_layout, o_layout, False)
        p_op = gl.convert_layout(p, gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
        acc = warpgroup_mma(p_op, v_ring.index(slot * 2 + WG).reshape([BN, D]), acc, is_async=True)
        s, acc = warpgroup_mma_wait(0, deps=(s_next, acc))
        mbarrier.arrive(empty.index(slot))
    last = n_tiles - 1
    p, m_i, l_i, acc = _softmax_tile(s, b_ring.index(last % NS), last * BN, J, qk_scale, m_i, l_i, acc, BM, BN, 0,
                                     s_layout, o_layout, True)
    acc = _pv(p, v_ring.index((last % NS) * 2 + WG).reshape([BN, D]), acc, o_layout)
    mbarrier.arrive(empty.index(last % NS))
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, o_layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_layout))
    ptrs = o_ptr + (((b * I + i) * J + rows[:, None]).to(gl.int64) * H + h) * D + cols[None, :]
    gl.store(ptrs, (acc / l_o[:, None]).to(gl.bfloat16), mask=rows[:, None] < J)


@gluon.jit
def attn_fwd_model(q_desc, k_desc, v_desc, b_desc, o_ptr, J, I, H, qk_scale, NS: gl.constexpr,
                   num_warps: gl.constexpr):
    """o = softmax(q k^T / sqrt(D) + bias) v on the model's [B, I, J, H, D] views (see the module docstring)."""
    BM: gl.constexpr = q_desc.block_type.shape[2]
    BN: gl.constexpr = k_desc.block_type.shape[2]
    q0 = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    q1 = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ring = gl.allocate_shared_memory(k_desc.dtype, [2 * NS] + k_desc.block_type.shape, k_desc.layout)
    v_ring = gl.allocate_shared_memory(v_desc.dtype, [2 * NS] + v_desc.block_type.shape, v_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [NS] + b_desc.block_type.shape, b_desc.layout)
    ready, empty = ring_barriers(NS, 2)
    for w in gl.static_range(2):
        mbarrier.init(q_bars.index(w), count=1)
    gl.warp_specialize([
        (_consumer, (q0, q_bars.index(0), k_ring, v_ring, b_ring, ready, empty, q_desc, o_ptr, J, I, H, qk_scale,
                     BN, NS, 0)),
        (_consumer, (q1, q_bars.index(1), k_ring, v_ring, b_ring, ready, empty, q_desc, o_ptr, J, I, H, qk_scale,
                     BN, NS, 1)),
        (_producer, (k_desc, v_desc, b_desc, k_ring, v_ring, b_ring, ready, empty, J, I, H, BM, NS)),
    ], [4, 1], [240, 24])


# ---- host side -------------------------------------------------------------------------------------------------

TILINGS = [(64, 64, 3), (64, 128, 2)]          # (BM, BN, NS)


def _block(rows: int) -> list[int]:
    return [1, 1, rows, HEAD_D]


def compile_offline(bm: int, bn: int, ns: int) -> dict:
    tile = lambda rows: f"tensordesc<bf16{_block(rows)},{shared_layout(_block(rows))!r}>"   # noqa: E731
    types = {"q_desc": tile(bm), "k_desc": tile(bn), "v_desc": tile(bn),
             "b_desc": f"tensordesc<bf16[{bm}, {bn}],{shared_layout([bm, bn])!r}>", "o_ptr": "*bf16", "J": "i32",
             "I": "i32", "H": "i32", "qk_scale": "fp32"}
    signature = {name: types.get(name, "constexpr") for name in attn_fwd_model.arg_names}
    compiled, ptx, regs, spills = compile_sm90(attn_fwd_model, signature, {"NS": ns, "num_warps": NUM_WARPS},
                                               NUM_WARPS)
    return {"kernel": f"attn_fwd_model {bm}x{bn} s{ns}", "regs": regs, "spill_bytes": spills,
            "smem": compiled.metadata.shared, "tma": ptx.count("cp.async.bulk.tensor")}


def _descriptor(x: torch.Tensor, rows: int) -> TensorDescriptor:
    """4-D TMA descriptor of a [B, I, J, H, D] view with (H, D) contiguous: [B, I, J, H*D], its own strides."""
    B, I, J, H, D = x.shape
    assert x.stride(4) == 1 and x.stride(3) == D, "(H, D) must be contiguous"
    return TensorDescriptor(x, [B, I, J, H * D], [x.stride(0), x.stride(1), x.stride(2), 1], _block(rows),
                            shared_layout(_block(rows)))


def launcher(q, k, v, bias, bm: int, bn: int, ns: int):
    B, I, J, H, D = q.shape
    o = torch.empty(B, I, J, H, D, device=q.device, dtype=q.dtype)
    args = (_descriptor(q, bm), _descriptor(k, bn), _descriptor(v, bn),
            TensorDescriptor.from_tensor(bias.reshape(-1, J), [bm, bn], shared_layout([bm, bn])), o, J, I, H,
            1.4426950408889634 / math.sqrt(D))
    grid = (triton.cdiv(J, bm), B * (I // 2) * H)

    def launch():
        attn_fwd_model[grid](*args, NS=ns, num_warps=NUM_WARPS)
        return o
    return launch


def run_gpu(B: int = 1, N: int = 768, H: int = 4) -> None:
    from mini_of3.kernels import triangle_attention
    torch.manual_seed(0)
    proj = torch.randn(B, N, N, 4, H, HEAD_D, device="cuda").to(torch.bfloat16)      # the gated projection's output
    bias = torch.randn(B, H, N, N, device="cuda").to(torch.bfloat16)
    for node, view in (("starting", proj), ("ending", proj.transpose(1, 2))):
        q, k, v = (view[:, :, :, n] for n in range(3))                                 # [B, I, J, H, D] views
        s = torch.einsum("bijhd,bikhd->bhijk", q.double(), k.double()) / math.sqrt(HEAD_D)
        ref = torch.einsum("bhijk,bikhd->bijhd", (s + bias.double()[:, :, None]).softmax(-1), v.double())
        with torch.no_grad():
            ours = lambda: triangle_attention(q, k, v, bias.float(), backend="triton")   # noqa: E731
            print(f"{node}: mini_of3 triton {_time_ms(ours):.3f} ms, err {_err(ours(), ref):.2e}")
        for bm, bn, ns in TILINGS:
            fn = launcher(q, k, v, bias, bm, bn, ns)
            print(f"{node}: attn_fwd_model {bm}x{bn} s{ns} {_time_ms(fn):.3f} ms, err {_err(fn(), ref):.2e}",
                  flush=True)


def _err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.double() - ref).norm() / ref.norm()).item()


def main() -> None:
    print(f"triton {triton.__version__}, torch {torch.__version__}; offline compile for sm_90, D={HEAD_D}")
    for tiling in TILINGS:
        try:
            print(compile_offline(*tiling))
        except Exception as e:  # a probe: report and go on
            cause = e
            while cause.__cause__ or cause.__context__:
                cause = cause.__cause__ or cause.__context__
            print(f"{tiling} compile FAILED: {type(e).__name__}: {str(cause)[-1500:]}")
    if torch.cuda.is_available():
        run_gpu()


if __name__ == "__main__":
    main()
