"""Transitions: the SwiGLU transition (AF3 SI Alg 11), adaptive LayerNorm (Alg 26), conditioned transition (Alg 25)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mini_of3.kernels import transition
from mini_of3.kernels.transition import kernel_takes
from mini_of3.model.kernel_choice import KernelChoice, runs_kernel
from mini_of3.model.norm import LayerNorm


class Transition(nn.Module):
    """Transition layer (AF3 SI Alg 11): LayerNorm, then a SwiGLU of width n * c, then back to c.

    Parameters
    ----------
    c : channels of the input and output
    n : expansion factor (4 in the Pairformer, 2 in the diffusion conditioning)
    kernels : for the pair transitions (Pairformer, diffusion conditioning), the kernel choice, whose
        pair_transition_backend picks
        "torch" (PyTorch, as below), "mini_of3" (our fused kernel, :func:`mini_of3.kernels.transition`: the hidden
        activations stay on the chip; CUDA, or CPU under TRITON_INTERPRET=1) or "auto" (the kernel on CUDA where it
        takes the widths and dtype: c <= 256, c and n c multiples of 16, 16- or 32-bit floats; else PyTorch);
        None (the single-track transitions): PyTorch
    """

    def __init__(self, *, c: int, n: int = 4, kernels: KernelChoice | None = None) -> None:
        super().__init__()
        self.backend = "torch" if kernels is None else kernels.pair_transition_backend
        self.layer_norm = LayerNorm(c)
        self.linear_a = nn.Linear(c, n * c, bias=False)
        self.linear_b = nn.Linear(c, n * c, bias=False)
        self.linear_out = nn.Linear(n * c, c, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., c] -> update [..., c] (the caller adds the residual)."""
        if runs_kernel(self.backend, kernel_takes(x, self.linear_a.out_features)):
            return transition(x, norm_weight=self.layer_norm.weight, norm_bias=self.layer_norm.bias,
                              a_weight=self.linear_a.weight, b_weight=self.linear_b.weight,
                              out_weight=self.linear_out.weight, eps=self.layer_norm.eps, backend="triton")
        x = self.layer_norm(x)
        return self.linear_out(F.silu(self.linear_a(x)) * self.linear_b(x))


class AdaLN(nn.Module):
    """Adaptive LayerNorm (AF3 SI Alg 26): normalise a, then scale and shift it from the conditioning s.

    a = sigmoid(Linear(LN(s))) * LN(a) + LinearNoBias(LN(s)), LN(a) without scale and offset, LN(s) without offset.
    """

    def __init__(self, *, c_a: int, c_s: int) -> None:
        super().__init__()
        self.layer_norm_a = LayerNorm(c_a, elementwise_affine=False)
        self.layer_norm_s = LayerNorm(c_s, bias=False)
        self.linear_scale = nn.Linear(c_s, c_a)
        self.linear_shift = nn.Linear(c_s, c_a, bias=False)

    def forward(self, a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """a: [..., N, c_a], s: [..., N, c_s] -> [..., N, c_a]."""
        a = self.layer_norm_a(a)
        s = self.layer_norm_s(s)
        return torch.sigmoid(self.linear_scale(s)) * a + self.linear_shift(s)


class ConditionedTransitionBlock(nn.Module):
    """SwiGLU transition conditioned on s through AdaLN and an output gate (AF3 SI Alg 25).

    Parameters
    ----------
    c_a : channels of a; c_s : channels of the conditioning s; n : expansion factor (AF3: 2)
    """

    def __init__(self, *, c_a: int, c_s: int, n: int = 2) -> None:
        super().__init__()
        self.ada_ln = AdaLN(c_a=c_a, c_s=c_s)
        self.linear_a = nn.Linear(c_a, n * c_a, bias=False)
        self.linear_b = nn.Linear(c_a, n * c_a, bias=False)
        self.linear_out = nn.Linear(n * c_a, c_a, bias=False)
        self.linear_gate = nn.Linear(c_s, c_a)
        nn.init.constant_(self.linear_gate.bias, -2.0)     # AF3: biasinit = -2, the block starts nearly closed

    def forward(self, a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """a: [..., N, c_a], s: [..., N, c_s] -> update [..., N, c_a]."""
        a = self.ada_ln(a, s)
        b = F.silu(self.linear_a(a)) * self.linear_b(a)
        return torch.sigmoid(self.linear_gate(s)) * self.linear_out(b)
