"""The three AF3 croppers (AF3 SI 2.7) and the weighted choice between them.

Every cropper takes a :class:`Structure`, a crop size and a ``numpy.random.Generator`` and returns the kept token
indices, sorted. A structure with no more tokens than the crop size is returned whole. Seed the generator with
:func:`crop_rng` ``(seed, epoch, index)`` so that any example can be reproduced on its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from .structure import Structure

INTERFACE_DISTANCE = 15.0                     # Angstrom, AF3 SI 2.7.3
AF3_CROP_WEIGHTS = (0.2, 0.4, 0.4)            # contiguous, spatial, spatial interface (AF3 SI 2.7)
CropMethod = Literal["whole", "contiguous", "spatial", "interface"]


def crop_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of one example: the same (seed, epoch, index) always gives the same crop."""
    return np.random.default_rng((seed, epoch, index))


def _all_tokens(structure: Structure) -> np.ndarray:
    return np.arange(structure.n_tokens)


def crop_contiguous(structure: Structure, crop_size: int, rng: np.random.Generator) -> np.ndarray:
    """Contiguous cropping (AF3 SI 2.7.1, AF-Multimer SI Algorithm 1): chains in a random order, each gives one
    contiguous run whose length is drawn so that the crop is exactly ``crop_size`` tokens.

    As in OpenFold3, the tokens still to come (``n_remaining``) exclude the current chain, which Algorithm 1 as printed
    gets wrong. Returns ``[min(N, crop_size)]`` sorted token indices.
    """
    n = structure.n_tokens
    if n <= crop_size:
        return _all_tokens(structure)
    chain_starts = np.flatnonzero(np.r_[True, structure.asym_id[1:] != structure.asym_id[:-1]])
    chain_ends = np.r_[chain_starts[1:], n]
    order = rng.permutation(len(chain_starts))
    n_added, n_remaining = 0, n
    runs = []
    for k in order:
        start, length = chain_starts[k], chain_ends[k] - chain_starts[k]
        n_remaining -= length
        size_max = min(crop_size - n_added, length)
        size_min = min(length, max(0, crop_size - n_added - n_remaining))
        size = int(rng.integers(size_min, size_max + 1))
        n_added += size
        offset = int(rng.integers(0, length - size + 1))
        runs.append(np.arange(start + offset, start + offset + size))
    return np.sort(np.concatenate(runs))


def nearest_tokens(ca: np.ndarray, resolved: np.ndarray, centre: int, k: int) -> np.ndarray:
    """The ``k`` resolved tokens whose Calpha is nearest to token ``centre``'s, sorted by index.

    Ties are broken by token index. AF3 SI 2.7.2 does that with a small index-dependent term added to each distance
    (``i * 1e-3`` in AF-Multimer's Algorithm 2); a stable sort on the exact distances breaks ties the same way without
    moving any distance (``1e-3`` per index is 2 A at token 2000).

    Args:
        ca: ``[N, 3]`` coordinates, NaN where unresolved.
        resolved: ``[N]`` bool.
    """
    candidates = np.flatnonzero(resolved)                                          # [M]
    distance = np.sqrt(((ca[candidates].astype(np.float64) - ca[centre]) ** 2).sum(-1))  # [M]
    order = np.argsort(distance, kind="stable")[:k]
    return np.sort(candidates[order])


def crop_spatial(structure: Structure, crop_size: int, rng: np.random.Generator) -> np.ndarray:
    """Spatial cropping (AF3 SI 2.7.2): a resolved token drawn uniformly as the centre, then the ``crop_size``
    resolved tokens nearest to it (Calpha). Returns sorted token indices."""
    if structure.n_tokens <= crop_size:
        return _all_tokens(structure)
    resolved = np.flatnonzero(structure.resolved)
    if len(resolved) == 0:
        return crop_contiguous(structure, crop_size, rng)
    centre = int(rng.choice(resolved))
    return nearest_tokens(structure.ca, structure.resolved, centre, crop_size)


