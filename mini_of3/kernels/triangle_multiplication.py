"""Fused triangle multiplicative update (AF3 SI Alg 12 outgoing, Alg 13 incoming): the public function, its checks,
the launchers and the autograd-wired custom ops.

    triangle_multiplication(z, mask=None, *, direction="outgoing", norm_in_weight, norm_in_bias, p_in_weight,
                            g_in_weight, norm_out_weight, norm_out_bias, p_out_weight, g_out_weight, eps=1e-5,
                            backend="auto") -> [B, N, N, C]

The semantics of ``mini_of3.model.tri_mul_backends.triangle_multiplication_torch`` (cuEquivariance's argument names).
Structure (kernels and launch order: tri_mul_kernels.py): two Triton kernels around one cuBLAS contraction forward,
their mirrors around two cuBLAS contractions backward. The contraction itself stays in cuBLAS: it is 2 N^3 h FLOPs
(116 GFLOP at N = 768, h = 128), which cuBLAS runs near the tensor cores' peak on [B * h, N, N] operands, outgoing
t_c = a_c b_c^T and incoming t_c = a_c^T b_c as transposed operands of the same batched GEMM (no copies). Everything
around it is memory-bound, so the Triton kernels fuse each side into one pass over the pair tensor: LayerNorm, the
four projections, gates and mask before (one read of z); LayerNorm over h, the output projection and gate after (one
read of t). The forward keeps a, b, t and g_out's pre-activation in the compute dtype for the backward (the
projections are recomputed from z there, cheaper than keeping the four of them).

Precision (16-bit compute dtype, i.e. bf16 autocast): the projections, the contraction and the output projection run
on the tensor cores with float32 accumulation; a, b, t, the normalised t and the output are rounded to bf16 once each,
as in the eager version under autocast; LayerNorm statistics, gates and their gradients are float32. Gradients: no
atomics. The weight gradients (sums over the N * N pairs) are cuBLAS GEMMs over operands materialised in the compute
dtype; the LayerNorm affine gradients are per-program float32 partials summed by torch in a fixed order. Output and
all gradients repeat bitwise for a given device.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from mini_of3.kernels import tri_mul_kernels as K
from mini_of3.kernels.launch import TileOverride, _dot_precision, _new, _num_sms, cdiv, eager_function, pow2, stacked
from mini_of3.kernels.launcher import interpreting, launch
from mini_of3.kernels.reference import triangle_multiplication_reference

BACKENDS = ("auto", "triton", "torch")
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# torch.mm / torch.bmm take out_dtype (float32 from 16-bit inputs, CUDA) from torch 2.8 on
_GEMM_OUT_DTYPE = torch.torch_version.TorchVersion(torch.__version__) >= "2.8"
WEIGHT_NAMES = ("norm_in_weight", "norm_in_bias", "p_in_weight", "g_in_weight", "norm_out_weight", "norm_out_bias",
                "p_out_weight", "g_out_weight")


# ---------------------------------------------------------------------------------------------------------------
# input checks


def _check_inputs(z, mask, direction, weights: dict, backend: str) -> None:
    if not isinstance(z, torch.Tensor) or z.dim() != 4 or z.shape[1] != z.shape[2]:
        raise ValueError(f"triangle_multiplication: z must be a [B, N, N, C] tensor, got "
                         f"{tuple(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__}")
    B, N, _, C = z.shape
    if z.dtype not in (*SUPPORTED_DTYPES, torch.float64):
        raise TypeError(f"triangle_multiplication: z dtype must be float16, bfloat16 or float32, got {z.dtype}")
    h2 = weights["p_in_weight"].shape[0] if weights["p_in_weight"].dim() == 2 else -1
    expected = {"norm_in_weight": (C,), "norm_in_bias": (C,), "p_in_weight": (h2, C), "g_in_weight": (h2, C),
                "norm_out_weight": (h2 // 2,), "norm_out_bias": (h2 // 2,), "p_out_weight": (C, h2 // 2),
                "g_out_weight": (C, C)}
    for name, shape in expected.items():
        w = weights[name]
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"triangle_multiplication: {name} must be a torch.Tensor, got {type(w).__name__}")
        if tuple(w.shape) != shape or h2 < 2 or h2 % 2:
            raise ValueError(f"triangle_multiplication: {name} must be {shape} for z of shape {tuple(z.shape)} and "
                             f"p_in_weight of shape {tuple(weights['p_in_weight'].shape)} (2 h rows), got "
                             f"{tuple(w.shape)}")
        if not w.is_floating_point():
            raise TypeError(f"triangle_multiplication: {name} must be floating point, got {w.dtype}")
    devices = {z.device, *(w.device for w in weights.values())}
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"triangle_multiplication: mask must be a tensor or None, got {type(mask).__name__}")
        if tuple(mask.shape) != (B, N, N):
            raise ValueError(f"triangle_multiplication: mask must be [B, N, N] = {(B, N, N)}, got "
                             f"{tuple(mask.shape)}")
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise TypeError(f"triangle_multiplication: mask must be bool or floating point, got {mask.dtype}")
        devices.add(mask.device)
    if len(devices) > 1:
        raise ValueError(f"triangle_multiplication: all inputs must be on one device, got {sorted(map(str, devices))}")
    if direction not in ("outgoing", "incoming"):
        raise ValueError(f"triangle_multiplication: direction must be 'outgoing' or 'incoming', got {direction!r}")
    if backend not in BACKENDS:
        raise ValueError(f"triangle_multiplication: backend must be one of {BACKENDS}, got {backend!r}")
    if min(B, N) < 1:
        raise ValueError(f"triangle_multiplication: every dimension must be >= 1, got z of shape {tuple(z.shape)}")


def _resolve_backend(backend: str, z: torch.Tensor, hidden: int) -> str:
    if backend == "auto":
        return "triton" if z.is_cuda else "torch"
    if backend == "triton":
        C = z.shape[-1]
        if C % 16 or hidden % 16:
            raise ValueError(f"triangle_multiplication: the Triton kernel needs the pair channels C and the hidden "
                             f"channels h to be multiples of 16 (tensor-core tiles), got C={C}, h={hidden}")
        if not z.is_cuda and not interpreting():
            raise ValueError("triangle_multiplication: backend='triton' needs CUDA tensors, or CPU tensors with "
                             "TRITON_INTERPRET=1 set before mini_of3 is imported")
        if z.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"triangle_multiplication: the Triton kernel takes float16, bfloat16 or float32 z, got "
                            f"{z.dtype}")
    return backend


# ---------------------------------------------------------------------------------------------------------------
# tiles and launchers


@dataclass(frozen=True, kw_only=True)
class TriMulTiles:
    """Launch tiles of the four Triton kernels, in launch order: pairs per program (``*_m``) or per tile of a
    persistent program (``*_p``), hidden channels per chunk of the projection kernels (``*_hc``), warps and pipeline
    stages per program, persistent programs per SM (``*_per_sm``; 0: one program per tile); ``fast_gates``: every
    kernel's sigmoid gates with the approximate ex2 and reciprocal instructions (GPU only; off under the interpreter,
    which cannot run them). The defaults are the fastest of the sweeps (C = h = 128, bf16;
    ``benchmarks/tune_tri_mul.py``): the projection kernels' on the H200 (tune_tri_mul_9f4fc3f.json: forward +
    backward 3.97 ms at N = 768, 5.23 with the first tiles), the persistent output kernels' on the H100
    (tune_tri_mul_f7eb62a_h100.json: backward 3.53 -> 3.31 ms at N = 768 against one program per tile)."""
    proj_fwd_m: int = 64
    proj_fwd_hc: int = 32
    proj_fwd_warps: int = 4
    proj_fwd_stages: int = 3
    out_fwd_p: int = 64
    out_fwd_warps: int = 4
    out_fwd_stages: int = 2
    out_fwd_per_sm: int = 2
    out_bwd_p: int = 64
    out_bwd_warps: int = 8
    out_bwd_stages: int = 3
    out_bwd_per_sm: int = 1
    proj_bwd_m: int = 128
    proj_bwd_hc: int = 32
    proj_bwd_warps: int = 8
    proj_bwd_stages: int = 3
    fast_gates: bool = False


tri_mul_tiles = TileOverride("tri_mul_tiles", TriMulTiles)
"""``with tri_mul_tiles(proj_fwd_m=128, ...)``: these tiles (any TriMulTiles field) instead of the defaults."""


@tri_mul_tiles.cached
def _tiles(C: int, hidden: int) -> TriMulTiles:
    """The tiles of one call: small under the interpreter, so that the tests' small N span several tiles and chunks;
    else the fixed defaults (fewer pairs per output program for a wide hidden dim, whose [pairs, h] tile is held
    whole), with any ``tri_mul_tiles`` override on top."""
    if interpreting():
        tiles = TriMulTiles(proj_fwd_m=32, proj_fwd_hc=16, proj_fwd_warps=4, proj_fwd_stages=1, out_fwd_p=32,
                            out_bwd_p=32, out_bwd_warps=4, proj_bwd_m=32, proj_bwd_hc=16, proj_bwd_warps=4,
                            proj_bwd_stages=1)
    elif hidden > 128:
        tiles = TriMulTiles(out_fwd_p=32, out_bwd_p=32)
    else:
        tiles = TriMulTiles()
    tiles = tri_mul_tiles.apply(tiles)
    hc = pow2(hidden)
    return replace(tiles, proj_fwd_hc=min(tiles.proj_fwd_hc, hc), proj_bwd_hc=min(tiles.proj_bwd_hc, hc),
                   fast_gates=tiles.fast_gates and not interpreting())


def _programs(n_tiles: int, per_sm: int, device: torch.device) -> int:
    """Programs of a persistent kernel over ``n_tiles`` tiles: ``per_sm`` per SM (0: one per tile); two under the
    interpreter, so that the tests' programs take several tiles each."""
    if interpreting():
        return min(n_tiles, 2)
    if per_sm == 0:
        return n_tiles
    return min(n_tiles, per_sm * _num_sms(device))


