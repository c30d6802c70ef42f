"""Losses against direct computations on a real structure (1CRN), masking, and the weighting of the total."""
import importlib.util
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mini_of3.config import LossConfig
from mini_of3.losses import (SIGMA_BIN_NAMES, compute_losses, diffusion_loss_by_sigma, diffusion_mse_loss,
                             distogram_loss, plddt_loss, rollout_confidence_sums, smooth_lddt_loss,
                             weighted_rigid_align)
from mini_of3.metrics import lddt_ca_per_token

_spec = importlib.util.spec_from_file_location("model_structures", Path(__file__).parent / "model" / "structures.py")
structures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(structures)

BOUNDARIES = torch.linspace(2, 22, 65)[1:-1]
# The losses are float32 by design. The same loss over a padded batch sums over other shapes in another order: its
# relative difference is a few float32 epsilons (measured: 1e-7, about 1 eps), by how much depends on the CPU's
# vector kernels; 2**7 eps (1.5e-5) bounds it on any CPU, while a padded or unresolved token that leaked in (junk
# of 1e3 A and 9x logits) moves a loss by far more.
REL32 = 2 ** 7 * torch.finfo(torch.float32).eps


@pytest.fixture(scope="module")
def crambin():
    t = structures.read_tokens("1CRN")
    return t["ca"][None], t["cb"][None], torch.ones(1, t["ca"].shape[0], dtype=torch.bool)


def random_rigid(x, seed):
    g = torch.Generator().manual_seed(seed)
    r = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64))[0]
    r = (r * torch.sign(torch.linalg.det(r))).float()
    return x @ r.T + torch.randn(3, generator=g) * 10


def test_distogram_loss_is_masked_cross_entropy(crambin):
    _, cb, mask = crambin
    n = cb.shape[1]
    mask = mask.clone()
    mask[0, 4] = False
    logits = torch.randn(1, n, n, 64, generator=torch.Generator().manual_seed(0))
    d = torch.cdist(cb, cb)[0]
    terms = [F.cross_entropy(logits[0, i, j], torch.bucketize(d[i, j], BOUNDARIES))
             for i in range(n) for j in range(n) if i != j and mask[0, i] and mask[0, j]]
    value = distogram_loss(logits, cb, mask, BOUNDARIES)
    assert float(value) == pytest.approx(float(torch.stack(terms).mean()), rel=1e-5)
    perfect = F.one_hot(torch.bucketize(d, BOUNDARIES), 64)[None].float() * 30
    assert float(distogram_loss(perfect, cb, mask, BOUNDARIES)) < 1e-6


def test_diffusion_mse_aligns_and_weights_by_noise_level(crambin):
    ca, _, mask = crambin
    B, S = 1, 3
    sigma = torch.tensor([[0.5, 16.0, 100.0]])
    moved = torch.stack([random_rigid(ca[0], k) for k in range(S)])[None]            # exact up to a rigid motion
    assert float(diffusion_mse_loss(moved, ca, mask, sigma)) < 1e-6
    noise = torch.randn(moved.shape, generator=torch.Generator().manual_seed(1))
    pred = moved + noise
    # direct: superpose true onto each prediction, 1/3 mean squared error, times (s^2 + sd^2) / (s sd)^2
    weight = (sigma ** 2 + 256.0) / (sigma * 16.0) ** 2
    aligned = weighted_rigid_align(ca[:, None].expand(B, S, -1, 3), pred, torch.ones(B, S, ca.shape[1]))
    mse = ((pred - aligned) ** 2).sum(-1).mean(-1) / 3
    assert float(diffusion_mse_loss(pred, ca, mask, sigma)) == pytest.approx(float((weight * mse).mean()), rel=1e-4)
    assert float(mse.mean()) < float((noise ** 2).sum(-1).mean() / 3)               # alignment can only help
    pred.requires_grad_(True)
    diffusion_mse_loss(pred, ca, mask, sigma).backward()
    assert torch.isfinite(pred.grad).all() and pred.grad.abs().sum() > 0


