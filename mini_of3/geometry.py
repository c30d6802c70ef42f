"""Rigid-body geometry shared by the losses, the metrics and the sampler: rotations from quaternions, and the
weighted Kabsch superposition (AF3 SI Alg 28) through Horn's quaternion method."""
from __future__ import annotations

import torch


def rotation_from_covariance(h: torch.Tensor, squarings: int = 32) -> torch.Tensor:
    """The proper rotation R maximising trace(R h) for covariances h = sum_l w_l x_l y_l^T: [..., 3, 3].

    Horn's quaternion method (J. Opt. Soc. Am. A 4, 629, 1987): R is the rotation of the unit quaternion that is the
    top eigenvector of a symmetric 4 x 4 matrix of h. The eigenvector comes from repeated squaring of that matrix,
    shifted to be positive semi-definite (its eigenvalues lie within +-sum of h's singular values <= sqrt(3) |h|_F):
    after k squarings the other eigenvalues have shrunk by (ratio)^(2^k), so 32 squarings resolve gaps down to
    ~1e-9 of the spread. Unlike an SVD, nothing here waits for the GPU (torch's CUDA SVD checks its convergence on
    the host): the training loss aligns every step without a synchronisation. A zero h gives the identity.
    """
    hxx, hxy, hxz, hyx, hyy, hyz, hzx, hzy, hzz = h.flatten(-2).unbind(-1)
    n = torch.stack([
        hxx + hyy + hzz, hyz - hzy, hzx - hxz, hxy - hyx,
        hyz - hzy, hxx - hyy - hzz, hxy + hyx, hzx + hxz,
        hzx - hxz, hxy + hyx, -hxx + hyy - hzz, hyz + hzy,
        hxy - hyx, hzx + hxz, hyz + hzy, -hxx - hyy + hzz,
    ], dim=-1).view(*h.shape[:-2], 4, 4)
    shift = 3 ** 0.5 * h.flatten(-2).norm(dim=-1) + 1e-30                       # [...]
    eye = torch.eye(4, dtype=h.dtype, device=h.device)
    eye = eye + 1e-12 * eye[:, :1] * eye[:1, :]          # ties (h = 0) go to the identity; no host-to-device copy
    a = n + shift[..., None, None] * eye                                        # [..., 4, 4], PSD
    for k in range(squarings):
        if k % 4 == 0:              # from Frobenius norm 1 (top eigenvalue >= 1/2) four squarings stay in [2^-16, 1]
            a = a / a.flatten(-2).norm(dim=-1)[..., None, None]
        a = a @ a
    column = torch.diagonal(a, dim1=-2, dim2=-1).argmax(-1)                     # [...]: a ~ q q^T
    q = torch.take_along_dim(a, column[..., None, None].expand(*a.shape[:-1], 1), dim=-1)[..., 0]
    return rotation_from_quaternion(q)


def rotation_from_quaternion(q: torch.Tensor) -> torch.Tensor:
    """Rotation matrices [..., 3, 3] of (unnormalised) quaternions q [..., 4] = (w, x, y, z)."""
    w, x, y, z = (q / q.norm(dim=-1, keepdim=True)).unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ], dim=-1).view(*q.shape[:-1], 3, 3)


def kabsch(mobile: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted least-squares rigid superposition (Kabsch; AF3 SI Alg 28), no reflections, in float64.

    mobile, target: [..., N, 3]; weights: [..., N] (0 = ignore). Returns R [..., 3, 3] and t [..., 1, 3] such that
    ``mobile @ R.transpose(-1, -2) + t`` is closest to target. Not differentiable by design (callers detach).
    """
    x, y, w = mobile.detach().double(), target.detach().double(), weights.detach().double()[..., None]
    w_sum = w.sum(-2, keepdim=True).clamp(min=1e-12)
    x_c, y_c = (x * w).sum(-2, keepdim=True) / w_sum, (y * w).sum(-2, keepdim=True) / w_sum
    r = rotation_from_covariance(((x - x_c) * w).transpose(-1, -2) @ (y - y_c))
    return r, y_c - x_c @ r.transpose(-1, -2)


def superpose(mobile: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """mobile moved onto target by the weighted Kabsch fit: [..., N, 3] (float64, no gradient)."""
    r, t = kabsch(mobile, target, weights)
    return mobile.detach().double() @ r.transpose(-1, -2) + t
