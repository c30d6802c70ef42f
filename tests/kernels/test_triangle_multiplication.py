"""The fused triangle multiplication (AF3 SI Alg 12/13) against the float64 reference (Triton interpreter on CPU, or
the GPU, where larger cases run too).

Covering set, not a cross-product (the interpreter is slow): N in {13, 17, 24} (odd, and no multiple of the 32-pair
tiles), C and h in {16, 32, 48} (48: channel tiles padded to 64), B in {1, 2}, both directions, float32 and bf16 z,
with and without bf16 autocast (and once fp16 autocast), bool, float and no masks (a fully masked token row and
column plus random holes), each appear at least once. Outputs are poisoned with NaN beforehand (MINI_OF3_POISON=1,
conftest.py), so an element a kernel forgot to write fails the comparison. Errors are norm-relative against float64
(the output, dz and every weight gradient on its own).
"""
from __future__ import annotations

import pytest
import torch

from mini_of3.bench.common import rel_err
from mini_of3.kernels import triangle_multiplication, triangle_multiplication_reference
from mini_of3.model.tri_mul_backends import triangle_multiplication_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("out", "dz", "norm_in_weight", "norm_in_bias", "p_in_weight", "g_in_weight", "norm_out_weight",
         "norm_out_bias", "p_out_weight", "g_out_weight")
# Norm-relative error bounds against float64, from the compute precision:
# - float32 compute (no autocast): a few float32 roundings summed in other orders, measured <= 5e-7 (~4 eps);
#   2**7 eps = 1.5e-5 bounds that, a wrong index or mask gives errors of order 1e-1.
# - bf16 compute: every quantity passes about four roundings to bf16 in series (x, a and b, t, normalised t or the
#   output; in the backward dy, dt, da/db, the projections' gradients), each of relative size u = 2^-8 (round to
#   nearest on the GPU; the interpreter truncates, up to 2u). Measured 4e-3 to 1.3e-2 under the interpreter, as
#   the eager path under autocast (3e-3 to 1.4e-2); the bound is 3e-2, about four truncation units.
# - fp16 compute: the same count of roundings with u = 2^-11: measured 4e-4 to 9e-4; bound 4e-3.
TOLERANCE = {torch.float32: 2 ** 7 * torch.finfo(torch.float32).eps, torch.bfloat16: 3e-2, torch.float16: 4e-3}


