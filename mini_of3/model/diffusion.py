"""A slim AF3 diffusion module over one atom per token (Calpha): conditioning, transformer, EDM preconditioning.

AF3 SI Alg 20-23 without the atom-level encoder and decoder: the noisy Calpha coordinates enter the token track
through one linear layer and leave it through another. The sampler and the augmentation are in sampler.py.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mini_of3.model.attention import AttentionPairBias
from mini_of3.model.compiled import run_block, run_sampler_step
from mini_of3.model.embedder import RelativePositionEncoding
from mini_of3.model.kernel_choice import KernelChoice
from mini_of3.model.norm import LayerNorm
from mini_of3.model.transition import ConditionedTransitionBlock, Transition


class FourierEmbedding(nn.Module):
    """Fourier embedding of the noise level (AF3 SI Alg 22): cos(2 pi (t w + b)), w and b ~ N(0, 1) fixed at init."""

    def __init__(self, *, c: int = 256) -> None:
        super().__init__()
        self.register_buffer("w", torch.randn(c))
        self.register_buffer("b", torch.randn(c))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """t: [...] -> [..., c]."""
        return torch.cos(2 * math.pi * (t[..., None] * self.w + self.b))


class DiffusionConditioning(nn.Module):
    """Conditioning of the diffusion module on the trunk and the noise level (AF3 SI Alg 21).

    Pair: z = LinearNoBias(LayerNorm([z_trunk, relpos])) + 2 transitions, independent of the noise level, so the
    sampler computes it once. Single: s = LinearNoBias(LayerNorm([s_trunk, s_inputs])) +
    LinearNoBias(LayerNorm(Fourier(log(t / sigma_data) / 4))) + 2 transitions, one per noise level.
    """

    def __init__(self, *, c_s: int, c_z: int, c_inputs: int, sigma_data: float, c_fourier: int = 256,
                 kernels: KernelChoice | None = None) -> None:
        super().__init__()
        self.sigma_data = sigma_data
        self.relpos = RelativePositionEncoding(c_z=c_z)
        self.layer_norm_z = LayerNorm(2 * c_z)
        self.linear_z = nn.Linear(2 * c_z, c_z, bias=False)
        # the pair transitions on the fused kernel where pair_transition_backend takes it: hidden [N, N, 2 c_z]
        # activations stay on the chip
        self.pair_transitions = nn.ModuleList(Transition(c=c_z, n=2, kernels=kernels) for _ in range(2))
        self.layer_norm_s = LayerNorm(c_s + c_inputs)
        self.linear_s = nn.Linear(c_s + c_inputs, c_s, bias=False)
        self.fourier = FourierEmbedding(c=c_fourier)
        self.layer_norm_n = LayerNorm(c_fourier)
        self.linear_n = nn.Linear(c_fourier, c_s, bias=False)
        self.single_transitions = nn.ModuleList(Transition(c=c_s, n=2) for _ in range(2))

    def condition_pair(self, batch: dict[str, torch.Tensor], z_trunk: torch.Tensor) -> torch.Tensor:
        """z_trunk: [B, N, N, c_z] -> z [B, N, N, c_z]."""
        relpos = self.relpos(batch["residue_index"], batch["asym_id"], batch["entity_id"], batch["sym_id"])
        z = self.linear_z(self.layer_norm_z(torch.cat([z_trunk, relpos.to(z_trunk.dtype)], dim=-1)))
        for transition in self.pair_transitions:
            z = z + transition(z)
        return z

    def condition_single(self, s_inputs: torch.Tensor, s_trunk: torch.Tensor) -> torch.Tensor:
        """s_inputs: [B, N, c_inputs], s_trunk: [B, N, c_s] -> the noise-independent part [B, N, c_s]."""
        return self.linear_s(self.layer_norm_s(torch.cat([s_trunk, s_inputs.to(s_trunk.dtype)], dim=-1)))

    def add_noise_level(self, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """s: [B, N, c_s] (from condition_single), t: [B, S] noise levels -> s [B, S, N, c_s]."""
        n = self.fourier(0.25 * torch.log(t / self.sigma_data))                  # [B, S, c_fourier]
        s = s[:, None] + self.linear_n(self.layer_norm_n(n))[:, :, None]         # [B, S, N, c_s]
        for transition in self.single_transitions:
            s = s + transition(s)
        return s


def chain_interior(residue_index: torch.Tensor, asym_id: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Tokens with a chain bond on both sides, where :func:`chain_binormals` is defined.

    Tokens i and i + 1 are bonded when both are present, in the same chain (asym_id) and consecutive in its
    sequence (residue_index steps by exactly 1): neighbours in a spatial or interface crop, or across an
    unresolved stretch left out of the crop, may sit far apart and are not bonded.

    residue_index, asym_id: [B, N]; present: [B, N] bool (real tokens; in training, real and resolved, since an
    unresolved token's coordinates are a placeholder at the centre) -> interior [B, N] bool
    """
    bonded = (present[:, 1:] & present[:, :-1] & (asym_id[:, 1:] == asym_id[:, :-1])
              & (residue_index[:, 1:] - residue_index[:, :-1] == 1))            # [B, N - 1]: i and i + 1 bonded
    interior = torch.zeros_like(present)
    interior[:, 1:-1] = bonded[:, :-1] & bonded[:, 1:]
    return interior


