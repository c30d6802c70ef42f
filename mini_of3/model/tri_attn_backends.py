"""Triangle attention backends: one call signature, several implementations (DESIGN.md, Tensor conventions).

Every backend takes mini_of3's layout and mask convention and returns the same thing:

    attend(q, k, v, bias, mask) -> o
    q, k, v: [B, I, J, H, D] (any strides; the ending node passes transposed views)
    bias:    [B, H, J, K], shared by every row i
    mask:    [B, I, K] bool, True = attend (or None)
    o:       [B, I, J, H, D]

``mini_of3`` is our fused Triton kernel, ``torch`` its plain PyTorch reference, ``auto`` the kernel on CUDA and the
reference on CPU. The anchors (``trifast``, ``cueq``, ``of3_triton``) are imported only when chosen; the adapters
below map layouts and mask conventions onto theirs and copy none of their code. They may copy a non-contiguous input
internally: that cost is theirs.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from mini_of3.kernels import gated_triangle_attention, triangle_attention
from mini_of3.kernels.triangle_attention import SUPPORTED_HEAD_DIMS

TRI_ATTN_BACKENDS = ("auto", "mini_of3", "torch", "trifast", "cueq", "of3_triton")
_KERNEL_BACKENDS = {"auto": "auto", "mini_of3": "triton", "torch": "torch"}   # ours -> the kernels' backend=
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]

_ANCHOR_PACKAGES = {
    "trifast": ("trifast", "triangle_attention"),
    "cueq": ("cuequivariance_torch", "triangle_attention"),
    "of3_triton": ("openfold3.core.kernels.triton.evoformer", "TritonEvoformer"),
}


def import_anchor(backend: str, module: str, name: str):
    """Import ``module.name`` for an anchor backend, or raise an ImportError that names the missing package."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        package = module.split(".")[0]
        raise ImportError(f"backend {backend!r} needs the package {package!r} ({module}.{name}), which does not "
                          f"import here: {err}") from err


