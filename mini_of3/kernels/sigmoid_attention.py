"""Sigmoid attention over dense, padded or packed variable-length sequences: the public function, its checks and
the autograd-wired custom ops.

    sigmoid_attention(q, k, v, *, seq_lens_q=None, seq_lens_k=None, cu_seqlens_q=None, cu_seqlens_k=None,
                      max_seqlen_q=None, max_seqlen_k=None, causal=False, scale=None, sigmoid_bias=None,
                      backend="auto") -> o

o_i = sum_k sigmoid(scale q_i . k_k + b) v_k over the valid keys of each sequence (softmax replaced by an
elementwise sigmoid, no normaliser), b = -log(number of valid keys) unless ``sigmoid_bias`` is given. The kernels
are in sigmoid_attention_kernels.py (their docstring gives the launch order and the cost model) and, for Hopper,
sigmoid_attention_hopper.py, launched by sigmoid_attention_host.py (tiles); the forward and backward are
``torch.library`` custom ops with fake implementations, so torch.compile treats them as opaque.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch

from mini_of3.kernels.host import dispatch, eager_function, interpreting, needs_grad
from mini_of3.kernels.reference import sigmoid_attention_ref, sigmoid_bias_table
from mini_of3.kernels.sigmoid_attention_host import backward, forward

SUPPORTED_HEAD_DIMS = (32, 64, 128)
KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
BACKENDS = ("auto", "triton", "torch")
_INT32_OFFSETS = 2**31        # in-sequence offsets (row x token stride) are 32-bit in the kernels


# ---------------------------------------------------------------------------------------------------------------
# custom ops (opaque to torch.compile) and autograd


@torch.library.custom_op("mini_of3::sigmoid_attention_fwd", mutates_args=())
def _fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_q: torch.Tensor | None,
            seq_k: torch.Tensor | None, bias: torch.Tensor | None, layout: str, max_q: int, max_k: int,
            causal: bool, scale: float, bias_value: float | None) -> torch.Tensor:
    return forward(q, k, v, seq_q, seq_k, bias, layout, max_q, max_k, causal, scale, bias_value)


@_fwd_op.register_fake
def _fwd_fake(q, k, v, seq_q, seq_k, bias, layout, max_q, max_k, causal, scale, bias_value):
    return q.new_empty(q.shape)


@torch.library.custom_op("mini_of3::sigmoid_attention_bwd", mutates_args=())
def _bwd_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_q: torch.Tensor | None,
            seq_k: torch.Tensor | None, bias: torch.Tensor | None, layout: str, max_q: int, max_k: int,
            causal: bool, scale: float, bias_value: float | None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return backward(do, q, k, v, seq_q, seq_k, bias, layout, max_q, max_k, causal, scale, bias_value)


@_bwd_op.register_fake
def _bwd_fake(do, q, k, v, seq_q, seq_k, bias, layout, max_q, max_k, causal, scale, bias_value):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, seq_q, seq_k, bias, *rest = inputs
    ctx.save_for_backward(q, k, v, seq_q, seq_k, bias)
    ctx.rest = rest        # layout, max_q, max_k, causal, scale, bias_value


def _autograd_backward(ctx, do, backward_fn=_bwd_op):
    q, k, v, seq_q, seq_k, bias = ctx.saved_tensors
    dq, dk, dv = backward_fn(do, q, k, v, seq_q, seq_k, bias, *ctx.rest)
    return dq, dk, dv, *(None,) * 9


_fwd_op.register_autograd(_autograd_backward, setup_context=_setup_context)
_EagerSigmoidAttention = eager_function("_EagerSigmoidAttention", forward, _setup_context, _autograd_backward,
                                        backward)


# ---------------------------------------------------------------------------------------------------------------
# input checks


class _Sequences(NamedTuple):
    """The layout of one call: dense, padded or varlen; seq_q/seq_k: the lengths [B] (padded) or cu_seqlens
    [S + 1] (varlen), None (dense); max_q/max_k: the longest sequence's queries and keys."""
    layout: str
    seq_q: torch.Tensor | None
    seq_k: torch.Tensor | None
    count: int
    max_q: int
    max_k: int


