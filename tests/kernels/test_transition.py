"""The fused SwiGLU transition (AF3 SI Alg 11) against the float64 reference (Triton interpreter on CPU, or the GPU,
where larger cases run too).

Covering set, not a cross-product: row counts that are no multiple of the 16-row tiles, C in {16, 32, 48} (48:
channel tiles padded to 64), hidden widths of one, several and a partial chunk, float32 and bf16 x, with and without
bf16 autocast (and once fp16), and leading shapes of two to four axes. Outputs are poisoned with NaN beforehand
(MINI_OF3_POISON=1, conftest.py). Errors are norm-relative against float64 (the output, dx and every weight gradient
on its own).
"""
from __future__ import annotations

import pytest
import torch

from mini_of3.bench.common import rel_err
from mini_of3.kernels import transition, transition_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("out", "dx", "norm_weight", "norm_bias", "a_weight", "b_weight", "out_weight")
# Norm-relative bounds against float64, from the compute precision (as test_triangle_multiplication.py):
# - float32: a few float32 roundings summed in other orders; 2**7 eps = 1.5e-5 bounds them, a wrong index gives ~1e-1.
# - bf16: x, h and the output (backward: dh's operands, da / db, the weight GEMMs' operands) each pass about three
#   roundings to bf16 in series, u = 2^-8 (the interpreter truncates: up to 2u). Measured 8e-3 to 1.3e-2 under the
#   interpreter (the eager version under autocast 6e-3); bound 3e-2.
# - fp16: the same count of roundings with u = 2^-11; bound 4e-3.
TOLERANCE = {torch.float32: 2 ** 7 * torch.finfo(torch.float32).eps, torch.bfloat16: 3e-2, torch.float16: 4e-3}


def make_inputs(shape, C, factor, *, x_dtype=torch.float32, seed=0):
    """x [*shape, C], the five weights (a non-trivial LayerNorm affine) and an output gradient, on DEVICE."""
    g = torch.Generator().manual_seed(seed)
    hid = factor * C
    weights = dict(norm_weight=1 + 0.2 * torch.randn(C, generator=g), norm_bias=0.2 * torch.randn(C, generator=g),
                   a_weight=torch.randn(hid, C, generator=g) / C ** 0.5,
                   b_weight=torch.randn(hid, C, generator=g) / C ** 0.5,
                   out_weight=torch.randn(C, hid, generator=g) / hid ** 0.5)
    x = (1.5 * torch.randn(*shape, C, generator=g) + 0.3).to(x_dtype)
    dout = torch.randn(*shape, C, generator=g)
    return x.to(DEVICE), {k: v.to(DEVICE) for k, v in weights.items()}, dout.to(DEVICE)


def run(fn, x, weights, dout, *, autocast=None, **kwargs) -> dict[str, torch.Tensor]:
    """Output and the gradients of x and every weight (fresh leaves), optionally under autocast(dtype)."""
    xl = x.detach().clone().requires_grad_(True)
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in weights.items()}
    with torch.autocast(x.device.type, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
        out = fn(xl, **leaves, **kwargs)
    out.backward(dout.to(out.dtype))
    return {"out": out.detach(), "dx": xl.grad, **{k: v.grad for k, v in leaves.items()}}


def reference(x, weights, dout) -> dict[str, torch.Tensor]:
    return run(transition_reference, x.double(), {k: v.double() for k, v in weights.items()}, dout.double())


CASES = [
    # leading shape, C, factor, x dtype, autocast
    ((1, 7, 9), 16, 4, torch.float32, None),
    ((2, 5, 5), 32, 4, torch.float32, torch.bfloat16),
    ((1, 6, 6), 48, 1, torch.float32, torch.bfloat16),      # hidden 48: one full and one partial 16-channel chunk
    ((3, 11), 16, 2, torch.bfloat16, torch.bfloat16),
    ((1, 2, 3, 5), 16, 4, torch.bfloat16, None),
    ((1, 5, 7), 32, 2, torch.float32, torch.float16),
]
GPU_CASES = [
    ((1, 97, 97), 128, 4, torch.float32, torch.bfloat16),
    ((1, 64, 64), 128, 4, torch.float32, None),
    ((2, 300), 256, 4, torch.float32, torch.bfloat16),      # the widest C the kernel takes (its own tiles)
    ((1, 40, 40), 192, 2, torch.float32, torch.bfloat16),
]


def check_case(shape, C, factor, x_dtype, autocast):
    x, weights, dout = make_inputs(shape, C, factor, x_dtype=x_dtype, seed=C + factor + len(shape))
    got = run(transition, x, weights, dout, autocast=autocast, backend="triton")
    ref = reference(x, weights, dout)
    compute = autocast or x_dtype
    assert got["out"].dtype == compute and got["out"].shape == x.shape
    for name in NAMES:
        g = got[name]
        assert torch.isfinite(g).all(), f"{name} has non-finite or unwritten elements"
        expected_dtype = x_dtype if name == "dx" else (compute if name == "out" else torch.float32)
        assert g.dtype == expected_dtype, (name, g.dtype)
        assert rel_err(g, ref[name]) < TOLERANCE[compute], (name, rel_err(g, ref[name]))


@pytest.mark.parametrize("shape,C,factor,x_dtype,autocast", CASES)
def test_matches_float64_reference(shape, C, factor, x_dtype, autocast):
    check_case(shape, C, factor, x_dtype, autocast)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="larger sizes run on the GPU only")
