"""Training losses (AF3 SI 4): distogram, diffusion (weighted aligned MSE + smooth lDDT) and pLDDT.

Pure functions of tensors, in float32 whatever the model's precision. Every loss is masked by
``token_mask & resolved``: padded and unresolved tokens contribute nothing. Each structure's loss is averaged over
its own valid pairs or tokens, then structures are averaged (a structure with nothing valid is left out).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from mini_of3.config import LossConfig
from mini_of3.geometry import kabsch
from mini_of3.metrics import LDDT_THRESHOLDS, lddt_ca_per_token

LOSS_PARTS = ("distogram", "diffusion", "smooth_lddt", "plddt")     # the parts of the total, as compute_losses names them


def _mean_over_structures(per_structure: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean of the valid entries of [B] (0 with a graph when none is valid, so backward still works)."""
    valid = valid.to(per_structure.dtype)
    return (per_structure * valid).sum() / valid.sum().clamp(min=1)


def distogram_loss(logits: torch.Tensor, cb: torch.Tensor, mask: torch.Tensor,
                   boundaries: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the distogram against binned true Cbeta distances (AF3 SI 4.4), pairs i != j.

    logits: [B, N, N, bins]; cb: [B, N, 3]; mask: [B, N] bool (real and resolved); boundaries: [bins - 1] A.
    """
    d = torch.cdist(cb.float(), cb.float())                                      # [B, N, N]
    target = torch.bucketize(d, boundaries.float())
    eye = torch.eye(mask.shape[1], dtype=torch.bool, device=mask.device)
    pairs = (mask[:, :, None] & mask[:, None, :] & ~eye).float()
    ce = F.cross_entropy(logits.float().flatten(0, 2), target.flatten(), reduction="none").view_as(d)
    count = pairs.sum((1, 2))
    return _mean_over_structures((ce * pairs).sum((1, 2)) / count.clamp(min=1), count > 0)


def weighted_rigid_align(x_true: torch.Tensor, x_pred: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The true coordinates superposed on the prediction, with no gradient (AF3 SI Alg 28).

    x_true: [..., N, 3]; x_pred: [..., N, 3]; weights: [..., N]. Returns [..., N, 3] float32.
    """
    r, t = kabsch(x_true, x_pred, weights)
    return (x_true.detach().double() @ r.transpose(-1, -2) + t).float()


def diffusion_mse_per_sample(x_pred: torch.Tensor, x_true: torch.Tensor, mask: torch.Tensor, sigma: torch.Tensor,
                             sigma_data: float = 16.0) -> torch.Tensor:
    """Weighted aligned MSE of each noised sample (AF3 SI 4.1.1, eq. 2-6): [B, S].

    x_pred: [B, S, N, 3] denoised; x_true: [B, N, 3]; mask: [B, N] bool; sigma: [B, S] noise levels.
    Each sample's L_MSE = 1/3 mean_i ||x_pred_i - align(x_true)_i||^2 over masked tokens, weighted by
    (sigma^2 + sigma_data^2) / (sigma sigma_data)^2 (EDM's weighting: about 1 for a denoiser that returns its input
    scaled, at every noise level, so the levels compare).
    """
    B, S, N, _ = x_pred.shape
    w = mask[:, None].expand(B, S, N).float()
    target = weighted_rigid_align(x_true[:, None].expand(B, S, N, 3), x_pred, w)
    sq = ((x_pred.float() - target) ** 2).sum(-1)                              # [B, S, N]
    mse = (sq * w).sum(-1) / (3 * w.sum(-1).clamp(min=1))                       # [B, S]
    return (sigma ** 2 + sigma_data ** 2) / (sigma * sigma_data) ** 2 * mse


def diffusion_mse_loss(x_pred: torch.Tensor, x_true: torch.Tensor, mask: torch.Tensor, sigma: torch.Tensor,
                       sigma_data: float = 16.0) -> torch.Tensor:
    """The weighted aligned MSE of :func:`diffusion_mse_per_sample`, averaged over samples, then structures."""
    per_sample = diffusion_mse_per_sample(x_pred, x_true, mask, sigma, sigma_data)
    return _mean_over_structures(per_sample.mean(-1), mask.any(-1))


SIGMA_BINS = (0.25, 1.0, 4.0)           # edges of sigma / sigma_data for diffusion_loss_by_sigma
SIGMA_BIN_NAMES = ("<0.25", "0.25-1", "1-4", ">4")


@torch.no_grad()
def diffusion_loss_by_sigma(outputs: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The weighted aligned MSE summed per noise-level bin (sigma / sigma_data below 0.25, 0.25-1, 1-4, above 4):
    (sums [4], sample counts [4]), float64 on the CPU, so a part of the denoiser that stalls shows in its bin.

    ``outputs`` and ``batch`` as for :func:`compute_losses`; structures with no valid token are left out.
    """
    mask = batch["token_mask"] & batch["resolved"]
    sigma, sigma_data = outputs["diffusion_sigma"].float(), float(outputs["sigma_data"])
    per_sample = diffusion_mse_per_sample(outputs["diffusion_coords"].detach(), batch["ca"], mask, sigma, sigma_data)
    edges = torch.tensor(SIGMA_BINS, device=sigma.device)
    bins = torch.bucketize(sigma / sigma_data, edges)                          # [B, S] in 0..3
    valid = mask.any(-1)[:, None].expand_as(bins)
    bins, values = bins[valid], per_sample[valid].double()
    sums = torch.zeros(len(SIGMA_BIN_NAMES), dtype=torch.float64, device=values.device).index_add_(0, bins, values)
    counts = torch.bincount(bins, minlength=len(SIGMA_BIN_NAMES)).double()
    return sums.cpu(), counts.cpu()


def smooth_lddt_loss(x_pred: torch.Tensor, x_true: torch.Tensor, mask: torch.Tensor,
                     cutoff: float = 15.0) -> torch.Tensor:
    """1 - smooth lDDT (AF3 SI Alg 27) on Calpha: sigmoids in place of the lDDT steps, 15 A inclusion.

    x_pred: [B, S, N, 3]; x_true: [B, N, 3]; mask: [B, N] bool.
    """
    d_pred = torch.cdist(x_pred.float(), x_pred.float())                        # [B, S, N, N]
    d_true = torch.cdist(x_true.float(), x_true.float())[:, None]               # [B, 1, N, N]
    delta = (d_pred - d_true).abs()
    eps = sum(torch.sigmoid(t - delta) for t in LDDT_THRESHOLDS) / len(LDDT_THRESHOLDS)
    eye = torch.eye(mask.shape[1], dtype=torch.bool, device=mask.device)
    include = ((d_true < cutoff) & (mask[:, :, None] & mask[:, None, :] & ~eye)[:, None]).float()
    count = include.sum((-1, -2))                                               # [B, 1]
    lddt = (eps * include).sum((-1, -2)) / count.clamp(min=1)                   # [B, S]
    return _mean_over_structures(1.0 - lddt.mean(-1), count[:, 0] > 0)


def plddt_loss(logits: torch.Tensor, x_sample: torch.Tensor, x_true: torch.Tensor, mask: torch.Tensor,
               cutoff: float = 15.0) -> torch.Tensor:
    """Cross-entropy of the pLDDT head against the binned per-token lDDT-Calpha of a sampled structure (AF3 SI 4.3).

    logits: [B, N, bins]; x_sample: [B, N, 3] (no gradient); x_true: [B, N, 3]; mask: [B, N] bool.
    """
    with torch.no_grad():
        lddt, has_partner = lddt_ca_per_token(x_sample.detach(), x_true, mask, cutoff)
        n_bins = logits.shape[-1]
        target = (lddt * n_bins).long().clamp(max=n_bins - 1)                  # [B, N]
        tokens = (mask & has_partner).float()
    ce = F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), reduction="none").view_as(tokens)
    count = tokens.sum(-1)
    return _mean_over_structures((ce * tokens).sum(-1) / count.clamp(min=1), count > 0)


def rollout_confidence_sums(outputs: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """What the pLDDT head is trained on, per step: [3] float64 on the CPU, the sums over structures of the mean
    lDDT-Calpha of the rollout sample (the head's target, :func:`plddt_loss`) and of the head's expected lDDT on it
    (0-1), and the number of structures with a scored token. A head that lags its targets, or targets far below
    the validation's samples, show here.
    """
    mask = batch["token_mask"] & batch["resolved"]
    with torch.no_grad():
        lddt, has_partner = lddt_ca_per_token(outputs["plddt_coords"].detach(), batch["ca"], mask)      # [B, N]
        logits = outputs["plddt_logits"].detach().float()                                                 # [B, N, bins]
        n_bins = logits.shape[-1]
        centres = (torch.arange(n_bins, device=logits.device, dtype=torch.float32) + 0.5) / n_bins
        predicted = (torch.softmax(logits, dim=-1) * centres).sum(-1)                                    # [B, N]
        tokens = (mask & has_partner).float()
        count = tokens.sum(-1)
        scored = count > 0
        per_structure = torch.stack([(lddt.float() * tokens).sum(-1), (predicted * tokens).sum(-1)]) \
            / count.clamp(min=1)                                                                          # [2, B]
        sums = (per_structure * scored).sum(-1)
    return torch.cat([sums, scored.sum()[None].to(sums.dtype)]).double().cpu()


def compute_losses(outputs: dict[str, torch.Tensor], batch: dict[str, torch.Tensor], cfg: LossConfig
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The total training loss and its detached parts.

    total = distogram * L_dist + diffusion * (L_mse + smooth_lddt * L_smooth_lddt) + plddt * L_plddt, the
    weights from LossConfig. ``outputs`` is MiniOF3.forward's dict (its distogram_boundaries and sigma_data set the
    bins and the noise weighting); ``batch`` holds ca, cb [B, N, 3], resolved, token_mask [B, N] and, optionally,
    cb_resolved [B, N] (the distogram then skips tokens whose Cbeta is missing).
    Returns (total, {part: value for part in LOSS_PARTS}).
    """
    mask = batch["token_mask"] & batch["resolved"]
    cb_mask = batch["token_mask"] & batch.get("cb_resolved", batch["resolved"])
    parts = {
        "distogram": distogram_loss(outputs["distogram_logits"], batch["cb"], cb_mask,
                                    outputs["distogram_boundaries"]),
        "diffusion": diffusion_mse_loss(outputs["diffusion_coords"], batch["ca"], mask, outputs["diffusion_sigma"],
                                        float(outputs["sigma_data"])),
        "smooth_lddt": smooth_lddt_loss(outputs["diffusion_coords"], batch["ca"], mask),
        "plddt": plddt_loss(outputs["plddt_logits"], outputs["plddt_coords"], batch["ca"], mask),
    }
    total = (cfg.distogram * parts["distogram"]
             + cfg.diffusion * (parts["diffusion"] + cfg.smooth_lddt * parts["smooth_lddt"])
             + cfg.plddt * parts["plddt"])
    return total, {name: value.detach() for name, value in parts.items()}
