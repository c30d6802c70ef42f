"""Triangle-attention dK/dV written in Gluon for Hopper (sm_90): a lab probe for issue 42, not shipped code.

Targets Triton 3.6.0 (`triton.experimental.gluon`) and torch 2.11. The backward is 3/4 of the triangle attention's
time in a training step; this probe asks whether the sigmoid backward's Gluon structure
(mini_of3/kernels/sigmoid_attention_hopper.py: keys kept, queries ringed, two consumer warpgroups and a producer
warp) beats our Triton `_bwd_dkdv` on the softmax with a pair bias.

    q, k, v, do  bf16 [B*I*H, J, D]   rows contiguous, D = 32
    bias         bf16 [B*H, J, J]     shared by every row i of one (b, h)
    lse2, delta  fp32 [B*I*H, J]      the forward's log-sum-exp in base 2 of the scaled scores, rowsum(dO * O)
    dk, dv       bf16 [B*I*H, J, D]   dV = P^T dO, dK = scale dS^T Q, dS = P (dP - delta), dP = dO V^T

- `dkdv_keys2`: the two consumer warpgroups on 2 x BN keys of one row; the ring holds Q, dO and the [BM, 2 BN] bias
  tile of both (each warpgroup reads its half).
- `dkdv_rows2`: the two consumer warpgroups on the same BN keys of rows i and i + 1 of one (b, h); the ring holds Q
  and dO of both rows and one [BM, BN] bias tile for both (half the bias bytes per score, as the forward probe's
  `attn_fwd_rows2`).

Both: S^T = K Q^T and dP^T = V dO^T issued together, the bias tile read transposed from shared memory, then
dV += P^T dO and dK += dS^T Q with P^T and dS^T from registers; queries past J get lse = +inf (P = 0), keys past J
are computed and not stored. No key mask yet.

    python tools/lab/gluon_tri_attn_bwd.py      # compile for sm_90 (no GPU needed): regs, spills, smem; with a CUDA
                                                # GPU also: errors against float64 and device time (CUDA graph)
                                                # beside the Triton _bwd_dkdv kernel's (torch.profiler)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
from gluon_common import alloc_tile, compile_sm90, shared_layout
from gluon_tri_attn_fwd import _pair_coords
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from mini_of3.kernels.sigmoid_attention_hopper import _load_kept, mma_layout, ring_barriers

LOG2E = 1.4426950408889634
HEAD_D = 32
NUM_WARPS = 4


@gluon.jit
def _dkdv_tile(dk, dv, k_smem, v_smem, q_slot, do_slot, bias_t, lse_ptr, delta_ptr, row, m0, J, qk_scale,
               BM: gl.constexpr, BN: gl.constexpr, st_layout: gl.constexpr, acc_layout: gl.constexpr):
    """dk, dv [BN, D] + the query tile [m0, m0 + BM) of row ``row``; bias_t: its bias tile [BN, BM] in st_layout."""
    op_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
    st = warpgroup_mma(k_smem, q_slot.permute((1, 0)), gl.zeros([BN, BM], gl.float32, st_layout), use_acc=False,
                       is_async=True)
    dpt = warpgroup_mma(v_smem, do_slot.permute((1, 0)), gl.zeros([BN, BM], gl.float32, st_layout), use_acc=False,
                        is_async=True)
    queries = m0 + gl.arange(0, BM, layout=gl.SliceLayout(0, st_layout))
    lse = gl.load(lse_ptr + row * J + queries, mask=queries < J, other=float("inf"))
    delta = gl.load(delta_ptr + row * J + queries, mask=queries < J, other=0.0)
    st, dpt = warpgroup_mma_wait(0, deps=(st, dpt))
    pt = gl.exp2(st * qk_scale + bias_t * 1.4426950408889634 - lse[None, :])                 # [BN, BM]
    dst = pt * (dpt - delta[None, :])
    dv = warpgroup_mma(gl.convert_layout(pt.to(gl.bfloat16), op_a), do_slot, dv, is_async=True)
    dk = warpgroup_mma(gl.convert_layout(dst.to(gl.bfloat16), op_a), q_slot, dk, is_async=True)
    return warpgroup_mma_wait(0, deps=(dk, dv))


@gluon.jit
def _store_rows(ptr, value, first, n0, J, BN: gl.constexpr, D: gl.constexpr, layout: gl.constexpr):
    """Rows n0 .. n0 + BN (those < J) of the [J, D] block at row ``first`` of a [rows, D] tensor."""
    rows = n0 + gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    gl.store(ptr + (first + rows[:, None]).to(gl.int64) * D + cols[None, :], value.to(gl.bfloat16),
             mask=rows[:, None] < J)


@gluon.jit
def _consumer(k_smem, v_smem, kv_bar, q_ring, do_ring, b_ring, ready, empty, k_desc, v_desc, lse_ptr, delta_ptr,
              dk_ptr, dv_ptr, J, I, H, qk_scale, scale, BM: gl.constexpr, NS: gl.constexpr, ROWS2: gl.constexpr,
              WG: gl.constexpr):
    """Consumer warpgroup WG: dK, dV of its BN keys of its row over every query tile of the row."""
    BN: gl.constexpr = k_desc.block_type.shape[0]
    D: gl.constexpr = k_desc.block_type.shape[1]
    st_layout: gl.constexpr = mma_layout(BM, 4)
    acc_layout: gl.constexpr = mma_layout(D, 4)
    if ROWS2:
        bih0, bh = _pair_coords(I, H)
        row = bih0 + WG * H
        n0 = gl.program_id(0) * BN
    else:
        row = gl.program_id(1)
        n0 = (gl.program_id(0) * 2 + WG) * BN
    _load_kept(k_desc, v_desc, row * J + n0, 0, k_smem, v_smem, kv_bar)
    dk = gl.zeros([BN, D], gl.float32, acc_layout)
    dv = gl.zeros([BN, D], gl.float32, acc_layout)
    for t in range(gl.cdiv(J, BM)):
        slot = t % NS
        mbarrier.wait(ready.index(slot), (t // NS) & 1)
        if ROWS2:
            q_slot, do_slot = q_ring.index(slot * 2 + WG), do_ring.index(slot * 2 + WG)
            bias_t = b_ring.index(slot).permute((1, 0)).load(st_layout).to(gl.float32)
        else:
            q_slot, do_slot = q_ring.index(slot), do_ring.index(slot)
            bias_t = b_ring.index(slot).slice(WG * BN, BN, dim=1).permute((1, 0)).load(st_layout).to(gl.float32)
        dk, dv = _dkdv_tile(dk, dv, k_smem, v_smem, q_slot, do_slot, bias_t, lse_ptr, delta_ptr, row, t * BM, J,
                            qk_scale, BM, BN, st_layout, acc_layout)
        mbarrier.arrive(empty.index(slot))
    _store_rows(dk_ptr, dk * scale, row * J, n0, J, BN, D, acc_layout)
    _store_rows(dv_ptr, dv, row * J, n0, J, BN, D, acc_layout)


@gluon.jit
def _producer(q_desc, do_desc, b_desc, q_ring, do_ring, b_ring, ready, empty, J, I, H, NS: gl.constexpr,
              ROWS2: gl.constexpr):
    """One warp: per query tile, Q and dO of the program's row(s) and the bias tile into the next free slot."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    BNB: gl.constexpr = b_desc.block_type.shape[1]            # keys of the bias tile: BN (rows2) or 2 BN
    rows: gl.constexpr = 2 if ROWS2 else 1
    if ROWS2:
        bih0, bh = _pair_coords(I, H)
    else:
        bih0 = gl.program_id(1)
        bh = bih0 // (I * H) * H + bih0 % H
    n0 = gl.program_id(0) * BNB
    nbytes: gl.constexpr = (2 if ROWS2 else 1) * (q_desc.block_type.nbytes + do_desc.block_type.nbytes) \
        + b_desc.block_type.nbytes
    for t in range(gl.cdiv(J, BM)):
        slot = t % NS
        mbarrier.wait(empty.index(slot), ((t // NS) & 1) ^ 1)
        mbarrier.expect(ready.index(slot), nbytes)
        for r in gl.static_range(rows):
            q_row = (bih0 + r * H) * J + t * BM
            tma.async_copy_global_to_shared(q_desc, [q_row, 0], ready.index(slot), q_ring.index(slot * rows + r))
            tma.async_copy_global_to_shared(do_desc, [q_row, 0], ready.index(slot), do_ring.index(slot * rows + r))
        tma.async_copy_global_to_shared(b_desc, [bh * J + t * BM, n0], ready.index(slot), b_ring.index(slot))


@gluon.jit
def dkdv(q_desc, k_desc, v_desc, do_desc, b_desc, lse_ptr, delta_ptr, dk_ptr, dv_ptr, J, I, H, qk_scale, scale,
         NS: gl.constexpr, ROWS2: gl.constexpr, num_warps: gl.constexpr):
    """dK, dV of triangle attention: ROWS2 (dkdv_rows2) or two key blocks of one row (dkdv_keys2), see the module
    docstring."""
    BM: gl.constexpr = q_desc.block_type.shape[0]
    rows: gl.constexpr = 2 if ROWS2 else 1
    k0, bar0 = alloc_tile(k_desc)
    v0 = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
    k1, bar1 = alloc_tile(k_desc)
    v1 = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
    q_ring = gl.allocate_shared_memory(q_desc.dtype, [NS * rows] + q_desc.block_type.shape, q_desc.layout)
    do_ring = gl.allocate_shared_memory(do_desc.dtype, [NS * rows] + do_desc.block_type.shape, do_desc.layout)
    b_ring = gl.allocate_shared_memory(b_desc.dtype, [NS] + b_desc.block_type.shape, b_desc.layout)
    ready, empty = ring_barriers(NS, 2)
    gl.warp_specialize([
        (_consumer, (k0, v0, bar0, q_ring, do_ring, b_ring, ready, empty, k_desc, v_desc, lse_ptr, delta_ptr,
                     dk_ptr, dv_ptr, J, I, H, qk_scale, scale, BM, NS, ROWS2, 0)),
        (_consumer, (k1, v1, bar1, q_ring, do_ring, b_ring, ready, empty, k_desc, v_desc, lse_ptr, delta_ptr,
                     dk_ptr, dv_ptr, J, I, H, qk_scale, scale, BM, NS, ROWS2, 1)),
        (_producer, (q_desc, do_desc, b_desc, q_ring, do_ring, b_ring, ready, empty, J, I, H, NS, ROWS2)),
    ], [4, 1], [240, 24])


# ---- host side -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """BM queries per ring stage, BN keys per consumer warpgroup, NS stages; rows2 or keys2."""
    bm: int
    bn: int
    ns: int
    rows2: bool

    @property
    def name(self) -> str:
        return f"dkdv_{'rows2' if self.rows2 else 'keys2'} {self.bm}x{self.bn} s{self.ns}"

    @property
    def bias_block(self) -> list[int]:
        return [self.bm, self.bn if self.rows2 else 2 * self.bn]


VARIANTS = [Variant(64, 64, 2, True), Variant(64, 64, 3, True), Variant(64, 64, 2, False),
            Variant(64, 64, 3, False)]          # 128 x 64 spills (388 B)


def _signature(v: Variant) -> tuple[dict, dict]:
    tile = lambda rows: f"tensordesc<bf16[{rows}, {HEAD_D}],{shared_layout([rows, HEAD_D])!r}>"   # noqa: E731
    types = {"q_desc": tile(v.bm), "do_desc": tile(v.bm), "k_desc": tile(v.bn), "v_desc": tile(v.bn),
             "b_desc": f"tensordesc<bf16{v.bias_block},{shared_layout(v.bias_block)!r}>",
             "lse_ptr": "*fp32", "delta_ptr": "*fp32", "dk_ptr": "*bf16", "dv_ptr": "*bf16", "J": "i32", "I": "i32",
             "H": "i32", "qk_scale": "fp32", "scale": "fp32"}
    constexprs = {"NS": v.ns, "ROWS2": v.rows2, "num_warps": NUM_WARPS}
    return {name: types.get(name, "constexpr") for name in dkdv.arg_names}, constexprs


def compile_offline(v: Variant) -> dict:
    compiled, ptx, regs, spills = compile_sm90(dkdv, *_signature(v), NUM_WARPS)
    return {"kernel": v.name, "regs": regs, "spill_bytes": spills, "smem": compiled.metadata.shared,
            "wgmma": ptx.count("wgmma.mma_async"), "tma": ptx.count("cp.async.bulk.tensor")}


def problem(B: int, I: int, H: int, J: int, seed: int = 0) -> dict:
    """Random q, k, v, do, a bf16 bias and the forward's lse2, delta (float64, then rounded as the kernels take them),
    with float64 dk, dv to compare against."""
    g = torch.Generator("cuda").manual_seed(seed)
    q, k, v, do = (torch.randn(B * I * H, J, HEAD_D, device="cuda", generator=g).to(torch.bfloat16)
                   for _ in range(4))
    bias = torch.randn(B * H, J, J, device="cuda", generator=g).to(torch.bfloat16)
    scale = 1 / math.sqrt(HEAD_D)
    q5, k5, v5, do5 = (x.double().view(B, I, H, J, HEAD_D) for x in (q, k, v, do))
    s = q5 @ k5.transpose(-1, -2) * scale + bias.double().view(B, 1, H, J, J)
    lse = torch.logsumexp(s, -1, keepdim=True)
    p = torch.exp(s - lse)
    o = p @ v5
    delta = (do5 * o).sum(-1, keepdim=True)
    ds = p * (do5 @ v5.transpose(-1, -2) - delta)
    return dict(q=q, k=k, v=v, do=do, bias=bias, scale=scale, lse2=(lse[..., 0] * LOG2E).float().reshape(-1, J),
                delta=delta[..., 0].float().reshape(-1, J), dk=(ds.transpose(-1, -2) @ q5 * scale).reshape(-1, J,
                HEAD_D), dv=(p.transpose(-1, -2) @ do5).reshape(-1, J, HEAD_D), I=I, H=H)


def launcher(v: Variant, pb: dict):
    """-> a function launching the variant on ``pb`` into dk, dv (returned); descriptors built once."""
    bih, J, D = pb["q"].shape
    dk, dv = torch.empty_like(pb["q"]), torch.empty_like(pb["q"])
    desc = lambda t, rows: TensorDescriptor.from_tensor(t.reshape(-1, D), [rows, D], shared_layout([rows, D]))  # noqa
    args = (desc(pb["q"], v.bm), desc(pb["k"], v.bn), desc(pb["v"], v.bn), desc(pb["do"], v.bm),
            TensorDescriptor.from_tensor(pb["bias"].reshape(-1, J), v.bias_block, shared_layout(v.bias_block)),
            pb["lse2"], pb["delta"], dk, dv, J, pb["I"], pb["H"], pb["scale"] * LOG2E, pb["scale"])
    grid = (triton.cdiv(J, v.bn), bih // 2) if v.rows2 else (triton.cdiv(J, 2 * v.bn), bih)

    def launch():
        dkdv[grid](*args, NS=v.ns, ROWS2=v.rows2, num_warps=NUM_WARPS)
        return dk, dv
    return launch


def triton_dkdv_ms(pb: dict) -> float:
    """Device ms of our Triton _bwd_dkdv kernel in a forward+backward of triangle_attention on the same tensors."""
    from mini_of3.bench.common import device_ms_by_kernel
    from mini_of3.kernels import triangle_attention
    bih, J, D = pb["q"].shape
    I, H = pb["I"], pb["H"]
    B = bih // (I * H)
    leaves = [x.view(B, I, H, J, D).permute(0, 1, 3, 2, 4).detach().requires_grad_(True)
              for x in (pb["q"], pb["k"], pb["v"])]
    bias = pb["bias"].view(B, H, J, J).float().requires_grad_(True)
    do = pb["do"].view(B, I, H, J, D).permute(0, 1, 3, 2, 4)

    def step(_r):
        o = triangle_attention(*leaves, bias, backend="triton")
        torch.autograd.grad(o, [*leaves, bias], do)
    by_kernel, _ = device_ms_by_kernel(step, iters=10, warmup=3)
    return sum(ms for name, (ms, _) in by_kernel.items() if "_bwd_dkdv" in name)


def run_gpu(B: int = 1, I: int = 128, H: int = 4, J: int = 768) -> None:
    from gluon_tri_attn_fwd import _time_ms
    pb = problem(B, I, H, J)
    print(f"B={B} I={I} H={H} J={J} D={HEAD_D}: Triton _bwd_dkdv {triton_dkdv_ms(pb):.3f} ms (profiler)")
    for variant in VARIANTS:
        try:
            fn = launcher(variant, pb)
            dk, dv = fn()
            err = [((g.double() - r).norm() / r.norm()).item() for g, r in ((dk, pb["dk"]), (dv, pb["dv"]))]
            print(f"{variant.name:26s} err dk {err[0]:.2e} dv {err[1]:.2e}  {_time_ms(fn):8.3f} ms", flush=True)
        except Exception as e:  # a probe: report and go on to the next kernel
            print(f"{variant.name:26s} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)


def main() -> None:
    print(f"triton {triton.__version__}, torch {torch.__version__}; offline compile for sm_90, D={HEAD_D}")
    for variant in VARIANTS:
        try:
            r = compile_offline(variant)
            print(f"{r['kernel']:26s} regs {r['regs']}  spill stores {r['spill_bytes']} B  smem {r['smem']} B  "
                  f"wgmma {r['wgmma']}  tma {r['tma']}")
        except Exception as e:  # a probe: report and go on to the next kernel
            print(f"{variant.name:26s} compile FAILED: {type(e).__name__}: {str(e)[:2000]}")
    if torch.cuda.is_available():
        run_gpu()


if __name__ == "__main__":
    main()
