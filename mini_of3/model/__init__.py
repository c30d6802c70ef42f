"""The slim AF3-style model: embedder, Pairformer trunk on mini_of3's kernels, distogram, Calpha diffusion, pLDDT.

    build_model(cfg: ModelConfig) -> MiniOF3
    MiniOF3.forward(batch, *, n_recycles, generator=None) -> dict (training outputs, see losses.compute_losses)
    MiniOF3.sample(batch, *, n_recycles, steps, samples, generator=None) -> {coords, plddt, distogram_logits}

Parameters and FLOPs per Pairformer block: ``python -m mini_of3.model.flops [N ...]`` (mini_of3.model.flops).
"""
from mini_of3.model.model import MiniOF3, build_model

__all__ = ["MiniOF3", "build_model"]
