"""MiniOF3: embedder -> recycled Pairformer trunk -> distogram, Calpha diffusion and pLDDT heads (AF3 SI Alg 1)."""
from __future__ import annotations

import functools

import torch
from torch import nn

from mini_of3.config import ModelConfig
from mini_of3.model.diffusion import DiffusionModule, chain_interior
from mini_of3.model.embedder import InputEmbedder
from mini_of3.model.heads import DistogramHead, PLDDTHead, bin_boundaries
from mini_of3.model.init import init_final_layers
from mini_of3.model.kernel_choice import KernelChoice
from mini_of3.model.norm import LayerNorm
from mini_of3.model.pairformer import PairformerStack
from mini_of3.model.sampler import centre_random_augmentation, randn, sample_diffusion, training_noise_levels


class MiniOF3(nn.Module):
    """The whole model (AF3 SI Alg 1), single sequence, protein only, one atom (Calpha) per token.

    Batch keys (padded to the batch's N): restype, residue_index, asym_id, entity_id, sym_id [B, N] long,
    token_mask [B, N] bool; for training also ca, cb [B, N, 3] float32 and resolved [B, N] bool.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        kernels = KernelChoice.from_config(cfg)      # checked here, once; anchors are imported by the layers
        self.embedder = InputEmbedder(c_s=cfg.c_s, c_z=cfg.c_z)
        # recycling (Alg 1 lines 8 and 11): the previous cycle's z and s enter through LayerNorm + LinearNoBias
        self.layer_norm_z_cycle = LayerNorm(cfg.c_z)
        self.linear_z_cycle = nn.Linear(cfg.c_z, cfg.c_z, bias=False)
        self.layer_norm_s_cycle = LayerNorm(cfg.c_s)
        self.linear_s_cycle = nn.Linear(cfg.c_s, cfg.c_s, bias=False)
        self.pairformer = PairformerStack(
            n_blocks=cfg.n_blocks, checkpointing=cfg.checkpointing, checkpoint_blocks=cfg.checkpoint_blocks,
            c_s=cfg.c_s, c_z=cfg.c_z,
            n_heads_tri=cfg.n_heads_tri, c_hidden_tri=cfg.c_hidden_tri, n_heads_single=cfg.n_heads_single,
            c_hidden_mul=cfg.c_hidden_mul, transition_factor=cfg.transition_factor, pair_dropout=cfg.pair_dropout,
            kernels=kernels)
        self.distogram_head = DistogramHead(c_z=cfg.c_z, n_bins=cfg.distogram_bins)
        self.diffusion = DiffusionModule(
            c_s=cfg.c_s, c_z=cfg.c_z, c_inputs=self.embedder.c_inputs, c_token=cfg.c_token,
            n_blocks=cfg.diffusion_blocks, n_heads=cfg.diffusion_heads, sigma_data=cfg.sigma_data,
            kernels=kernels, checkpointing=cfg.checkpointing)
        self.plddt_head = PLDDTHead(c_s=cfg.c_s, c_z=cfg.c_z, n_bins=cfg.plddt_bins)
        init_final_layers(self)          # residual updates start at zero, distogram logits uniform (AF3)

    @property
    def coordinate_dtype(self) -> torch.dtype:
        """Coordinates stay float32 (float64 in a float64 model), whatever the precision of the layers."""
        return torch.promote_types(torch.float32, self.diffusion.linear_r.weight.dtype)

    # ---- trunk ------------------------------------------------------------------------------------------------

    def trunk(self, batch: dict[str, torch.Tensor], n_recycles: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Embedding and recycled Pairformer (Alg 1 lines 1-13): n_recycles gradient-free cycles, then one more.

        Returns s_inputs [B, N, 21], s [B, N, c_s], z [B, N, N, c_z].
        """
        if n_recycles < 0:
            raise ValueError(f"n_recycles must be >= 0, got {n_recycles}")
        mask = batch["token_mask"]
        s_inputs, s_init, z_init = self.embedder(batch)
        s_prev = z_prev = None                   # the first cycle's: zero (Alg 1 lines 6-7)
        grad = torch.is_grad_enabled()
        for cycle in range(n_recycles + 1):
            last = cycle == n_recycles
            with torch.set_grad_enabled(grad and last):
                z = z_init + recycled(self.layer_norm_z_cycle, self.linear_z_cycle, z_prev, z_init)
                s = s_init + recycled(self.layer_norm_s_cycle, self.linear_s_cycle, s_prev, s_init)
                s_prev = z_prev = None           # nothing the Pairformer runs beside holds a pair tensor it
                if last:                         # does not need: the previous cycle's z, and z_init once done
                    s_init = z_init = None
                s, z = self.pairformer(s, z, mask)
            s_prev, z_prev = s.detach(), z.detach()
        return s_inputs, s, z

    # ---- training forward ---------------------------------------------------------------------------------------

    def forward(self, batch: dict[str, torch.Tensor], *, n_recycles: int,
                generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Training forward.

        Returns
        -------
        distogram_logits [B, N, N, n_bins] (float32), distogram_boundaries [n_bins - 1] (A);
        diffusion_coords [B, S, N, 3]: denoised Calpha of S = cfg.diffusion_samples noisy, augmented copies of the
        target, with their noise levels diffusion_sigma [B, S] and sigma_data (0-d);
        plddt_logits [B, N, n_plddt_bins] for plddt_coords [B, N, 3], a structure sampled by a short
        gradient-free rollout (cfg.plddt_rollout_steps) from the detached trunk.
        """
        cfg, mask, dtype = self.cfg, batch["token_mask"], self.coordinate_dtype
        s_inputs, s, z = self.trunk(batch, n_recycles)
        out = {"distogram_logits": self.distogram_head(z).float(),
               "distogram_boundaries": bin_boundaries(cfg.distogram_bins, cfg.distogram_min, cfg.distogram_max,
                                                      device=z.device)}
        # diffusion training (AF3 SI 3.7.1): noisy augmented copies of the target Calpha
        B, N = mask.shape
        S = cfg.diffusion_samples
        context = self.diffusion.prepare(batch, s_inputs, s, z)
        resolved = batch["resolved"] & mask
        x = batch["ca"].to(dtype)[:, None].expand(B, S, N, 3)
        x = centre_random_augmentation(x, resolved, generator)
        sigma = training_noise_levels((B, S), cfg.sigma_data, cfg.noise_p_mean, cfg.noise_p_std, generator,
                                      z.device, dtype)
        x_noisy = x + sigma[:, :, None, None] * randn((B, S, N, 3), generator, z.device, dtype)
        # unresolved targets are placeholders at the centre: no chain bond to or through them
        train_context = {**context, "interior": chain_interior(batch["residue_index"], batch["asym_id"], resolved)}
        out["diffusion_coords"] = self.diffusion(x_noisy, sigma, train_context)
        out["diffusion_sigma"] = sigma
        out["sigma_data"] = torch.tensor(cfg.sigma_data)
        # pLDDT (AF3 SI 4.3): a mini-rollout without gradients; the head sees the detached trunk
        with torch.no_grad():
            rollout = {key: value.detach() for key, value in context.items()}
            x_sample = sample_diffusion(lambda xn, t: self.diffusion(xn, t, rollout), (B, 1, N, 3), mask,
                                        sigma_data=cfg.sigma_data, steps=cfg.plddt_rollout_steps,
                                        generator=generator, dtype=dtype,
                                        sampler_step=functools.partial(self.diffusion.sampler_step, rollout))
        out["plddt_logits"] = self.plddt_head(s.detach(), z.detach(), x_sample, mask)[:, 0].float()
        out["plddt_coords"] = x_sample[:, 0]
        return out

    # ---- inference ------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def sample(self, batch: dict[str, torch.Tensor], *, n_recycles: int, steps: int, samples: int,
               generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Predict structures: trunk once, then ``samples`` EDM trajectories of ``steps`` steps (call eval() first).

        Returns coords [B, S, N, 3] (Calpha, A), plddt [B, S, N] (0-100), distogram_logits [B, N, N, n_bins].
        """
        mask = batch["token_mask"]
        B, N = mask.shape
        s_inputs, s, z = self.trunk(batch, n_recycles)
        context = self.diffusion.prepare(batch, s_inputs, s, z)
        x = sample_diffusion(lambda xn, t: self.diffusion(xn, t, context), (B, samples, N, 3), mask,
                             sigma_data=self.cfg.sigma_data, steps=steps, generator=generator,
                             dtype=self.coordinate_dtype,
                             sampler_step=functools.partial(self.diffusion.sampler_step, context))
        probs = torch.softmax(self.plddt_head(s, z, x, mask).float(), dim=-1)      # [B, S, N, bins]
        n_bins = probs.shape[-1]
        centres = (torch.arange(n_bins, device=x.device, dtype=torch.float32) + 0.5) / n_bins
        return {"coords": x, "plddt": 100.0 * (probs * centres).sum(-1),
                "distogram_logits": self.distogram_head(z).float()}


def recycled(norm: nn.Module, linear: nn.Module, previous: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """LinearNoBias(LayerNorm(previous)) (AF3 SI Alg 1 lines 8 and 11). The first cycle's previous is zero, the same
    in every position: computed on one zero row [c] and broadcast, so no zero tensor of ``like``'s shape is made."""
    if previous is None:
        return linear(norm(like.new_zeros(like.shape[-1])))
    return linear(norm(previous))


def build_model(cfg: ModelConfig) -> MiniOF3:
    """MiniOF3 of a model config section (checked when the section was made; anchor backends are imported here)."""
    return MiniOF3(cfg)
