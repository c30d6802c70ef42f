"""The fused triangle attention kernel against the float64 reference (Triton interpreter on CPU, or the GPU).

Covering set, not a cross-product (the interpreter is slow): every N in {1, 5, 17, 33, 64}, D in {16, 32, 64, 128},
H in {1, 2}, both activations, fp32 / bf16 / fp16, random masks with fully masked rows, transposed views (the
ending node) and a bias in the input dtype each appear at least once. Outputs are poisoned with NaN beforehand
(MINI_OF3_POISON=1), so an element a kernel forgot to write fails the comparison.
"""
from __future__ import annotations

import functools
import itertools

import pytest
import torch

from mini_of3.kernels import gated_triangle_attention, triangle_attention, triangle_attention_ref
from mini_of3.kernels.triangle_attention import kernel_head_dim
from mini_of3.kernels.triangle_attention_host import TriAttnTiles, tri_attn_tiles

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# relative Frobenius error against float64. The interpreter rounds float32 -> bf16 by truncation (twice the error
# of the GPU's round-to-nearest), hence the bf16 bound; fp32 runs exact IEEE dots.
TOLERANCE = {torch.float32: 2e-5, torch.float16: 4e-3, torch.bfloat16: 1.5e-2}


def make_inputs(B, I, N, H, D, dtype, *, masked, transposed, bias_dtype=torch.float32, seed=0, bias_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    shape = (B, N, I, H, D) if transposed else (B, I, N, H, D)
    q, k, v, do = (torch.randn(shape, generator=g).to(dtype) for _ in range(4))
    if transposed:   # the ending node: [B, J, I, H, D] viewed as [B, I, J, H, D], no copy
        q, k, v, do = (t.transpose(1, 2) for t in (q, k, v, do))
    bias = (torch.randn(B, H, N, N, generator=g) * bias_scale).to(bias_dtype)
    mask = None
    if masked:
        mask = torch.rand(B, I, N, generator=g) > 0.3
        mask[:, 0] = False                          # a fully masked row
        if I > 1:
            mask[:, 1] = True
    to = dict(device=DEVICE)
    return (q.to(**to), k.to(**to), v.to(**to), bias.to(**to), None if mask is None else mask.to(**to), do.to(**to))


def run(fn, q, k, v, bias, mask, do, **kw):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, bias)]
    o = fn(*leaves, mask, **kw)
    o.backward(do)
    return [o.detach()] + [t.grad for t in leaves]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error; the floor of 1 on the norm keeps gradients that are exactly zero in theory (N = 1
    softmax: dq = dk = 0) from dividing rounding noise by zero."""
    return ((x.double() - ref).norm() / ref.norm().clamp(min=1.0)).item()


CASES = [
    # B, I, N, H, D, dtype, activation, masked, transposed, bias dtype
    (1, 3, 1, 1, 16, torch.float32, "softmax", True, False, torch.float32),
    (2, 2, 5, 2, 32, torch.bfloat16, "sigmoid", True, True, torch.float32),
    (1, 3, 17, 1, 64, torch.float32, "sigmoid", False, False, torch.float32),
    (1, 4, 33, 2, 16, torch.bfloat16, "softmax", True, True, torch.float32),
    (1, 2, 64, 1, 128, torch.bfloat16, "softmax", True, False, torch.bfloat16),
    (1, 2, 33, 2, 128, torch.float32, "sigmoid", True, True, torch.float32),
    (1, 3, 64, 2, 32, torch.float16, "softmax", False, False, torch.float16),
    (1, 2, 17, 2, 32, torch.float32, "softmax", True, True, torch.float32),
]


@pytest.mark.parametrize("B,I,N,H,D,dtype,activation,masked,transposed,bias_dtype", CASES)
def test_matches_float64_reference(B, I, N, H, D, dtype, activation, masked, transposed, bias_dtype):
    q, k, v, bias, mask, do = make_inputs(B, I, N, H, D, dtype, masked=masked, transposed=transposed,
                                          bias_dtype=bias_dtype, seed=N * 7 + D)
    got = run(triangle_attention, q, k, v, bias, mask, do, activation=activation, backend="triton")
    ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double(),
              activation=activation)
    for name, g, r in zip(("o", "dq", "dk", "dv", "dbias"), got, ref):
        assert torch.isfinite(g).all(), f"{name} has non-finite or unwritten elements"
        assert g.dtype == (bias_dtype if name == "dbias" else dtype), f"{name} dtype {g.dtype}"
        assert rel_err(g, r) < TOLERANCE[dtype if name != "dbias" else bias_dtype], (name, rel_err(g, r))
    if masked:   # a row with no valid key: output and its gradients exactly zero
        for name, g in zip(("o", "dq", "dk", "dv"), got[:4]):
            assert torch.count_nonzero(g[:, 0]) == 0, f"{name} of a fully masked row is not zero"


def test_single_track_attention_with_pair_bias():
    """I = 1 is attention with pair bias (AF3 SI Alg 24)."""
    q, k, v, bias, mask, do = make_inputs(2, 1, 40, 2, 16, torch.float32, masked=False, transposed=False)
    got = run(triangle_attention, q, k, v, bias, mask, do, backend="triton")
    ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double())
    for g, r in zip(got, ref):
        assert rel_err(g, r) < TOLERANCE[torch.float32]


@pytest.mark.parametrize("activation", ["softmax", "sigmoid"])
def test_extreme_bias_and_masks_stay_finite(activation):
    q, k, v, bias, mask, do = make_inputs(1, 3, 20, 1, 16, torch.float32, masked=True, transposed=False,
                                          bias_scale=1e4)
    got = run(triangle_attention, q, k, v, bias, mask, do, activation=activation, backend="triton")
    ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double(),
              activation=activation)
    for name, g, r in zip(("o", "dq", "dk", "dv", "dbias"), got, ref):
        assert torch.isfinite(g).all(), name
        # scores of magnitude 1e4 carry an float32 ulp of 1e-3 in the exponent: errors of a few 1e-4 are inherent
        assert rel_err(g, r) < 2e-3, (name, rel_err(g, r))


def test_bitwise_repeat_and_chunked_bias_gradient():
    """Three runs give identical bits; the bias gradient summed over 3 chunks of rows equals the reference."""
    q, k, v, bias, mask, do = make_inputs(1, 7, 24, 2, 16, torch.bfloat16, masked=True, transposed=False)
    with tri_attn_tiles(dbias_chunks=3):
        runs = [run(triangle_attention, q, k, v, bias, mask, do, backend="triton") for _ in range(3)]
    for name, first, *again in zip(("o", "dq", "dk", "dv", "dbias"), *runs):
        for other in again:
            assert torch.equal(first, other), f"{name} differs between runs"
    ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double())
    assert rel_err(runs[0][4], ref[4]) < 1e-4


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_delta_is_exact_despite_the_rounded_output(dtype):
    """delta = rowsum(dO * O) must use the unrounded O. The dQ kernel makes it exactly as rowsum(p * dP) and corrects
    its own dQ for the rounded output's delta, so the float32 bias gradient stays near float32 accuracy (below 2e-5
    here, with the interpreter's truncating casts); a delta from the rounded output alone fails this bound."""
    q, k, v, bias, mask, do = make_inputs(1, 6, 40, 2, 32, dtype, masked=True, transposed=False)
    got = run(triangle_attention, q, k, v, bias, mask, do, backend="triton")
    ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double())
    assert rel_err(got[4], ref[4]) < 2e-5, rel_err(got[4], ref[4])