def chain_binormals(r: torch.Tensor, interior: torch.Tensor) -> torch.Tensor:
    """Unit normals of the chain's two bonds at each token, scaled by the sine of their angle:
    n_i = (r_i - r_(i-1)) x (r_(i+1) - r_i) / (|r_i - r_(i-1)| |r_(i+1) - r_i|), 0 where a neighbour is missing.

    A cross product turns with rotations as coordinates do but not with reflections, so the token track sees
    local chirality (the handedness of helices), which AF3's atom encoder reads from the backbone atoms and a
    Calpha-only model would otherwise lack (without it, overfitted models sample mirror images).

    r: [B, S, N, 3]; interior: [B, N] bool (token bonded on both sides, :func:`chain_interior`) -> [B, S, N, 3]
    """
    before = r[:, :, 1:-1] - r[:, :, :-2]                                        # [B, S, N - 2, 3]
    after = r[:, :, 2:] - r[:, :, 1:-1]
    normal = torch.linalg.cross(before, after) / (before.norm(dim=-1, keepdim=True)
                                                  * after.norm(dim=-1, keepdim=True)).clamp(min=1e-6)
    normal = torch.nn.functional.pad(normal, (0, 0, 1, 1))                       # [B, S, N, 3]
    return normal * interior[:, None, :, None].to(normal.dtype)


class DiffusionTransformerBlock(nn.Module):
    """One block of the diffusion transformer (AF3 SI Alg 23): attention with pair bias conditioned on s, then a
    conditioned transition, each added to a as a residual."""

    def __init__(self, *, c_token: int, c_s: int, c_z: int, n_heads: int,
                 kernels: KernelChoice = KernelChoice()) -> None:
        super().__init__()
        self.attention = AttentionPairBias(c_a=c_token, c_z=c_z, n_heads=n_heads, c_s=c_s, kernels=kernels)
        self.transition = ConditionedTransitionBlock(c_a=c_token, c_s=c_s, n=2)

    def forward(self, a: torch.Tensor, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor,
                bias: torch.Tensor) -> torch.Tensor:
        """a: [B, S, N, c_token], s: [B, S, N, c_s], z: [B, N, N, c_z], mask: [B, N], bias: [B, H, N, N]."""
        a = a + self.attention(a, z, mask, s, bias=bias)
        return a + self.transition(a, s)


