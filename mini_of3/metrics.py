"""Structure metrics on Calpha (and Cbeta) coordinates: torch in, torch out, one value per structure.

Coordinates are ``[N, 3]`` or ``[B, N, 3]``, masks ``[N]`` or ``[B, N]`` bool (True = resolved real token); a metric
returns a 0-d tensor for one structure and ``[B]`` for a batch. Distances are taken in float64. Homomers: where an
entity has several identical chains, ``structure_metrics`` first picks the assignment of predicted to true chains
(``assign_homomer_chains``, greedy as AF3 SI 4.2).
"""
from __future__ import annotations

import math

import torch

from .geometry import kabsch, rotation_from_covariance, superpose

LDDT_THRESHOLDS = (0.5, 1.0, 2.0, 4.0)


def _as_batch(*tensors: torch.Tensor) -> tuple[bool, list[torch.Tensor]]:
    single = tensors[0].dim() == 2
    return single, [t[None] if single else t for t in tensors]


# ---- lDDT, RMSD -----------------------------------------------------------------------------------------------


def lddt_pair_scores(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor, cutoff: float = 15.0
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-pair lDDT scores and the pairs that count.

    pred, true: [B, N, 3]; mask: [B, N]. Returns score [B, N, N] (mean over thresholds 0.5, 1, 2, 4 A of
    |d_pred - d_true| < threshold) and include [B, N, N] (i != j, both in mask, d_true < cutoff).
    """
    d_true = torch.cdist(true.double(), true.double())
    d_pred = torch.cdist(pred.double(), pred.double())
    n = mask.shape[-1]
    eye = torch.eye(n, dtype=torch.bool, device=mask.device)
    include = mask[:, :, None] & mask[:, None, :] & ~eye & (d_true < cutoff)
    diff = (d_pred - d_true).abs()
    score = sum((diff < t).double() for t in LDDT_THRESHOLDS) / len(LDDT_THRESHOLDS)
    return score, include


def lddt_ca(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor, cutoff: float = 15.0) -> torch.Tensor:
    """lDDT-Calpha pooled over all pairs: 15 A inclusion radius on the true structure, thresholds 0.5/1/2/4 A."""
    single, (pred, true, mask) = _as_batch(pred, true, mask)
    score, include = lddt_pair_scores(pred, true, mask, cutoff)
    value = (score * include).sum((-1, -2)) / include.sum((-1, -2))             # NaN with no pair
    return value[0] if single else value


def lddt_ca_per_token(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor, cutoff: float = 15.0
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token lDDT-Calpha (the pLDDT target): [B, N] scores, and [B, N] bool for tokens with any partner."""
    score, include = lddt_pair_scores(pred, true, mask, cutoff)
    count = include.sum(-1)
    return (score * include).sum(-1) / count.clamp(min=1), count > 0


def rmsd_kabsch(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Calpha RMSD (A) over the masked tokens after the optimal rigid superposition of pred onto true."""
    single, (pred, true, mask) = _as_batch(pred, true, mask)
    moved = superpose(pred, true, mask)
    sq = ((moved - true.double()) ** 2).sum(-1)
    value = torch.sqrt((sq * mask).sum(-1) / mask.sum(-1))
    return value[0] if single else value


# ---- TM-score -------------------------------------------------------------------------------------------------


TM_BATCH_ELEMENTS = 2 ** 25       # [S, F, L] float64 tensors of the TM-score search stay under 256 MB each


def tm_d0(length: int) -> float:
    """TM-score's distance scale d0 = 1.24 (L - 15)^(1/3) - 1.8, at least 0.5 (and 0.5 for L <= 21)."""
    return 0.5 if length <= 21 else max(0.5, 1.24 * (length - 15) ** (1 / 3) - 1.8)


def _tm_round(x, y, sel, d0, d_cut):
    """Superpose each structure of x on y on each row's selection, score it, and select the residues closer than
    d_cut for the next round; d_cut grows by 0.5 A until at least 3 are selected (as the TM-score program's
    score_fun).

    x: [S, L, 3], S structures searched at once; y: [L, 3]; sel: [S, F, L] bool, F selections per structure.
    Moments and distances are matrix products over L, so no [S, F, L, 3] tensor is made (the search runs thousands
    of superpositions).
    """
    w = sel.double()                                                            # [S, F, L]
    w_sum = w.sum(-1, keepdim=True).clamp(min=1e-12)                            # [S, F, 1]
    x_c, y_c = (w @ x) / w_sum, (w @ y) / w_sum                                 # [S, F, 3]
    moments = (w @ (x[..., :, None] * y[:, None, :]).flatten(-2)).unflatten(-1, (3, 3))  # sum_l w x_l y_l^T
    r = rotation_from_covariance(moments - w_sum[..., None] * x_c[..., :, None] * y_c[..., None, :])
    t = y_c - (r @ x_c[..., None])[..., 0]                                      # [S, F, 3]
    # |R x_l + t - y_l|^2 expanded into products over the 3 coordinates
    y_x = (y[:, :, None] * x[..., :, None, :]).flatten(-2)                      # [S, L, 9]: y_i x_j
    sq = ((x * x).sum(-1) + (y * y).sum(-1))[:, None, :] + (t * t).sum(-1, keepdim=True) \
        + 2 * (r.transpose(-1, -2) @ t[..., None])[..., 0] @ x.transpose(-1, -2) \
        - 2 * r.flatten(-2) @ y_x.transpose(-1, -2) - 2 * t @ y.T
    dist = sq.clamp(min=0).sqrt()                                               # [S, F, L]
    tm = (1.0 / (1.0 + (dist / d0) ** 2)).sum(-1)
    length = y.shape[0]
    if length > 3:
        third = dist.topk(3, dim=-1, largest=False).values[..., 2]              # [S, F]
        steps = torch.where(third >= d_cut, torch.floor((third - d_cut) / 0.5) + 1, torch.zeros_like(third))
        d_cut = d_cut + 0.5 * steps[..., None]
    return tm / length, dist < d_cut


def _tm_scores_one(x: torch.Tensor, y: torch.Tensor, n_iter: int = 20) -> torch.Tensor:
    """Sequence-dependent TM-scores [S] of the structures x [S, L, 3] against y [L, 3] (float64, residue i of x
    matches residue i of y).

    The superposition search of the TM-score program (Zhang & Skolnick 2004): seed superpositions on every
    fragment of length L, L/2, L/4, ... (down to 4), then repeat: superpose on the residues within d0_search + 1
    of the target, re-select; keep the best score seen. Each seed's search is independent of the others', so the
    seeds of every fragment length, and the S structures, run as the rows of one batch: 1 + n_iter rounds of
    launches in all (per chunk of seeds, above :data:`TM_BATCH_ELEMENTS`: one chunk up to ~2,000 tokens).
    """
    length = y.shape[0]
    if length == 0:
        return torch.full((x.shape[0],), float("nan"), dtype=torch.float64)
    d0 = tm_d0(length)
    d0_search = min(max(d0, 4.5), 8.0)
    l_min = min(length, 4)
    fragment_lengths = []
    for i in range(5):
        fragment_lengths.append(max(length // 2 ** i, l_min))
        if fragment_lengths[-1] <= l_min:
            break
    else:
        fragment_lengths.append(l_min)
    index = torch.arange(length, device=y.device)
    starts = torch.cat([torch.arange(length - frag + 1, device=y.device) for frag in fragment_lengths])[:, None]
    ends = starts + torch.cat([torch.full((length - frag + 1,), frag, device=y.device) for frag in fragment_lengths
                               ])[:, None]
    seeds = (index >= starts) & (index < ends)                                  # [F, L]: every seed fragment
    best = torch.zeros(x.shape[0], dtype=torch.float64, device=y.device)
    rows = max(1, TM_BATCH_ELEMENTS // (x.shape[0] * length))                  # seeds searched at once
    for chunk in seeds.split(rows):
        sel = chunk.expand(x.shape[0], -1, -1)                                  # [S, F', L]
        tm, sel = _tm_round(x, y, sel, d0, d0_search - 1)
        best = torch.maximum(best, tm.amax(-1))
        for _ in range(n_iter):
            tm, sel = _tm_round(x, y, sel, d0, d0_search + 1)
            best = torch.maximum(best, tm.amax(-1))
    return best.cpu()


def tm_score(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """TM-score of pred against true over the masked tokens, d0 from the true length L = mask.sum()."""
    single, (pred, true, mask) = _as_batch(pred, true, mask)
    values = torch.stack([_tm_scores_one(p[m].double()[None], t[m].double())[0] for p, t, m in zip(pred, true, mask)])
    return values[0] if single else values


def tm_score_and_mirror(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """The TM-scores of one structure pred [N, 3] and of its mirror image -pred against true, in one search."""
    m = mask.bool()
    both = torch.stack([pred[m], -pred[m]]).double()                            # [2, L, 3]
    tm, mirror = _tm_scores_one(both, true[m].double()).tolist()
    return tm, mirror


# ---- distogram and contacts -----------------------------------------------------------------------------------


def distance_bins(d: torch.Tensor, n_bins: int, d_min: float = 2.0, d_max: float = 22.0) -> torch.Tensor:
    """Bin index of each distance: n_bins equal bins on [d_min, d_max], the first and last open-ended."""
    boundaries = torch.linspace(d_min, d_max, n_bins + 1, device=d.device, dtype=torch.float64)[1:-1]
    return torch.bucketize(d.double(), boundaries)


def _pair_mask(mask: torch.Tensor) -> torch.Tensor:
    eye = torch.eye(mask.shape[-1], dtype=torch.bool, device=mask.device)
    return mask[:, :, None] & mask[:, None, :] & ~eye


def distogram_accuracy(logits: torch.Tensor, true_cb: torch.Tensor, mask: torch.Tensor, d_min: float = 2.0,
                       d_max: float = 22.0) -> torch.Tensor:
    """Top-1 accuracy of the distogram over resolved pairs i != j. logits: [N, N, bins] or [B, N, N, bins]."""
    single, (true_cb, mask) = _as_batch(true_cb, mask)
    logits = logits[None] if single else logits
    target = distance_bins(torch.cdist(true_cb.double(), true_cb.double()), logits.shape[-1], d_min, d_max)
    pairs = _pair_mask(mask)
    value = ((logits.argmax(-1) == target) & pairs).double().sum((-1, -2)) / pairs.sum((-1, -2))
    return value[0] if single else value


def contact_precision(logits_or_pred: torch.Tensor, true_cb: torch.Tensor, mask: torch.Tensor,
                      asym_id: torch.Tensor | None = None, *, min_separation: int = 24, threshold: float = 8.0,
                      top_fraction: float = 0.2, d_min: float = 2.0, d_max: float = 22.0) -> torch.Tensor:
    """Precision of the top L/5 long-range contacts (separation >= 24 within a chain, true Cbeta < 8 A).

    logits_or_pred: distogram logits [(B,) N, N, bins] (contact score = probability of the bins below 8 A) or
    predicted coordinates [(B,) N, 3] (score = minus the distance). L = number of masked tokens.
    """
    single, (true_cb, mask) = _as_batch(true_cb, mask)
    x = logits_or_pred[None] if single else logits_or_pred
    if x.shape[-1] == 3 and x.dim() == 3:
        score = -torch.cdist(x.double(), x.double())
    else:
        upper = torch.linspace(d_min, d_max, x.shape[-1] + 1, device=x.device)[1:]   # upper edge of each bin
        score = (torch.softmax(x.double(), -1) * (upper <= threshold)).sum(-1)
    n = mask.shape[-1]
    index = torch.arange(n, device=mask.device)
    pairs = _pair_mask(mask) & ((index[None, :] - index[:, None]) >= min_separation)   # i < j by >= 24
    if asym_id is not None:
        asym = asym_id[None] if asym_id.dim() == 1 else asym_id
        pairs = pairs & (asym[:, :, None] == asym[:, None, :])
    contact = torch.cdist(true_cb.double(), true_cb.double()) < threshold
    values = []
    for b in range(mask.shape[0]):
        k = max(1, int(int(mask[b].sum()) * top_fraction))
        candidates = score[b][pairs[b]]
        if candidates.numel() == 0:
            values.append(torch.tensor(float("nan"), dtype=torch.float64))
            continue
        top = torch.topk(candidates, min(k, candidates.numel())).indices
        values.append(contact[b][pairs[b]][top].double().mean().cpu())
    value = torch.stack(values)
    return value[0] if single else value


# ---- homomers: chain assignment -------------------------------------------------------------------------------


def _chain_tokens(asym_id: torch.Tensor) -> dict[int, torch.Tensor]:
    return {int(a): torch.nonzero(asym_id == a).flatten() for a in torch.unique(asym_id)}


def _greedy_assignment(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor, chains: dict[int, torch.Tensor],
                       groups: dict[int, list[int]], fixed: dict[int, int]) -> dict[int, int]:
    """Pair each remaining predicted chain with a true chain of its entity: closest centroids first."""
    assignment = dict(fixed)
    for members in groups.values():
        free_pred = [p for p in members if p not in assignment]
        free_true = [q for q in members if q not in assignment.values()]
        costs = []
        for p in free_pred:
            for q in free_true:
                m = mask[chains[q]]
                if not m.any():                         # nothing resolved: any place will do, last
                    costs.append((math.inf, p, q))
                    continue
                gap = pred[chains[p]][m].mean(0) - true[chains[q]][m].mean(0)
                costs.append((float(gap.norm()), p, q))
        for _, p, q in sorted(costs):
            if p not in assignment and q not in assignment.values():
                assignment[p] = q
    return assignment


def homomer_permutation(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor, asym_id: torch.Tensor,
                        entity_id: torch.Tensor, sym_id: torch.Tensor | None = None) -> torch.Tensor:
    """Token permutation of the true structure that best matches the predicted chains (AF3 SI 4.2).

    For an entity with several identical chains, any true chain may stand for a predicted one. As AF3: take an
    anchor chain from the entity with the fewest copies (then the longest chain); for each true chain of its
    entity, superpose the predicted anchor on it, assign the other chains greedily by centroid distance, and keep
    the assignment with the lowest Calpha RMSD over the whole complex. sym_id is not needed (chains are matched by
    asym_id, tokens position by position) and is accepted for the common signature.

    pred, true: [N, 3]; mask, asym_id, entity_id: [N]. Returns perm [N] long: ``true[perm]`` matches pred.
    """
    n = pred.shape[0]
    identity = torch.arange(n, device=pred.device)
    chains = _chain_tokens(asym_id)
    groups: dict[tuple[int, int], list[int]] = {}         # chains that can stand for each other: entity, length
    for a, idx in chains.items():
        groups.setdefault((int(entity_id[idx[0]]), len(idx)), []).append(a)
    if all(len(members) == 1 for members in groups.values()):
        return identity
    pred, true = pred.detach().double(), true.detach().double()
    anchor_group = min(groups, key=lambda e: (len(groups[e]), -len(chains[groups[e][0]])))
    anchor = groups[anchor_group][0]
    best, best_rmsd = identity, math.inf
    for candidate in groups[anchor_group]:
        m = mask[chains[candidate]]
        if int(m.sum()) < 3:
            continue
        r, t = kabsch(pred[chains[anchor]], true[chains[candidate]], m)
        moved = pred @ r.transpose(-1, -2) + t
        assignment = _greedy_assignment(moved, true, mask, chains, groups, {anchor: candidate})
        perm = identity.clone()
        for p, q in assignment.items():
            perm[chains[p]] = chains[q]
        value = float(rmsd_kabsch(pred, true[perm], mask[perm]))
        if value < best_rmsd:
            best, best_rmsd = perm, value
    return best


def assign_homomer_chains(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor, asym_id: torch.Tensor,
                          entity_id: torch.Tensor, sym_id: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The true structure with its identical chains re-assigned to match pred (see ``homomer_permutation``).

    Returns the permuted ``true`` [N, 3] and the permuted ``mask`` [N] (a chain's resolved tokens move with it).
    """
    perm = homomer_permutation(pred, true, mask, asym_id, entity_id, sym_id)
    return true[perm], mask[perm]


def _assigned_truth(pred, true, mask, asym_id, entity_id, sym_id, true_cb, cb_mask):
    """The true Calpha, mask, Cbeta and Cbeta mask, their homomer chains permuted to match ``pred``
    (:func:`homomer_permutation`); missing coordinates zeroed outside their masks."""
    true = torch.where(mask[:, None], true, 0.0)
    perm = homomer_permutation(pred, true, mask, asym_id, entity_id, sym_id)
    true, mask = true[perm], mask[perm]
    cb = true_cb[perm] if true_cb is not None else true
    cb_mask = mask & torch.isfinite(cb).all(-1) & (cb_mask[perm] if cb_mask is not None else True)
    return true, mask, torch.where(cb_mask[:, None], cb, 0.0), cb_mask


def structure_metrics(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor, asym_id: torch.Tensor,
                      entity_id: torch.Tensor, sym_id: torch.Tensor, distogram_logits: torch.Tensor | None = None,
                      true_cb: torch.Tensor | None = None, cb_mask: torch.Tensor | None = None) -> dict[str, float]:
    """All metrics of one predicted structure after the homomer chain assignment.

    pred, true: [N, 3] Calpha (unpadded, or with padding outside mask); mask: [N] bool resolved;
    asym_id, entity_id, sym_id: [N]; distogram_logits: [N, N, bins] (for distogram_accuracy and the contacts);
    true_cb: [N, 3] Cbeta (Calpha for glycine) of the true structure (Calpha stands in when None).
    cb_mask: [N] bool, the observed Cbeta (the batch's cb_resolved); else every masked token whose Cbeta is finite.
    Missing coordinates may be NaN (as in a data Structure): NaN Calpha must be outside mask, NaN Cbeta is skipped.
    Contacts are scored from the distogram when given, else from the predicted Calpha distances.
    Returns lddt_ca, rmsd, tm_score, tm_score_mirror (the TM-score of pred's mirror image: lDDT cannot tell a
    structure from its mirror image, TM-score can, so tm_score_mirror > tm_score flags a sample of the wrong hand),
    contact_precision, distogram_accuracy (NaN where not computable).
    """
    true, mask, cb, cb_mask = _assigned_truth(pred, true, mask, asym_id, entity_id, sym_id, true_cb, cb_mask)
    contacts_from = distogram_logits if distogram_logits is not None else pred
    return {
        "lddt_ca": float(lddt_ca(pred, true, mask)),
        "rmsd": float(rmsd_kabsch(pred, true, mask)),
        **dict(zip(("tm_score", "tm_score_mirror"), tm_score_and_mirror(pred, true, mask))),
        "contact_precision": float(contact_precision(contacts_from, cb, cb_mask, asym_id)),
        "distogram_accuracy": float(distogram_accuracy(distogram_logits, cb, cb_mask))
        if distogram_logits is not None else float("nan"),
    }


def interface_metrics(pred: torch.Tensor, true: torch.Tensor, mask: torch.Tensor, asym_id: torch.Tensor,
                      entity_id: torch.Tensor, sym_id: torch.Tensor, distogram_logits: torch.Tensor | None = None,
                      true_cb: torch.Tensor | None = None, cb_mask: torch.Tensor | None = None) -> dict[str, float]:
    """How well the chains of a complex sit relative to each other, after the homomer chain assignment (arguments
    as :func:`structure_metrics`):

    interface_lddt: lDDT-Calpha pooled over the pairs of tokens in different chains whose true distance is under the
        15 A inclusion radius (NaN when there is no such pair: a single chain, or chains apart);
    interchain_contact_precision: of the top max(1, L/5) pairs of tokens in different chains by predicted contact
        score (the distogram's probability below 8 A, else minus the predicted Calpha distance), the share whose true
        Cbeta distance is under 8 A (NaN without a true inter-chain contact).
    """
    true, mask, cb, cb_mask = _assigned_truth(pred, true, mask, asym_id, entity_id, sym_id, true_cb, cb_mask)
    between = asym_id[:, None] != asym_id[None, :]                                      # [N, N]
    score, include = lddt_pair_scores(pred[None], true[None], mask[None])
    pairs = include[0] & between
    interface_lddt = float((score[0] * pairs).sum() / pairs.sum()) if pairs.any() else float("nan")
    candidates = between & cb_mask[:, None] & cb_mask[None, :]
    contact = (torch.cdist(cb.double(), cb.double()) < 8.0) & candidates
    if not contact.any():
        return {"interface_lddt": interface_lddt, "interchain_contact_precision": float("nan")}
    if distogram_logits is not None:
        upper = torch.linspace(2.0, 22.0, distogram_logits.shape[-1] + 1)[1:].to(distogram_logits.device)
        predicted = (torch.softmax(distogram_logits.double(), -1) * (upper <= 8.0)).sum(-1)
    else:
        predicted = -torch.cdist(pred.double(), pred.double())
    upper_half = torch.triu(candidates, diagonal=1)
    k = max(1, int(mask.sum()) // 5)
    top = torch.topk(predicted[upper_half], min(k, int(upper_half.sum()))).indices
    return {"interface_lddt": interface_lddt,
            "interchain_contact_precision": float(contact[upper_half][top].double().mean())}