def test_split_ds_reaches_the_kernels():
    """By default (split_ds=False) the backward rounds dS to bf16 once before dS @ k and dS^T @ q; ``split_ds=True``
    adds the product of the rounding residual: dq and dk change and come closer to float64, o, dv and dbias (which
    do not use those products) stay bitwise the same. Both within the bf16 bound."""
    q, k, v, bias, mask, do = make_inputs(1, 3, 33, 2, 16, torch.bfloat16, masked=True, transposed=False)
    rounded = run(triangle_attention, q, k, v, bias, mask, do, backend="triton")
    by_keyword = run(triangle_attention, q, k, v, bias, mask, do, backend="triton", split_ds=False)
    split = run(triangle_attention, q, k, v, bias, mask, do, backend="triton", split_ds=True)
    assert all(torch.equal(a, b) for a, b in zip(rounded, by_keyword)), "the default is split_ds=False"
    ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double())
    for name, a, b, r in zip(("o", "dq", "dk", "dv", "dbias"), split, rounded, ref):
        assert rel_err(a, r) < TOLERANCE[torch.bfloat16 if name != "dbias" else torch.float32], name
        assert rel_err(b, r) < TOLERANCE[torch.bfloat16 if name != "dbias" else torch.float32], name
        assert torch.equal(a, b) == (name not in ("dq", "dk")), name
        if name in ("dq", "dk"):
            assert rel_err(a, r) < rel_err(b, r), name


