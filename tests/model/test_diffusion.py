"""Diffusion module: EDM preconditioning, noise levels, augmentation and the sampler (AF3 SI 3.7, Alg 18-22)."""
import math

import pytest
import torch
from torch import nn

from mini_of3.config import ModelConfig
from mini_of3.geometry import superpose
from mini_of3.metrics import rmsd_kabsch
from mini_of3.model import build_model, diffusion
from mini_of3.model.diffusion import FourierEmbedding, chain_binormals, chain_interior
from mini_of3.model.sampler import (centre_random_augmentation, noise_schedule, random_rotation, sample_diffusion,
                                    training_noise_levels)
from structures import as_batch, read_tokens
from tiny import tiny_config


def test_noise_schedule_matches_af3():
    c = noise_schedule(200, 16.0)
    assert c.shape == (201,)
    assert float(c[0]) == pytest.approx(16 * 160) and float(c[-1]) == pytest.approx(16 * 4e-4, rel=1e-5)
    assert bool((c[1:] < c[:-1]).all())
    mid = 16 * (160 ** (1 / 7) + 0.5 * (4e-4 ** (1 / 7) - 160 ** (1 / 7))) ** 7
    assert float(c[100]) == pytest.approx(mid, rel=1e-5)


def test_training_noise_levels_are_log_normal_as_af3():
    af3 = ModelConfig()                                   # the defaults are AF3's
    sigma = training_noise_levels((20000,), 16.0, af3.noise_p_mean, af3.noise_p_std, torch.Generator().manual_seed(0),
                                  "cpu")
    log = torch.log(sigma / 16.0)
    assert float(log.mean()) == pytest.approx(-1.2, abs=0.03) and float(log.std()) == pytest.approx(1.5, abs=0.03)
    shifted = training_noise_levels((20000,), 16.0, -0.4, 1.0, torch.Generator().manual_seed(0), "cpu")
    log = torch.log(shifted / 16.0)                        # model.noise_p_mean / noise_p_std
    assert float(log.mean()) == pytest.approx(-0.4, abs=0.03) and float(log.std()) == pytest.approx(1.0, abs=0.03)


def test_random_rotations_are_proper_and_uniform():
    r = random_rotation((5000,), torch.Generator().manual_seed(0), "cpu")
    eye = torch.eye(3, dtype=r.dtype).expand_as(r)
    torch.testing.assert_close(r @ r.transpose(-1, -2), eye, atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.linalg.det(r), torch.ones(5000, dtype=r.dtype), atol=1e-6, rtol=0)
    assert float(r.mean(0).abs().max()) < 0.03            # E[R] = 0 for the uniform distribution on SO(3)


def test_centre_random_augmentation_alg19():
    x = read_tokens("1CRN")["ca"][None, None].expand(2, 3, -1, -1)
    mask = torch.ones(2, x.shape[2], dtype=torch.bool)
    mask[1, :5] = False
    y = centre_random_augmentation(x, mask, torch.Generator().manual_seed(0), s_trans=1.0)
    for b in range(2):
        m = mask[b]
        dist = lambda p: (p[:, :, None] - p[:, None, :]).norm(dim=-1)      # noqa: E731
        torch.testing.assert_close(dist(y[b, :, m]), dist(x[b, :, m]), atol=1e-3, rtol=1e-5)
        centre = y[b, :, m].mean(1)                                          # = the translation t
        assert float(centre.norm(dim=-1).max()) < 5.0
        if not m.all():                                                      # unmasked atoms sit on the centre
            torch.testing.assert_close(y[b, :, ~m], centre[:, None].expand(-1, int((~m).sum()), 3), atol=1e-4,
                                       rtol=0)
    assert not torch.allclose(y[0, 0], y[0, 1])                              # each copy gets its own motion


def test_fourier_embedding_alg22():
    m = FourierEmbedding(c=8)
    t = torch.tensor([[0.1, -0.3]])
    torch.testing.assert_close(m(t), torch.cos(2 * math.pi * (t[..., None] * m.w + m.b)))


class FixedOutput(nn.Module):
    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, a):
        return self.value


def test_edm_preconditioning_alg20():
    """D(x, t) = sigma_d^2 / (sigma_d^2 + t^2) x + sigma_d t / sqrt(sigma_d^2 + t^2) F(x / sqrt(t^2 + sigma_d^2))."""
    torch.manual_seed(0)
    model = build_model(tiny_config())
    batch = as_batch(read_tokens("1L2Y"))
    s_inputs, s, z = model.trunk(batch, n_recycles=0)
    context = model.diffusion.prepare(batch, s_inputs, s, z)
    x = torch.randn(1, 2, 20, 3) * 30
    t = torch.tensor([[0.5, 80.0]])
    sd = 16.0
    c_skip = (sd ** 2 / (sd ** 2 + t ** 2))[..., None, None]
    c_out = (sd * t / torch.sqrt(sd ** 2 + t ** 2))[..., None, None]
    torch.testing.assert_close(model.diffusion(x, t, context), c_skip * x)     # output layer starts at zero
    f = torch.randn(1, 2, 20, 3)
    model.diffusion.layer_norm_a = nn.Identity()
    model.diffusion.linear_out = FixedOutput(f)
    torch.testing.assert_close(model.diffusion(x, t, context), c_skip * x + c_out * f)


