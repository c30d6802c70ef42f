"""Triangle updates of the pair track: multiplication (AF3 SI Alg 12/13) and attention (Alg 14/15)."""
from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from mini_of3.model.kernel_choice import KernelChoice
from mini_of3.model.norm import LayerNorm
from mini_of3.model.projections import linear_channels_first
from mini_of3.model.tri_attn_backends import tri_attn_backend, tri_attn_backend_gated
from mini_of3.model.tri_mul_backends import tri_mul_backend


class TriangleMultiplication(nn.Module):
    """Triangle multiplicative update, outgoing edges (AF3 SI Alg 12) or incoming edges (Alg 13).

    z_ij += g_ij * Linear(LayerNorm(sum_k a_ik * b_jk))   (outgoing; incoming sums a_ki * b_kj)
    with a, b = sigmoid(LinearNoBias(z)) * LinearNoBias(z), masked by the pair mask, and g = sigmoid(LinearNoBias(z)).
    The module owns the parameters under cuEquivariance's names and calls the backend function with them.

    Parameters
    ----------
    c_z : pair channels
    c_hidden : channels of a and b (AF3: 128)
    direction : "outgoing" | "incoming"
    kernels : the kernel choice (its tri_mul_backend: auto | mini_of3 | torch | cueq)
    """

    def __init__(self, *, c_z: int, c_hidden: int, direction: Literal["outgoing", "incoming"],
                 kernels: KernelChoice = KernelChoice()) -> None:
        super().__init__()
        if direction not in ("outgoing", "incoming"):
            raise ValueError(f"TriangleMultiplication: direction must be 'outgoing' or 'incoming', got {direction!r}")
        self.direction = direction
        self.norm_in = LayerNorm(c_z)
        self.p_in = nn.Linear(c_z, 2 * c_hidden, bias=False)
        self.g_in = nn.Linear(c_z, 2 * c_hidden, bias=False)
        self.norm_out = LayerNorm(c_hidden)
        self.p_out = nn.Linear(c_hidden, c_z, bias=False)
        self.g_out = nn.Linear(c_z, c_z, bias=False)
        self.update = tri_mul_backend(kernels)

    def forward(self, z: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        """z: [B, N, N, c_z], pair_mask: [B, N, N] bool -> update [B, N, N, c_z]."""
        return self.update(
            z, pair_mask, direction=self.direction,
            norm_in_weight=self.norm_in.weight, norm_in_bias=self.norm_in.bias,
            p_in_weight=self.p_in.weight, g_in_weight=self.g_in.weight,
            norm_out_weight=self.norm_out.weight, norm_out_bias=self.norm_out.bias,
            p_out_weight=self.p_out.weight, g_out_weight=self.g_out.weight,
            eps=self.norm_in.eps,
        )


class TriangleAttention(nn.Module):
    """Triangle self-attention around the starting node (AF3 SI Alg 14) or the ending node (Alg 15).

    Starting node: o_ij = sum_k softmax_k(q_ij . k_ik / sqrt(c) + b_jk) v_ik (attention along row i).
    Ending node:   o_ij = sum_k softmax_k(q_ij . k_kj / sqrt(c) + b_ki) v_kj (attention along column j),
    which is the starting-node attention on the transposed pair: the layer norm's output is transposed once (in
    the copy that casts it for the projections) and the update is returned as a transposed view. Every node hands
    the kernel q, k, v from one projection and a contiguous bias [B, H, J, K]. Gated by g = sigmoid(LinearNoBias(z)):
    inside our kernels (one projection output in, one gradient buffer out), in PyTorch around an anchor's.

    Parameters
    ----------
    c_z : pair channels
    n_heads, c_hidden : heads and head dim (AF3: 4 x 32)
    node : "starting" | "ending"
    kernels : the kernel choice (its tri_attn_backend, tri_attn_activation, tri_attn_fused_gate: with our backends
        the gate inside the kernels, else in PyTorch; tri_attn_split_ds)
    mask_queries : the pair mask (token_i & token_k) masks the queries too: the update of a pair with a padded token
        is 0 and its attention is skipped (a padded entry costs its real tokens); False computes it. No real pair's
        update depends on it: a padded query is no real pair's key.
    """

    def __init__(self, *, c_z: int, n_heads: int, c_hidden: int, node: Literal["starting", "ending"],
                 kernels: KernelChoice = KernelChoice(), mask_queries: bool = True) -> None:
        super().__init__()
        if node not in ("starting", "ending"):
            raise ValueError(f"TriangleAttention: node must be 'starting' or 'ending', got {node!r}")
        self.node, self.n_heads, self.head_dim = node, n_heads, c_hidden
        self.mask_queries = mask_queries
        self.layer_norm = LayerNorm(c_z)
        self.linear_q = nn.Linear(c_z, n_heads * c_hidden, bias=False)
        self.linear_k = nn.Linear(c_z, n_heads * c_hidden, bias=False)
        self.linear_v = nn.Linear(c_z, n_heads * c_hidden, bias=False)
        self.linear_b = nn.Linear(c_z, n_heads, bias=False)
        self.linear_g = nn.Linear(c_z, n_heads * c_hidden, bias=False)
        self.linear_o = nn.Linear(n_heads * c_hidden, c_z, bias=False)
        self.attend = tri_attn_backend(kernels)
        self.attend_gated = tri_attn_backend_gated(kernels) if kernels.tri_attn_fused_gate else None

    def attention_inputs(self, z: torch.Tensor, pair_mask: torch.Tensor):
        """The kernel's inputs in this node's frame (the pair itself, or its transpose for the ending node).

        z: [B, N, N, c_z], pair_mask: [B, N, N] bool -> qkvg [B, I, J, 4, H, D] (q, k, v and the gate's input g
        along dim 3: one projection's output, contiguous), bias [B, H, J, K] (contiguous), mask [B, I, K]
        (contiguous). The layer norm's output is cast to the autocast dtype and, for the ending node, transposed
        in one copy; then one GEMM makes q, k, v and g, and one more the bias, heads first.
        """
        B, N = z.shape[:2]
        H, D = self.n_heads, self.head_dim
        x = self.layer_norm(z)                                   # [B, N, N, c_z]
        if self.node == "ending":                                # Alg 15 = Alg 14 on the transposed pair
            x, pair_mask = x.transpose(1, 2), pair_mask.transpose(1, 2)
        x = x.to(_projection_dtype(x), memory_format=torch.contiguous_format)
        w = torch.cat([self.linear_q.weight, self.linear_k.weight, self.linear_v.weight, self.linear_g.weight])
        qkvg = torch.nn.functional.linear(x, w).view(B, N, N, 4, H, D)                  # [B, I, J, 4, H, D]
        bias = linear_channels_first(x, self.linear_b.weight)   # [B, H, J, K]: bias[j, k] = b_jk of this frame
        return qkvg, bias, pair_mask.contiguous()

    def forward(self, z: torch.Tensor, pair_mask: torch.Tensor) -> torch.Tensor:
        """z: [B, N, N, c_z], pair_mask: [B, N, N] bool (True = both tokens real) -> update [B, N, N, c_z]."""
        B, N = z.shape[:2]
        qkvg, bias, mask = self.attention_inputs(z, pair_mask)
        if self.attend_gated is not None:    # our kernels: the gate inside, one gradient buffer for q, k, v, g
            o = self.attend_gated(qkvg, bias, mask, mask_queries=self.mask_queries)   # [B, I, J, H, D]
        else:
            q, k, v, g = qkvg.unbind(3)                           # [B, I, J, H, D] each
            o = torch.sigmoid(g) * self.attend(q, k, v, bias, mask, mask_queries=self.mask_queries)
        update = self.linear_o(o.reshape(B, N, N, -1))
        return update if self.node == "starting" else update.transpose(1, 2)   # back to the pair's frame


def _projection_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the projections compute in: autocast's when it is on, else x's."""
    device = x.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