@pytest.mark.parametrize("shape,C,factor,x_dtype,autocast", GPU_CASES)
def test_matches_float64_reference_gpu_sizes(shape, C, factor, x_dtype, autocast):
    check_case(shape, C, factor, x_dtype, autocast)


@pytest.mark.parametrize("tiles", [dict(fwd_m=32, fwd_hc=32, bwd_m=32, bwd_hc=64),
                                   dict(fwd_m=16, fwd_hc=64, fwd_warps=8, bwd_m=64, bwd_hc=16)])
def test_other_tiles_compute_the_same_function(tiles):
    """Any tiles (a sweep on the GPU) meet the float64 reference: 35 rows span one to three programs, hidden 64 one
    to four chunks."""
    from mini_of3.kernels.transition_host import transition_tiles
    with transition_tiles(**tiles):
        check_case((1, 5, 7), 16, 4, torch.float32, torch.bfloat16)
    with pytest.raises(ValueError, match="unknown fields"), transition_tiles(block_m=64):
        pass


def test_bitwise_repeat():
    """Two runs give identical bits: output, dx and every weight gradient (no atomics, fixed-order sums)."""
    shape, C = ((1, 97, 97), 128) if DEVICE == "cuda" else ((1, 9, 7), 16)
    x, weights, dout = make_inputs(shape, C, 4)
    runs = [run(transition, x, weights, dout, autocast=torch.bfloat16, backend="triton") for _ in range(2)]
    for name in NAMES:
        assert torch.equal(runs[0][name], runs[1][name]), f"{name} differs between runs"


def test_inference_path_equals_the_autograd_path():
    """Without gradients the forward runs without an autograd node and keeps no statistics; same bits."""
    x, weights, dout = make_inputs((1, 5, 7), 16, 4)
    with_grad = run(transition, x, weights, dout, backend="triton")
    with torch.no_grad():
        plain = transition(x, backend="triton", **weights)
    assert torch.equal(plain, with_grad["out"])


def test_strided_input_equals_its_copy():
    """A transposed view of x (rows not contiguous) gives the bits of its contiguous copy."""
    x, weights, dout = make_inputs((1, 6, 5), 16, 4)
    view = x.transpose(1, 2)
    runs = [run(transition, v, weights, dout.transpose(1, 2), backend="triton") for v in (view, view.contiguous())]
    for name in NAMES:
        assert torch.equal(runs[0][name], runs[1][name]), name


def test_compiles_as_an_opaque_op():
    """torch.compile (fullgraph) traces around the custom op (fake implementations), forward and backward, and gets
    the eager path's bits."""
    x, weights, dout = make_inputs((1, 5, 6), 16, 4)

    def layer(x, **w):
        return transition(x * 1.0, backend="triton", **w) * 2.0

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    got = run(compiled, x, weights, dout, autocast=torch.bfloat16)
    ref = run(layer, x, weights, dout, autocast=torch.bfloat16)
    for name in NAMES:
        assert torch.equal(got[name], ref[name]), name


