"""Per-token features of a crop, as numpy arrays (``dataset.py`` turns them into tensors and pads batches).

The subset of AF3's token features (AF3 SI 2.8, Table 5) that a single-sequence, one-atom-per-token model uses,
plus its training targets:

=================  ==========  =========================================================================
name               shape       meaning
=================  ==========  =========================================================================
``restype``        [N] int64   0..20, order ``ARNDCQEGHILKMFPSTWYV``, 20 = UNK
``residue_index``  [N] int64   position in the entity sequence (1-based)
``asym_id``        [N] int64   chain index in the structure
``entity_id``      [N] int64   entity index in the structure
``sym_id``         [N] int64   index of the chain among the chains of its entity
``token_mask``     [N] bool    True for a real token (the collate pads with False)
``ca``             [N, 3] f32  Calpha target, 0 where unresolved
``cb``             [N, 3] f32  Cbeta target (Calpha for glycine), 0 where unresolved
``resolved``       [N] bool    the Calpha is observed
``cb_resolved``    [N] bool    the Cbeta (for the distogram) is observed
=================  ==========  =========================================================================
"""
from __future__ import annotations

import numpy as np

from .structure import Structure

INT_FEATURES = ("restype", "residue_index", "asym_id", "entity_id", "sym_id")
MASK_FEATURES = ("token_mask", "resolved", "cb_resolved")
COORD_FEATURES = ("ca", "cb")
FEATURE_NAMES = INT_FEATURES + MASK_FEATURES + COORD_FEATURES


def token_features(structure: Structure, indices: np.ndarray) -> dict[str, np.ndarray]:
    """Features of the tokens ``indices`` (``[n]``, sorted, e.g. a crop) of ``structure``; NaN targets become 0 with
    their masks False."""
    indices = np.asarray(indices, dtype=np.int64)
    out: dict[str, np.ndarray] = {name: getattr(structure, name)[indices].astype(np.int64) for name in INT_FEATURES}
    ca = structure.ca[indices]                                     # [n, 3]
    cb = structure.cb[indices]                                     # [n, 3]
    out["token_mask"] = np.ones(len(indices), dtype=bool)
    out["resolved"] = structure.resolved[indices] & ~np.isnan(ca).any(-1)
    out["cb_resolved"] = ~np.isnan(cb).any(-1)
    out["ca"] = np.nan_to_num(ca, nan=0.0)
    out["cb"] = np.nan_to_num(cb, nan=0.0)
    return out
