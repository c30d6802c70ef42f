"""Sigmoid attention's Triton kernels on the GPU at realistic sizes, against float64 on the GPU.

What the interpreter cannot show: the PTX sigmoid evaluations ("rcp", "tanh": inline ex2/rcp/tanh
approximations), the tensor-core tiles at their default sizes, and sequences of thousands of tokens (T up to 2048,
16 packed sequences), through both backwards (dq recomputed, dq from stored scores). Skipped without CUDA.
"""
from __future__ import annotations

import pytest
import torch

from mini_of3.kernels import sigmoid_attention
from mini_of3.kernels.sigmoid_attention_host import SIGMOID_VARIANTS, scores_per_head, sigmoid_tiles
from tests.kernels.test_sigmoid_attention import (NAMES, assert_padding_zero, cumulative, i32, make_inputs,
                                                  reference, rel_err, run)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# round-to-nearest on the GPU: sigma and dS rounded once to the input dtype before their products
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 5e-5}


def assert_matches(got, ref, dtype):
    for name, g, r in zip(NAMES, got, ref):
        assert torch.isfinite(g).all(), f"{name} has non-finite or unwritten elements"
        assert rel_err(g, r) < TOLERANCE[dtype], (name, rel_err(g, r))


def varlen_lengths(n: int, low: int, high: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (n,), generator=g).tolist()


@pytest.mark.parametrize("B,Tq,Tk,H,D,dtype,causal", [
    (2, 2048, 2048, 4, 64, torch.bfloat16, False),
    (1, 1000, 2048, 4, 128, torch.float16, True),
    (2, 1537, 1537, 4, 32, torch.bfloat16, True),
    (1, 2048, 777, 2, 128, torch.bfloat16, True),
    (1, 512, 512, 2, 64, torch.float32, False),
])
def test_dense(B, Tq, Tk, H, D, dtype, causal):
    q, k, v, do = make_inputs((B, Tq, H, D), (B, Tk, H, D), dtype, seed=D)
    got = run(sigmoid_attention, q, k, v, do, causal=causal)
    assert_matches(got, reference(q, k, v, do, causal=causal), dtype)


@pytest.mark.parametrize("D,dtype,causal", [(128, torch.bfloat16, False), (64, torch.float16, True),
                                            (32, torch.bfloat16, True)])
def test_padded(D, dtype, causal):
    lens_q, lens_k = [2048, 1000, 1, 0], [1900, 2048, 0, 5]
    q, k, v, do = make_inputs((4, 2048, 2, D), (4, 2048, 2, D), dtype, seed=D + 1)
    kw = dict(seq_lens_q=i32(lens_q), seq_lens_k=i32(lens_k), causal=causal)
    got = run(sigmoid_attention, q, k, v, do, **kw)
    assert_matches(got, reference(q, k, v, do, **kw), dtype)
    assert_padding_zero(got, lens_q, lens_k)


@pytest.mark.parametrize("D,dtype,causal", [(128, torch.bfloat16, True), (64, torch.bfloat16, False),
                                            (128, torch.float16, False), (32, torch.float16, True)])
def test_packed_varlen_16_sequences(D, dtype, causal):
    lens_q = varlen_lengths(16, 1, 2048, seed=D)
    lens_k = lens_q if causal else varlen_lengths(16, 1, 2048, seed=D + 1)
    q, k, v, do = make_inputs((sum(lens_q), 2, D), (sum(lens_k), 2, D), dtype, seed=D + 2)
    kw = dict(cu_seqlens_q=cumulative(lens_q), cu_seqlens_k=cumulative(lens_k), max_seqlen_q=max(lens_q),
              max_seqlen_k=max(lens_k), causal=causal)
    got = run(sigmoid_attention, q, k, v, do, **kw)
    assert_matches(got, reference(q, k, v, do, **kw), dtype)


@pytest.mark.parametrize("variant", SIGMOID_VARIANTS)
def test_sigmoid_evaluations_on_the_gpu(variant):
    """Every evaluation of the sigmoid, its PTX approximations included, at b = -log(2048) (sigmas ~5e-4). "tanh"
    (TritonSigmoid's) is held only to a loose bound: tanh.approx's error near -1 is large relative to such sigmas."""
    q, k, v, do = make_inputs((1, 2048, 4, 64), (1, 2048, 4, 64), torch.bfloat16, seed=3)
    with sigmoid_tiles(sigmoid=variant):
        got = run(sigmoid_attention, q, k, v, do, causal=True)
    ref = reference(q, k, v, do, causal=True)
    errors = {name: rel_err(g, r) for name, g, r in zip(NAMES, got, ref)}
    print(variant, errors)
    bound = 0.5 if variant == "tanh" else TOLERANCE[torch.bfloat16]
    assert all(torch.isfinite(g).all() for g in got)
    assert max(errors.values()) < bound, errors