def test_smooth_lddt_alg27(crambin):
    ca, _, mask = crambin
    expected_same = 1 - sum(torch.sigmoid(torch.tensor(t)) for t in (0.5, 1.0, 2.0, 4.0)) / 4
    assert float(smooth_lddt_loss(ca[:, None], ca, mask)) == pytest.approx(float(expected_same), rel=1e-5)
    pred = (ca + 1.5 * torch.randn(ca.shape, generator=torch.Generator().manual_seed(0)))[:, None]
    d_p, d_t = torch.cdist(pred[0, 0], pred[0, 0]), torch.cdist(ca[0], ca[0])
    n = ca.shape[1]
    num = den = 0.0
    for i in range(n):
        for j in range(n):
            if i != j and d_t[i, j] < 15:
                delta = abs(float(d_p[i, j] - d_t[i, j]))
                num += sum(1 / (1 + math.exp(-(t - delta))) for t in (0.5, 1, 2, 4)) / 4
                den += 1
    assert float(smooth_lddt_loss(pred, ca, mask)) == pytest.approx(1 - num / den, rel=1e-5)
    far = (ca + 6.0 * torch.randn(ca.shape, generator=torch.Generator().manual_seed(0)))[:, None]
    assert float(smooth_lddt_loss(far, ca, mask)) > float(smooth_lddt_loss(pred, ca, mask))


def test_plddt_loss_targets_binned_per_token_lddt(crambin):
    ca, _, mask = crambin
    sample = ca + torch.randn(ca.shape, generator=torch.Generator().manual_seed(0))
    lddt, _ = lddt_ca_per_token(sample, ca, mask)
    target = (lddt * 50).long().clamp(max=49)
    logits = torch.randn(1, ca.shape[1], 50, generator=torch.Generator().manual_seed(1))
    expected = F.cross_entropy(logits[0], target[0])
    assert float(plddt_loss(logits, sample, ca, mask)) == pytest.approx(float(expected), rel=1e-5)
    perfect = F.one_hot(target, 50).float() * 30
    assert float(plddt_loss(perfect, sample, ca, mask)) < 1e-6


def test_rollout_confidence_sums_report_the_plddt_heads_target_and_prediction(crambin):
    """Target: the mean per-token lDDT-Calpha of the rollout sample; prediction: the head's expected lDDT (bin
    centres); both over the scored tokens, summed over structures, with the count of structures."""
    ca, _, mask = crambin
    sample = ca + torch.randn(ca.shape, generator=torch.Generator().manual_seed(0))
    lddt, has_partner = lddt_ca_per_token(sample, ca, mask)
    tokens = mask & has_partner
    target = (lddt * 50).long().clamp(max=49)
    sharp = F.one_hot(target, 50).float() * 60                  # the head puts all its mass in the target's bin
    outputs = {"plddt_coords": sample, "plddt_logits": sharp}
    batch = {"ca": ca, "token_mask": mask, "resolved": torch.ones_like(mask)}
    sums = rollout_confidence_sums(outputs, batch)
    assert sums.dtype == torch.float64 and sums.shape == (3,) and float(sums[2]) == 1
    assert float(sums[0]) == pytest.approx(float(lddt[tokens].mean()), rel=1e-6)
    centres = (target[tokens].double() + 0.5) / 50
    assert float(sums[1]) == pytest.approx(float(centres.mean()), rel=1e-5)
    assert abs(float(sums[1] - sums[0])) <= 0.5 / 50 + 1e-6     # within half a bin of the target
    empty = {**batch, "resolved": torch.zeros_like(mask)}       # no scored token: nothing counted
    assert rollout_confidence_sums(outputs, empty).tolist() == [0.0, 0.0, 0.0]


def fake_outputs(ca, cb, seed=0, samples=2):
    g = torch.Generator().manual_seed(seed)
    B, N = ca.shape[:2]
    return {"distogram_logits": torch.randn(B, N, N, 64, generator=g), "distogram_boundaries": BOUNDARIES,
            "diffusion_coords": ca[:, None] + torch.randn(B, samples, N, 3, generator=g),
            "diffusion_sigma": torch.tensor([[2.0, 30.0]]).expand(B, samples), "sigma_data": torch.tensor(16.0),
            "plddt_logits": torch.randn(B, N, 50, generator=g), "plddt_coords": ca + torch.randn(B, N, 3, generator=g)}