def test_mask_view_and_its_copy_agree_bitwise():
    """The caller's bool mask is read in the kernels with its own strides (no copy): a non-contiguous view and its
    contiguous copy give the same bits."""
    q, k, v, bias, mask, do = make_inputs(1, 5, 19, 2, 16, torch.bfloat16, masked=True, transposed=False)
    view = mask.transpose(1, 2).contiguous().transpose(1, 2)          # [B, I, K] with strides of [B, K, I]
    runs = [run(triangle_attention, q, k, v, bias, m, do, backend="triton") for m in (view, mask)]
    for name, a, b in zip(("o", "dq", "dk", "dv", "dbias"), *runs):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("dq_rows,prefetch", [(1, 0), (1, 1), (1, 2), (2, 0), (2, 2)])
def test_small_tiles_cover_many_tile_loops(dq_rows, prefetch):
    """16 x 16 tiles: many key and query tiles per row, partial last tiles; one or two rows per dQ program, over an
    odd number of rows; square and 16 x 32 dbias tiles; the dK/dV kernel's q, dO (and bias) loaded in place or one
    query tile ahead (past the last tile: masked)."""
    q, k, v, bias, mask, do = make_inputs(1, 3, 37, 1, 16, torch.float32, masked=True, transposed=True)
    with tri_attn_tiles(fwd_block_j=16, fwd_block_k=16, dq_block_j=16, dq_block_k=16, dq_rows=dq_rows,
                        dbias_block_j=16, dbias_block_k=16 * dq_rows, dkdv_block_j=16, dkdv_block_k=16,
                        dkdv_prefetch=prefetch):
        got = run(triangle_attention, q, k, v, bias, mask, do, backend="triton")
    ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double())
    for g, r in zip(got, ref):
        assert rel_err(g, r) < TOLERANCE[torch.float32]


def test_tiles_take_keywords_only():
    with pytest.raises(TypeError):
        TriAttnTiles(32, 32)
    assert TriAttnTiles(fwd_block_j=32).fwd_block_j == 32


def test_custom_sigmoid_bias_and_scale():
    q, k, v, bias, mask, do = make_inputs(1, 2, 9, 2, 16, torch.float32, masked=True, transposed=False)
    kw = dict(activation="sigmoid", sigmoid_bias=-1.5, scale=0.3)
    got = run(triangle_attention, q, k, v, bias, mask, do, backend="triton", **kw)
    ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double(), **kw)
    for g, r in zip(got, ref):
        assert rel_err(g, r) < TOLERANCE[torch.float32]


def test_torch_backend_is_the_reference_in_the_input_dtype():
    q, k, v, bias, mask, do = make_inputs(1, 2, 12, 2, 16, torch.float32, masked=True, transposed=False)
    got = run(triangle_attention, q, k, v, bias, mask, do, backend="torch")
    ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double())
    for g, r in zip(got, ref):
        assert g.dtype == torch.float32 and rel_err(g, r) < 1e-5


@pytest.mark.parametrize("mask_queries", [False, True])
def test_compiles_as_an_opaque_op(mask_queries):
    """torch.compile traces around the custom op (fake implementation), forward and backward, with no graph break."""
    q, k, v, bias, mask, do = make_inputs(1, 2, 16, 1, 16, torch.float32, masked=True, transposed=False)

    def layer(q, k, v, bias, mask):
        return triangle_attention(q * 1.0, k, v, bias, mask, backend="triton", mask_queries=mask_queries) * 2.0

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    got = run(compiled, q, k, v, bias, mask, do)
    ref = run(layer, q, k, v, bias, mask, do)
    for g, r in zip(got, ref):
        assert torch.equal(g, r)


def test_eager_calls_skip_the_dispatcher(monkeypatch):
    """Outside torch.compile the kernels are called through an autograd.Function, not the custom ops (their dispatch
    is most of a small call's host time); test_compiles_as_an_opaque_op checks that both paths agree bitwise."""
    import sys
    module = sys.modules["mini_of3.kernels.triangle_attention"]

    def unreachable(*args, **kwargs):
        raise AssertionError("the eager path went through torch.library")
    monkeypatch.setattr(module, "_fwd_op", unreachable)
    monkeypatch.setattr(module, "_bwd_op", unreachable)
    q, k, v, bias, mask, do = make_inputs(1, 2, 9, 1, 16, torch.float32, masked=True, transposed=False)
    got = run(triangle_attention, q, k, v, bias, mask, do, backend="triton")
    ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double())
    for g, r in zip(got, ref):
        assert rel_err(g, r) < TOLERANCE[torch.float32]


