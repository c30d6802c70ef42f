"""A random compact chain: what a structure scores with generic chain geometry and no knowledge of the protein.

Consecutive Calpha atoms 3.8 A apart, each step a random direction whose end stays inside a sphere with the radius
of a folded protein of that length (radius of gyration 2.2 N^0.38 A, the sphere sqrt(5/3) times that); a
step that would leave the sphere is drawn again, up to ``tries`` times, then taken towards the centre. Such chains
score lDDT-Calpha near 0.17 on small proteins: a model's prediction must do better to show it learned anything.
"""
from __future__ import annotations

import numpy as np

CA_CA = 3.8                              # Angstrom between consecutive Calpha atoms


def compact_radius(n: int) -> float:
    """The radius of a sphere holding a folded chain of ``n`` residues (Rg = 2.2 n^0.38 A)."""
    return float(np.sqrt(5.0 / 3.0) * 2.2 * max(n, 1) ** 0.38)


def random_compact_chain(n: int, rng: np.random.Generator, tries: int = 20) -> np.ndarray:
    """``[n, 3]`` float32 Calpha coordinates of a random compact chain (module docstring)."""
    radius = compact_radius(n)
    x = np.zeros((n, 3))
    for i in range(1, n):
        for _ in range(tries):
            step = rng.normal(size=3)
            step *= CA_CA / np.linalg.norm(step)
            if np.linalg.norm(x[i - 1] + step) <= radius:
                break
        else:
            inward = -x[i - 1] / max(np.linalg.norm(x[i - 1]), 1e-9)
            step = CA_CA * inward
        x[i] = x[i - 1] + step
    return (x - x.mean(0)).astype(np.float32)
