"""Metrics against independent values on real structures (models of NMR entries, a hinge-moved crystal structure,
the hemoglobin homomer 2HHB)."""
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from mini_of3.geometry import superpose
from mini_of3.metrics import (assign_homomer_chains, contact_precision, distance_bins, distogram_accuracy, lddt_ca,
                              lddt_ca_per_token, rmsd_kabsch, structure_metrics, tm_d0, tm_score,
                              tm_score_and_mirror)

_spec = importlib.util.spec_from_file_location("model_structures", Path(__file__).parent / "model" / "structures.py")
structures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(structures)
read_tokens = structures.read_tokens


def nmr_pair(pdb_id, i, j):
    a, b = read_tokens(pdb_id, i), read_tokens(pdb_id, j)
    assert torch.equal(a["residue_index"], b["residue_index"])
    return a["ca"], b["ca"], a["resolved"]


def hinge(x, split, angle, seed, noise):
    """Rotate residues split: of x by `angle` about a random axis through residue split, then add noise."""
    g = torch.Generator().manual_seed(seed)
    x = x.double().clone()
    axis = torch.randn(3, generator=g, dtype=torch.float64)
    axis /= axis.norm()
    k = torch.tensor([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    r = torch.eye(3, dtype=torch.float64) + math.sin(angle) * k + (1 - math.cos(angle)) * k @ k
    x[split:] = (x[split:] - x[split]) @ r.T + x[split]
    return x + noise * torch.randn(x.shape, generator=g, dtype=torch.float64)


def lddt_loops(pred, true, mask, cutoff=15.0):
    """lDDT-Calpha pooled over pairs, written as plain loops (the independent value)."""
    p, t, m = pred.double().numpy(), true.double().numpy(), mask.numpy()
    kept = total = 0.0
    for i in range(len(p)):
        for j in range(len(p)):
            if i == j or not (m[i] and m[j]):
                continue
            dt = np.linalg.norm(t[i] - t[j])
            if dt >= cutoff:
                continue
            dp = np.linalg.norm(p[i] - p[j])
            kept += np.mean([abs(dp - dt) < thr for thr in (0.5, 1, 2, 4)])
            total += 1
    return kept / total


@pytest.mark.parametrize("pdb_id,i,j", [("1L2Y", 0, 1), ("2CRB", 0, 5), ("1PSM", 2, 7)])
def test_lddt_and_rmsd_against_independent_values_on_nmr_models(pdb_id, i, j):
    from Bio.SVDSuperimposer import SVDSuperimposer
    pred, true, mask = nmr_pair(pdb_id, i, j)
    mask = mask.clone()
    mask[::7] = False                                   # a few unresolved tokens must be ignored by both
    assert float(lddt_ca(pred, true, mask)) == pytest.approx(lddt_loops(pred, true, mask), abs=1e-12)
    sup = SVDSuperimposer()
    sup.set(true[mask].double().numpy(), pred[mask].double().numpy())
    sup.run()
    assert float(rmsd_kabsch(pred, true, mask)) == pytest.approx(sup.get_rms(), abs=1e-9)
    # invariance: lDDT to any rigid motion, RMSD to motion of pred
    r = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64))[0]
    r = r * torch.sign(torch.linalg.det(r))
    moved = pred.double() @ r.T + torch.tensor([5.0, -3.0, 20.0], dtype=torch.float64)
    assert float(lddt_ca(moved, true, mask)) == pytest.approx(float(lddt_ca(pred, true, mask)), abs=1e-12)
    assert float(rmsd_kabsch(moved, true, mask)) == pytest.approx(float(rmsd_kabsch(pred, true, mask)), abs=1e-9)


def test_lddt_known_values():
    true = read_tokens("1CRN")["ca"].double()
    mask = torch.ones(len(true), dtype=torch.bool)
    assert float(lddt_ca(true, true, mask)) == 1.0
    pred = true.clone()
    pred[10] += torch.tensor([3.0, 0.0, 0.0], dtype=torch.float64)       # one atom moved by 3 A
    value = float(lddt_ca(pred, true, mask))
    assert value == pytest.approx(lddt_loops(pred, true, mask), abs=1e-12) and value < 1.0
    per_token, valid = lddt_ca_per_token(pred[None], true[None], mask[None])
    assert valid.all() and per_token[0, 10] == per_token[0].min()