def test_autotuned_launch_reuses_the_choice_per_key(monkeypatch):
    """The first launch of a key goes through the autotuner; later ones launch its choice directly (grid from the
    chosen block sizes, the launch options passed); a new key (here fp32 tensors instead of bf16) tunes again;
    without autotuning the fixed config is launched."""
    import sys

    import triton
    module = sys.modules["mini_of3.kernels.triangle_attention_host"]
    calls = []

    class Launcher:
        def __init__(self, kind):
            self.kind = kind
            self.best_config = triton.Config({"BLOCK_J": 64, "BLOCK_K": 32}, num_warps=4, num_stages=3)

        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((self.kind, grid, kwargs))

    monkeypatch.setattr(module, "_tuned_kernel", lambda *args: Launcher("autotuner"))
    monkeypatch.setattr(module, "_chosen", {})
    monkeypatch.setattr(module, "_autotune_enabled", lambda: True)
    grid = lambda meta: (10 * meta["BLOCK_J"],)  # noqa: E731
    flags = dict(BLOCK_D=32, HAS_KEY_BIAS=True, SIGMOID=False, SPLIT_DS=True)
    bf16 = torch.zeros(2, dtype=torch.bfloat16)
    for _ in range(3):
        module._launch_tuned("fwd", Launcher("direct"), [], None, grid, (bf16, 3), 1024, flags, ("SPLIT_DS",))
    assert [kind for kind, _, _ in calls] == ["autotuner", "direct", "direct"]
    _, launch_grid, kwargs = calls[1]
    assert launch_grid == (640,) and kwargs["BLOCK_J"] == 64 and kwargs["num_stages"] == 3 and kwargs["SPLIT_DS"]
    module._launch_tuned("fwd", Launcher("direct"), [], None, grid, (bf16.float(), 3), 1024, flags, ("SPLIT_DS",))
    assert calls[-1][0] == "autotuner"
    # without autotuning (interpreter, MINI_OF3_AUTOTUNE=0, tri_attn_tiles) the fixed config is launched as given
    monkeypatch.setattr(module, "_autotune_enabled", lambda: False)
    fixed = triton.Config({"BLOCK_J": 16, "BLOCK_K": 16}, num_warps=2, num_stages=1)
    module._launch_tuned("fwd", Launcher("direct"), [], fixed, grid, (bf16, 3), 1024, flags, ("SPLIT_DS",))
    kind, launch_grid, kwargs = calls[-1]
    assert kind == "direct" and launch_grid == (160,) and kwargs["num_warps"] == 2 and kwargs["BLOCK_K"] == 16


def test_a_tile_override_fixes_the_tiles(monkeypatch):
    """Inside ``with tri_attn_tiles(...)`` (fields or none) the fixed tiles are launched, not the autotuner's."""
    import sys
    module = sys.modules["mini_of3.kernels.triangle_attention_host"]
    for name in ("mini_of3.kernels.triangle_attention_host", "mini_of3.kernels.host"):   # as on the GPU
        monkeypatch.setattr(sys.modules[name], "interpreting", lambda: False)
    monkeypatch.setenv("MINI_OF3_AUTOTUNE", "1")
    assert module._autotune_enabled()
    with tri_attn_tiles():
        assert not module._autotune_enabled()
    with tri_attn_tiles(dq_rows=1):
        assert not module._autotune_enabled() and module.tiles(32).dq_rows == 1
    assert module._autotune_enabled() and module.tiles(32) == TriAttnTiles()