def forward(z, mask, ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out, outgoing: bool, eps: float,
            compute_dtype: torch.dtype, out_dtype: torch.dtype):
    """out [B, N, N, C] (out_dtype) and the residuals of the backward: ab [2, B * h, N, N], t [B * h, N, N],
    g_out's pre-activation [B, N, N, C] (all compute_dtype), stats_in, stats_out [2, B, N * N] float32, and the
    projection weights in the compute dtype, (p_in | g_in | g_out) [4 h + C, C] (the rows of the input side's
    weight-gradient buffer) and p_out [C, h], so that the backward casts none again."""
    B, N, _, C = z.shape
    h, NN, dev = p_in.shape[0] // 2, N * N, z.device
    tiles = _tiles(C, h)
    cdt = compute_dtype
    w_in, w_po = stacked((p_in, g_in, g_out), cdt), stacked((p_out,), cdt)
    w_p, w_g, w_go = w_in[:2 * h], w_in[2 * h:4 * h], w_in[4 * h:]
    ab = _new((2, B * h, N, N), cdt, dev)
    gpre = _new((B, N, N, C), cdt, dev)
    stats_in = _new((2, B, NN), torch.float32, dev)
    m_arg, m_strides = (mask, mask.stride()) if mask is not None else (z, (0, 0, 0))
    launch(
        K._tri_mul_proj_fwd, (cdiv(NN, tiles.proj_fwd_m), B),
        z, m_arg, ln_in_w.float().contiguous(), ln_in_b.float().contiguous(), w_p, w_g, w_go, ab, gpre, stats_in[0],
        stats_in[1], *z.stride(), *m_strides, N, NN, B * h * NN, eps,
        C=C, H=h, HAS_MASK=mask is not None, DOT_PREC=_dot_precision(cdt), BLOCK_M=tiles.proj_fwd_m,
        BLOCK_C=pow2(C), BLOCK_HC=tiles.proj_fwd_hc, FAST_GATES=tiles.fast_gates, num_warps=tiles.proj_fwd_warps,
        num_stages=tiles.proj_fwd_stages)
    a, b = ab[0], ab[1]                                                   # [B * h, N, N] each
    t = torch.matmul(a, b.mT) if outgoing else torch.matmul(a.mT, b)     # [B * h, N(i), N(j)]
    out = _new((B, N, N, C), out_dtype, dev)
    stats_out = _new((2, B, NN), torch.float32, dev)
    n_tiles = B * cdiv(NN, tiles.out_fwd_p)
    launch(
        K._tri_mul_out_fwd, (_programs(n_tiles, tiles.out_fwd_per_sm, dev),),
        t, ln_out_w.float().contiguous(), ln_out_b.float().contiguous(), w_po, gpre, out, stats_out[0], stats_out[1],
        NN, n_tiles, eps, C=C, H=h, DOT_PREC=_dot_precision(cdt), BLOCK_P=tiles.out_fwd_p, BLOCK_C=pow2(C),
        BLOCK_H=pow2(h), FAST_GATES=tiles.fast_gates, num_warps=tiles.out_fwd_warps, num_stages=tiles.out_fwd_stages)
    return out, ab, t, gpre, stats_in, stats_out, w_in, w_po


