"""mini_of3's GPU kernels (Triton) and their PyTorch references.

Public API (DESIGN.md, Tensor conventions):
    triangle_attention(q, k, v, bias, mask=None, *, activation="softmax", scale=None, sigmoid_bias=None,
                       backend="auto") -> o
"""
from mini_of3.kernels.reference import triangle_attention_ref
from mini_of3.kernels.triangle_attention import triangle_attention

__all__ = ["triangle_attention", "triangle_attention_ref"]