@pytest.mark.parametrize("dtype,mask_queries", [(torch.float32, False), (torch.bfloat16, True)])
def test_opcheck_forward_op(dtype, mask_queries):
    from mini_of3.kernels.triangle_attention import _fwd_op
    q, k, v, bias, mask, _ = make_inputs(1, 2, 16, 1, 16, dtype, masked=True, transposed=False)
    q, k, v, bias = (t.requires_grad_(True) for t in (q, k, v, bias))
    key_bias = torch.where(mask, 0.0, float("-inf"))
    torch.library.opcheck(_fwd_op, (q, k, v, bias, key_bias, False, 0.25, True, True, False, mask_queries),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.parametrize("change,error", [
    (dict(q=torch.zeros(1, 2, 3, 1)), ValueError),                          # 4-D q
    (dict(k=torch.zeros(1, 2, 5, 1, 16)), ValueError),                      # k shape differs
    (dict(bias=torch.zeros(1, 1, 4, 4)), ValueError),                       # bias shape
    (dict(mask=torch.ones(1, 2, 4, dtype=torch.bool)), ValueError),         # mask shape
    (dict(mask=torch.ones(1, 2, 3)), TypeError),                            # mask not bool
    (dict(q=torch.zeros(1, 2, 3, 1, 16, dtype=torch.int32)), TypeError),    # integer q
    (dict(bias=torch.zeros(1, 1, 3, 3, dtype=torch.float16)), TypeError),  # bias dtype neither fp32 nor input's
    (dict(activation="relu"), ValueError),
    (dict(sigmoid_bias=1.0), ValueError),                                   # sigmoid_bias with softmax
    (dict(backend="cuda"), ValueError),
    (dict(mask_queries="yes"), TypeError),
])
def test_clear_errors(change, error):
    args = dict(q=torch.zeros(1, 2, 3, 1, 16), k=torch.zeros(1, 2, 3, 1, 16), v=torch.zeros(1, 2, 3, 1, 16),
                bias=torch.zeros(1, 1, 3, 3), mask=None, activation="softmax", backend="torch")
    args.update(change)
    with pytest.raises(error):
        triangle_attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("bias"), args.pop("mask"), **args)


@pytest.mark.parametrize("activation,gated", [("softmax", False), ("sigmoid", False), ("softmax", True)])
def test_key_tiles_past_the_last_valid_key_are_skipped_exactly(activation, gated):
    """A padded entry (its 17 tokens first, as under data.pad_to_crop, pair mask token_i & token_k; the ending
    layout): every loop stops at its row's last valid key, rows past the entry run none; the output and every
    gradient equal, bit for bit, those of the loops over every key tile, and the float64 reference."""
    n, valid = 34, 17
    token = torch.arange(n) < valid
    mask = (token[:, None] & token[None, :])[None].to(DEVICE)                            # [1, I, K]
    if gated:
        qkvg, bias, _, dout = make_packed(1, n, n, 1, 16, torch.float32, masked=False, transposed=True, seed=5)
        call, inputs = run_gated, (qkvg, bias, mask, dout)
    else:
        q, k, v, bias, _, do = make_inputs(1, n, n, 1, 16, torch.float32, masked=False, transposed=True, seed=5)
        call, inputs = functools.partial(run, triangle_attention), (q, k, v, bias, mask, do)
    skipped = call(*inputs, activation=activation, backend="triton")
    with tri_attn_tiles(skip_masked_keys=False):
        every_tile = call(*inputs, activation=activation, backend="triton")
    for got, full in zip(skipped, every_tile):
        assert torch.equal(got, full)
    if not gated:
        ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double(),
                  activation=activation)
        assert all(rel_err(g, r) < TOLERANCE[torch.float32] for g, r in zip(skipped, ref))
        assert torch.count_nonzero(skipped[0][:, valid:]) == 0                      # rows past the entry: zeros


def test_unsupported_head_dim_for_the_kernel():
    x = torch.zeros(1, 1, 4, 1, 160, device=DEVICE)
    with pytest.raises(ValueError, match="head dim D must be at most 128"):
        triangle_attention(x, x, x, torch.zeros(1, 1, 4, 4, device=DEVICE), backend="triton")
    packed = torch.zeros(1, 1, 4, 4, 1, 24, device=DEVICE)
    with pytest.raises(ValueError, match=r"gated_triangle_attention: head dim D must be one of \(16, 32, 64, 128\)"):
        gated_triangle_attention(packed, torch.zeros(1, 1, 4, 4, device=DEVICE), backend="triton")