def _key_mask(q: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The mask, or all keys valid: [B, I, K] bool."""
    if mask is not None:
        return mask
    B, I, J = q.shape[:3]
    return torch.ones(B, I, J, dtype=torch.bool, device=q.device)


def _mini_of3(kernel_backend: str, activation: str, split_ds: bool | None) -> Attend:
    def attend(q, k, v, bias, mask):
        return triangle_attention(q, k, v, bias, mask, activation=activation, backend=kernel_backend,
                                  split_ds=split_ds)
    return attend


def _trifast(fn) -> Attend:
    def attend(q, k, v, bias, mask):
        # trifast: q, k, v [B, H, I, J, D]; bias [B, H, J, K] in q's dtype; mask [B, I, K] with True = masked out
        qt, kt, vt = (x.permute(0, 3, 1, 2, 4) for x in (q, k, v))
        o = fn(qt, kt, vt, bias.to(q.dtype), ~_key_mask(q, mask))          # [B, H, I, J, D]
        return o.permute(0, 2, 3, 1, 4)
    return attend


def _cueq(fn) -> Attend:
    def attend(q, k, v, bias, mask):
        # cuEquivariance: q, k, v [B, I, H, J, D]; bias [B, 1, H, J, K] float32; mask [B, I, 1, 1, K], True = attend
        qt, kt, vt = (x.permute(0, 1, 3, 2, 4) for x in (q, k, v))
        o = fn(qt, kt, vt, bias[:, None].float(), mask=_key_mask(q, mask)[:, :, None, None, :])  # [B, I, H, J, D]
        return o.permute(0, 1, 3, 2, 4)
    return attend


def _of3_triton(fn) -> Attend:
    def attend(q, k, v, bias, mask):
        # OpenFold3 0.5's TritonEvoformer: q, k, v [B, I, J, H, D] ("[Batch, N_seq, N_res, Head, Dim]": our layout);
        # additive mask [B, I, 1, 1, K] and bias [B, 1, H, J, K], both in q's dtype
        # its kernel indexes q, k, v as if contiguous: views of one projection fault (illegal address, H200)
        q, k, v = (x.contiguous() for x in (q, k, v))
        additive = torch.where(_key_mask(q, mask), 0.0, -1e9).to(q.dtype)[:, :, None, None, :]
        return fn(q, k, v, additive, bias[:, None].to(q.dtype))             # [B, I, J, H, D]
    return attend


# trifast and OpenFold3 launch their Triton kernels from a plain autograd.Function; inside a compiled block inductor
# recompiles such kernels itself and trifast's forward fails there (triton 3.6: "acc.type.element_ty == out_dtype"
# in tl.dot, H200). They run eagerly, a graph break around each call, as a user of them would run them.
_RAW_TRITON_ANCHORS = ("trifast", "of3_triton")


def tri_attn_backend(name: str, activation: str = "softmax", split_ds: bool | None = None) -> Attend:
    """The triangle attention function for ``model.tri_attn_backend`` = ``name`` (imports an anchor now).

    Parameters
    ----------
    name : one of auto | mini_of3 | torch | trifast | cueq | of3_triton
    activation : softmax | sigmoid (sigmoid only with auto, mini_of3 and torch)
    split_ds : model.tri_attn_split_ds, for our kernel (:func:`mini_of3.kernels.triangle_attention`)
    """
    if name not in TRI_ATTN_BACKENDS:
        raise ValueError(f"tri_attn_backend must be one of {TRI_ATTN_BACKENDS}, got {name!r}")
    if activation not in ("softmax", "sigmoid"):
        raise ValueError(f"tri_attn_activation must be 'softmax' or 'sigmoid', got {activation!r}")
    if name in _KERNEL_BACKENDS:
        return _mini_of3(_KERNEL_BACKENDS[name], activation, split_ds)
    if activation != "softmax":
        raise ValueError(f"tri_attn_backend {name!r} implements softmax attention only, got "
                         f"tri_attn_activation={activation!r}")
    fn = import_anchor(name, *_ANCHOR_PACKAGES[name])
    attend = {"trifast": _trifast, "cueq": _cueq, "of3_triton": _of3_triton}[name](fn)
    if name in _RAW_TRITON_ANCHORS:
        attend = torch.compiler.disable(attend)
    return attend


def tri_attn_backend_gated(name: str, activation: str = "softmax", split_ds: bool | None = None):
    """For our backends (auto, mini_of3, torch), ``attend_gated(qkvg, bias, mask) -> sigmoid(g) * o`` with q, k, v
    and g packed [B, I, J, 4, H, D] (:func:`mini_of3.kernels.gated_triangle_attention`: the gate in the kernels, the
    four gradients in one buffer); None for the anchors, which take q, k, v only (the model gates around them).
    ``name`` and ``activation`` are checked by :func:`tri_attn_backend`; ``split_ds`` as there."""
    if name not in _KERNEL_BACKENDS:
        return None
    kernel_backend = _KERNEL_BACKENDS[name]

    def attend_gated(qkvg, bias, mask):
        return gated_triangle_attention(qkvg, bias, mask, activation=activation, backend=kernel_backend,
                                        split_ds=split_ds)
    return attend_gated


def pair_bias_attention(name: str) -> Attend:
    """Softmax attention with pair bias for the single track (AF3 SI Alg 24): the triangle kernel with I = samples.

    ``name`` is ``model.tri_attn_backend``, but the anchors do not take part here: with ``trifast``, ``cueq`` or
    ``of3_triton`` chosen, this attention still runs OUR kernel (on CUDA; the reference on CPU), as with ``auto``, so
    a backend comparison swaps the triangle attention only. ``mini_of3`` forces the Triton kernel, ``torch`` the
    reference. Either way the reference takes over where the kernel lacks the head dim (it supports 16, 32, 64,
    128): AF3's single attention has head dim 24.
    """
    if name not in TRI_ATTN_BACKENDS:
        raise ValueError(f"tri_attn_backend must be one of {TRI_ATTN_BACKENDS}, got {name!r}")
    preferred = {"mini_of3": "triton", "torch": "torch"}.get(name, "auto")

    def attend(q, k, v, bias, mask):
        backend = preferred if q.shape[-1] in SUPPORTED_HEAD_DIMS else "torch"
        return triangle_attention(q, k, v, bias, mask, activation="softmax", backend=backend)
    return attend