def _weight_grad(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """sum_batch a @ b for [B, M, K] @ [B, K, P] in the compute dtype, cast to ``dtype``: a weight gradient (K the
    N * N pairs). On CUDA cuBLAS writes float32 itself (``out_dtype``), one GEMM and no other kernel when B = 1;
    elsewhere the product is rounded to the compute dtype first, then summed over the batch in float32, in order."""
    if _GEMM_OUT_DTYPE and a.is_cuda and a.dtype in (torch.bfloat16, torch.float16):
        if a.shape[0] == 1:
            return torch.mm(a[0], b[0], out_dtype=torch.float32).to(dtype)
        return torch.bmm(a, b, out_dtype=torch.float32).sum(0).to(dtype)
    return torch.matmul(a, b).float().sum(0).to(dtype)


def backward(dout, z, mask, ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out, ab, t, gpre, stats_in,
             stats_out, w_in, w_po, outgoing: bool, eps: float):
    """dz and the weight gradients as whole float32 buffers (``weight_grads`` slices them): the norm_in weight
    and bias rows [2, pow2(C)], d(p_in | g_in | g_out) [4 h + C, C], the norm_out rows [2, pow2(h)], and d p_out
    [C, h] in p_out's dtype."""
    B, N, _, C = z.shape
    h, NN, dev, cdt = p_in.shape[0] // 2, N * N, z.device, ab.dtype
    tiles = _tiles(C, h)
    w_p, w_g, w_go = w_in[:2 * h], w_in[2 * h:4 * h], w_in[4 * h:]
    prec = _dot_precision(cdt)

    # output side: LayerNorm over h, p_out, the gate
    dt = _new((B * h, N, N), cdt, dev)
    ta = _new((B, h, NN), cdt, dev)
    dy = _new((B, NN, C), cdt, dev)
    # the input side's weight-gradient operand: d(p_in, g_in) in rows 0..4h-1 (written by _tri_mul_proj_bwd),
    # d(g_out pre-activation) in the last C rows (written here), so one GEMM gives all three weight gradients
    dpg = _new((B, 4 * h + C, NN), cdt, dev)
    n_tiles = B * cdiv(NN, tiles.out_bwd_p)
    programs = _programs(n_tiles, tiles.out_bwd_per_sm, dev)
    part_out = _new((programs, 2, pow2(h)), torch.float32, dev)
    launch(
        K._tri_mul_out_bwd, (programs,),
        t, ln_out_w.float().contiguous(), ln_out_b.float().contiguous(), w_po, gpre, dout, stats_out[0], stats_out[1],
        dt, ta, dy, dpg, part_out, *dout.stride(), N, NN, n_tiles, C=C, H=h, DOT_PREC=prec,
        BLOCK_P=tiles.out_bwd_p, BLOCK_C=pow2(C), BLOCK_H=pow2(h), FAST_GATES=tiles.fast_gates,
        num_warps=tiles.out_bwd_warps, num_stages=tiles.out_bwd_stages)
    d_ln_out = part_out.sum(0)                                                   # [2, pow2(h)]
    d_p_out = _weight_grad(dy.mT, ta.mT, p_out.dtype)                            # [C, h]
    del dy, ta

    # the contraction: outgoing t = a b^T, incoming t = a^T b, per channel
    a, b = ab[0], ab[1]
    dab = _new((2, B * h, N, N), cdt, dev)
    if outgoing:
        torch.matmul(dt, b, out=dab[0])
        torch.matmul(dt.mT, a, out=dab[1])
    else:
        torch.matmul(b, dt.mT, out=dab[0])
        torch.matmul(a, dt, out=dab[1])
    del dt

    # input side: LayerNorm over C, the projections, gates and mask
    dz = _new(z.shape, z.dtype, dev)
    x = _new((B, NN, C), cdt, dev)
    grid_m = (cdiv(NN, tiles.proj_bwd_m), B)
    part_in = _new((grid_m[0] * B, 2, pow2(C)), torch.float32, dev)
    m_arg, m_strides = (mask, mask.stride()) if mask is not None else (z, (0, 0, 0))
    launch(
        K._tri_mul_proj_bwd, grid_m,
        z, m_arg, ln_in_w.float().contiguous(), ln_in_b.float().contiguous(), w_p, w_g, w_go, dab, stats_in[0],
        stats_in[1], dz, dpg, x, part_in, *z.stride(), *m_strides, N, NN, B * h * NN,
        C=C, H=h, HAS_MASK=mask is not None, DOT_PREC=prec, BLOCK_M=tiles.proj_bwd_m, BLOCK_C=pow2(C),
        BLOCK_HC=tiles.proj_bwd_hc, FAST_GATES=tiles.fast_gates, num_warps=tiles.proj_bwd_warps,
        num_stages=tiles.proj_bwd_stages)
    d_ln_in = part_in.sum(0)                                                     # [2, pow2(C)]
    d_pg = _weight_grad(dpg, x, torch.float32)                                   # [4 h + C, C]
    return dz, d_ln_in, d_pg, d_ln_out, d_p_out


def weight_grads(weights, d_ln_in, d_pg, d_ln_out, d_p_out):
    """The eight weight gradients, in WEIGHT_NAMES order and each weight's dtype, from the backward's whole
    buffers: views of them where the dtype already matches (no copy kernels)."""
    ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out = weights
    C, h = ln_in_w.shape[0], p_in.shape[0] // 2
    return (d_ln_in[0, :C].to(ln_in_w.dtype), d_ln_in[1, :C].to(ln_in_b.dtype), d_pg[:2 * h].to(p_in.dtype),
            d_pg[2 * h:4 * h].to(g_in.dtype), d_ln_out[0, :h].to(ln_out_w.dtype),
            d_ln_out[1, :h].to(ln_out_b.dtype), d_p_out, d_pg[4 * h:].to(g_out.dtype))


# ---------------------------------------------------------------------------------------------------------------
# custom ops (opaque to torch.compile) and autograd


@torch.library.custom_op("mini_of3::triangle_multiplication_fwd", mutates_args=())
def _fwd_op(z: torch.Tensor, mask: torch.Tensor | None, ln_in_w: torch.Tensor, ln_in_b: torch.Tensor,
            p_in: torch.Tensor, g_in: torch.Tensor, ln_out_w: torch.Tensor, ln_out_b: torch.Tensor,
            p_out: torch.Tensor, g_out: torch.Tensor, outgoing: bool, eps: float, compute_dtype: torch.dtype,
            out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                             torch.Tensor, torch.Tensor, torch.Tensor]:
    return forward(z, mask, ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out, outgoing, eps,
                   compute_dtype, out_dtype)


@_fwd_op.register_fake
def _fwd_fake(z, mask, ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out, outgoing, eps,
              compute_dtype, out_dtype):
    B, N, _, C = z.shape
    h = p_in.shape[0] // 2
    return (z.new_empty((B, N, N, C), dtype=out_dtype), z.new_empty((2, B * h, N, N), dtype=compute_dtype),
            z.new_empty((B * h, N, N), dtype=compute_dtype), z.new_empty((B, N, N, C), dtype=compute_dtype),
            z.new_empty((2, B, N * N), dtype=torch.float32), z.new_empty((2, B, N * N), dtype=torch.float32),
            z.new_empty((4 * h + C, C), dtype=compute_dtype), z.new_empty((C, h), dtype=compute_dtype))


@torch.library.custom_op("mini_of3::triangle_multiplication_bwd", mutates_args=())
def _bwd_op(dout: torch.Tensor, z: torch.Tensor, mask: torch.Tensor | None, ln_in_w: torch.Tensor,
            ln_in_b: torch.Tensor, p_in: torch.Tensor, g_in: torch.Tensor, ln_out_w: torch.Tensor,
            ln_out_b: torch.Tensor, p_out: torch.Tensor, g_out: torch.Tensor, ab: torch.Tensor, t: torch.Tensor,
            gpre: torch.Tensor, stats_in: torch.Tensor, stats_out: torch.Tensor, w_in: torch.Tensor,
            w_po: torch.Tensor, outgoing: bool, eps: float
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return backward(dout, z, mask, ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out, ab, t, gpre,
                    stats_in, stats_out, w_in, w_po, outgoing, eps)


@_bwd_op.register_fake
def _bwd_fake(dout, z, mask, ln_in_w, ln_in_b, p_in, g_in, ln_out_w, ln_out_b, p_out, g_out, ab, t, gpre, stats_in,
              stats_out, w_in, w_po, outgoing, eps):
    C, h2, f32 = z.shape[-1], p_in.shape[0], torch.float32
    return (z.new_empty(z.shape), z.new_empty((2, pow2(C)), dtype=f32), z.new_empty((h2 * 2 + C, C), dtype=f32),
            z.new_empty((2, pow2(h2 // 2)), dtype=f32), p_out.new_empty(p_out.shape))


def _setup_context(ctx, inputs, output):
    z, mask, *weights, outgoing, eps, _compute_dtype, _out_dtype = inputs
    _out, *residuals = output
    ctx.save_for_backward(z, mask, *weights, *residuals)
    ctx.outgoing, ctx.eps = outgoing, eps
    ctx.mark_non_differentiable(*residuals)
    ctx.set_materialize_grads(False)     # no zero-filled gradients for the residuals


def _autograd_backward(ctx, dout, *_residual_grads, backward_fn=_bwd_op):
    z, mask, *rest = ctx.saved_tensors
    dz, *buffers = backward_fn(dout, z, mask, *rest, ctx.outgoing, ctx.eps)
    return dz, None, *weight_grads(rest[:8], *buffers), None, None, None, None


_fwd_op.register_autograd(_autograd_backward, setup_context=_setup_context)


_EagerTriangleMultiplication = eager_function("_EagerTriangleMultiplication", forward, _setup_context,
                                              _autograd_backward, backward)


# ---------------------------------------------------------------------------------------------------------------
# public function


def triangle_multiplication(
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
    backend: str = "auto",
) -> torch.Tensor:
    """Fused triangle multiplicative update, outgoing (AF3 SI Alg 12) or incoming (Alg 13).

    out_ij = sigmoid(x_ij g_out^T) * (LayerNorm(sum_k a_ik b_jk) p_out^T) (outgoing; incoming sums a_ki b_kj), with
    x = LayerNorm(z), a | b = (x p_in^T) * sigmoid(x g_in^T) * mask.

    Args:
        z: [B, N, N, C], any strides; float32, bfloat16 or float16
        mask: [B, N, N] pair mask (bool or float, 1 = keep), any strides, or None
        p_in_weight, g_in_weight: [2 h, C]; the first h rows make a, the last h make b
        norm_in_weight, norm_in_bias: [C]; norm_out_weight, norm_out_bias: [h]; p_out_weight: [C, h];
        g_out_weight: [C, C]
        backend: "triton" (CUDA, or CPU under TRITON_INTERPRET=1; C and h multiples of 16), "torch" (the plain
            reference of reference.py, as called) or "auto" (triton on CUDA, else torch)
    Returns:
        [B, N, N, C], contiguous: in the autocast dtype under autocast (as the eager version returns), else in z's
        dtype. The Triton path computes in that dtype with float32 accumulation and statistics; gradients come in
        each input's dtype.
    """
    weights = dict(norm_in_weight=norm_in_weight, norm_in_bias=norm_in_bias, p_in_weight=p_in_weight,
                   g_in_weight=g_in_weight, norm_out_weight=norm_out_weight, norm_out_bias=norm_out_bias,
                   p_out_weight=p_out_weight, g_out_weight=g_out_weight)
    _check_inputs(z, mask, direction, weights, backend)
    if _resolve_backend(backend, z, p_in_weight.shape[0] // 2) == "torch":
        return triangle_multiplication_reference(z, mask, direction=direction, eps=eps, **weights)
    device = z.device.type
    if torch.is_autocast_enabled(device):
        compute_dtype = out_dtype = torch.get_autocast_dtype(device)
    else:
        compute_dtype = out_dtype = z.dtype
    inputs = (z, mask, *(weights[name] for name in WEIGHT_NAMES), direction == "outgoing", float(eps), compute_dtype,
              out_dtype)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (z, *weights.values()))
    if not needs_grad and not torch.compiler.is_compiling():   # inference: no autograd node
        return forward(*inputs)[0]
    apply = _fwd_op if torch.compiler.is_compiling() else _EagerTriangleMultiplication.apply
    return apply(*inputs)[0]