def test_bitwise_repeat():
    lens = varlen_lengths(16, 1, 2048, seed=5)
    q, k, v, do = make_inputs((sum(lens), 4, 128), (sum(lens), 4, 128), torch.bfloat16, seed=5)
    kw = dict(cu_seqlens_q=cumulative(lens), cu_seqlens_k=cumulative(lens), max_seqlen_q=max(lens),
              max_seqlen_k=max(lens), causal=True)
    first, *again = [run(sigmoid_attention, q, k, v, do, **kw) for _ in range(3)]
    for other in again:
        for name, a, b in zip(NAMES, first, other):
            assert torch.equal(a, b), f"{name} differs between runs"


@pytest.mark.parametrize("layout,D,dtype,causal", [("dense", 128, torch.bfloat16, False),
                                                   ("padded", 128, torch.float16, True),
                                                   ("varlen", 128, torch.bfloat16, True),
                                                   ("varlen", 64, torch.bfloat16, False),
                                                   ("dense", 32, torch.float32, True)])
def test_backward_from_stored_scores(layout, D, dtype, causal):
    """The Triton kernels' stored-scores backward, every head in one chunk and one head per chunk: float64 holds,
    the chunks agree bit for bit, o, dk and dv equal the recomputing backward's bit for bit."""
    lens_q = varlen_lengths(4, 1, 1500, seed=D) if layout != "dense" else [1500] * 2
    lens_k = lens_q if causal or layout == "dense" else varlen_lengths(4, 1, 1500, seed=D + 1)
    H = 3
    if layout == "varlen":
        q, k, v, do = make_inputs((sum(lens_q), H, D), (sum(lens_k), H, D), dtype, seed=D + 3)
        kw = dict(cu_seqlens_q=cumulative(lens_q), cu_seqlens_k=cumulative(lens_k), max_seqlen_q=max(lens_q),
                  max_seqlen_k=max(lens_k), causal=causal)
        n_seq, max_q, max_k = len(lens_q), max(lens_q), max(lens_k)
    else:
        B, Tq, Tk = len(lens_q), 1500, 1500
        q, k, v, do = make_inputs((B, Tq, H, D), (B, Tk, H, D), dtype, seed=D + 3)
        kw = dict(causal=causal)
        if layout == "padded":
            kw.update(seq_lens_q=i32(lens_q), seq_lens_k=i32(lens_k))
        n_seq, max_q, max_k = B, Tq, Tk
    one_head = scores_per_head(q, k, n_seq, layout, max_q, max_k) * q.element_size()
    with sigmoid_tiles(scores_budget=one_head, hopper=0):
        chunked = run(sigmoid_attention, q, k, v, do, **kw)
    with sigmoid_tiles(scores_budget=H * one_head, hopper=0):
        whole = run(sigmoid_attention, q, k, v, do, **kw)
    with sigmoid_tiles(scores_budget=0, hopper=0):
        recomputed = run(sigmoid_attention, q, k, v, do, **kw)
    assert_matches(whole, reference(q, k, v, do, **kw), dtype)
    for name, a, b, c in zip(NAMES, whole, chunked, recomputed):
        assert torch.equal(a, b), name
        if name != "dq":
            assert torch.equal(a, c), name
    if layout == "padded":
        assert_padding_zero(whole, lens_q, lens_k)


# ---- the Hopper (Gluon) kernels of sigmoid_attention_hopper.py: sm_90 only ----------------------------------------

sm90 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                          reason="needs an sm_90 GPU (H100, H200)")
HOPPER_LAYOUTS = {     # (lengths of the queries, of the keys): odd sizes, an empty sequence, Tq != Tk, one key
    "dense": ([1000] * 2, [1000] * 2),
    "dense Tq != Tk": ([777] * 2, [1537] * 2),
    "varlen": ([1, 0, 2047, 64, 129, 1000, 3], [1, 0, 2047, 64, 129, 1000, 3]),
    "varlen Tq != Tk": ([300, 0, 1500, 65, 7], [1200, 5, 0, 65, 2048]),
}


def hopper_case(layout: str, dtype, H: int = 3, seed: int = 0, D: int = 128, bias=None):
    """(q, k, v, do, kwargs) of a HOPPER_LAYOUTS case; ``bias``: the sigmoid_bias (a scalar, "per head": a table for
    H = 3, None: the default)."""
    lens_q, lens_k = HOPPER_LAYOUTS[layout]
    if layout.startswith("dense"):
        q, k, v, do = make_inputs((len(lens_q), lens_q[0], H, D), (len(lens_k), lens_k[0], H, D), dtype, seed)
        kw = {}
    else:
        q, k, v, do = make_inputs((sum(lens_q), H, D), (sum(lens_k), H, D), dtype, seed)
        kw = dict(cu_seqlens_q=cumulative(lens_q), cu_seqlens_k=cumulative(lens_k), max_seqlen_q=max(lens_q),
                  max_seqlen_k=max(lens_k))
    if bias is not None:
        kw["sigmoid_bias"] = torch.tensor([-1.0, -4.0, -7.5], device=q.device) if bias == "per head" else bias
    return q, k, v, do, kw