def test_tm_score_matches_tm_align_where_its_alignment_is_the_identity():
    """Independent value: TM-align (tmtools). Its alignment is sequence-free; where it comes out as the identity,
    its TM-score (normalised by the true structure) is the sequence-dependent TM-score. Tolerance: 1e-4."""
    from tmtools import tm_align
    cases = [nmr_pair("1L2Y", 0, 1), nmr_pair("1AS5", 0, 1), nmr_pair("1AS5", 1, 4), nmr_pair("1LCD", 0, 1)]
    a8o = read_tokens("1A8O")
    cases.append((hinge(a8o["ca"], 35, 0.4, seed=1, noise=0.3), a8o["ca"], a8o["resolved"]))
    for pred, true, mask in cases:
        seq = "A" * len(true)
        ref = tm_align(pred.double().numpy(), true.double().numpy(), seq, seq)
        assert ref.seqxA == seq and ref.seqyA == seq, "TM-align's alignment is not the identity here"
        assert float(tm_score(pred, true, mask)) == pytest.approx(ref.tm_norm_chain2, abs=1e-4)


def test_tm_score_search_beats_one_global_superposition():
    pred, true, mask = nmr_pair("1AS5", 0, 1)
    d0 = tm_d0(len(true))
    one = superpose(pred, true, mask)
    global_fit = float((1 / (1 + ((one - true.double()).norm(dim=-1) / d0) ** 2)).mean())
    assert float(tm_score(pred, true, mask)) > global_fit + 0.02
    assert float(tm_score(true, true, mask)) == pytest.approx(1.0, abs=1e-12)
    assert tm_d0(21) == 0.5 and tm_d0(100) == pytest.approx(1.24 * 85 ** (1 / 3) - 1.8)


def test_batched_metrics_equal_per_structure_values():
    pairs = [nmr_pair("1L2Y", 0, k) for k in (1, 2, 3)]
    pred = torch.stack([p for p, _, _ in pairs])
    true = torch.stack([t for _, t, _ in pairs])
    mask = torch.stack([m for _, _, m in pairs])
    mask[1, :4] = False
    for fn in (lddt_ca, rmsd_kabsch, tm_score):
        batched = fn(pred, true, mask)
        assert batched.shape == (3,)
        for b in range(3):
            assert float(batched[b]) == pytest.approx(float(fn(pred[b], true[b], mask[b])), abs=1e-12)


def contact_precision_loops(score, true_cb, mask, asym, min_sep=24, top_frac=0.2):
    """Independent: list the long-range pairs, sort by score, take the top L/5, count true contacts."""
    n = len(mask)
    d = torch.cdist(true_cb.double(), true_cb.double()).numpy()
    pairs = [(float(score[i, j]), i, j) for i in range(n) for j in range(i + min_sep, n)
             if mask[i] and mask[j] and asym[i] == asym[j]]
    pairs.sort(key=lambda p: -p[0])
    top = pairs[:max(1, int(int(mask.sum()) * top_frac))]
    return np.mean([d[i, j] < 8.0 for _, i, j in top])


def test_contact_precision_and_distogram_accuracy():
    tokens = read_tokens("2CRB")
    cb, mask, asym = tokens["cb"], tokens["resolved"].clone(), tokens["asym_id"]
    mask[5] = False
    d = torch.cdist(cb.double(), cb.double())
    perfect = torch.nn.functional.one_hot(distance_bins(d, 64), 64).float() * 10
    assert float(distogram_accuracy(perfect, cb, mask)) == 1.0
    assert float(contact_precision(perfect, cb, mask, asym)) == 1.0
    assert float(contact_precision(cb, cb, mask, asym)) == 1.0            # true coordinates as the prediction
    logits = torch.randn(len(cb), len(cb), 64, generator=torch.Generator().manual_seed(0)) + perfect * 0.25
    upper = torch.linspace(2, 22, 65)[1:]
    probs = (torch.softmax(logits.double(), -1) * (upper <= 8.0)).sum(-1)
    expected = contact_precision_loops(probs, cb, mask, asym)
    assert float(contact_precision(logits, cb, mask, asym)) == pytest.approx(expected, abs=1e-12)
    eye = torch.eye(len(cb), dtype=torch.bool)
    pairs = mask[:, None] & mask[None] & ~eye
    expected_acc = (logits.argmax(-1) == distance_bins(d, 64))[pairs].double().mean()
    assert float(distogram_accuracy(logits, cb, mask)) == pytest.approx(float(expected_acc), abs=1e-12)
    # 64 bins on 2-22 A: width 0.3125, open outer bins
    assert distance_bins(torch.tensor([0.0, 2.31, 2.32, 8.0, 21.7, 50.0]), 64).tolist() == [0, 0, 1, 19, 63, 63]