def _squared_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[A, B]`` squared distances between ``a [A, 3]`` and ``b [B, 3]``, one axis at a time (no BLAS: exact, and
    no thread pool to fight the loader's other workers for the cores)."""
    d2 = np.zeros((len(a), len(b)))
    for k in range(3):
        diff = a[:, None, k] - b[None, :, k]     # [A, B]
        d2 += diff * diff
    return d2


def interface_tokens(structure: Structure, distance: float = INTERFACE_DISTANCE) -> np.ndarray:
    """``[N]`` bool: resolved tokens with a resolved token of another chain within ``distance`` A (Calpha; AF3 SI
    2.7.3). Per chain, only the other chains' tokens inside its bounding box grown by ``distance`` are compared,
    and only with its own tokens inside theirs."""
    out = np.zeros(structure.n_tokens, dtype=bool)
    idx = np.flatnonzero(structure.resolved)
    x = structure.ca[idx].astype(np.float64)                    # [M, 3]
    chain = structure.asym_id[idx]                              # [M]
    for c in np.unique(chain):
        mine, other = np.flatnonzero(chain == c), np.flatnonzero(chain != c)
        xm, xo = x[mine], x[other]
        xo = xo[np.all((xo >= xm.min(0) - distance) & (xo <= xm.max(0) + distance), axis=1)]
        if len(xo) == 0:
            continue
        near = np.all((xm >= xo.min(0) - distance) & (xm <= xo.max(0) + distance), axis=1)
        hit = (_squared_distances(xm[near], xo) <= distance * distance).any(1)
        out[idx[mine[near]]] = hit
    return out


def crop_spatial_interface(structure: Structure, crop_size: int, rng: np.random.Generator,
                           interface: np.ndarray | None = None,
                           distance: float = INTERFACE_DISTANCE) -> np.ndarray:
    """Spatial interface cropping (AF3 SI 2.7.3): the centre is drawn among interface tokens (``interface``, ``[N]``
    bool, computed by :func:`interface_tokens` when not given), then the nearest resolved tokens as in
    :func:`crop_spatial`. A structure without interface tokens (a monomer) gets a spatial crop."""
    if structure.n_tokens <= crop_size:
        return _all_tokens(structure)
    if interface is None:
        interface = interface_tokens(structure, distance)
    centres = np.flatnonzero(interface)
    if len(centres) == 0:
        return crop_spatial(structure, crop_size, rng)
    centre = int(rng.choice(centres))
    return nearest_tokens(structure.ca, structure.resolved, centre, crop_size)


@dataclass
class Crop:
    indices: np.ndarray                    # [n] sorted token indices
    method: CropMethod
    interface: np.ndarray | None = None    # [N] interface mask when it was used (for the caller to cache)


def crop_structure(structure: Structure, crop_size: int, rng: np.random.Generator,
                   weights: Sequence[float] = AF3_CROP_WEIGHTS, interface: np.ndarray | None = None,
                   distance: float = INTERFACE_DISTANCE) -> Crop:
    """Choose a cropper with ``weights`` (contiguous, spatial, interface; AF3 SI 2.7 uses 0.2, 0.4, 0.4) and crop.

    A structure without interface tokens (a monomer, or chains apart) gets a spatial crop where the interface cropper
    was drawn, i.e. its interface weight moves to spatial; one with no resolved token is cropped contiguously.
    ``interface`` is the ``[N]`` mask of :func:`interface_tokens`; it is computed here only when the interface cropper
    is drawn and it is not given (pass it in to cache it).
    """
    if len(weights) != 3 or min(weights) < 0 or sum(weights) <= 0:
        raise ValueError(f"crop weights must be three non-negative numbers, not all zero; got {list(weights)}")
    if crop_size < 1:
        raise ValueError(f"crop_size must be >= 1, got {crop_size}")
    if structure.n_tokens <= crop_size:
        return Crop(_all_tokens(structure), "whole")
    w = np.asarray(weights, dtype=np.float64)
    method = ("contiguous", "spatial", "interface")[int(rng.choice(3, p=w / w.sum()))]
    if not structure.resolved.any():
        method = "contiguous"
    if method == "interface":
        if interface is None:
            interface = interface_tokens(structure, distance)
        if not interface.any():
            method = "spatial"
    if method == "contiguous":
        return Crop(crop_contiguous(structure, crop_size, rng), method, interface)
    if method == "spatial":
        return Crop(crop_spatial(structure, crop_size, rng), method, interface)
    return Crop(crop_spatial_interface(structure, crop_size, rng, interface, distance), method, interface)
