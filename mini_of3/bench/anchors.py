"""The public triangle-attention kernels that mini_of3 is measured against, each called in its own native layout.

Each implementation takes the canonical inputs (q, k, v [B, I, J, H, D], bias [B, H, J, K] float32, mask [B, I, K]
True = attend), converts them ONCE, outside the timed region, into the contiguous layout and dtypes it wants
(so no permute is timed), and maps its outputs and gradients back to the canonical layout for the error check.
Anchors are imported lazily; one that does not import is reported and skipped. No anchor code is copied here:
each is called through its package's public function.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from mini_of3.kernels import triangle_attention, triangle_attention_ref
from mini_of3.kernels.triangle_attention_host import tri_attn_tiles

# canonical [B, I, J, H, D] -> native, and the permutation back
_TO_BHIJD, _FROM_BHIJD = (0, 3, 1, 2, 4), (0, 2, 3, 1, 4)
_TO_BIHJD, _FROM_BIHJD = (0, 1, 3, 2, 4), (0, 1, 3, 2, 4)


@dataclass
class Impl:
    name: str
    bias_dtype: str                                # "fp32" or "input" (the q/k/v dtype)
    native: Callable[..., tuple]                   # (q, k, v, bias, mask) -> native (q, k, v, bias, mask)
    call: Callable[..., torch.Tensor]              # native (q, k, v, bias, mask) -> native o
    back: Callable[[torch.Tensor, str], torch.Tensor]   # (native tensor, "qkvo" | "bias") -> canonical


def _same(t: torch.Tensor, kind: str) -> torch.Tensor:
    return t


def _mini_of3(name: str, bias_fp32: bool = True, fixed: bool = False, split_ds: bool = False) -> Impl:
    """Ours, autotuned (or the fixed default tiles), with a float32 or bf16 bias, with or without the hi+lo split of
    dS (the speed/accuracy trade-off, docs/kernels.md; the model's default: without)."""
    def native(q, k, v, bias, mask):
        return q, k, v, bias if bias_fp32 else bias.to(q.dtype), mask

    def call(q, k, v, bias, mask):
        if fixed:
            with tri_attn_tiles():
                return triangle_attention(q, k, v, bias, mask, backend="triton", split_ds=split_ds)
        return triangle_attention(q, k, v, bias, mask, backend="triton", split_ds=split_ds)
    return Impl(name, "fp32" if bias_fp32 else "input", native, call, _same)


def _torch_eager() -> Impl:
    def call(q, k, v, bias, mask):
        return triangle_attention_ref(q, k, v, bias, mask)
    return Impl("torch", "fp32", lambda *a: a, call, _same)


def _trifast() -> Impl:
    from trifast import triangle_attention as trifast_attention

    def native(q, k, v, bias, mask):
        # trifast: q, k, v [B, H, I, J, D]; bias [B, H, J, K] in q's dtype; mask [B, I, K] True = masked OUT
        qkv = tuple(t.permute(_TO_BHIJD).contiguous() for t in (q, k, v))
        return (*qkv, bias.to(q.dtype).contiguous(), (~mask).contiguous())

    def back(t, kind):
        return t if kind == "bias" else t.permute(_FROM_BHIJD)
    return Impl("trifast", "input", native, trifast_attention, back)


def _cueq() -> Impl:
    from cuequivariance_torch import triangle_attention as cueq_attention

    def native(q, k, v, bias, mask):
        # cuEquivariance: q, k, v [B, I, H, J, D]; bias [B, 1, H, J, K] float32; mask [B, I, 1, 1, K] True = attend
        qkv = tuple(t.permute(_TO_BIHJD).contiguous() for t in (q, k, v))
        return (*qkv, bias[:, None].contiguous(), mask[:, :, None, None, :].contiguous())

    def call(q, k, v, bias, mask):
        return cueq_attention(q, k, v, bias, mask=mask)

    def back(t, kind):
        return t[:, 0] if kind == "bias" else t.permute(_FROM_BIHJD)
    return Impl("cueq", "fp32", native, call, back)


def _of3_triton() -> Impl:
    from openfold3.core.kernels.triton.evoformer import TritonEvoformer

    def native(q, k, v, bias, mask):
        # OpenFold3 0.5: q, k, v [B, N_seq, N_res, H, D] (= canonical); additive mask [B, I, 1, 1, K] and bias
        # [B, 1, H, J, K], both in q's dtype
        additive = torch.where(mask, 0.0, -1e9).to(q.dtype)[:, :, None, None, :].contiguous()
        return q, k, v, bias.to(q.dtype)[:, None].contiguous(), additive

    def call(q, k, v, bias, mask):
        return TritonEvoformer(q, k, v, mask, bias)

    def back(t, kind):
        return t[:, 0] if kind == "bias" else t
    return Impl("of3_triton", "input", native, call, back)


FACTORIES: dict[str, Callable[[], Impl]] = {
    "mini_of3": lambda: _mini_of3("mini_of3"),
    "mini_of3_bf16bias": lambda: _mini_of3("mini_of3_bf16bias", bias_fp32=False),
    "mini_of3_fixed": lambda: _mini_of3("mini_of3_fixed", fixed=True),
    "mini_of3_split": lambda: _mini_of3("mini_of3_split", split_ds=True),
    "trifast": _trifast,
    "cueq": _cueq,
    "of3_triton": _of3_triton,
    "torch": _torch_eager,
}


def load_impls(names: list[str]) -> tuple[list[Impl], dict[str, str]]:
    """The implementations that import, and for the others the reason they were skipped."""
    impls, skipped = [], {}
    for name in names:
        try:
            impls.append(FACTORIES[name]())
        except Exception as err:  # an anchor missing or broken on this machine is reported, not fatal
            skipped[name] = f"{type(err).__name__}: {str(err)[:200]}"
    return impls, skipped


def load_impls_reported(names: str) -> list[Impl]:
    """load_impls for a comma-separated list of names, printing each skipped one with its reason (the development
    scripts under tools/lab/)."""
    impls, skipped = load_impls(names.split(","))
    for name, why in skipped.items():
        print(f"skipped {name}: {why}", flush=True)
    return impls