@pytest.mark.parametrize("swaps", [[(1, 3)], [(1, 3), (2, 4)]], ids=["A-C", "A-C+B-D"])
def test_homomer_chain_swap_leaves_metrics_unchanged_on_2hhb(swaps):
    """2HHB is alpha2 beta2 (entities: A, C alpha; B, D beta). Swapping the coordinates of identical chains in the
    prediction is the same prediction under another chain naming, so every metric must be unchanged."""
    t = read_tokens("2HHB")
    true, asym, entity, sym = t["ca"].double(), t["asym_id"], t["entity_id"], t["sym_id"]
    mask = t["resolved"].clone()
    mask[[3, 200, 400]] = False                                  # some unresolved tokens move with their chain
    g = torch.Generator().manual_seed(0)
    pred = hinge(true, 300, 0.1, seed=2, noise=1.0)
    perm = torch.arange(len(true))
    for first, second in swaps:
        chain_a, chain_c = (asym == first).nonzero().flatten(), (asym == second).nonzero().flatten()
        assert len(chain_a) == len(chain_c) and bool((entity[chain_a] == entity[chain_c]).all())
        perm[chain_a], perm[chain_c] = chain_c, chain_a
    swapped = pred[perm]
    true_cb = t["cb"].double()
    logits = torch.randn(len(true), len(true), 64, generator=g)
    swapped_logits = logits[perm][:, perm]
    base = structure_metrics(pred, true, mask, asym, entity, sym, logits, true_cb)
    after = structure_metrics(swapped, true, mask, asym, entity, sym, swapped_logits, true_cb)
    for key in base:
        assert after[key] == pytest.approx(base[key], abs=1e-9), key
    if len(swaps) == 1:   # without the assignment one swap is penalised (both swaps are nearly 2HHB's own C2 turn)
        assert float(lddt_ca(swapped, true, mask)) < base["lddt_ca"] - 0.05
        assert float(rmsd_kabsch(swapped, true, mask)) > base["rmsd"] + 5
    permuted_true, permuted_mask = assign_homomer_chains(swapped, true, mask, asym, entity, sym)
    assert torch.equal(permuted_true, true[perm]) and torch.equal(permuted_mask, mask[perm])
    assert base["rmsd"] < 2.0 and base["tm_score"] > 0.8


def test_structure_metrics_accept_nan_for_missing_atoms():
    t = read_tokens("2CRB")
    true, cb, mask = t["ca"].double(), t["cb"].double(), t["resolved"].clone()
    pred = hinge(true, 50, 0.2, seed=3, noise=1.0)
    logits = torch.randn(len(true), len(true), 64, generator=torch.Generator().manual_seed(0))
    ids = (t["asym_id"], t["entity_id"], t["sym_id"])
    mask[10] = False
    clean = structure_metrics(pred, true, mask, *ids, logits, cb)
    true_nan, cb_nan = true.clone(), cb.clone()
    true_nan[10] = float("nan")
    cb_nan[10] = float("nan")
    assert structure_metrics(pred, true_nan, mask, *ids, logits, cb_nan) == pytest.approx(clean, abs=1e-12)
    assert all(math.isfinite(v) for v in clean.values())
    # a token with Calpha but no Cbeta: NaN, or 0 with cb_mask (the batch's cb_resolved, as the collate gives it)
    cb_nan, cb_zero, cb_observed = cb.clone(), cb.clone(), mask.clone()
    cb_nan[20], cb_zero[20], cb_observed[20] = float("nan"), 0.0, False
    with_nan = structure_metrics(pred, true, mask, *ids, logits, cb_nan)
    assert structure_metrics(pred, true, mask, *ids, logits, cb_zero, cb_mask=cb_observed) == \
        pytest.approx(with_nan, abs=1e-12)
    assert with_nan["lddt_ca"] == clean["lddt_ca"] and with_nan["distogram_accuracy"] != clean["distogram_accuracy"]