def test_edm_sampler_alg18_with_an_oracle_denoiser_recovers_the_structure():
    """With the ideal denoiser (the true structure superposed on the noisy input) the sampler must end on the true
    structure; a wrong sign, step or noise scale leaves it far off."""
    true = read_tokens("1CRN")["ca"].double()
    n = true.shape[0]
    mask = torch.ones(1, n, dtype=torch.bool)

    def oracle(x_noisy, t):
        return superpose(true.expand_as(x_noisy), x_noisy, torch.ones(x_noisy.shape[:-1])).to(x_noisy.dtype)

    g = torch.Generator().manual_seed(0)
    x = sample_diffusion(oracle, (1, 2, n, 3), mask, sigma_data=16.0, steps=40, generator=g, dtype=torch.float64)
    for k in range(2):
        assert float(rmsd_kabsch(x[0, k], true, mask[0])) < 0.05
    # and the same generator gives the same samples
    again = sample_diffusion(oracle, (1, 2, n, 3), mask, sigma_data=16.0, steps=40,
                             generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    torch.testing.assert_close(again, x)


def test_chain_binormals_turn_with_rotations_and_flip_with_reflections():
    x = read_tokens("1L2Y")["ca"].double()[None, None]                     # [1, 1, 20, 3]
    interior = torch.ones(1, 20, dtype=torch.bool)
    interior[0, [0, 9, 19]] = False                                          # chain ends and a break at 9
    n = chain_binormals(x, interior)
    b1, b2 = x[0, 0, 5] - x[0, 0, 4], x[0, 0, 6] - x[0, 0, 5]
    torch.testing.assert_close(n[0, 0, 5], torch.linalg.cross(b1, b2) / (b1.norm() * b2.norm()))
    assert float(n[0, 0, [0, 9, 19]].abs().sum()) == 0.0
    r = random_rotation((), torch.Generator().manual_seed(0), "cpu")
    torch.testing.assert_close(chain_binormals(x @ r.T, interior), n @ r.T)     # rotates like a vector
    mirror = torch.diag(torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(chain_binormals(x @ mirror, interior), -(n @ mirror))   # but not like one in a mirror
    # the model marks as interior only tokens with real neighbours in the same chain
    torch.manual_seed(0)
    model = build_model(tiny_config())
    batch = {k: v.clone() for k, v in as_batch(read_tokens("1L2Y")).items()}
    batch["asym_id"][0, 10:] = 2
    batch["token_mask"][0, 17:] = False
    s_inputs, s, z = model.trunk(batch, n_recycles=0)
    interior = model.diffusion.prepare(batch, s_inputs, s, z)["interior"][0]
    expected = [0] + [1] * 8 + [0, 0] + [1] * 5 + [0] * 4
    assert interior.int().tolist() == expected


def test_chain_bond_needs_consecutive_residues_and_resolved_ends(monkeypatch):
    """A crop of 1L2Y with a gap (residues 1-8 then 13-20: tokens 7 and 8 are 4 residues apart in one chain) and
    residue 4 unresolved: no binormal across the gap, and none at an unresolved token's neighbours when the
    resolved mask is given (training), while sampling, which generates every token, links through it."""
    tokens = read_tokens("1L2Y")
    crop = torch.cat([torch.arange(0, 8), torch.arange(12, 20)])              # 16 tokens, gap after token 7
    batch = {k: v[crop].clone()[None] for k, v in tokens.items()}
    batch["resolved"][0, 3] = False                                            # residue 4
    real, resolved = batch["token_mask"], batch["token_mask"] & batch["resolved"]
    across_gap = [0] + [1] * 6 + [0, 0] + [1] * 6 + [0]
    assert chain_interior(batch["residue_index"], batch["asym_id"], real)[0].int().tolist() == across_gap
    without_4 = [0, 1, 0, 0, 0] + [1] * 2 + [0, 0] + [1] * 6 + [0]
    assert chain_interior(batch["residue_index"], batch["asym_id"], resolved)[0].int().tolist() == without_4
    r = batch["ca"].double()[:, None]                                          # [1, 1, 16, 3]
    n = chain_binormals(r, chain_interior(batch["residue_index"], batch["asym_id"], resolved))
    assert float(n[0, 0, [2, 3, 4, 7, 8]].abs().sum()) == 0.0
    # the training forward gives the denoiser the resolved interior, the pLDDT rollout (sampling) the real one
    seen = []

    def spy(r, interior):
        seen.append(interior[0].int().tolist())
        return chain_binormals(r, interior)

    torch.manual_seed(0)
    model = build_model(tiny_config())
    monkeypatch.setattr(diffusion, "chain_binormals", spy)
    model(batch, n_recycles=0, generator=torch.Generator().manual_seed(0))
    assert seen[0] == without_4
    assert seen[1:] and all(interior == across_gap for interior in seen[1:])
