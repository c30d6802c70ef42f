"""The validation split by sequence identity (mini_of3.data.homology): no training chain above the cut against any
validation chain, on real entries of the shared set."""
from __future__ import annotations

import dataclasses

import pytest

from mini_of3.config import DataConfig
from mini_of3.data import ProteinDataset, load_prepared, read_manifest
from mini_of3.data.homology import CACHE_FILE, IdentityCache, entry_chains, sequence_identity

# 1BD2: TCR B7 on HLA-A2 with beta-2-microglobulin (chains A, B); 2CRB: an 97-residue NMR domain
VAL = ["1BD2", "2CRB"]
CFG = DataConfig(crop_size=64, min_tokens=1, max_resolution=None, num_workers=0, val_ids=VAL, val_identity_cut=0.4)
NEEDED = {*VAL, "3PWP", "3KPR", "4ZEY", "1CRN"}       # the homologues and the unrelated entry the tests name


def need_named_entries(prepared) -> None:
    """Skip where the prepared folder lacks the entries the tests name (the offline package has no 2CRB, 4ZEY)."""
    missing = NEEDED - {r.id for r in read_manifest(prepared)}
    if missing:
        pytest.skip(f"needs {', '.join(sorted(missing))} from the shared set (../shared/data/mmcif)")


def test_sequence_identity_over_the_shorter_chain():
    a = "MKTAYIAKQRQISFVKSHFSRQLEERLGLIEVQ"                                      # 33 residues
    assert sequence_identity(a, a) == 1.0
    assert sequence_identity(a[5:30], a) == 1.0                                  # a fragment: free end gaps
    half = a[:20] + "W" * 20
    assert sequence_identity(half, a[:20] + a[:10] + "DEGNPSTVDE") == 0.5       # 20 of 40 identical
    assert sequence_identity("X" * 25, "X" * 25) == 0.0                         # unknown residues never count
    assert sequence_identity("", a) == 0.0
    assert sequence_identity(a[3:28], a) == sequence_identity(a, a[3:28])
    # under 20 residues a chain matches only where it is part of the other: the Tax peptide of 1BD2 (chain C)
    assert sequence_identity("LLFGYPVYV", "MAHFPGFGQSLLFGYPVYVFGDCVQG") == 1.0
    assert sequence_identity("LLFGYPVYV", a) == 0.0


def chains_of(prepared, rows):
    return {r.id: entry_chains(load_prepared(prepared / r.npz), r.id) for r in rows}


def test_no_training_chain_above_the_cut_against_any_validation_chain(prepared):
    """3PWP (the same TCR and HLA-A2 as 1BD2), 3KPR (HLA-B44 and the same beta-2-microglobulin) and 4ZEY (90 %
    identical to 2CRB; 2CRB is its NMR structure) trained under the split by entry id; with the cut at 0.4 they go, crambin (1CRN) stays."""
    need_named_entries(prepared)
    by_id = ProteinDataset(prepared, dataclasses.replace(CFG, val_identity_cut=None), "train")
    train = ProteinDataset(prepared, CFG, "train")
    val = ProteinDataset(prepared, CFG, "val")
    assert {"3PWP", "3KPR", "4ZEY"} <= {r.id for r in by_id.rows}                # the leak this split closes
    kept = {r.id for r in train.rows}
    assert {"3PWP", "3KPR", "4ZEY"}.isdisjoint(kept) and "1CRN" in kept
    assert {r.id for r in val.rows} == set(VAL)
    val_chains = [c for chains in chains_of(prepared, val.rows).values() for c in chains]
    for entry, chains in chains_of(prepared, train.rows).items():
        for t in chains:
            for v in val_chains:
                assert sequence_identity(t.sequence, v.sequence) <= 0.4, (entry, t.chain, v.entry, v.chain)
    # one line per removed entry, naming the validation chain it matched and the identity
    removed = {h.train.entry: h for h in train.removed}
    assert set(removed) == {r.id for r in by_id.rows} - kept
    assert removed["3PWP"].identity == 1.0 and removed["3PWP"].val.entry == "1BD2"
    assert removed["4ZEY"].val.entry == "2CRB" and removed["4ZEY"].identity > 0.9
    lines = train.removal_report()
    assert len(lines) == len(removed)
    assert any(line.startswith("3PWP: not trained on, chain ") and "100.0% identical to validation 1BD2" in line
               for line in lines)


def test_identity_results_are_cached_in_the_prepared_folder(prepared):
    need_named_entries(prepared)
    ProteinDataset(prepared, CFG, "train")
    cache = IdentityCache(prepared)
    assert (prepared / CACHE_FILE).is_file() and cache.values
    rows = {r.id: r for r in read_manifest(prepared)}
    (a,), (b,) = (entry_chains(load_prepared(prepared / rows[i].npz), i)[:1] for i in ("1BD2", "3PWP"))
    assert cache.identity(a.sequence, b.sequence) == 1.0 and cache.added == 0     # read back, not aligned again
