"""mini_of3: a minimal, end-to-end protein structure-prediction trainer on fused Triton kernels."""

__version__ = "0.1.0"
