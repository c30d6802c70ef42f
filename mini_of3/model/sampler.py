"""Noise levels, augmentation and the EDM sampler of the diffusion module (AF3 SI 3.7, Alg 18 and 19)."""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from mini_of3.geometry import rotation_from_quaternion


def randn(shape, generator: torch.Generator | None, device, dtype=torch.float32) -> torch.Tensor:
    """Standard normal numbers drawn on the generator's device (any device may be passed in), then moved."""
    draw_on = generator.device if generator is not None else device
    return torch.randn(shape, generator=generator, device=draw_on, dtype=dtype).to(device)


def training_noise_levels(shape, sigma_data: float, p_mean: float, p_std: float, generator: torch.Generator | None,
                          device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """AF3's training noise distribution (SI 3.7.1): sigma = sigma_data * exp(p_mean + p_std N(0, 1)); AF3's p_mean
    and p_std are ``ModelConfig``'s defaults (-1.2, 1.5)."""
    return sigma_data * torch.exp(p_mean + p_std * randn(shape, generator, device, dtype))


def noise_schedule(steps: int, sigma_data: float, s_max: float = 160.0, s_min: float = 4e-4, p: float = 7.0,
                   device=None) -> torch.Tensor:
    """AF3's sampling schedule (SI 3.7.1): c_tau = sigma_data (s_max^(1/p) + tau/T (s_min^(1/p) - s_max^(1/p)))^p.

    Returns [steps + 1] noise levels in A, from sigma_data * s_max down to sigma_data * s_min.
    """
    tau = torch.arange(steps + 1, dtype=torch.float64, device=device) / steps
    c = sigma_data * (s_max ** (1 / p) + tau * (s_min ** (1 / p) - s_max ** (1 / p))) ** p
    return c.float()


def random_rotation(shape, generator: torch.Generator | None, device) -> torch.Tensor:
    """Rotations uniform on SO(3) from normalised Gaussian quaternions: [*shape, 3, 3]."""
    return rotation_from_quaternion(randn((*shape, 4), generator, device, torch.float64))  # exactly orthogonal


def augmentation_draws(B: int, S: int, generator: torch.Generator | None, device, dtype: torch.dtype,
                       s_trans: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The random numbers of one augmentation (AF3 SI Alg 19), in the order drawn: a Gaussian quaternion [B, S, 4]
    (float64, uniform rotations once normalised) and a shift s_trans N(0, I) [B, S, 1, 3]."""
    quaternion = randn((B, S, 4), generator, device, torch.float64)
    return quaternion, s_trans * randn((B, S, 1, 3), generator, device, dtype)


def centre_and_move(x: torch.Tensor, mask: torch.Tensor, rotation: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """R (x - centre) + t (AF3 SI Alg 19 given its draws): x [B, S, N, 3], mask [B, N] bool (the atoms that define
    the centre; the others are put on it first), rotation [B, S, 3, 3] (float64 is cast to x's dtype), shift
    [B, S, 1, 3]."""
    m = mask[:, None, :, None].to(x.dtype)                                       # [B, 1, N, 1]
    centre = (x * m).sum(-2, keepdim=True) / m.sum(-2, keepdim=True).clamp(min=1)
    x = (x - centre) * m
    return x @ rotation.to(x.dtype).transpose(-1, -2) + shift


def centre_random_augmentation(x: torch.Tensor, mask: torch.Tensor, generator: torch.Generator | None,
                               s_trans: float = 1.0) -> torch.Tensor:
    """Centre, then rotate and translate each structure at random (AF3 SI Alg 19).

    x: [B, S, N, 3]; mask: [B, N] bool, the atoms that define the centre. Atoms outside the mask are put on the
    centre before the rotation, so unresolved or padded positions carry no stale coordinates.
    Returns [B, S, N, 3] = R (x - centre) + t, with R uniform on SO(3) and t ~ s_trans N(0, I) per structure.
    """
    quaternion, shift = augmentation_draws(*x.shape[:2], generator, x.device, x.dtype, s_trans)
    return centre_and_move(x, mask, rotation_from_quaternion(quaternion), shift)


def edm_step(denoise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: torch.Tensor, mask: torch.Tensor,
             quaternion: torch.Tensor, shift: torch.Tensor, zeta: torch.Tensor, t_hat: torch.Tensor,
             step: torch.Tensor) -> torch.Tensor:
    """One step of AF3's sampler (SI Alg 18, lines 3-9) given its random draws, all tensors (no python number that
    changes from step to step, so one compiled graph serves every step):

    x [B, S, N, 3]; quaternion [B, S, 4] float64 and shift [B, S, 1, 3] (the augmentation); zeta [B, S, N, 3] (the
    added noise); t_hat [B, S] (the raised noise level); step: 0-d, eta (c_tau - t_hat) -> x of the next level.
    """
    x = centre_and_move(x, mask, rotation_from_quaternion(quaternion), shift)
    x_noisy = x + zeta
    delta = (x_noisy - denoise(x_noisy, t_hat)) / t_hat[:, :, None, None]
    return x_noisy + step * delta


def sample_diffusion(denoise: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], shape, mask: torch.Tensor,
                     *, sigma_data: float, steps: int, generator: torch.Generator | None = None,
                     dtype: torch.dtype = torch.float32,
                     gamma_0: float = 0.8, gamma_min: float = 1.0, noise_scale: float = 1.003,
                     step_scale: float = 1.5, sampler_step: Callable | None = None) -> torch.Tensor:
    """EDM sampler of AF3 (SI Alg 18): stochastic steps along the schedule c_0 > c_1 > ... > c_T.

    Parameters
    ----------
    denoise : (x_noisy [B, S, N, 3], t [B, S]) -> denoised x [B, S, N, 3]
    shape : (B, S, N, 3)
    mask : [B, N] bool, the real tokens (they define the centre of each augmentation)
    steps : T; gamma_0, gamma_min, noise_scale (lambda), step_scale (eta) : AF3's 0.8, 1, 1.003, 1.5
    dtype : of the coordinates (float32; float64 for a float64 model)
    sampler_step : (x, mask, quaternion, shift, zeta, t_hat, step) -> x, one step given its draws; default
        :func:`edm_step` with ``denoise`` (a compiled model passes its compiled step, which calls its own denoiser)

    Returns
    -------
    x [B, S, N, 3]
    """
    device = mask.device
    B, S = shape[:2]
    if sampler_step is None:
        sampler_step = functools.partial(edm_step, denoise)
    c = noise_schedule(steps, sigma_data).tolist()          # python floats: no device sync inside the loop
    x = c[0] * randn(shape, generator, device, dtype)
    for tau in range(1, steps + 1):
        quaternion, shift = augmentation_draws(B, S, generator, device, dtype)     # then the noise, as AF3 draws
        gamma = gamma_0 if c[tau] > gamma_min else 0.0
        t_hat = c[tau - 1] * (gamma + 1)
        zeta = noise_scale * (t_hat ** 2 - c[tau - 1] ** 2) ** 0.5 * randn(shape, generator, device, dtype)
        x = sampler_step(x, mask, quaternion, shift, zeta, torch.full((B, S), t_hat, device=device, dtype=dtype),
                         torch.full((), step_scale * (c[tau] - t_hat), device=device, dtype=dtype))
    return x
