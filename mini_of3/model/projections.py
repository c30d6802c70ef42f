"""Projections of the pair track laid out for the attention kernels: heads first, no copies."""
from __future__ import annotations

import torch


def pair_bias_heads_first(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """LinearNoBias over the channels of a pair tensor, written heads first (AF3 SI Alg 14 line 5, Alg 24 line 6).

    x: [B, N, M, C] (contiguous over its last three axes), weight: [H, C] -> bias [B, H, N, M], contiguous.
    One GEMM, weight @ x^T, writes the kernels' bias layout directly: ``Linear(x).permute(0, 3, 1, 2)`` would give
    the same values with heads innermost, a layout whose every bias tile load gathers one element in H.
    """
    B, N, M, C = x.shape
    return torch.matmul(weight, x.reshape(B, N * M, C).mT).view(B, weight.shape[0], N, M)
