"""The AF3 croppers (SI 2.7) against brute-force references on real structures."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from mini_of3.data import (crop_contiguous, crop_rng, crop_spatial, crop_spatial_interface, crop_structure,
                           interface_tokens, nearest_tokens, token_features)

from .helpers import LARGE

SIZES = (256, 384, 512, 640, 768)


def brute_nearest(ca: np.ndarray, resolved: np.ndarray, centre: int, k: int) -> list[int]:
    """The k resolved tokens nearest to the centre, by plain Python, ties to the lower index."""
    c = [float(v) for v in ca[centre]]
    dist = [(math.sqrt(sum((float(a) - b) ** 2 for a, b in zip(ca[i], c))), i)
            for i in range(len(ca)) if resolved[i]]
    return sorted(i for _, i in sorted(dist)[:k])


def brute_interface(s, distance: float = 15.0) -> np.ndarray:
    out = np.zeros(s.n_tokens, dtype=bool)
    idx = np.flatnonzero(s.resolved)
    for i in idx:
        other = idx[s.asym_id[idx] != s.asym_id[i]]
        d = np.sqrt(((s.ca[other].astype(np.float64) - s.ca[i]) ** 2).sum(-1))
        out[i] = bool((d <= distance).any())
    return out


def large(structures, pdb_id):
    if pdb_id not in structures:
        pytest.skip(f"{pdb_id} is only in ../shared/data/mmcif")
    return structures[pdb_id]


def test_nearest_tokens_equal_brute_force(structures):
    rng = np.random.default_rng(0)
    for pdb_id in ("3KPR", "1BD2", "5PTI"):
        s = structures.get(pdb_id)
        if s is None:
            continue
        for _ in range(3):
            centre = int(rng.choice(np.flatnonzero(s.resolved)))
            k = int(rng.integers(1, s.n_tokens))
            assert nearest_tokens(s.ca, s.resolved, centre, k).tolist() == brute_nearest(s.ca, s.resolved, centre, k)


def test_ties_are_broken_by_token_index():
    from mini_of3.data import Structure

    n = 8
    ca = np.zeros((n, 3), np.float32)
    ca[:, 0] = [0, 1, -1, 1, -1, 2, -2, 3]        # tokens 1/2 and 3/4 at equal distances from token 0
    s = Structure(pdb_id="TIES", restype=np.zeros(n), residue_index=np.arange(1, n + 1), asym_id=np.zeros(n),
                  entity_id=np.zeros(n), sym_id=np.zeros(n), ca=ca, cb=ca, resolved=np.ones(n, bool),
                  chain_ids=("A",), auth_chain_ids=("A",), entity_ids=("1",))
    assert nearest_tokens(s.ca, s.resolved, 0, 2).tolist() == [0, 1]
    assert nearest_tokens(s.ca, s.resolved, 0, 4).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("pdb_id", LARGE)
def test_spatial_crop_is_the_k_nearest_to_its_centre(structures, pdb_id):
    s = large(structures, pdb_id)
    for seed in range(2):
        crop = crop_spatial(s, 384, crop_rng(seed, 0, 0))
        centre = int(crop_rng(seed, 0, 0).choice(np.flatnonzero(s.resolved)))   # the same draw
        assert crop.tolist() == brute_nearest(s.ca, s.resolved, centre, 384)


def test_interface_tokens_equal_brute_force(structures):
    for pdb_id in ("3KPR", "1BD2", "2HHB", "5PTI"):
        s = structures.get(pdb_id)
        if s is not None:
            assert (interface_tokens(s) == brute_interface(s)).all(), pdb_id
    monomer = structures.get("5PTI")
    if monomer is not None:
        assert not interface_tokens(monomer).any()


@pytest.mark.parametrize("pdb_id", ["3KPR", "1BD2", "3SN6"])
def test_interface_crop_is_centred_on_an_interface_token(structures, pdb_id):
    s = large(structures, pdb_id)
    interface = brute_interface(s)
    assert interface.any()
    for seed in range(3):
        crop = crop_spatial_interface(s, 256, crop_rng(seed, 1, 2))
        centre = int(crop_rng(seed, 1, 2).choice(np.flatnonzero(interface)))
        assert interface[centre] and centre in crop
        assert crop.tolist() == brute_nearest(s.ca, s.resolved, centre, 256)


def test_interface_crop_of_a_monomer_is_spatial(structures):
    s = structures.get("4Q8N") or structures["5PTI"]
    size = min(64, s.n_tokens - 1)
    assert (crop_spatial_interface(s, size, crop_rng(0, 0, 0)) == crop_spatial(s, size, crop_rng(0, 0, 0))).all()


@pytest.mark.parametrize("pdb_id", LARGE)
def test_contiguous_crop_is_one_run_per_chain(structures, pdb_id):
    s = large(structures, pdb_id)
    for seed in range(5):
        crop = crop_contiguous(s, 512, crop_rng(seed, 0, 0))
        assert len(crop) == 512 and (np.diff(crop) > 0).all()
        for chain in np.unique(s.asym_id[crop]):
            run = crop[s.asym_id[crop] == chain]
            assert (np.diff(run) == 1).all(), f"chain {chain} is not one contiguous run"


def test_contiguous_crop_follows_af_multimer_algorithm_1(structures):
    """Over many seeds every chain takes part, run lengths vary, and runs touch chain starts and ends."""
    s = large(structures, "3KPR")
    starts = np.flatnonzero(np.r_[True, s.asym_id[1:] != s.asym_id[:-1]])
    ends = np.r_[starts[1:], s.n_tokens] - 1
    seen, lengths, at_start, at_end = Counter(), set(), 0, 0
    for seed in range(200):
        crop = crop_contiguous(s, 256, crop_rng(seed, 0, 0))
        for chain in np.unique(s.asym_id[crop]):
            run = crop[s.asym_id[crop] == chain]
            seen[int(chain)] += 1
            lengths.add(len(run))
            at_start += run[0] == starts[chain]
            at_end += run[-1] == ends[chain]
    assert len(seen) == s.n_chains and len(lengths) > 50 and at_start > 0 and at_end > 0


@pytest.mark.parametrize("size", SIZES)
def test_crops_of_every_size_from_the_large_entries(structures, size):
    found = [structures[k] for k in LARGE if k in structures]
    if not found:
        pytest.skip("the large entries are only in ../shared/data/mmcif")
    for s in found:
        for seed in range(6):
            crop = crop_structure(s, size, crop_rng(seed, 0, size))
            assert len(crop.indices) == size, (s.pdb_id, crop.method)
            assert (np.diff(crop.indices) > 0).all()
            features = token_features(s, crop.indices)
            assert features["ca"].shape == (size, 3) and features["restype"].shape == (size,)
            assert not np.isnan(features["ca"]).any()


def test_same_seed_same_crop_and_other_seeds_differ(structures):
    s = large(structures, "3WIP")
    a = crop_structure(s, 384, crop_rng(7, 3, 11))
    b = crop_structure(s, 384, crop_rng(7, 3, 11))
    assert a.method == b.method and (a.indices == b.indices).all()
    others = {tuple(crop_structure(s, 384, crop_rng(7, e, 11)).indices[:5]) for e in range(10)}
    assert len(others) > 5


def test_small_structures_are_returned_whole(structures):
    s = structures.get("5PTI") or next(iter(structures.values()))
    for cropper in (crop_contiguous, crop_spatial, crop_spatial_interface):
        assert cropper(s, s.n_tokens, crop_rng(0, 0, 0)).tolist() == list(range(s.n_tokens))
    crop = crop_structure(s, 10_000, crop_rng(0, 0, 0))
    assert crop.method == "whole" and len(crop.indices) == s.n_tokens


def test_weights_choose_the_cropper(structures):
    s = large(structures, "3KPR")
    methods = Counter(crop_structure(s, 256, crop_rng(0, 0, i)).method for i in range(500))
    assert set(methods) == {"contiguous", "spatial", "interface"}
    for method, weight in zip(("contiguous", "spatial", "interface"), (0.2, 0.4, 0.4)):
        assert abs(methods[method] / 500 - weight) < 0.07, methods
    only = Counter(crop_structure(s, 256, crop_rng(0, 0, i), weights=(1, 0, 0)).method for i in range(20))
    assert only == {"contiguous": 20}
    monomer = structures.get("4Q8N") or structures["5PTI"]
    fallback = Counter(crop_structure(monomer, 32, crop_rng(0, 0, i), weights=(0, 0, 1)).method for i in range(20))
    assert fallback == {"spatial": 20}
    with pytest.raises(ValueError, match="crop weights"):
        crop_structure(s, 256, crop_rng(0, 0, 0), weights=(0, 0, 0))
    with pytest.raises(ValueError, match="crop_size"):
        crop_structure(s, 0, crop_rng(0, 0, 0))