@pytest.mark.parametrize("D,padded", [(24, 32), (8, 16), (40, 64), (100, 128)])
def test_other_head_dims_run_zero_padded(D, padded):
    """AF3's single attention (D = 24) and other head dims run the kernel of the next supported head dim on q, k, v
    zero-padded to it; the scale stays 1/sqrt(D), the output and gradients have D channels."""
    assert kernel_head_dim(D) == padded
    q, k, v, bias, mask, do = make_inputs(1, 2, 19, 2, D, torch.float32, masked=True, transposed=True, seed=D)
    got = run(triangle_attention, q, k, v, bias, mask, do, backend="triton")
    ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double())
    for name, g, r in zip(("o", "dq", "dk", "dv", "dbias"), got, ref):
        assert g.shape == r.shape and torch.isfinite(g).all(), name
        assert rel_err(g, r) < TOLERANCE[torch.float32], (name, rel_err(g, r))
    assert got[0].is_contiguous()


# ---------------------------------------------------------------------------------------------------------------
# the gated form: q, k, v, g packed as one projection's output, sigmoid(g) applied in the kernels


def make_packed(B, I, N, H, D, dtype, *, masked, transposed, seed=0):
    """qkvg [B, I, J, 4, H, D] (for ``transposed``, a view of [B, J, I, 4, H, D] as the ending node's), float32 bias,
    mask with a fully masked row, and the output's gradient."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.randn((B, N, I, 4, H, D) if transposed else (B, I, N, 4, H, D), generator=g).to(dtype)
    qkvg = packed.transpose(1, 2) if transposed else packed
    bias = torch.randn(B, H, N, N, generator=g)
    dout = torch.randn(B, I, N, H, D, generator=g).to(dtype)
    mask = None
    if masked:
        mask = torch.rand(B, I, N, generator=g) > 0.3
        mask[:, 0] = False
    to = dict(device=DEVICE)
    return qkvg.to(**to), bias.to(**to), None if mask is None else mask.to(**to), dout.to(**to)


def run_gated(qkvg, bias, mask, dout, **kw):
    leaves = [t.detach().clone().requires_grad_(True) for t in (qkvg, bias)]
    out = gated_triangle_attention(*leaves, mask, **kw)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves]


def gated_reference(qkvg, bias, mask, dout, **kw):
    """sigmoid(g) * the float64 reference (AF3 SI Alg 14 lines 5-6), and its gradients."""
    return run_gated(qkvg.double(), bias.double(), mask, dout.double(), backend="torch", **kw)


@pytest.mark.parametrize("B,I,N,H,D,dtype,activation,masked,transposed", [
    (1, 3, 17, 2, 32, torch.float32, "softmax", True, False),     # odd I: the second dQ row past the end
    (2, 2, 9, 1, 16, torch.bfloat16, "sigmoid", True, True),
    (1, 2, 33, 2, 16, torch.bfloat16, "softmax", False, True),
])
def test_gated_matches_float64_reference(B, I, N, H, D, dtype, activation, masked, transposed):
    """Output, the packed gradient (dq, dk, dv, dg in one buffer, every element written: the buffer is poisoned)
    and dbias. The bf16 dbias bound is the input dtype's: the kernels take dO = dout * sigmoid(g) rounded to bf16,
    as the eager gate's backward under autocast does."""
    qkvg, bias, mask, dout = make_packed(B, I, N, H, D, dtype, masked=masked, transposed=transposed, seed=N + D)
    got = run_gated(qkvg, bias, mask, dout, activation=activation, backend="triton")
    ref = gated_reference(qkvg, bias, mask, dout, activation=activation)
    for name, g, r in zip(("out", "dqkvg", "dbias"), got, ref):
        assert torch.isfinite(g).all(), f"{name} has non-finite or unwritten elements"
        assert g.shape == r.shape and g.dtype == (torch.float32 if name == "dbias" else dtype), name
        assert rel_err(g, r) < TOLERANCE[dtype], (name, rel_err(g, r))
    if masked:   # a row with no valid key: output and all four gradients exactly zero
        assert torch.count_nonzero(got[0][:, 0]) == 0 and torch.count_nonzero(got[1][:, 0]) == 0


def test_gated_repeats_bitwise_and_compiles_as_an_opaque_op():
    """Two eager runs and a compiled one (aot_eager, fullgraph: the gated custom ops) give identical bits."""
    qkvg, bias, mask, dout = make_packed(1, 3, 19, 2, 16, torch.bfloat16, masked=True, transposed=False)

    def layer(qkvg, bias, mask):
        return gated_triangle_attention(qkvg * 1.0, bias, mask, backend="triton") * 2.0

    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    runs = [run_gated(qkvg, bias, mask, dout, backend="triton") for _ in range(2)]
    runs += [[t / 2 if i == 0 else t for i, t in enumerate(fn(qkvg, bias, mask, dout))]
             for fn in (lambda *a: _run_layer(layer, *a), lambda *a: _run_layer(compiled, *a))]
    for name, first, *again in zip(("out", "dqkvg", "dbias"), *runs):
        for other in again:
            assert torch.equal(first, other), name