class DiffusionModule(nn.Module):
    """Denoiser D(x_noisy, t) of Calpha coordinates with EDM preconditioning (AF3 SI Alg 20), sigma_data = 16 A.

    r = x_noisy / sqrt(t^2 + sigma_data^2);  a = LinearNoBias(r) + LinearNoBias(binormals(r)) +
    LinearNoBias(LayerNorm(s)) (the binormals stand in for the atom encoder's view of local chirality);
    a = DiffusionTransformer(a, s, z);  r_update = LinearNoBias(LayerNorm(a));
    x_out = sigma_data^2 / (sigma_data^2 + t^2) x_noisy + sigma_data t / sqrt(sigma_data^2 + t^2) r_update.

    Parameters
    ----------
    c_s, c_z : trunk channels; c_inputs : channels of s_inputs; c_token : transformer width
    n_blocks, n_heads : transformer depth and heads
    sigma_data : data standard deviation in A (AF3: 16)
    kernels : the kernel choice (its tri_attn_backend for the attention with pair bias, its
        pair_transition_backend for the conditioning's pair transitions)
    checkpointing : recompute each transformer block in the backward pass
    """

    def __init__(self, *, c_s: int, c_z: int, c_inputs: int, c_token: int, n_blocks: int, n_heads: int,
                 sigma_data: float = 16.0, kernels: KernelChoice = KernelChoice(),
                 checkpointing: bool = False) -> None:
        super().__init__()
        self.sigma_data, self.checkpointing = sigma_data, checkpointing
        self.conditioning = DiffusionConditioning(c_s=c_s, c_z=c_z, c_inputs=c_inputs, sigma_data=sigma_data,
                                                  kernels=kernels)
        self.linear_r = nn.Linear(3, c_token, bias=False)
        self.linear_binormal = nn.Linear(3, c_token, bias=False)
        self.layer_norm_s = LayerNorm(c_s)
        self.linear_s = nn.Linear(c_s, c_token, bias=False)
        self.blocks = nn.ModuleList(DiffusionTransformerBlock(c_token=c_token, c_s=c_s, c_z=c_z, n_heads=n_heads,
                                                              kernels=kernels) for _ in range(n_blocks))
        self.layer_norm_a = LayerNorm(c_token)
        self.linear_out = nn.Linear(c_token, 3, bias=False)     # zero at build (init.py): D(x, t) = c_skip(t) x
        self.run_block = run_block          # compiled by mini_of3.model.compiled.compile_blocks
        self.run_sampler_step = run_sampler_step      # likewise: one graph per sampler step (no gradients)

    def prepare(self, batch: dict[str, torch.Tensor], s_inputs: torch.Tensor, s_trunk: torch.Tensor,
                z_trunk: torch.Tensor) -> dict[str, torch.Tensor]:
        """Everything that does not depend on the noise level, computed once per trunk output.

        Returns a context: ``s`` [B, N, c_s], ``z`` [B, N, N, c_z], ``biases`` [n_blocks, B, H, N, N],
        ``mask`` [B, N], ``interior`` [B, N] (bonded to a real predecessor and successor, :func:`chain_interior`;
        right for sampling, where every real token is generated; training replaces it with the resolved tokens').
        """
        z = self.conditioning.condition_pair(batch, z_trunk)
        mask = batch["token_mask"]
        interior = chain_interior(batch["residue_index"], batch["asym_id"], mask)
        return {
            "s": self.conditioning.condition_single(s_inputs, s_trunk),
            "z": z,
            "biases": torch.stack([block.attention.pair_bias(z) for block in self.blocks]) if self.blocks
            else z.new_empty(0),
            "mask": mask,
            "interior": interior,
        }

    def sampler_step(self, context: dict[str, torch.Tensor], *step_inputs: torch.Tensor) -> torch.Tensor:
        """One step of the sampler (:func:`mini_of3.model.sampler.edm_step`) with this denoiser: ``step_inputs``
        are (x, mask, quaternion, shift, zeta, t_hat, step); what ``sample_diffusion(..., sampler_step=)`` takes."""
        return self.run_sampler_step(self, context, *step_inputs)

    def forward(self, x_noisy: torch.Tensor, t: torch.Tensor, context: dict[str, torch.Tensor]) -> torch.Tensor:
        """x_noisy: [B, S, N, 3] noisy Calpha, t: [B, S] noise levels in A -> denoised x [B, S, N, 3]."""
        sd = self.sigma_data
        t4 = t[:, :, None, None]                                                 # [B, S, 1, 1]
        s = self.conditioning.add_noise_level(context["s"], t)                  # [B, S, N, c_s]
        r = x_noisy / torch.sqrt(t4 ** 2 + sd ** 2)
        a = self.linear_r(r) + self.linear_binormal(chain_binormals(r, context["interior"])) \
            + self.linear_s(self.layer_norm_s(s))                                # [B, S, N, c_token]
        for block, bias in zip(self.blocks, context["biases"]):
            args = (a, s, context["z"], context["mask"], bias)
            if self.checkpointing and torch.is_grad_enabled():
                a = checkpoint(self.run_block, block, *args, use_reentrant=False)
            else:
                a = self.run_block(block, *args)
        r_update = self.linear_out(self.layer_norm_a(a)).to(x_noisy.dtype)     # [B, S, N, 3]
        return sd ** 2 / (sd ** 2 + t4 ** 2) * x_noisy + sd * t4 / torch.sqrt(sd ** 2 + t4 ** 2) * r_update