def make_inputs(B, N, C, h, *, z_dtype=torch.float32, mask="bool", seed=0):
    """z, mask, the eight weights (non-trivial LayerNorm affines) and an output gradient, on DEVICE."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(B, N, N, C, generator=g)
    weights = dict(
        norm_in_weight=1 + 0.2 * torch.randn(C, generator=g), norm_in_bias=0.2 * torch.randn(C, generator=g),
        p_in_weight=torch.randn(2 * h, C, generator=g) / C ** 0.5,
        g_in_weight=torch.randn(2 * h, C, generator=g) / C ** 0.5,
        norm_out_weight=1 + 0.2 * torch.randn(h, generator=g), norm_out_bias=0.2 * torch.randn(h, generator=g),
        p_out_weight=torch.randn(C, h, generator=g) / h ** 0.5,
        g_out_weight=torch.randn(C, C, generator=g) / C ** 0.5)
    pair = None
    if mask is not None:
        token = torch.rand(B, N, generator=g) > 0.15
        token[:, 1] = False                                                 # a fully masked token row and column
        pair = token[:, :, None] & token[:, None, :] & (torch.rand(B, N, N, generator=g) > 0.1)   # and holes
        pair = pair if mask == "bool" else pair.float()
    dout = torch.randn(B, N, N, C, generator=g)
    to = dict(device=DEVICE)
    return (z.to(z_dtype).to(**to), None if pair is None else pair.to(**to), {k: v.to(**to) for k, v in
            weights.items()}, dout.to(**to))


def run(fn, z, mask, weights, dout, *, autocast=None, **kwargs) -> dict[str, torch.Tensor]:
    """Output and the gradients of z and every weight (fresh leaves), optionally under autocast(dtype)."""
    zl = z.detach().clone().requires_grad_(True)
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in weights.items()}
    with torch.autocast(z.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        out = fn(zl, mask, **leaves, **kwargs)
    out.backward(dout.to(out.dtype))
    return {"out": out.detach(), "dz": zl.grad, **{k: v.grad for k, v in leaves.items()}}


def reference(z, mask, weights, dout, **kwargs) -> dict[str, torch.Tensor]:
    return run(triangle_multiplication_reference, z.double(), mask, {k: v.double() for k, v in weights.items()},
               dout.double(), **kwargs)


CASES = [
    # B, N, C, h, direction, z dtype, autocast, mask
    (1, 13, 16, 16, "outgoing", torch.float32, None, "bool"),
    (2, 24, 32, 16, "incoming", torch.float32, torch.bfloat16, "float"),
    (1, 24, 16, 32, "outgoing", torch.bfloat16, torch.bfloat16, "bool"),
    (2, 13, 32, 32, "incoming", torch.float32, None, None),
    (1, 17, 48, 48, "incoming", torch.float32, torch.bfloat16, "bool"),
    (1, 13, 16, 16, "outgoing", torch.bfloat16, None, "bool"),
    (1, 17, 32, 16, "outgoing", torch.float32, torch.float16, "bool"),
]
GPU_CASES = [
    (2, 97, 128, 128, "outgoing", torch.float32, torch.bfloat16, "bool"),
    (1, 97, 64, 32, "incoming", torch.float32, None, "float"),
    (1, 256, 128, 128, "incoming", torch.float32, torch.bfloat16, "bool"),
    (1, 256, 128, 128, "outgoing", torch.bfloat16, torch.bfloat16, "bool"),
]


def check_case(B, N, C, h, direction, z_dtype, autocast, mask):
    z, pair, weights, dout = make_inputs(B, N, C, h, z_dtype=z_dtype, mask=mask, seed=N + C + h)
    got = run(triangle_multiplication, z, pair, weights, dout, autocast=autocast, direction=direction,
              backend="triton")
    ref = reference(z, pair, weights, dout, direction=direction)
    compute = autocast or z_dtype
    if autocast is not None:   # the eager version's output dtype under autocast
        with torch.no_grad(), torch.autocast(z.device.type, dtype=autocast):
            assert got["out"].dtype == triangle_multiplication_torch(z, pair, direction=direction, **weights).dtype
    else:
        assert got["out"].dtype == z_dtype
    for name in NAMES:
        g = got[name]
        assert torch.isfinite(g).all(), f"{name} has non-finite or unwritten elements"
        expected_dtype = z_dtype if name == "dz" else (compute if name == "out" else torch.float32)
        assert g.dtype == expected_dtype, (name, g.dtype)
        assert rel_err(g, ref[name]) < TOLERANCE[compute], (name, rel_err(g, ref[name]))


@pytest.mark.parametrize("B,N,C,h,direction,z_dtype,autocast,mask", CASES)
def test_matches_float64_reference(B, N, C, h, direction, z_dtype, autocast, mask):
    check_case(B, N, C, h, direction, z_dtype, autocast, mask)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="larger sizes run on the GPU only")
@pytest.mark.parametrize("B,N,C,h,direction,z_dtype,autocast,mask", GPU_CASES)
def test_matches_float64_reference_gpu_sizes(B, N, C, h, direction, z_dtype, autocast, mask):
    check_case(B, N, C, h, direction, z_dtype, autocast, mask)


@pytest.mark.parametrize("tiles", [
    dict(proj_fwd_m=16, proj_fwd_hc=32, out_fwd_p=64, out_bwd_p=16, proj_bwd_m=64, proj_bwd_hc=32),
    dict(proj_fwd_m=64, proj_fwd_hc=16, proj_fwd_warps=8, out_fwd_p=16, out_fwd_warps=8, proj_bwd_m=16),
])
def test_other_tiles_compute_the_same_function(tiles):
    """Any tiles (tools/lab/tune_tri_mul.py sweeps them) meet the float64 reference: N = 19 spans one to two
    programs and h = 32 one or two hidden-channel chunks, with masks."""
    from mini_of3.kernels.triangle_multiplication_host import tri_mul_tiles
    with tri_mul_tiles(**tiles):
        check_case(1, 19, 16, 32, "incoming", torch.float32, torch.bfloat16, "bool")
    with pytest.raises(ValueError, match="unknown fields"), tri_mul_tiles(block_m=64):
        pass


@pytest.mark.parametrize("direction", ["outgoing", "incoming"])
def test_fast_gates_meet_the_reference(direction):
    """``fast_gates`` (approximate ex2 and reciprocal for every sigmoid gate) within the same bounds; under the
    interpreter, which cannot run those instructions, the tiles resolve it to the exact gates."""
    from mini_of3.kernels.triangle_multiplication_host import tri_mul_tiles
    n = 97 if torch.cuda.is_available() else 19
    with tri_mul_tiles(fast_gates=True):
        check_case(1, n, 32, 32, direction, torch.float32, torch.bfloat16, "bool")
    if torch.cuda.is_available():   # the switch reaches the kernels: the gates' last bits differ
        z, pair, weights, dout = make_inputs(1, n, 32, 32, seed=n)
        exact = run(triangle_multiplication, z, pair, weights, dout, autocast=torch.bfloat16, direction=direction,
                    backend="triton")
        with tri_mul_tiles(fast_gates=True):
            fast = run(triangle_multiplication, z, pair, weights, dout, autocast=torch.bfloat16,
                       direction=direction, backend="triton")
        assert not torch.equal(exact["dz"], fast["dz"])


@pytest.mark.parametrize("direction", ["outgoing", "incoming"])
def test_bitwise_repeat(direction):
    """Two runs give identical bits: output, dz and every weight gradient (no atomics, fixed-order sums)."""
    n, c = (97, 128) if DEVICE == "cuda" else (13, 16)
    z, pair, weights, dout = make_inputs(2, n, c, c, mask="bool")
    runs = [run(triangle_multiplication, z, pair, weights, dout, autocast=torch.bfloat16, direction=direction,
                backend="triton") for _ in range(2)]
    for name in NAMES:
        assert torch.equal(runs[0][name], runs[1][name]), f"{name} differs between runs"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_replay_gives_the_eager_bits():
    """Forward + backward recorded as one CUDA graph (as the reduce-overhead configs train, and as bench trimul's
    fwdbwd_graph_ms times it): replayed on new inputs copied into the recorded ones, it gives the eager call's bits
    on those inputs (no host-side state baked in)."""
    z, pair, weights, dout = make_inputs(1, 97, 128, 128, mask="bool", seed=1)
    z2, pair2, _, dout2 = make_inputs(1, 97, 128, 128, mask="bool", seed=2)
    zl = z.clone().requires_grad_(True)
    leaves = {k: v.clone().requires_grad_(True) for k, v in weights.items()}

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = triangle_multiplication(zl, pair, direction="incoming", backend="triton", **leaves)
        return out, torch.autograd.grad(out, [zl, *leaves.values()], dout.to(out.dtype))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, grads = step()
    with torch.no_grad():
        zl.copy_(z2), pair.copy_(pair2), dout.copy_(dout2)
    graph.replay()
    expected = run(triangle_multiplication, z2, pair2, weights, dout2, autocast=torch.bfloat16,
                   direction="incoming", backend="triton")
    for name, got in zip(NAMES, (out, *grads)):
        assert torch.equal(got, expected[name]), name


@pytest.mark.parametrize("direction", ["outgoing", "incoming"])
def test_contractions_take_views_not_copies(monkeypatch, direction):
    """Every cuBLAS product of the forward and backward gets its operands as contiguous tensors or transposed views
    of them (unit stride on one of the last two axes: a GEMM operand, no copy), the incoming direction included."""
    seen = []
    real_matmul = torch.matmul

    def spy(a, b, **kwargs):
        seen.append((a.stride()[-2:], b.stride()[-2:]))
        return real_matmul(a, b, **kwargs)

    monkeypatch.setattr(torch, "matmul", spy)
    z, pair, weights, dout = make_inputs(1, 13, 16, 16)
    run(triangle_multiplication, z, pair, weights, dout, direction=direction, backend="triton")
    assert len(seen) == 5   # the contraction, its two backward products, the p_out GEMM, one p_in + g_in + g_out GEMM
    for strides in seen:
        assert all(1 in s for s in strides), strides


def test_inference_path_equals_the_autograd_path():
    """Without gradients the forward runs without an autograd node; same bits as with one."""
    z, pair, weights, dout = make_inputs(1, 13, 16, 16)
    with_grad = run(triangle_multiplication, z, pair, weights, dout, direction="incoming", backend="triton")
    with torch.no_grad():
        plain = triangle_multiplication(z, pair, direction="incoming", backend="triton", **weights)
    assert torch.equal(plain, with_grad["out"])


def test_mask_view_and_its_copy_agree_bitwise():
    """The mask is read with its own strides (no copy): a transposed view and its contiguous copy agree."""
    z, pair, weights, dout = make_inputs(1, 13, 16, 16)
    view = pair.transpose(1, 2).contiguous().transpose(1, 2)
    runs = [run(triangle_multiplication, z, m, weights, dout, backend="triton") for m in (view, pair)]
    for name in NAMES:
        assert torch.equal(runs[0][name], runs[1][name]), name


def test_compiles_as_an_opaque_op():
    """torch.compile (fullgraph) traces around the custom op (fake implementations), forward and backward, and gets
    the eager path's bits."""
    z, pair, weights, dout = make_inputs(1, 11, 16, 16)

    def layer(z, mask, **w):
        return triangle_multiplication(z * 1.0, mask, direction="incoming", backend="triton", **w) * 2.0

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    got = run(compiled, z, pair, weights, dout, autocast=torch.bfloat16)
    ref = run(layer, z, pair, weights, dout, autocast=torch.bfloat16)
    for name in NAMES:
        assert torch.equal(got[name], ref[name]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_forward_op(dtype):
    from mini_of3.kernels.triangle_multiplication import WEIGHT_NAMES, _fwd_op
    z, pair, weights, _ = make_inputs(1, 8, 16, 16)
    args = (z.requires_grad_(True), pair, *(weights[n].requires_grad_(True) for n in WEIGHT_NAMES), True, 1e-5,
            dtype, dtype)
    torch.library.opcheck(_fwd_op, args, test_utils=("test_schema", "test_autograd_registration",
                                                     "test_faketensor"))


def test_opcheck_backward_op():
    from mini_of3.kernels.triangle_multiplication import WEIGHT_NAMES, _bwd_op, forward
    z, pair, weights, dout = make_inputs(1, 8, 16, 16)
    w = [weights[n] for n in WEIGHT_NAMES]
    _, *residuals = forward(z, pair, *w, False, 1e-5, torch.bfloat16, torch.bfloat16)
    torch.library.opcheck(_bwd_op, (dout.bfloat16(), z, pair, *w, *residuals, False, 1e-5),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_backend_is_the_reference():
    z, pair, weights, dout = make_inputs(1, 9, 16, 16)
    got = run(triangle_multiplication, z, pair, weights, dout, backend="torch")
    ref = reference(z, pair, weights, dout)
    for name in NAMES:
        assert rel_err(got[name], ref[name]) < TOLERANCE[torch.float32], name


@pytest.mark.parametrize("change,error,match", [
    (dict(z=torch.zeros(1, 4, 5, 16)), ValueError, "z must be"),                         # not square
    (dict(mask=torch.ones(1, 4, 5, dtype=torch.bool)), ValueError, "mask must be"),
    (dict(mask=torch.ones(1, 4, 4, dtype=torch.int32)), TypeError, "mask must be bool"),
    (dict(p_in_weight=torch.zeros(32, 8)), ValueError, "p_in_weight must be"),          # wrong C
    (dict(g_out_weight=torch.zeros(16, 8)), ValueError, "g_out_weight must be"),
    (dict(direction="sideways"), ValueError, "direction"),
    (dict(backend="cuda"), ValueError, "backend"),
    (dict(z=torch.zeros(1, 4, 4, 24), norm_in_weight=torch.ones(24), norm_in_bias=torch.zeros(24),
          p_in_weight=torch.zeros(32, 24), g_in_weight=torch.zeros(32, 24), p_out_weight=torch.zeros(24, 16),
          g_out_weight=torch.zeros(24, 24), backend="triton"), ValueError, "multiples of 16"),
])
def test_clear_errors(change, error, match):
    C, h = 16, 16
    args = dict(z=torch.zeros(1, 4, 4, C), mask=None, norm_in_weight=torch.ones(C), norm_in_bias=torch.zeros(C),
                p_in_weight=torch.zeros(2 * h, C), g_in_weight=torch.zeros(2 * h, C), norm_out_weight=torch.ones(h),
                norm_out_bias=torch.zeros(h), p_out_weight=torch.zeros(C, h), g_out_weight=torch.zeros(C, C),
                backend="torch")
    args.update(change)
    with pytest.raises(error, match=match):
        triangle_multiplication(args.pop("z"), args.pop("mask"), **args)


def test_weight_gradients_accumulate_as_separate_tensors():
    """The weight gradients come back as views of the backward's whole buffers (no copy kernels): two backward
    passes into the same leaves accumulate exactly twice one pass, and each .grad holds only its own weight's."""
    z, pair, weights, dout = make_inputs(1, 9, 16, 16)
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in weights.items()}
    once = run(triangle_multiplication, z, pair, weights, dout, backend="triton")
    for _ in range(2):
        out = triangle_multiplication(z, pair, backend="triton", **leaves)
        out.backward(dout)
    for name, leaf in leaves.items():
        assert leaf.grad.shape == leaf.shape
        torch.testing.assert_close(leaf.grad, 2 * once[name], rtol=1e-6, atol=1e-7, msg=name)
