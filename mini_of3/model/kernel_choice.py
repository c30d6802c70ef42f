"""Which kernel runs each fused layer: the allowed names, and the one object the layers receive.

    KernelChoice(tri_attn_backend="auto", tri_mul_backend="auto", pair_transition_backend="auto",
                 tri_attn_activation="softmax", tri_attn_fused_gate=True, tri_attn_split_ds=False)
    KernelChoice.from_config(model_cfg) -> KernelChoice     the fields of the model config section of the same names
    runs_kernel(backend, kernel_takes) -> bool              whether a layer calls our Triton kernel

The fields keep the names of the config keys (``model.tri_attn_backend`` is ``KernelChoice.tri_attn_backend``) and
are checked once, when the object is made. Every op reads its backend the same way: ``mini_of3`` is our Triton
kernel (CUDA, or CPU under TRITON_INTERPRET=1), ``torch`` the layer's PyTorch code, ``auto`` our kernel where it
takes the call (CUDA tensors of a shape and dtype it supports; the op's ``kernel_takes``) and PyTorch elsewhere (on
the CPU always); the anchors (``trifast``, ``cueq``, ``of3_triton``) are other projects' kernels, imported when a
layer is built. Torch-free, so that the config can take its allowed values from here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

TRI_ATTN_BACKENDS = ("auto", "mini_of3", "torch", "trifast", "cueq", "of3_triton")
TRI_MUL_BACKENDS = ("auto", "mini_of3", "torch", "cueq")
TRANSITION_BACKENDS = ("auto", "mini_of3", "torch")
TRI_ATTN_ACTIVATIONS = ("softmax", "sigmoid")
OURS = ("auto", "mini_of3", "torch")          # the backends served by mini_of3.kernels and the layers' own code


@dataclass(frozen=True, kw_only=True)
class KernelChoice:
    """The kernels of the fused layers (AF3 SI Alg 11-15, 24), resolved from the config once and handed to them.

    Parameters
    ----------
    tri_attn_backend : triangle attention (Alg 14/15); the attention with pair bias (Alg 24) follows it with our
        kernel or PyTorch (``mini_of3``, ``torch``; ``auto`` for the anchors, which take no single track)
    tri_mul_backend : triangle multiplication (Alg 12/13)
    pair_transition_backend : the pair transitions (Alg 11: the Pairformer's, and the two of the diffusion
        conditioning, Alg 21); the single-track transitions run PyTorch
    tri_attn_activation : softmax (AF3) or sigmoid (our kernel and PyTorch only)
    tri_attn_fused_gate : with our backends, the gate sigmoid(g) inside the kernels (one gradient buffer for q, k,
        v, g) rather than in PyTorch around them
    tri_attn_split_ds : our attention backward splits dS into bf16 hi + lo parts before its products with k and q
        (dq, dk errors 1.7e-3 rather than 2.4e-3 at N = 256, D = 32; 583 against 619 ms per step at crop 768 on the
        H100 without the split)
    """
    tri_attn_backend: str = "auto"
    tri_mul_backend: str = "auto"
    pair_transition_backend: str = "auto"
    tri_attn_activation: str = "softmax"
    tri_attn_fused_gate: bool = True
    tri_attn_split_ds: bool = False

    def __post_init__(self) -> None:
        for key, allowed in (("tri_attn_backend", TRI_ATTN_BACKENDS), ("tri_mul_backend", TRI_MUL_BACKENDS),
                             ("pair_transition_backend", TRANSITION_BACKENDS),
                             ("tri_attn_activation", TRI_ATTN_ACTIVATIONS)):
            value = getattr(self, key)
            if value not in allowed:
                raise ValueError(f"model.{key}: got {value!r}, expected one of {', '.join(allowed)}")
        for key in ("tri_attn_fused_gate", "tri_attn_split_ds"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"model.{key}: got {getattr(self, key)!r}, expected true or false")
        if self.tri_attn_activation != "softmax" and self.tri_attn_backend not in OURS:
            raise ValueError(f"model.tri_attn_activation: got {self.tri_attn_activation!r}, but "
                             f"model.tri_attn_backend={self.tri_attn_backend!r} implements softmax attention only "
                             f"(sigmoid needs one of {', '.join(OURS)})")

    @classmethod
    def from_config(cls, cfg) -> KernelChoice:
        """The choice in a model config section (any object with attributes of the fields' names)."""
        return cls(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls)})


def runs_kernel(backend: str, kernel_takes: bool) -> bool:
    """Whether a layer with ``backend`` (one of OURS) calls our Triton kernel: ``mini_of3`` always (the kernel
    raises where it cannot run), ``auto`` where the kernel takes the call, ``torch`` never."""
    return backend == "mini_of3" or (backend == "auto" and kernel_takes)
