"""The slim AF3-style model: embedder, Pairformer trunk on mini_of3's kernels, distogram, Calpha diffusion, pLDDT.

    build_model(cfg: ModelConfig) -> MiniOF3
    MiniOF3.forward(batch, *, n_recycles, generator=None) -> dict (training outputs, see losses.compute_losses)
    MiniOF3.sample(batch, *, n_recycles, steps, samples, generator=None) -> {coords, plddt, distogram_logits}

Which kernel runs each fused layer: ``mini_of3.model.kernel_choice`` (torch-free: importing it, or this package,
loads no torch; ``MiniOF3`` and ``build_model`` are imported on first use). Parameters and FLOPs per Pairformer
block: ``python -m mini_of3.model.flops [N ...]`` (mini_of3.model.flops).
"""
__all__ = ["MiniOF3", "build_model"]


def __getattr__(name: str):
    if name in __all__:
        from mini_of3.model import model
        return getattr(model, name)
    raise AttributeError(f"module 'mini_of3.model' has no attribute {name!r}")
