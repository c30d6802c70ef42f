"""Layer normalisation that keeps autocast's dtype: the pair track's layer norms read and write bf16.

Under autocast PyTorch runs ``layer_norm`` in float32: it widens a bf16 input in one pass, writes a float32 output,
and every projection that reads it casts it back to bf16 in another. At N = 768 one pair tensor is 75.5 M values,
and those passes were a quarter of a training step's GPU time (the float32 layer norm kernel and the dtype copies,
in a step of the crop384 config). Here a bf16 (or fp16) input under autocast is normalised in its own dtype: the
CUDA kernel still accumulates the statistics and the affine map in float32 and rounds the output once, to the dtype
the projections would have cast it to. Only the affine weights are rounded to bf16 on the way in.
OpenFold's LayerNorm does the same under bf16.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm over the last axis; under autocast with a 16-bit x, computed and returned in x's dtype."""
    device = x.device.type
    if torch.is_autocast_enabled(device) and x.dtype in (torch.bfloat16, torch.float16):
        with torch.autocast(device, enabled=False):
            return F.layer_norm(x, x.shape[-1:], None if weight is None else weight.to(x.dtype),
                                None if bias is None else bias.to(x.dtype), eps)
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` over the last axis that keeps a 16-bit input's dtype under autocast (:func:`layer_norm`);
    outside autocast it is ``nn.LayerNorm``. Same parameters and names, so checkpoints load either way."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.normalized_shape) != 1:
            return super().forward(x)
        return layer_norm(x, self.weight, self.bias, self.eps)