def assert_no_further_from_float64(got, baseline, ref, slack: float, label: str) -> list[float]:
    """Every output of ``got`` finite and, against float64, within 1.25x the error of ``baseline`` + slack; -> the
    errors."""
    errors = []
    for name, g, b, r in zip(NAMES, got, baseline, ref):
        assert torch.isfinite(g).all(), f"{name} has non-finite or unwritten elements"
        err, err_baseline = rel_err(g, r), rel_err(b, r)
        print(name, label, f"{err:.2e} (baseline {err_baseline:.2e})")
        assert err <= 1.25 * err_baseline + slack, (name, err, err_baseline)
        errors.append(err)
    return errors


@sm90
@pytest.mark.parametrize("layout", list(HOPPER_LAYOUTS))
@pytest.mark.parametrize("D,dtype,variant,bias", [(128, torch.bfloat16, "rcp", None),
                                                  (128, torch.float16, "tanh", None),
                                                  (128, torch.bfloat16, "tanh", -2.5),
                                                  (128, torch.float16, "rcp", "per head")])
def test_hopper_kernels_match_float64_and_the_triton_kernels(layout, D, dtype, variant, bias):
    """The Gluon kernels against float64: within the tolerance where the Triton kernels are (rcp), and no further
    from float64 than the Triton kernels with the same evaluation (tanh: its error near sigma ~ 0 dominates)."""
    from mini_of3.kernels.sigmoid_attention_host import current_tiles, gluon_takes

    q, k, v, do, kw = hopper_case(layout, dtype, seed=len(layout), D=D, bias=bias)
    with sigmoid_tiles(sigmoid=variant, hopper=1, hopper_fwd_min_keys=0):
        assert gluon_takes(q, k, "varlen" if "cu_seqlens_q" in kw else "dense", kw.get("max_seqlen_k", k.shape[1]),
                           False, current_tiles(D, dtype)) == (True, True)
        got = run(sigmoid_attention, q, k, v, do, **kw)
    with sigmoid_tiles(sigmoid=variant, hopper=0):
        triton_path = run(sigmoid_attention, q, k, v, do, **kw)
    errors = assert_no_further_from_float64(got, triton_path, reference(q, k, v, do, **kw), 1e-3,
                                            f"{layout} {variant}")
    if variant == "rcp":
        assert max(errors) < TOLERANCE[dtype], errors


@sm90
def test_hopper_default_path_per_direction():
    """By default (hopper=1) 16-bit calls at D = 128 run the Gluon backward, and the Gluon forward from
    hopper_fwd_min_keys keys on; D = 64 and causal calls run the Triton kernels."""
    from mini_of3.kernels.sigmoid_attention_host import current_tiles, gluon_takes

    tiles = current_tiles(128, torch.bfloat16)
    q, k = (torch.zeros(1, 16, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    assert gluon_takes(q, k, "dense", tiles.hopper_fwd_min_keys - 1, False, tiles) == (False, True)
    assert gluon_takes(q, k, "dense", tiles.hopper_fwd_min_keys, False, tiles) == (True, True)
    assert gluon_takes(q, k, "dense", tiles.hopper_fwd_min_keys, True, tiles) == (False, False)
    q64, k64 = (x[..., :64] for x in (q, k))
    assert gluon_takes(q64, k64, "dense", 16384, False, current_tiles(64, torch.bfloat16)) == (False, False)


@sm90
@pytest.mark.parametrize("layout", list(HOPPER_LAYOUTS))
@pytest.mark.parametrize("dtype,variant,bias", [(torch.bfloat16, "rcp", None), (torch.float16, "tanh", "per head")])
@pytest.mark.parametrize("fused", [1, 2], ids=["fused", "fused_pairs"])
def test_hopper_fused_backward_matches_float64_and_the_two_kernels(layout, dtype, variant, bias, fused):
    """The one-kernel backward (dQ added over key blocks in a fixed order) no further from float64 than the
    two-kernel one."""
    q, k, v, do, kw = hopper_case(layout, dtype, seed=3 + len(layout), bias=bias)
    with sigmoid_tiles(sigmoid=variant, hopper=1, hopper_fwd_min_keys=0, hopper_bwd_fused=fused):
        one = run(sigmoid_attention, q, k, v, do, **kw)
    with sigmoid_tiles(sigmoid=variant, hopper=1, hopper_fwd_min_keys=0, hopper_bwd_fused=0):
        two = run(sigmoid_attention, q, k, v, do, **kw)
    assert_no_further_from_float64(one, two, reference(q, k, v, do, **kw), 1e-4, f"{layout} {variant}")


@sm90
@pytest.mark.parametrize("layout", ["dense", "varlen Tq != Tk"])
@pytest.mark.parametrize("fused", [0, 1, 2], ids=["two_kernels", "fused", "fused_pairs"])
def test_hopper_kernels_repeat_bitwise(layout, fused):
    q, k, v, do, kw = hopper_case(layout, torch.bfloat16, H=4, seed=11)
    with sigmoid_tiles(hopper=1, hopper_fwd_min_keys=0, hopper_bwd_fused=fused):
        first, *again = [run(sigmoid_attention, q, k, v, do, **kw) for _ in range(3)]
    for other in again:
        for name, a, b in zip(NAMES, first, other):
            assert torch.equal(a, b), f"{name} differs between runs"
