"""The Pairformer (AF3 SI Alg 17): a block of triangle updates on the pair track and attention on the single track."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mini_of3.model.attention import AttentionPairBias
from mini_of3.model.compiled import run_block
from mini_of3.model.kernel_choice import KernelChoice
from mini_of3.model.transition import Transition
from mini_of3.model.triangle import TriangleAttention, TriangleMultiplication


def shared_dropout(x: torch.Tensor, p: float, shared_dim: int, training: bool) -> torch.Tensor:
    """Dropout whose mask is shared along one axis of x: AF3's DropoutRowwise (shared_dim=1, one mask for every
    row i) and DropoutColumnwise (shared_dim=2). Uses the global RNG, which activation checkpointing replays.

    x: [B, N, N, C] -> [B, N, N, C]
    """
    if not training or p == 0.0:
        return x
    shape = list(x.shape)
    shape[shared_dim] = 1
    keep = torch.empty(shape, device=x.device, dtype=x.dtype).bernoulli_(1.0 - p)
    return x * keep / (1.0 - p)


class PairformerBlock(nn.Module):
    """One Pairformer block (AF3 SI Alg 17, lines 2-8).

    Parameters
    ----------
    c_s, c_z : single and pair channels
    n_heads_tri, c_hidden_tri : triangle attention heads and head dim
    n_heads_single : heads of the single attention with pair bias
    c_hidden_mul : channels of the triangle multiplication
    transition_factor : expansion of both transitions (AF3: 4)
    pair_dropout : rate of the row/column-shared dropout on the triangle updates (AF3: 0.25)
    kernels : which kernel runs each fused layer (mini_of3.model.kernel_choice)
    """

    def __init__(self, *, c_s: int, c_z: int, n_heads_tri: int, c_hidden_tri: int, n_heads_single: int,
                 c_hidden_mul: int, transition_factor: int = 4, pair_dropout: float = 0.25,
                 kernels: KernelChoice = KernelChoice()) -> None:
        super().__init__()
        self.pair_dropout = pair_dropout
        self.tri_mul_out = TriangleMultiplication(c_z=c_z, c_hidden=c_hidden_mul, direction="outgoing",
                                                  kernels=kernels)
        self.tri_mul_in = TriangleMultiplication(c_z=c_z, c_hidden=c_hidden_mul, direction="incoming",
                                                 kernels=kernels)
        attn = dict(c_z=c_z, n_heads=n_heads_tri, c_hidden=c_hidden_tri, kernels=kernels)
        self.tri_attn_start = TriangleAttention(node="starting", **attn)
        self.tri_attn_end = TriangleAttention(node="ending", **attn)
        self.pair_transition = Transition(c=c_z, n=transition_factor, kernels=kernels)
        self.single_attention = AttentionPairBias(c_a=c_s, c_z=c_z, n_heads=n_heads_single, kernels=kernels)
        self.single_transition = Transition(c=c_s, n=transition_factor)

    def forward(self, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """s: [B, N, c_s], z: [B, N, N, c_z], mask: [B, N] bool -> (s, z) of the same shapes."""
        pair_mask = mask[:, :, None] & mask[:, None, :]                       # [B, N, N]
        p, train = self.pair_dropout, self.training
        z = z + shared_dropout(self.tri_mul_out(z, pair_mask), p, 1, train)
        z = z + shared_dropout(self.tri_mul_in(z, pair_mask), p, 1, train)
        z = z + shared_dropout(self.tri_attn_start(z, pair_mask), p, 1, train)
        z = z + shared_dropout(self.tri_attn_end(z, pair_mask), p, 2, train)
        z = z + self.pair_transition(z)
        s = s + self.single_attention(s[:, None], z, mask)[:, 0]             # I = 1: one single track per pair
        s = s + self.single_transition(s)
        return s, z


class PairformerStack(nn.Module):
    """n_blocks Pairformer blocks (AF3 SI Alg 17), all or the first few under activation checkpointing.

    Parameters
    ----------
    n_blocks : number of blocks
    checkpointing : recompute blocks' activations in the backward pass (training with gradients only)
    checkpoint_blocks : with checkpointing, how many blocks recompute (the first ones; None: all). The others keep
        their activations: less recomputation for more memory. The first ones, because the backward reaches them
        last, when the kept activations of the later blocks are already freed.
    **block_kwargs : the PairformerBlock arguments
    """

    def __init__(self, *, n_blocks: int, checkpointing: bool = False, checkpoint_blocks: int | None = None,
                 **block_kwargs) -> None:
        super().__init__()
        self.checkpointed = (n_blocks if checkpoint_blocks is None else checkpoint_blocks) if checkpointing else 0
        self.blocks = nn.ModuleList(PairformerBlock(**block_kwargs) for _ in range(n_blocks))
        self.run_block = run_block          # compiled by mini_of3.model.compiled.compile_blocks

    @property
    def checkpointing(self) -> bool:
        """Whether any block recomputes in the backward (compile_blocks asks: CUDA graphs cannot replay those)."""
        return self.checkpointed > 0

    def forward(self, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """s: [B, N, c_s], z: [B, N, N, c_z], mask: [B, N] bool -> (s, z)."""
        for index, block in enumerate(self.blocks):
            if index < self.checkpointed and torch.is_grad_enabled():
                s, z = checkpoint(self.run_block, block, s, z, mask, use_reentrant=False)
            else:
                s, z = self.run_block(block, s, z, mask)
        return s, z