def test_compute_losses_weights_and_ignores_padding_and_unresolved(crambin):
    ca, cb, mask = crambin
    batch = {"ca": ca, "cb": cb, "resolved": mask.clone(), "token_mask": mask.clone()}
    batch["resolved"][0, 7] = False
    outputs = fake_outputs(ca, cb)
    cfg = LossConfig(distogram=0.3, diffusion=4.0, smooth_lddt=0.5, plddt=0.01)
    total, parts = compute_losses(outputs, batch, cfg)
    expected = 0.3 * parts["distogram"] + 4.0 * (parts["diffusion"] + 0.5 * parts["smooth_lddt"]) \
        + 0.01 * parts["plddt"]
    assert float(total) == pytest.approx(float(expected), rel=1e-6)

    # an unresolved token's coordinates and outputs do not matter
    moved = {k: v.clone() for k, v in batch.items()}
    moved["ca"][0, 7] += 100.0
    moved["cb"][0, 7] -= 100.0
    outputs_moved = {k: v.clone() for k, v in outputs.items()}
    outputs_moved["diffusion_coords"][:, :, 7] += 50.0
    outputs_moved["plddt_logits"][:, 7] = 0.0
    total_moved, _ = compute_losses(outputs_moved, moved, cfg)
    assert float(total_moved) == pytest.approx(float(total), rel=1e-5)

    # a missing Cbeta (cb_resolved False) leaves the distogram loss alone
    no_cb = {k: v.clone() for k, v in batch.items()}
    no_cb["cb_resolved"] = batch["resolved"].clone()
    no_cb["cb_resolved"][0, 20] = False
    _, parts_no_cb = compute_losses(outputs, no_cb, cfg)
    no_cb["cb"][0, 20] += 100.0
    _, parts_moved_cb = compute_losses(outputs, no_cb, cfg)
    assert float(parts_moved_cb["distogram"]) == pytest.approx(float(parts_no_cb["distogram"]), rel=1e-6)
    assert float(parts_no_cb["distogram"]) != pytest.approx(float(parts["distogram"]), rel=1e-6)

    # a second, padded structure in the batch: the first structure's losses come out the same when both are equal
    pad = 6
    padded = {k: torch.cat([v, torch.zeros(1, pad, *v.shape[2:], dtype=v.dtype)], 1).expand(2, -1, *v.shape[2:])
              .clone() for k, v in batch.items()}
    n = ca.shape[1] + pad
    out_pad = {"distogram_logits": torch.zeros(2, n, n, 64), "distogram_boundaries": BOUNDARIES,
               "diffusion_coords": torch.zeros(2, 2, n, 3), "diffusion_sigma": outputs["diffusion_sigma"].expand(2, 2),
               "sigma_data": torch.tensor(16.0), "plddt_logits": torch.randn(2, n, 50) * 9,
               "plddt_coords": torch.randn(2, n, 3) * 40}
    n0 = ca.shape[1]
    out_pad["distogram_logits"][:, :n0, :n0] = outputs["distogram_logits"]
    out_pad["diffusion_coords"][:, :, :n0] = outputs["diffusion_coords"]
    out_pad["diffusion_coords"][:, :, n0:] = 1e3
    out_pad["plddt_logits"][:, :n0] = outputs["plddt_logits"]
    out_pad["plddt_coords"][:, :n0] = outputs["plddt_coords"]
    total_pad, parts_pad = compute_losses(out_pad, padded, cfg)
    assert float(total_pad) == pytest.approx(float(total), rel=REL32)
    for key in parts:
        assert float(parts_pad[key]) == pytest.approx(float(parts[key]), rel=REL32), key


def test_diffusion_loss_by_noise_bin_splits_the_diffusion_loss(crambin):
    """Per bin of sigma / sigma_data (<0.25, 0.25-1, 1-4, >4): the samples of that bin only; together the bins give
    the diffusion loss back."""
    ca, _, mask = crambin
    generator = torch.Generator().manual_seed(0)
    sigma = 16.0 * torch.tensor([[0.1, 0.2, 0.5, 2.0, 3.0, 8.0]])
    pred = ca[:, None] + torch.randn(1, 6, ca.shape[1], 3, generator=generator) * sigma[..., None, None] / 4
    outputs = {"diffusion_coords": pred, "diffusion_sigma": sigma, "sigma_data": torch.tensor(16.0)}
    sums, counts = diffusion_loss_by_sigma(outputs, {"ca": ca, "token_mask": mask, "resolved": mask})
    assert len(SIGMA_BIN_NAMES) == 4 and counts.tolist() == [2, 1, 2, 1]
    assert float(sums.sum() / counts.sum()) == pytest.approx(float(diffusion_mse_loss(pred, ca, mask, sigma)), rel=1e-6)
    alone = diffusion_mse_loss(pred[:, 5:], ca, mask, sigma[:, 5:])              # the >4 bin holds sample 5 only
    assert float(sums[3]) == pytest.approx(float(alone), rel=1e-6)
