"""Triangle attention backends: one call signature, several implementations (docs/design.md, Tensor conventions).

Every backend takes mini_of3's layout and mask convention and returns the same thing:

    attend(q, k, v, bias, mask, mask_queries=False) -> o
    q, k, v: [B, I, J, H, D] (any strides; the ending node passes transposed views)
    bias:    [B, H, J, K], shared by every row i
    mask:    [B, I, K] bool, True = attend (or None)
    mask_queries: the mask holds for the queries too (the pair mask token_i & token_k): o is 0 at every query j of
             row i where mask[b, i, j] is False, with every backend (our kernels skip that work; an anchor, which
             computes every query, has its output zeroed there)
    o:       [B, I, J, H, D]

    tri_attn_backend(kernels) -> attend                 the choice's ``tri_attn_backend``
    tri_attn_backend_gated(kernels) -> attend_gated     the same with the gate inside our kernels, or None
    pair_bias_attention(kernels) -> attend              the single track's attention (AF3 SI Alg 24)

``mini_of3`` is our fused Triton kernel, ``torch`` its plain PyTorch reference, ``auto`` the kernel where it takes
the call and the reference elsewhere (``mini_of3.model.kernel_choice``). The anchors (``trifast``, ``cueq``,
``of3_triton``) are imported only when chosen; the adapters below map layouts and mask conventions onto theirs and
copy none of their code. They may copy a non-contiguous input internally: that cost is theirs.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from mini_of3.kernels import gated_triangle_attention, triangle_attention
from mini_of3.kernels.triangle_attention import kernel_head_dim, kernel_takes
from mini_of3.model.kernel_choice import OURS, KernelChoice, runs_kernel

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


def _zero_masked_queries(o: torch.Tensor, mask: torch.Tensor | None, mask_queries: bool) -> torch.Tensor:
    """An anchor's o [B, I, J, H, D] with the masked queries' outputs set to 0 (``mask_queries``), as our kernels
    give them: the anchors compute every query."""
    if not mask_queries or mask is None:
        return o
    return o.masked_fill(~mask[:, :, :, None, None], 0.0)


def _ours(kernels: KernelChoice) -> Attend:
    backend, activation, split_ds = kernels.tri_attn_backend, kernels.tri_attn_activation, kernels.tri_attn_split_ds

    def attend(q, k, v, bias, mask, mask_queries=False):
        kernel = "triton" if runs_kernel(backend, kernel_takes(q)) else "torch"
        return triangle_attention(q, k, v, bias, mask, activation=activation, backend=kernel, split_ds=split_ds,
                                  mask_queries=mask_queries)
    return attend


def _trifast(fn) -> Attend:
    def attend(q, k, v, bias, mask, mask_queries=False):
        # trifast: q, k, v [B, H, I, J, D]; bias [B, H, J, K] in q's dtype; mask [B, I, K] with True = masked out
        qt, kt, vt = (x.permute(0, 3, 1, 2, 4) for x in (q, k, v))
        o = fn(qt, kt, vt, bias.to(q.dtype), ~_key_mask(q, mask))          # [B, H, I, J, D]
        return _zero_masked_queries(o.permute(0, 2, 3, 1, 4), mask, mask_queries)
    return attend


def _cueq(fn) -> Attend:
    def attend(q, k, v, bias, mask, mask_queries=False):
        # cuEquivariance: q, k, v [B, I, H, J, D]; bias [B, 1, H, J, K] float32; mask [B, I, 1, 1, K], True = attend
        qt, kt, vt = (x.permute(0, 1, 3, 2, 4) for x in (q, k, v))
        o = fn(qt, kt, vt, bias[:, None].float(), mask=_key_mask(q, mask)[:, :, None, None, :])  # [B, I, H, J, D]
        return _zero_masked_queries(o.permute(0, 1, 3, 2, 4), mask, mask_queries)
    return attend


def _of3_triton(fn) -> Attend:
    def attend(q, k, v, bias, mask, mask_queries=False):
        # OpenFold3 0.5's TritonEvoformer: q, k, v [B, I, J, H, D] ("[Batch, N_seq, N_res, Head, Dim]": our layout);
        # additive mask [B, I, 1, 1, K] and bias [B, 1, H, J, K], both in q's dtype
        # its kernel indexes q, k, v as if contiguous: views of one projection fault (illegal address, H200)
        q, k, v = (x.contiguous() for x in (q, k, v))
        additive = torch.where(_key_mask(q, mask), 0.0, -1e9).to(q.dtype)[:, :, None, None, :]
        o = fn(q, k, v, additive, bias[:, None].to(q.dtype))                # [B, I, J, H, D]
        return _zero_masked_queries(o, mask, mask_queries)
    return attend


# trifast and OpenFold3 launch their Triton kernels from a plain autograd.Function; inside a compiled block inductor
# recompiles such kernels itself and trifast's forward fails there (triton 3.6: "acc.type.element_ty == out_dtype"
# in tl.dot, H200). They run eagerly, a graph break around each call, as a user of them would run them.
_RAW_TRITON_ANCHORS = ("trifast", "of3_triton")


def tri_attn_backend(kernels: KernelChoice) -> Attend:
    """The triangle attention function for ``kernels.tri_attn_backend`` (imports an anchor now)."""
    name = kernels.tri_attn_backend
    if name in OURS:
        return _ours(kernels)
    fn = import_anchor(name, *_ANCHOR_PACKAGES[name])
    attend = {"trifast": _trifast, "cueq": _cueq, "of3_triton": _of3_triton}[name](fn)
    if name in _RAW_TRITON_ANCHORS:
        attend = torch.compiler.disable(attend)
    return attend


def tri_attn_backend_gated(kernels: KernelChoice):
    """For our backends (auto, mini_of3, torch), ``attend_gated(qkvg, bias, mask, mask_queries=False) -> sigmoid(g)
    * o`` with q, k, v and g packed [B, I, J, 4, H, D] (:func:`mini_of3.kernels.gated_triangle_attention`: the gate
    in the kernels, the four gradients in one buffer); None for the anchors, which take q, k, v only (the model gates
    around them)."""
    backend, activation, split_ds = kernels.tri_attn_backend, kernels.tri_attn_activation, kernels.tri_attn_split_ds
    if backend not in OURS:
        return None

    def attend_gated(qkvg, bias, mask, mask_queries=False):
        kernel = "triton" if runs_kernel(backend, kernel_takes(qkvg.select(3, 0), pads_head_dim=False)) else "torch"
        return gated_triangle_attention(qkvg, bias, mask, activation=activation, backend=kernel, split_ds=split_ds,
                                        mask_queries=mask_queries)
    return attend_gated


def pair_bias_attention(kernels: KernelChoice) -> Attend:
    """Softmax attention with pair bias for the single track (AF3 SI Alg 24): the triangle kernel with I = samples.

    The anchors do not take part here: with ``trifast``, ``cueq`` or ``of3_triton`` chosen for the triangle
    attention, this attention runs as with ``auto``, so a backend comparison swaps the triangle attention only.
    ``mini_of3`` takes the Triton kernel, ``torch`` the reference. AF3's single attention has head dim 24: the
    kernel runs it zero-padded to 32 (:func:`mini_of3.kernels.triangle_attention.kernel_head_dim`); above 128 the
    reference takes over.
    """
    backend = kernels.tri_attn_backend if kernels.tri_attn_backend in ("mini_of3", "torch") else "auto"

    def attend(q, k, v, bias, mask, mask_queries=False):
        ours = kernel_head_dim(q.shape[-1]) is not None and runs_kernel(backend, kernel_takes(q))
        return triangle_attention(q, k, v, bias, mask, activation="softmax", backend="triton" if ours else "torch",
                                  mask_queries=mask_queries)
    return attend