def _fail(message: str, error: type = ValueError):
    raise error(f"sigmoid_attention: {message}")


def _check_qkv(q, k, v, varlen: bool) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}", TypeError)
    rank, form = (3, "[total, H, D]") if varlen else (4, "[B, T, H, D]")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != rank:
            _fail(f"{name} must be {form}{' (packed, with cu_seqlens)' if varlen else ''}, got shape "
                  f"{tuple(t.shape)}")
    if k.shape != v.shape:
        _fail(f"k and v must have one shape, got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[-2:] != k.shape[-2:]:
        _fail(f"q and k must share H and D, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if not varlen and q.shape[0] != k.shape[0]:
        _fail(f"q and k must share the batch B, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    if q.shape[-1] < 1 or q.shape[-2] < 1:
        _fail(f"H and D must be >= 1, got q {tuple(q.shape)}")
    if q.dtype not in (*KERNEL_DTYPES, torch.float64):
        _fail(f"q dtype must be float16, bfloat16, float32 (or float64 for backend='torch'), got {q.dtype}",
              TypeError)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        _fail(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}", TypeError)
    if k.device != q.device or v.device != q.device:
        _fail(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def _check_index_tensor(name: str, t, shape: tuple, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} must be an int32 tensor, got {type(t).__name__}", TypeError)
    if t.dtype != torch.int32:
        _fail(f"{name} must be int32, got {t.dtype}", TypeError)
    if tuple(t.shape) != shape:
        _fail(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.device != device:
        _fail(f"{name} must be on q's device {device}, got {t.device}")


def _values_checkable(q: torch.Tensor) -> bool:
    """Whether the lengths may be read on the host now (one copy of a few ints): not while torch.compile traces
    nor while a CUDA graph is captured."""
    if torch.compiler.is_compiling():
        return False
    return not (q.is_cuda and torch.cuda.is_current_stream_capturing())


def _padded_sequences(q, k, seq_lens_q, seq_lens_k, check_values: bool) -> _Sequences:
    B, Tq, Tk = q.shape[0], q.shape[1], k.shape[1]
    if seq_lens_q is None and seq_lens_k is None:
        return _Sequences("dense", None, None, B, Tq, Tk)
    lens = []
    for name, t, T in (("seq_lens_q", seq_lens_q, Tq), ("seq_lens_k", seq_lens_k, Tk)):
        if t is None:
            t = torch.full((B,), T, dtype=torch.int32, device=q.device)
        _check_index_tensor(name, t, (B,), q.device)
        if check_values and B > 0:
            low, high = t.min().item(), t.max().item()
            if low < 0 or high > T:
                _fail(f"{name} must lie in [0, {T}] (the padded length), got values in [{low}, {high}]")
        lens.append(t)
    return _Sequences("padded", lens[0], lens[1], B, Tq, Tk)


def _varlen_sequences(q, k, cu_q, cu_k, max_q, max_k, check_values: bool) -> _Sequences:
    for name, t in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.numel() < 2:
            _fail(f"{name} must be an int32 tensor [S + 1] with S >= 1, got "
                  f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        _check_index_tensor(name, t, (cu_q.numel(),), q.device)
    for name, m in (("max_seqlen_q", max_q), ("max_seqlen_k", max_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            _fail(f"{name} must be a Python int >= 0 with cu_seqlens (no device sync), got {m!r}", TypeError)
    if check_values:
        for name, t, total, m, max_name in (("cu_seqlens_q", cu_q, q.shape[0], max_q, "max_seqlen_q"),
                                            ("cu_seqlens_k", cu_k, k.shape[0], max_k, "max_seqlen_k")):
            c = t.tolist()
            if c[0] != 0:
                _fail(f"{name} must start at 0, got {c[0]}")
            lengths = [b - a for a, b in zip(c[:-1], c[1:])]
            if min(lengths) < 0:
                _fail(f"{name} must be non-decreasing, got {c}")
            if c[-1] != total:
                _fail(f"{name}[-1] must equal the packed length {total}, got {c[-1]}")
            if max(lengths) > m:
                _fail(f"{max_name}={m} is smaller than the longest sequence ({max(lengths)} tokens in {name})")
    return _Sequences("varlen", cu_q, cu_k, cu_q.numel() - 1, max_q, max_k)


def _sequences(q, k, seq_lens_q, seq_lens_k, cu_q, cu_k, max_q, max_k) -> _Sequences:
    varlen = cu_q is not None or cu_k is not None
    if varlen and (seq_lens_q is not None or seq_lens_k is not None):
        _fail("give either seq_lens_q/k (padded [B, T, H, D]) or cu_seqlens_q/k (packed [total, H, D]), not both")
    if varlen and (cu_q is None or cu_k is None):
        _fail("packed varlen needs both cu_seqlens_q and cu_seqlens_k")
    if not varlen and (max_q is not None or max_k is not None):
        _fail("max_seqlen_q/k go with cu_seqlens_q/k (packed varlen); the padded layout reads T from the shapes")
    check_values = _values_checkable(q)
    if varlen:
        return _varlen_sequences(q, k, cu_q, cu_k, max_q, max_k, check_values)
    return _padded_sequences(q, k, seq_lens_q, seq_lens_k, check_values)


def _bias_args(sigmoid_bias, seqs: _Sequences, q: torch.Tensor) -> tuple[torch.Tensor | None, float | None]:
    """(table [S, H] float32 or None, scalar or None); both None: b = -log(valid keys)."""
    if sigmoid_bias is None:
        return None, None
    if isinstance(sigmoid_bias, torch.Tensor):
        if not sigmoid_bias.is_floating_point():
            _fail(f"sigmoid_bias tensor must be floating point, got {sigmoid_bias.dtype}", TypeError)
        if sigmoid_bias.device != q.device:
            _fail(f"sigmoid_bias must be on q's device {q.device}, got {sigmoid_bias.device}")
        try:
            table = sigmoid_bias_table(sigmoid_bias.detach(), seqs.count, q.shape[-2])
        except ValueError as err:
            _fail(str(err))
        return table.to(torch.float32), None
    if isinstance(sigmoid_bias, bool) or not isinstance(sigmoid_bias, (int, float)) or \
            not math.isfinite(sigmoid_bias):
        _fail(f"sigmoid_bias must be None, a finite float or a tensor, got {sigmoid_bias!r}", TypeError)
    return None, float(sigmoid_bias)


def _check_kernel_inputs(q: torch.Tensor, seqs: _Sequences) -> None:
    if not q.is_cuda and not interpreting():
        _fail("backend='triton' needs CUDA tensors, or CPU tensors with TRITON_INTERPRET=1 set before mini_of3 is "
              "imported")
    if q.shape[-1] not in SUPPORTED_HEAD_DIMS:
        _fail(f"head dim D must be one of {SUPPORTED_HEAD_DIMS} for the Triton kernel, got {q.shape[-1]}")
    if q.dtype not in KERNEL_DTYPES:
        _fail(f"the Triton kernel takes float16, bfloat16 or float32, got {q.dtype}", TypeError)
    if seqs.count > 65535 or q.shape[-2] > 65535:
        _fail(f"at most 65535 sequences and heads (grid limits), got {seqs.count} and {q.shape[-2]}")


def _check_offsets(seqs: _Sequences, tensors: dict[str, torch.Tensor]) -> None:
    for name, t in tensors.items():
        longest = seqs.max_q if name == "q" else seqs.max_k
        if longest * max(t.stride()[-3:-1]) >= _INT32_OFFSETS:
            _fail(f"{name}: a sequence of {longest} tokens at strides {t.stride()} exceeds the kernels' 32-bit "
                  "offsets within a sequence")


# ---------------------------------------------------------------------------------------------------------------
# public function


def sigmoid_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    seq_lens_q: torch.Tensor | None = None,
    seq_lens_k: torch.Tensor | None = None,
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    causal: bool = False,
    scale: float | None = None,
    sigmoid_bias: float | torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Sigmoid attention: o_i = sum_k sigmoid(scale q_i . k_k + b) v_k over the keys of each sequence that query i
    sees.

    Layouts:
        dense: q [B, Tq, H, D], k, v [B, Tk, H, D]
        padded: the same with ``seq_lens_q`` and/or ``seq_lens_k`` (int32 [B], valid rows first); padded rows of
            o and of the gradients are zero
        packed varlen: q [total_q, H, D], k, v [total_k, H, D] with ``cu_seqlens_q``, ``cu_seqlens_k`` (int32
            [S + 1], as FlashAttention's varlen API) and ``max_seqlen_q``, ``max_seqlen_k`` (Python ints)
    Any token and head strides are taken without copies (a last dim with stride != 1 is made contiguous).
    Args:
        causal: query i of a sequence with Lq queries and Lk keys sees the keys k <= i + Lk - Lq (bottom-right)
        scale: default 1 / sqrt(D)
        sigmoid_bias: b; default -log(number of valid keys of the sequence); a float, or a tensor [S] / [S, 1]
            per sequence, [H] / [1, H] per head, or [S, H] (a constant: no gradient)
        backend: "triton" (D in {32, 64, 128}, float16 / bfloat16 / float32), "torch" (the reference) or "auto"
            (triton on CUDA, else torch)
    Returns:
        o: q's shape and dtype, contiguous. A query that sees no key gives zeros, never NaN. The kernels' o and
        gradients repeat bit for bit between runs (no atomics).
    The lengths are checked on the host (one copy of S + 1 ints) except under torch.compile or CUDA-graph capture.
    Memory: the forward keeps nothing beyond q, k, v; at D = 128 the Triton backward takes a workspace of up to 2
    GiB for the scores' gradient (faster: 5 products per score instead of 7); ``with sigmoid_tiles(scores_budget=0)``
    turns it off (sigmoid_attention_host.Tiles). On sm_90, 16-bit calls at D = 128 without a causal mask, dense or
    packed, run on Gluon kernels instead (sigmoid_attention_hopper.py; no workspace): the backward always, the
    forward from 8192 keys on (``sigmoid_tiles(hopper=0)``: the Triton kernels only).
    """
    if backend not in BACKENDS:
        _fail(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not isinstance(causal, bool):
        _fail(f"causal must be a bool, got {causal!r}", TypeError)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or
                              not math.isfinite(scale)):
        _fail(f"scale must be None or a finite float, got {scale!r}", TypeError)
    varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
    _check_qkv(q, k, v, varlen)
    seqs = _sequences(q, k, seq_lens_q, seq_lens_k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    bias, bias_value = _bias_args(sigmoid_bias, seqs, q)
    if backend == "auto":
        backend = "triton" if q.is_cuda else "torch"
    if backend == "torch":
        return sigmoid_attention_ref(q, k, v, seq_lens_q=seq_lens_q, seq_lens_k=seq_lens_k,
                                     cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, causal=causal,
                                     scale=scale, sigmoid_bias=sigmoid_bias)
    _check_kernel_inputs(q, seqs)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    _check_offsets(seqs, {"q": q, "k": k, "v": v})
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    args = (q, k, v, seqs.seq_q, seqs.seq_k, bias, seqs.layout, seqs.max_q, seqs.max_k, causal, scale, bias_value)
    return dispatch(_fwd_op, _EagerSigmoidAttention, forward, args, needs_grad(q, k, v))
