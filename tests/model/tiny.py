"""Test helper: a tiny model config and batches (real ones from structures.py, padded ones)."""
from __future__ import annotations

import torch

from mini_of3.config import ModelConfig


def tiny_config(**overrides) -> ModelConfig:
    """A model small enough for CPU tests: c_z 16, one block, head dims 16 (the Triton kernel's smallest)."""
    values = dict(n_blocks=1, c_s=32, c_z=16, n_heads_tri=2, c_hidden_tri=16, n_heads_single=2, c_hidden_mul=16,
                  transition_factor=2, pair_dropout=0.0, tri_attn_backend="torch", checkpointing=False,
                  diffusion_blocks=1, diffusion_heads=2, c_token=32, diffusion_samples=2, plddt_rollout_steps=3)
    values.update(overrides)
    return ModelConfig(**values)


def pad_batch(batch: dict[str, torch.Tensor], extra: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """The batch with ``extra`` padded tokens appended, filled with random junk (token_mask False)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, value in batch.items():
        B = value.shape[0]
        shape = (B, extra, *value.shape[2:])
        if key in ("token_mask", "resolved"):
            junk = torch.zeros(shape, dtype=torch.bool)
        elif value.dtype == torch.long:
            junk = torch.randint(0, 21, shape, generator=g)
        else:
            junk = torch.randn(shape, generator=g, dtype=value.dtype) * 30
        out[key] = torch.cat([value, junk], dim=1)
    return out


def random_batch(B: int, N: int, seed: int = 0, chains: int = 1) -> dict[str, torch.Tensor]:
    """A synthetic batch with a compact random-walk Calpha trace per structure."""
    g = torch.Generator().manual_seed(seed)
    steps = torch.randn(B, N, 3, generator=g)
    ca = torch.cumsum(3.8 * steps / steps.norm(dim=-1, keepdim=True), dim=1)
    asym = torch.arange(N).div(-(-N // chains), rounding_mode="floor")[None].expand(B, N) + 1
    return {"restype": torch.randint(0, 21, (B, N), generator=g),
            "residue_index": torch.arange(1, N + 1)[None].expand(B, N).clone(),
            "asym_id": asym.clone(), "entity_id": torch.ones(B, N, dtype=torch.long), "sym_id": asym.clone(),
            "token_mask": torch.ones(B, N, dtype=torch.bool), "ca": ca,
            "cb": ca + torch.randn(B, N, 3, generator=g), "resolved": torch.ones(B, N, dtype=torch.bool)}


def relative_error(actual: torch.Tensor, expected: torch.Tensor, scale: float | None = None) -> float:
    """``|actual - expected| / scale`` in the Frobenius norm, in float64; ``scale`` defaults to ``|expected|``
    (pass the norm of a whole set, e.g. all gradients, for a tensor that is zero up to rounding). Unlike an
    elementwise tolerance it does not depend on how single near-zero elements round, so a bound derived from the
    dtype's epsilon holds on any CPU whatever the order of its sums."""
    diff = float((actual.detach().double() - expected.detach().double()).norm())
    scale = float(expected.detach().double().norm()) if scale is None else scale
    return diff / scale if scale > 0 else diff


def double_batch(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch with its floating-point features in float64 (for tests run in float64)."""
    return {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}


def perturb_zero_parameters(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """``model`` with every all-zero parameter (the residual updates' and heads' final layers, which start at zero,
    and LayerNorm offsets) drawn from a seeded N(0, 1 / fan_in), for tests of a property (padding invariance, equal
    gradients on two backends) that zero layers would satisfy trivially by blocking the signal."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if not p.any():
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * p.shape[-1] ** -0.5)
    return model