def test_opcheck_ops():
    from mini_of3.kernels.transition import _bwd_op, _fwd_op, forward
    x, weights, dout = make_inputs((1, 4, 5), 16, 2)
    w = [weights[n] for n in ("norm_weight", "norm_bias", "a_weight", "b_weight", "out_weight")]
    args = (x.requires_grad_(True), *(t.requires_grad_(True) for t in w), 1e-5, torch.bfloat16, torch.bfloat16, True)
    torch.library.opcheck(_fwd_op, args, test_utils=("test_schema", "test_autograd_registration",
                                                     "test_faketensor"))
    x, w = x.detach(), [t.detach() for t in w]
    _, *residuals = forward(x, *w, 1e-5, torch.bfloat16, torch.bfloat16, True)
    torch.library.opcheck(_bwd_op, (dout.bfloat16(), x, *w, *residuals, torch.bfloat16),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_backend_is_the_reference():
    x, weights, dout = make_inputs((1, 5, 5), 16, 4)
    got = run(transition, x, weights, dout, backend="torch")
    ref = reference(x, weights, dout)
    for name in NAMES:
        assert rel_err(got[name], ref[name]) < TOLERANCE[torch.float32], name


@pytest.mark.parametrize("change,error,match", [
    (dict(x=torch.zeros(16)), ValueError, "x must be"),
    (dict(x=torch.zeros(2, 16, dtype=torch.int32)), TypeError, "x dtype"),
    (dict(a_weight=torch.zeros(64, 8)), ValueError, "a_weight must be"),
    (dict(out_weight=torch.zeros(16, 32)), ValueError, "out_weight must be"),
    (dict(norm_bias=torch.zeros(15)), ValueError, "norm_bias must be"),
    (dict(backend="cuda"), ValueError, "backend"),
    (dict(x=torch.zeros(0, 16)), ValueError, ">= 1"),
    (dict(x=torch.zeros(2, 24), norm_weight=torch.ones(24), norm_bias=torch.zeros(24), a_weight=torch.zeros(64, 24),
          b_weight=torch.zeros(64, 24), out_weight=torch.zeros(24, 64), backend="triton"), ValueError,
     "multiples of 16"),
    (dict(x=torch.zeros(2, 272), norm_weight=torch.ones(272), norm_bias=torch.zeros(272),
          a_weight=torch.zeros(544, 272), b_weight=torch.zeros(544, 272), out_weight=torch.zeros(272, 544),
          backend="triton"), ValueError, "C <= 256"),
])
def test_clear_errors(change, error, match):
    C = 16
    args = dict(x=torch.zeros(2, 3, C), norm_weight=torch.ones(C), norm_bias=torch.zeros(C),
                a_weight=torch.zeros(4 * C, C), b_weight=torch.zeros(4 * C, C), out_weight=torch.zeros(C, 4 * C),
                backend="torch")
    args.update(change)
    with pytest.raises(error, match=match):
        transition(args.pop("x"), **args)


@pytest.mark.parametrize("C,dtype,expected", [(128, torch.float32, "triton"), (128, torch.bfloat16, "triton"),
                                              (384, torch.float32, "torch"), (24, torch.float32, "torch"),
                                              (128, torch.float64, "torch")])
def test_auto_takes_the_kernel_only_for_cuda_tensors_it_fits(monkeypatch, C, dtype, expected):
    """backend="auto" on a CUDA tensor (faked here): the kernel where C <= 256, C and the hidden width are multiples
    of 16 and the dtype is a 16- or 32-bit float; else the reference."""
    from mini_of3.kernels.transition import _resolve_backend
    x = torch.zeros(2, C, dtype=dtype)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    assert _resolve_backend("auto", x, 4 * C) == expected


def test_weight_gradients_accumulate_as_separate_tensors():
    """The weight gradients come back as views of the backward's whole buffers (no copy kernels): two backward
    passes into the same leaves accumulate exactly twice one pass."""
    x, weights, dout = make_inputs((1, 5, 7), 16, 4)
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in weights.items()}
    once = run(transition, x, weights, dout, backend="triton")
    for _ in range(2):
        transition(x, backend="triton", **leaves).backward(dout)
    for name, leaf in leaves.items():
        assert leaf.grad.shape == leaf.shape
        torch.testing.assert_close(leaf.grad, 2 * once[name], rtol=1e-6, atol=1e-7, msg=name)