def test_tm_score_sees_a_mirror_image_that_lddt_cannot():
    """Crambin's mirror image: every distance is right (lDDT-Calpha 1), the hand is wrong (TM-score far below 1);
    tm_score_mirror scores the mirror image of the prediction, so it is 1 here."""
    t = read_tokens("1CRN")
    true, mask = t["ca"].double(), t["resolved"]
    mirrored = structure_metrics(-true, true, mask, t["asym_id"], t["entity_id"], t["sym_id"])
    assert mirrored["lddt_ca"] == pytest.approx(1.0) and mirrored["tm_score_mirror"] == pytest.approx(1.0)
    assert mirrored["tm_score"] < 0.5
    same = structure_metrics(true, true, mask, t["asym_id"], t["entity_id"], t["sym_id"])
    assert same["tm_score"] == pytest.approx(1.0) and same["tm_score_mirror"] < 0.5


def test_one_search_scores_a_structure_and_its_mirror_image_as_two_searches_do():
    """tm_score_and_mirror runs both searches as the rows of one batch: the same TM-scores (float64) as tm_score of
    pred and of -pred, on odd lengths, gaps in the mask and an empty mask."""
    generator = torch.Generator().manual_seed(3)
    for length in (0, 3, 4, 11, 37, 90):
        true = torch.cumsum(torch.randn(length, 3, generator=generator, dtype=torch.float64) * 2.2, 0)
        pred = true + 2.5 * torch.randn(length, 3, generator=generator, dtype=torch.float64)
        mask = torch.rand(length, generator=generator) > 0.2
        both = tm_score_and_mirror(pred, true, mask)
        apart = (float(tm_score(pred, true, mask)), float(tm_score(-pred, true, mask)))
        assert both == pytest.approx(apart, abs=1e-12, nan_ok=True)


def test_tm_score_searches_its_seeds_in_chunks_alike(monkeypatch):
    """Above TM_BATCH_ELEMENTS the seed fragments are searched in chunks: the same TM-scores as in one batch."""
    import mini_of3.metrics as metrics
    generator = torch.Generator().manual_seed(4)
    true = torch.cumsum(torch.randn(70, 3, generator=generator, dtype=torch.float64) * 2.2, 0)
    pred = true + 3.0 * torch.randn(70, 3, generator=generator, dtype=torch.float64)
    mask = torch.ones(70, dtype=torch.bool)
    whole = tm_score_and_mirror(pred, true, mask)
    monkeypatch.setattr(metrics, "TM_BATCH_ELEMENTS", 2 * 70 * 9)                 # chunks of 9 of the 221 seeds
    assert tm_score_and_mirror(pred, true, mask) == pytest.approx(whole, abs=1e-12)


def _svd_rotation(h: torch.Tensor) -> torch.Tensor:
    """Kabsch by SVD, with the reflection fix: the reference for geometry.rotation_from_covariance (float64)."""
    u, _, vh = torch.linalg.svd(h)
    d = torch.sign(torch.linalg.det(vh.transpose(-1, -2) @ u.transpose(-1, -2)))
    flip = torch.ones_like(h[..., 0])
    flip[..., 2] = d
    return vh.transpose(-1, -2) @ (flip[..., None] * u.transpose(-1, -2))


def test_sync_free_rotation_is_the_kabsch_optimum():
    """Horn's quaternion rotation (no SVD, no host synchronisation) reaches the SVD's optimum of trace(R h) on any
    covariance, reflections included, and is a proper rotation; h = 0 gives the identity."""
    from mini_of3.geometry import rotation_from_covariance as _rotation
    h = torch.randn(2000, 3, 3, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    h[:500] = h[:500] @ torch.diag(torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64))   # det(h) < 0 cases too
    ours, ref = _rotation(h), _svd_rotation(h)

    def objective(r):
        return (r @ h).diagonal(dim1=-2, dim2=-1).sum(-1)
    scale = torch.linalg.svdvals(h).sum(-1)
    assert ((objective(ref) - objective(ours)) / scale).abs().max() < 1e-12
    assert (torch.linalg.det(ours) - 1).abs().max() < 1e-12
    assert (ours @ ours.transpose(-1, -2) - torch.eye(3, dtype=torch.float64)).abs().max() < 1e-12
    gap = torch.linalg.svdvals(h)
    separated = (gap[:, 1] - gap[:, 2]) / gap[:, 0] > 1e-3        # a unique optimum: the rotations agree too
    assert (ours[separated] - ref[separated]).abs().max() < 1e-6
    assert torch.equal(_rotation(torch.zeros(3, 3, dtype=torch.float64)), torch.eye(3, dtype=torch.float64))