def _run_layer(layer, qkvg, bias, mask, dout):
    leaves = [t.detach().clone().requires_grad_(True) for t in (qkvg, bias)]
    out = layer(*leaves, mask)
    out.backward(dout * 0.5)          # the layer doubles its output: the same gradient reaches the op
    return [out.detach()] + [t.grad for t in leaves]


def test_gated_opcheck_and_errors():
    from mini_of3.kernels.triangle_attention import _gated_fwd_op
    qkvg, bias, mask, _ = make_packed(1, 2, 16, 1, 16, torch.float32, masked=True, transposed=False)
    qkvg, bias = qkvg.requires_grad_(True), bias.requires_grad_(True)
    torch.library.opcheck(_gated_fwd_op, (qkvg, bias, mask, False, 0.25, True, True, False, True),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    with pytest.raises(ValueError, match="4, H, D"):
        gated_triangle_attention(qkvg[:, :, :, :3], bias, mask)
    with pytest.raises(ValueError, match="bias"):
        gated_triangle_attention(qkvg, bias[:, :, :5], mask)


# ---------------------------------------------------------------------------------------------------------------
# mask_queries: the mask holds for the queries too (the model's pair mask token_i & token_k); a masked query gives 0
# and no gradient, and the kernels skip the query tiles past each row's last valid key


def query_masks(B, I, N, kind, seed=0):
    """[B, I, K] masks: "prefix", rows of padded entries as under data.pad_to_crop (the first N // 3 or N - 7 tokens
    valid, per batch element; the last row a padded token's, no valid key), or "holes", random with a row of no
    valid key."""
    if kind == "prefix":
        valid = torch.tensor([N // 3, N - 7])[:B]
        mask = (torch.arange(N)[None, None, :] < valid[:, None, None]).expand(B, I, N).clone()
        mask[:, -1] = False
    else:
        mask = torch.rand(B, I, N, generator=torch.Generator().manual_seed(seed)) > 0.35
        mask[:, 0] = False
    return mask.to(DEVICE)


TILES_16 = dict(fwd_block_j=16, fwd_block_k=16, dq_block_j=16, dq_block_k=16, dq_rows=1, dbias_block_j=16,
                dbias_block_k=32, dkdv_block_j=16, dkdv_block_k=16, dkdv_prefetch=2)


@pytest.mark.parametrize("B,I,N,H,D,dtype,activation,gated,kind,transposed,tiles", [
    (1, 3, 37, 1, 16, torch.float32, "softmax", False, "prefix", True, {}),
    (2, 3, 50, 2, 32, torch.bfloat16, "sigmoid", False, "holes", False, {}),
    (1, 3, 37, 2, 32, torch.float32, "softmax", True, "holes", False, {}),
    (2, 2, 50, 1, 16, torch.float32, "sigmoid", True, "prefix", True, TILES_16),
])
def test_mask_queries_matches_float64_reference(B, I, N, H, D, dtype, activation, gated, kind, transposed, tiles):
    """mask_queries=True: output and every gradient against the float64 reference (the outputs poisoned); masked
    queries' outputs and dq exactly 0 (and dk, dv, dg: they are masked keys too), dbias exactly 0 in the rows of
    queries masked in every row. For padded entries (prefix masks) the skipped tiles change no bit: the same call
    with the loops over every tile (skip_masked_keys off: no bounds, only the zeroing) gives the same results."""
    mask = query_masks(B, I, N, kind, seed=N)
    kw = dict(activation=activation, mask_queries=True)
    if gated:
        qkvg, bias, _, dout = make_packed(B, I, N, H, D, dtype, masked=False, transposed=transposed, seed=N + D)
        call = functools.partial(run_gated, qkvg, bias, mask, dout)
        ref = gated_reference(qkvg, bias, mask, dout, **kw)
        names = ("out", "dqkvg", "dbias")
    else:
        q, k, v, bias, _, do = make_inputs(B, I, N, H, D, dtype, masked=False, transposed=transposed, seed=N + D)
        call = functools.partial(run, triangle_attention, q, k, v, bias, mask, do)
        ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double(), **kw)
        names = ("o", "dq", "dk", "dv", "dbias")
    with tri_attn_tiles(**tiles):
        got = call(backend="triton", **kw)
    for name, g, r in zip(names, got, ref):
        assert torch.isfinite(g).all(), f"{name} has non-finite or unwritten elements"
        assert rel_err(g, r) < TOLERANCE[dtype if name != "dbias" else torch.float32], (name, rel_err(g, r))
    for name, g in zip(names[:-1], got[:-1]):
        assert torch.count_nonzero(g[~mask]) == 0, f"{name} of a masked query is not zero"
    never = ~mask.any(1)                                                  # [B, J]: queries masked in every row
    assert never.any() and torch.count_nonzero(got[-1].transpose(1, 2)[never]) == 0, "dbias of masked queries"
    if kind == "prefix":
        with tri_attn_tiles(**tiles, skip_masked_keys=False):
            every_tile = call(backend="triton", **kw)
        for name, g, full in zip(names, got, every_tile):
            assert torch.equal(g, full), f"{name}: skipping the padded tiles changed bits"


def test_mask_queries_changes_nothing_without_a_mask_and_is_off_by_default():
    """mask=None: mask_queries=True gives the same bits as False. With a mask, the default is False (every query
    computed: a masked query's output is not zero) and equals mask_queries=False bitwise."""
    q, k, v, bias, mask, do = make_inputs(1, 3, 19, 1, 16, torch.float32, masked=True, transposed=False)
    unmasked = [run(triangle_attention, q, k, v, bias, None, do, backend="triton", mask_queries=flag)
                for flag in (False, True)]
    masked = [run(triangle_attention, q, k, v, bias, mask, do, backend="triton", **kw)
              for kw in ({}, dict(mask_queries=False))]
    for name, a, b, c, d in zip(("o", "dq", "dk", "dv", "dbias"), *unmasked, *masked):
        assert torch.equal(a, b) and torch.equal(c, d), name
    assert torch.count_nonzero(masked[0][0][0, 2][~mask[0, 2]]) > 0       # o of row 2's masked queries


@pytest.mark.slow
@pytest.mark.parametrize("N,D,H,dtype,activation,transposed", list(itertools.product(
    [1, 5, 17, 33, 64], [16, 32, 64, 128], [1, 2], [torch.float32, torch.bfloat16], ["softmax", "sigmoid"],
    [False, True]))[::3])
def test_sweep(N, D, H, dtype, activation, transposed):
    """A third of the full cross-product (every third case), for runs with time to spare: pytest -m slow."""
    q, k, v, bias, mask, do = make_inputs(1, 2, N, H, D, dtype, masked=True, transposed=transposed, seed=N + D)
    got = run(triangle_attention, q, k, v, bias, mask, do, activation=activation, backend="triton")
    ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double(),
              activation=activation)
    for g, r in zip(got, ref):
        assert torch.isfinite(g).all() and rel_err(g, r) < TOLERANCE[dtype]


@pytest.mark.slow
@pytest.mark.parametrize("D", [16, 32, 64, 128])
def test_every_autotune_candidate_of_the_dkdv_kernel(D):
    """The autotuner may pick any candidate on the GPU (tile shapes, q/dO/bias prefetch), so each one is
    checked here against float64 over partial tiles: N = 70 is no multiple of 32, 64 or 128."""
    from mini_of3.kernels.triangle_attention_host import _dkdv_configs
    q, k, v, bias, mask, do = make_inputs(1, 3, 70, 1, D, torch.float32, masked=True, transposed=False, seed=D)
    ref = run(triangle_attention_ref, *(t.double() for t in (q, k, v, bias)), mask, do.double())
    for c in _dkdv_configs(D):
        with tri_attn_tiles(dkdv_block_j=c.kwargs["BLOCK_J"], dkdv_block_k=c.kwargs["BLOCK_K"],
                            dkdv_warps=c.num_warps, dkdv_stages=c.num_stages, dkdv_prefetch=c.kwargs["PREFETCH"]):
            got = run(triangle_attention, q, k, v, bias, mask, do, backend="triton")
        for name, g, r in zip(("o", "dq", "dk", "dv", "dbias"), got, ref):
            assert rel_err(g, r) < TOLERANCE[torch.float32], (c, name)
