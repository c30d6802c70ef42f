"""``data.val_ids: auto``: a validation set chosen from the prepared folder itself, the same on every machine.

The validation entries should span small to large proteins (up to ``data.val_auto_max_tokens`` tokens, so that a
model trained at any crop is scored on whole entries), and cost the training set as little as possible: every
training entry with a chain more than ``data.val_identity_cut`` identical to a validation chain is left out
(:mod:`.homology`), so the entries that have no such relative among the others are the ones to take. The choice:

1. candidates: the entries that pass the filters, with ``min_tokens`` to ``val_auto_max_tokens`` tokens;
2. each candidate's relatives: the other entries (of all sizes) with a chain above the identity cut to one of its
   chains; a candidate with fewer relatives is preferred (none is best: it removes nothing from training);
3. ``val_auto_count`` size targets spaced geometrically from the smallest to the largest candidate; for each target,
   the candidate with the fewest relatives among those closest in size (by log size, within a factor of 1.5 of the
   target where one exists), not a relative of one already chosen; ties broken by id.

Deterministic: a function of the prepared folder's entries and the config only.
"""
from __future__ import annotations

import math
from typing import Sequence

from ..config import DataConfig
from .homology import ChainSequence, IdentityCache
from .manifest import ManifestRow

SIZE_WINDOW = math.log(1.5)         # a candidate within this factor of a size target counts as close to it


def relatives(chains: dict[str, list[ChainSequence]], entry: str, cut: float, cache: IdentityCache) -> set[str]:
    """The entries with a chain more than ``cut`` identical to a chain of ``entry``."""
    return {other for other, theirs in chains.items() if other != entry
            and any(cache.identity(a.sequence, b.sequence) > cut for a in chains[entry] for b in theirs)}


def choose_validation(rows: Sequence[ManifestRow], chains: dict[str, list[ChainSequence]], cfg: DataConfig,
                      cache: IdentityCache) -> list[str]:
    """The ids of the automatic validation set (module docstring); ``rows`` are the entries that pass the
    filters, ``chains`` their chain sequences by id."""
    cut = 0.4 if cfg.val_identity_cut is None else cfg.val_identity_cut
    candidates = sorted((r for r in rows if cfg.min_tokens <= r.tokens <= cfg.val_auto_max_tokens),
                        key=lambda r: (r.tokens, r.id))
    if not candidates:
        return []
    kin = {r.id: relatives(chains, r.id, cut, cache) for r in candidates}
    cache.save()
    low, high = math.log(candidates[0].tokens), math.log(candidates[-1].tokens)
    count = min(cfg.val_auto_count, len(candidates))
    targets = [low + (high - low) * i / max(count - 1, 1) for i in range(count)]
    chosen: list[ManifestRow] = []
    for target in targets:
        free = [r for r in candidates if r not in chosen and not any(r.id in kin[c.id] for c in chosen)]
        if not free:
            break
        nearest = min(abs(math.log(r.tokens) - target) for r in free)
        close = [r for r in free if abs(math.log(r.tokens) - target) <= max(nearest, SIZE_WINDOW)]
        chosen.append(min(close, key=lambda r: (len(kin[r.id]), abs(math.log(r.tokens) - target), r.id)))
    return sorted(r.id for r in chosen)
