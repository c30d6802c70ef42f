"""Attention with pair bias for the single track (AF3 SI Alg 24), on the triangle attention kernel with I = samples."""
from __future__ import annotations

import torch
from torch import nn

from mini_of3.model.kernel_choice import KernelChoice
from mini_of3.model.norm import LayerNorm
from mini_of3.model.projections import linear_channels_first
from mini_of3.model.transition import AdaLN
from mini_of3.model.tri_attn_backends import pair_bias_attention


class AttentionPairBias(nn.Module):
    """Gated multi-head self-attention over tokens whose logits carry a bias from the pair track (AF3 SI Alg 24).

    In the Pairformer (Alg 17) it runs without conditioning (LayerNorm on a); in the diffusion transformer (Alg 23)
    with conditioning s (AdaLN on a, and an output gate from s). Several copies of the single track that share one
    pair representation (the diffusion samples) are the kernel's rows I: the bias [B, H, N, N] is built once and
    shared, as the triangle kernel shares it over rows.

    Parameters
    ----------
    c_a : channels of the attended track a
    c_z : channels of the pair track z
    n_heads : number of heads; head dim = c_a // n_heads
    c_s : channels of the conditioning s, or None for no conditioning
    kernels : the kernel choice (its tri_attn_backend; mini_of3 uses our kernel when the head dim allows it)
    """

    def __init__(self, *, c_a: int, c_z: int, n_heads: int, c_s: int | None = None,
                 kernels: KernelChoice = KernelChoice()) -> None:
        super().__init__()
        if c_a % n_heads:
            raise ValueError(f"AttentionPairBias: c_a={c_a} must be a multiple of n_heads={n_heads}")
        self.n_heads, self.head_dim = n_heads, c_a // n_heads
        self.conditioned = c_s is not None
        self.norm_a = AdaLN(c_a=c_a, c_s=c_s) if self.conditioned else LayerNorm(c_a)
        self.linear_q = nn.Linear(c_a, c_a)
        self.linear_k = nn.Linear(c_a, c_a, bias=False)
        self.linear_v = nn.Linear(c_a, c_a, bias=False)
        self.layer_norm_z = LayerNorm(c_z)
        self.linear_b = nn.Linear(c_z, n_heads, bias=False)
        self.linear_g = nn.Linear(c_a, c_a, bias=False)
        self.linear_o = nn.Linear(c_a, c_a, bias=False)
        if self.conditioned:
            self.linear_s_gate = nn.Linear(c_s, c_a)
            nn.init.constant_(self.linear_s_gate.bias, -2.0)   # AF3: biasinit = -2
        self.attend = pair_bias_attention(kernels)

    def pair_bias(self, z: torch.Tensor) -> torch.Tensor:
        """z: [B, N, N, c_z] -> bias [B, H, N, N] (b_ij = LinearNoBias(LayerNorm(z_ij)), Alg 24 line 6)."""
        return linear_channels_first(self.layer_norm_z(z), self.linear_b.weight)

    def forward(self, a: torch.Tensor, z: torch.Tensor, mask: torch.Tensor, s: torch.Tensor | None = None,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        """Attention update for a.

        Parameters
        ----------
        a : [B, I, N, c_a] (I = 1 in the Pairformer, I = samples in the diffusion module)
        z : [B, N, N, c_z] pair track, shared by the I rows
        mask : [B, N] bool, True = real token (padding is never attended to)
        s : [B, I, N, c_s] conditioning, only when built with c_s
        bias : [B, H, N, N] a precomputed ``pair_bias(z)`` (the sampler reuses it across steps), else computed

        Returns
        -------
        [B, I, N, c_a] update (the caller adds the residual)
        """
        B, I, N, _ = a.shape
        H, D = self.n_heads, self.head_dim
        a = self.norm_a(a, s) if self.conditioned else self.norm_a(a)
        q = self.linear_q(a).view(B, I, N, H, D)                 # [B, I, N, H, D]
        k = self.linear_k(a).view(B, I, N, H, D)
        v = self.linear_v(a).view(B, I, N, H, D)
        g = torch.sigmoid(self.linear_g(a))                      # [B, I, N, c_a]
        if bias is None:
            bias = self.pair_bias(z)                             # [B, H, N, N]
        bias = bias.to(q.dtype) if bias.dtype not in (torch.float32, q.dtype) else bias
        o = self.attend(q, k, v, bias, mask[:, None, :].expand(B, I, N))   # [B, I, N, H, D]
        out = self.linear_o(g * o.reshape(B, I, N, H * D))
        if self.conditioned:
            out = torch.sigmoid(self.linear_s_gate(s)) * out
        return out
