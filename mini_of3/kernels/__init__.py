"""mini_of3's GPU kernels (Triton) and their PyTorch references.

Public API (docs/design.md, Tensor conventions):
    triangle_attention(q, k, v, bias, mask=None, *, activation="softmax", scale=None, sigmoid_bias=None,
                       backend="auto", split_ds=False, mask_queries=False) -> o
    gated_triangle_attention(qkvg, bias, mask=None, *, activation="softmax", scale=None, sigmoid_bias=None,
                             backend="auto", split_ds=False, mask_queries=False) -> sigmoid(g) * o
    triangle_multiplication(z, mask=None, *, direction="outgoing", norm_in_weight, norm_in_bias, p_in_weight,
                            g_in_weight, norm_out_weight, norm_out_bias, p_out_weight, g_out_weight, eps=1e-5,
                            backend="auto") -> [B, N, N, C]
    transition(x, *, norm_weight, norm_bias, a_weight, b_weight, out_weight, eps=1e-5, backend="auto") -> [..., C]
    sigmoid_attention(q, k, v, *, seq_lens_q=None, seq_lens_k=None, cu_seqlens_q=None, cu_seqlens_k=None,
                      max_seqlen_q=None, max_seqlen_k=None, causal=False, scale=None, sigmoid_bias=None,
                      backend="auto") -> o

backend: "triton" (the kernels; CUDA, or CPU under TRITON_INTERPRET=1), "torch" (the reference) or "auto" (triton
where the op's ``kernel_takes`` says the kernel takes the call, else torch).

The room, per op ``<op>``: ``<op>.py`` (the public function, its checks, the custom ops and autograd), ``<op>_host.py``
(tiles and launchers), ``<op>_kernels.py`` (the Triton kernels, their launch order and grids at the top); shared by
all: ``host.py`` (launch, allocation, tile overrides, dispatch), ``primitives.py`` (device-side helpers) and
``reference.py`` (the float64-capable PyTorch references). No op imports another op's modules.
"""
from mini_of3.kernels.reference import (sigmoid_attention_ref, transition_reference, triangle_attention_ref,
                                        triangle_multiplication_reference)
from mini_of3.kernels.sigmoid_attention import sigmoid_attention
from mini_of3.kernels.triangle_attention import gated_triangle_attention, triangle_attention
from mini_of3.kernels.transition import transition
from mini_of3.kernels.triangle_multiplication import triangle_multiplication

__all__ = ["gated_triangle_attention", "sigmoid_attention", "sigmoid_attention_ref", "transition",
           "transition_reference", "triangle_attention", "triangle_attention_ref", "triangle_multiplication",
           "triangle_multiplication_reference"]
