"""Features, collate, filters and the train/validation split, the sampler, and the loaders."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from mini_of3.config import DataConfig
from mini_of3.data import (EpochSampler, ProteinDataset, build_dataloaders, collate, crop_rng, crop_structure,
                           read_manifest, select_entries, token_features)
from mini_of3.data.dataset import filter_reason, is_validation, sample_weights

CFG = DataConfig(crop_size=64, min_tokens=1, max_resolution=None, num_workers=0)


def test_token_features_mask_unresolved_targets(structures):
    s = next(x for x in structures.values() if not x.resolved.all() and x.n_tokens > 100)
    idx = np.arange(s.n_tokens)
    f = token_features(s, idx)
    assert f["restype"].dtype == np.int64 and f["ca"].dtype == np.float32 and f["token_mask"].all()
    assert (f["resolved"] == s.resolved).all()
    assert (f["ca"][~s.resolved] == 0).all() and np.array_equal(f["ca"][s.resolved], s.ca[s.resolved])
    assert (f["cb_resolved"] == ~np.isnan(s.cb).any(-1)).all() and not np.isnan(f["cb"]).any()
    for name in ("residue_index", "asym_id", "entity_id", "sym_id"):
        assert (f[name] == getattr(s, name)).all()


def test_collate_pads_and_masks(prepared):
    ds = ProteinDataset(prepared, dataclasses.replace(CFG, crop_size=128), "all")
    short = next(i for i, r in enumerate(ds.rows) if r.tokens < 60)
    long = next(i for i, r in enumerate(ds.rows) if r.tokens > 200)
    a, b = ds[(short, 0)], ds[(long, 0)]
    batch = collate([a, b])
    n = a["token_mask"].shape[0]
    assert batch["restype"].shape == (2, 128) and batch["ca"].shape == (2, 128, 3)
    assert batch["token_mask"][0, :n].all() and not batch["token_mask"][0, n:].any()
    assert not batch["resolved"][0, n:].any() and (batch["ca"][0, n:] == 0).all()
    assert torch.equal(batch["ca"][1], b["ca"]) and batch["pdb_id"] == [a["pdb_id"], b["pdb_id"]]
    assert batch["restype"].dtype == torch.int64 and batch["token_mask"].dtype == torch.bool
    fixed = collate([a], n_tokens=150)                       # a fixed length, as data.pad_to_crop asks
    assert fixed["ca"].shape == (1, 150, 3) and fixed["token_mask"][0].sum() == n
    assert torch.equal(fixed["ca"][0, :n], a["ca"]) and not fixed["resolved"][0, n:].any()
    with pytest.raises(ValueError, match="more than n_tokens=100"):
        collate([a, b], n_tokens=100)


def test_pad_to_crop_gives_every_training_batch_the_crop_length(prepared):
    cfg = dataclasses.replace(CFG, crop_size=200, pad_to_crop=True, val_ids=["7ETN"])
    loaders = build_dataloaders(cfg, prepared, seed=0)
    loaders.train_sampler.set_epoch(0)
    batches = [b for _, b in zip(range(6), loaders.train)]
    assert {tuple(b["restype"].shape) for b in batches} == {(1, 200)}
    assert any(b["token_mask"].sum() < 200 for b in batches)          # entries shorter than the crop are padded
    assert all(b["restype"].shape[1] == b["token_mask"].sum() for b in loaders.val)   # validation is not padded


def test_getitem_is_a_function_of_index_and_epoch(prepared):
    ds = ProteinDataset(prepared, dataclasses.replace(CFG, crop_size=96), "all", seed=3)
    i = max(range(len(ds)), key=lambda k: ds.rows[k].tokens)
    a, b = ds[(i, 5)], ds[(i, 5)]
    assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))
    s = ds.structure(i)
    crop = crop_structure(s, 96, crop_rng(3, 5, i), weights=CFG.crop_weights)
    assert crop.method == a["crop_method"] and np.array_equal(token_features(s, crop.indices)["restype"],
                                                              a["restype"].numpy())
    epochs = {tuple(ds[(i, e)]["residue_index"][:4].tolist()) for e in range(8)}
    assert len(epochs) > 3
    ds.set_epoch(5)
    assert torch.equal(ds[i]["ca"], a["ca"])


def test_validation_crops_have_their_own_size_the_training_crops_keep_crop_size(prepared):
    """data.val_crop_size: runs with different training crops validate on the same tokens (python -m
    mini_of3.ablate); unset, validation crops to data.crop_size as before."""
    rows = read_manifest(prepared)
    big = max(rows, key=lambda r: r.tokens)
    cfg = dataclasses.replace(CFG, crop_size=32, val_ids=[big.id], max_tokens=None)
    for train_crop in (32, 48):
        fixed = dataclasses.replace(cfg, crop_size=train_crop, val_crop_size=64)
        val, train = ProteinDataset(prepared, fixed, "val"), ProteinDataset(prepared, fixed, "train")
        assert [r.id for r in val.rows] == [big.id] and len(val[(0, 0)]["restype"]) == min(64, big.tokens)
        assert {len(train[(i, 0)]["restype"]) for i in range(3)} <= set(range(1, train_crop + 1))
        if train_crop == 32:
            first = val[(0, 0)]
        assert torch.equal(val[(0, 0)]["residue_index"], first["residue_index"])   # the same tokens
    assert len(ProteinDataset(prepared, cfg, "val")[(0, 0)]["restype"]) == min(32, big.tokens)


def test_filters(prepared):
    rows = read_manifest(prepared)
    assert all(r.tokens >= 100 for r in select_entries(rows, dataclasses.replace(CFG, min_tokens=100), "all"))
    assert all(r.tokens <= 200 for r in select_entries(rows, dataclasses.replace(CFG, max_tokens=200), "all"))
    kept = select_entries(rows, dataclasses.replace(CFG, max_resolution=2.0), "all")
    assert all(r.resolution is None or r.resolution <= 2.0 for r in kept)
    assert any(r.resolution is None for r in kept) == any(r.resolution is None for r in rows)
    least = min(rows, key=lambda r: r.resolved_fraction)
    cut = dataclasses.replace(CFG, min_resolved_fraction=(least.resolved_fraction + 1.0) / 2)
    assert least.resolved_fraction < 1.0          # the real entries include one with unresolved tokens
    assert {r.id for r in select_entries(rows, cut, "all")} == \
        {r.id for r in rows if r.resolved_fraction >= cut.min_resolved_fraction} and least.id not in \
        {r.id for r in select_entries(rows, cut, "all")}
    assert "of its tokens resolved < min_resolved_fraction" in filter_reason(least, cut)
    xray = select_entries(rows, dataclasses.replace(CFG, methods=["x-ray diffraction"]), "all")
    assert xray and all("X-RAY DIFFRACTION" in r.method.split(";") for r in xray)
    assert filter_reason(rows[0], dataclasses.replace(CFG, min_tokens=10**6)).startswith(f"{rows[0].tokens} tokens")


def test_validation_entries_are_never_trained_on(prepared):
    rows = read_manifest(prepared)
    cfg = dataclasses.replace(CFG, val_ids=[rows[0].id.lower()], val_after="2012-01-01")
    train, val = select_entries(rows, cfg, "train"), select_entries(rows, cfg, "val")
    assert {r.id for r in train}.isdisjoint({r.id for r in val})
    assert len(train) + len(val) == len(select_entries(rows, cfg, "all"))
    assert rows[0].id in {r.id for r in val}
    assert all(r.release_date is None or r.release_date <= "2012-01-01" for r in train)
    assert any(r.release_date and r.release_date > "2012-01-01" for r in val)
    assert is_validation(rows[0], cfg)
    with pytest.raises(ValueError, match="split"):
        select_entries(rows, cfg, "test")
    with pytest.warns(UserWarning, match=r"val_ids \['9ZZZ'\]"):
        ProteinDataset(prepared, dataclasses.replace(cfg, val_ids=["9ZZZ"]), "val")


def test_train_ids_train_on_those_entries_only_validation_ones_included(prepared):
    """A fit check (bench fit) trains on its validation entries on purpose: train_ids names them."""
    rows = read_manifest(prepared)
    named = [rows[0].id.lower(), rows[1].pdb_id]
    cfg = dataclasses.replace(CFG, train_ids=named, val_ids=[rows[0].id], val_identity_cut=None)
    assert [r.id for r in select_entries(rows, cfg, "train")] == [rows[0].id, rows[1].id]
    assert [r.id for r in select_entries(rows, cfg, "val")] == [rows[0].id]
    assert [r.id for r in ProteinDataset(prepared, cfg, "train").rows] == [rows[0].id, rows[1].id]
    with pytest.warns(UserWarning, match=r"train_ids \['9ZZZ'\]"):
        ProteinDataset(prepared, dataclasses.replace(cfg, train_ids=["9ZZZ"]), "train")


def test_sample_weights(prepared):
    rows = read_manifest(prepared)
    for how, key in (("length", "tokens"), ("chains", "chains")):
        w = sample_weights(rows, how)
        expected = np.array([getattr(r, key) for r in rows], float)
        np.testing.assert_allclose(w, expected / expected.sum())
    np.testing.assert_allclose(sample_weights(rows, "uniform"), 1 / len(rows))


def test_sampler_is_deterministic_and_sharded_without_duplicates():
    sampler = EpochSampler(np.ones(10), seed=1, world_size=1)
    assert np.array_equal(sampler.stream(0), EpochSampler(np.ones(10), seed=1).stream(0))
    assert sorted(sampler.stream(0)) == list(range(10)) and not np.array_equal(sampler.stream(0), sampler.stream(1))
    ranks = [EpochSampler(np.ones(12), seed=1, rank=r, world_size=3) for r in range(3)]
    shards = [list(s) for s in ranks]
    assert all(len(x) == 4 for x in shards)
    assert sorted(i for shard in shards for i, _ in shard) == list(range(12))
    odd = [EpochSampler(np.ones(10), seed=1, rank=r, world_size=4) for r in range(4)]
    assert len({len(s) for s in odd}) == 1 and sum(len(s) for s in odd) == 12


def test_sampler_resumes_exactly():
    weights = np.arange(1, 9, dtype=float)
    full = EpochSampler(weights, seed=5, rank=1, world_size=2)
    full.set_epoch(3)
    expected = list(full)
    resumed = EpochSampler(weights, seed=5, rank=1, world_size=2)
    resumed.load_state_dict({"epoch": 3, "start": 2, "seed": 5, "total": full.total})
    assert list(resumed) == expected[2:] and len(resumed) == len(expected) - 2
    assert all(epoch == 3 for _, epoch in expected)
    with pytest.raises(ValueError, match="seed"):
        resumed.load_state_dict({"epoch": 0, "start": 0, "seed": 6, "total": full.total})


def test_weighted_sampler_follows_the_weights():
    weights = np.array([1.0, 2.0, 7.0])
    sampler = EpochSampler(weights, seed=0, num_samples=20_000)
    counts = np.bincount(sampler.stream(0), minlength=3) / 20_000
    np.testing.assert_allclose(counts, weights / weights.sum(), atol=0.02)


def test_dataloader_with_workers_gives_the_same_batches(prepared):
    cfg = dataclasses.replace(CFG, crop_size=48, batch_size=2, num_workers=2, val_ids=["7ETN", "1YJP"])
    loaders = build_dataloaders(cfg, prepared, seed=0)
    loaders.train_sampler.set_epoch(1)
    with_workers = [b for _, b in zip(range(3), loaders.train)]
    single = build_dataloaders(dataclasses.replace(cfg, num_workers=0), prepared, seed=0)
    single.train_sampler.set_epoch(1)
    in_process = [b for _, b in zip(range(3), single.train)]
    assert len(with_workers) == len(in_process) >= 2 and with_workers[0]["restype"].shape[0] == 2
    for a, b in zip(with_workers, in_process):
        assert a["id"] == b["id"] and torch.equal(a["ca"], b["ca"]) and a["restype"].shape[0] == len(a["id"])
    val_ids = {i for batch in loaders.val for i in batch["id"]}
    train_ids = {loaders.train.dataset.rows[i].id for i in loaders.train_sampler.stream(1)}
    assert val_ids and val_ids.isdisjoint(train_ids)


def test_the_crop_configs_validate_on_six_entries_of_the_shared_set_with_no_warning(shared_mmcif, tmp_path):
    """configs/crop384.yaml (data.val_ids: auto) on a prepared folder of the shared entries: six validation entries
    from small to large, none above 40 % identity to a training chain, chosen the same way twice, no warning."""
    import warnings
    from pathlib import Path

    from mini_of3.config import load_config
    from mini_of3.data import ProteinDataset, prepare_folder
    from mini_of3.data.homology import IdentityCache, find_homologues
    from mini_of3.data.dataset import _chains, resolve_validation

    if len(list(shared_mmcif.glob("*.cif.gz"))) < 50:
        pytest.skip("needs the shared entries")
    prepared = tmp_path / "prepared"
    prepare_folder(shared_mmcif, prepared, workers=2, progress=False)
    repo = Path(__file__).resolve().parents[2]
    cfg = load_config(repo / "configs" / "crop384.yaml", [f"data.root={prepared}", f"data.cache_dir={prepared}"]).data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chosen = resolve_validation(prepared, cfg)
        val = ProteinDataset(prepared, chosen, "val")
        train = ProteinDataset(prepared, chosen, "train")
    assert len(val) >= 6 and resolve_validation(prepared, cfg).val_ids == chosen.val_ids
    sizes = sorted(r.tokens for r in val.rows)
    assert sizes[0] <= 64 and 384 < sizes[-1] <= 768, sizes
    val_chains = [c for r in val.rows for c in _chains(prepared, r)]
    assert not find_homologues([_chains(prepared, r) for r in train.rows], val_chains, 0.4, IdentityCache(prepared))
    assert len(train) >= 40
