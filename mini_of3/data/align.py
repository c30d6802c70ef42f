"""Placing the observed residues of a chain on its entity sequence (``_entity_poly_seq``), so that every residue of
the sequence becomes a token and the unobserved ones are known (AF3 SI 2.1 and 2.6 tokenize the full sequence).

By ``label_seq_id`` first; where the file lacks it or it does not fit, by the author numbering shifted by one offset;
else by a global alignment with biopython's ``PairwiseAligner``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from Bio.Align import PairwiseAligner

from .residue_constants import RESTYPES_WITH_X, restype_of


@dataclass
class Observed:
    """One observed residue after the conformer is chosen: only what the one-atom-per-token scheme needs."""

    name: str                  # CCD code as written in the file
    label_seq: int | None      # position in _entity_poly_seq (1-based), None when the file lacks it
    seqnum: int                # author residue number
    icode: str                 # author insertion code ("" for none)
    ca: tuple[float, float, float] | None   # None: no CA with occupancy > 0
    cb: tuple[float, float, float] | None
    occupancy: float           # mean occupancy of the chosen conformer's atoms


def _one_letter(name: str, parents: dict[str, str]) -> str:
    return RESTYPES_WITH_X[restype_of(name, parents)]


def first_alternative(entry: str) -> str:
    return entry.split(",")[0]


def _placed(observed: list[Observed], sequence: list[str], numbers: list[int | None]) -> list[int] | None:
    """``numbers`` (1-based) as 0-based positions if every one is in range, unique and names the observed residue."""
    positions = []
    for res, p in zip(observed, numbers):
        if p is None or not 1 <= p <= len(sequence) or res.name not in sequence[p - 1].split(","):
            return None
        positions.append(p - 1)
    return positions if len(set(positions)) == len(positions) else None


def align_by_numbering(observed: list[Observed], sequence: list[str]) -> list[int] | None:
    """Map each observed residue to its position (0-based) in the entity sequence from ``label_seq_id``; None when
    the numbering is missing, out of range, repeated or names a different residue than the sequence has."""
    return _placed(observed, sequence, [res.label_seq for res in observed])


def align_by_author_numbering(observed: list[Observed], sequence: list[str],
                              guess: list[int | None]) -> list[int] | None:
    """Author numbers shifted by one constant offset, when such an offset places every observed residue on its own
    residue of the sequence (no insertion codes); the offsets of a sequence alignment ``guess`` are tried, most
    common first. This settles where the alignment alone is ambiguous (a gap next to a repeated residue)."""
    if any(res.icode for res in observed):
        return None
    offsets = Counter(res.seqnum - p for res, p in zip(observed, guess) if p is not None)
    for offset, _ in offsets.most_common(3):
        positions = _placed(observed, sequence, [res.seqnum - offset + 1 for res in observed])
        if positions is not None:
            return positions
    return None


def _aligner() -> PairwiseAligner:
    aligner = PairwiseAligner(mode="global", match_score=2.0, mismatch_score=-1.0)
    # target = entity sequence, query = observed residues. Missing residues (deletions in the query) are common and
    # cheap, most of all at the ends; observed residues absent from the sequence (insertions) are costly.
    scores = {("open_internal_deletion_score", "query_internal_open_gap_score"): -2.0,
              ("extend_internal_deletion_score", "query_internal_extend_gap_score"): -0.1,
              ("end_deletion_score", "query_end_gap_score"): 0.0,
              ("open_internal_insertion_score", "target_internal_open_gap_score"): -10.0,
              ("extend_internal_insertion_score", "target_internal_extend_gap_score"): -10.0,
              ("end_insertion_score", "target_end_gap_score"): -10.0}
    for (new, old), value in scores.items():
        setattr(aligner, new if hasattr(aligner, new) else old, value)
    return aligner


def align_by_sequence(observed: list[Observed], sequence: list[str], parents: dict[str, str]) -> list[int | None]:
    """Align the observed residues to the entity sequence with biopython's PairwiseAligner (used when the numbering
    cannot be trusted); returns the 0-based position of each observed residue, None where it aligns to a gap."""
    target = "".join(_one_letter(first_alternative(s), parents) for s in sequence)
    query = "".join(_one_letter(res.name, parents) for res in observed)
    alignment = _aligner().align(target, query)[0]
    positions: list[int | None] = [None] * len(observed)
    for (t0, t1), (q0, q1) in zip(*alignment.aligned):
        for offset in range(t1 - t0):
            positions[q0 + offset] = t0 + offset
    return positions
