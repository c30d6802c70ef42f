"""Projections of the pair track written channels first, the layout the kernels and the contraction want."""
from __future__ import annotations

import torch


def linear_channels_first(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """LinearNoBias over the channels of a pair tensor, written channels first: x [B, N, M, C] (contiguous over its
    last three axes), weight [H, C] -> [B, H, N, M], contiguous.

    One GEMM, weight @ x^T, writes this layout directly, where ``Linear(x).permute(0, 3, 1, 2)`` gives the same
    values with the channels innermost: as an attention bias (AF3 SI Alg 14 line 5, Alg 24 line 6) every bias tile
    load then gathers one element in H, and the triangle multiplication's per-channel contraction (Alg 12/13) would
    need a permuted copy.
    """
    B, N, M, C = x.shape
    return torch.matmul(weight, x.reshape(B, N * M, C).mT).view(B, weight.shape[0], N, M)
