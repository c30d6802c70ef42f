"""Sequence identity between protein chains, and the training entries it removes for a validation set.

AF3 (its low-homology evaluation sets) and OpenFold3 keep validation chains at most 40 % identical to any training chain; splitting by
entry id alone leaves the same protein on both sides (T4 lysozyme as 2LZM and 1L63, trypsin as 2PTC and 3PTB). Here
the validation entries are given, so the training entries are filtered instead: an entry with any chain more than
``cut`` identical to any validation chain is not trained on.

Identity of chains a and b: identical aligned residues (UNK excluded) of a global alignment (biopython's
``PairwiseAligner``, BLOSUM62, gap open -11, extend -1, end gaps free so that a short chain may sit anywhere in a long
one), divided by the length of the shorter chain. It is symmetric, and 1.0 for a chain and any fragment of it.
A short chain finds 40 % or more of its residues in an unrelated long chain by chance (on the shared set: an 11- and
a 14-residue peptide at 45 % and 43 % to a TCR chain, a 9-residue one at 44 % to most chains; the 20-residue
Trp-cage at 35 %), so a pair with a chain under 20 residues has identity 1.0 when the short chain is part of the
other, else 0.0, as AF3 clusters peptides (under 10 residues, SI 2.5.3) at 100 % identity only.
Results are cached per sequence pair in ``<prepared>/identity_cache.tsv``.
"""
from __future__ import annotations

import csv
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from Bio.Align import PairwiseAligner, substitution_matrices

from .atomic import atomic_path
from .structure import Structure

PEPTIDE_LENGTH = 20                 # shorter chains are matched only where one contains the other
IDENTITY_DEFINITION = ("global BLOSUM62 open -11 extend -1, free end gaps, identical non-X / shorter length; "
                       f"peptides under {PEPTIDE_LENGTH}: contained or not")
CACHE_FILE = "identity_cache.tsv"


@dataclass(frozen=True)
class ChainSequence:
    """One protein chain of an entry: ``entry`` id, ``chain`` (author chain id) and one-letter ``sequence``."""

    entry: str
    chain: str
    sequence: str


@dataclass(frozen=True)
class Homologue:
    """A training entry removed because its chain ``train`` is ``identity`` identical to validation chain ``val``."""

    train: ChainSequence
    val: ChainSequence
    identity: float

    def line(self) -> str:
        return (f"{self.train.entry}: not trained on, chain {self.train.chain} is {self.identity:.1%} identical to "
                f"validation {self.val.entry} chain {self.val.chain}")


def identity_aligner() -> PairwiseAligner:
    """The aligner of :func:`sequence_identity` (see the module docstring)."""
    aligner = PairwiseAligner(mode="global")
    aligner.substitution_matrix = substitution_matrices.load("BLOSUM62")
    aligner.open_gap_score, aligner.extend_gap_score = -11.0, -1.0
    aligner.end_gap_score = 0.0
    return aligner


def sequence_identity(a: str, b: str, aligner: PairwiseAligner | None = None) -> float:
    """Identical aligned residues of ``a`` and ``b`` over the length of the shorter; for a chain under
    ``PEPTIDE_LENGTH`` residues, whether it is part of the other (module docstring); 0 for an empty sequence."""
    if not a or not b:
        return 0.0
    if min(len(a), len(b)) < PEPTIDE_LENGTH:
        short, long = sorted((a, b), key=len)
        return float(short in long and set(short) != {"X"})
    a, b = sorted((a, b))                     # one order, so that ties in the alignment break the same way
    alignment = (aligner or identity_aligner()).align(a, b)[0]
    same = sum(a[i] == b[j] != "X" for (a0, a1), (b0, _) in zip(*alignment.aligned)
               for i, j in zip(range(a0, a1), range(b0, b0 + a1 - a0)))
    return same / min(len(a), len(b))


def entry_chains(structure: Structure, entry: str) -> list[ChainSequence]:
    """One :class:`ChainSequence` per entity of ``structure`` (its first chain; copies share the sequence)."""
    out, seen = [], set()
    for asym, name in enumerate(structure.auth_chain_ids):
        tokens = structure.asym_id == asym
        entity = int(structure.entity_id[tokens][0]) if tokens.any() else None
        if entity is None or entity in seen:
            continue
        seen.add(entity)
        out.append(ChainSequence(entry, name, structure.chain_sequence(asym)))
    return out


def _digest(sequence: str) -> str:
    return hashlib.sha1(sequence.encode()).hexdigest()[:20]


class IdentityCache:
    """Identities by sequence pair, read from and written to ``<folder>/identity_cache.tsv`` (a folder that cannot
    be written, e.g. a read-only copy of a prepared folder, only loses the cache)."""

    def __init__(self, folder: str | Path | None):
        self.path = Path(folder) / CACHE_FILE if folder is not None else None
        self.values: dict[tuple[str, str], float] = {}
        self.added = 0
        if self.path is not None and self.path.is_file():
            with open(self.path, newline="") as handle:
                rows = list(csv.reader(handle, delimiter="\t"))
            if rows and rows[0] == ["# " + IDENTITY_DEFINITION]:      # another definition: start afresh
                self.values = {(r[0], r[1]): float(r[2]) for r in rows[1:] if len(r) == 3}
        self._aligner = identity_aligner()

    def identity(self, a: str, b: str) -> float:
        key = tuple(sorted((_digest(a), _digest(b))))
        if key not in self.values:
            self.values[key] = sequence_identity(a, b, self._aligner)
            self.added += 1
        return self.values[key]

    def save(self) -> None:
        if self.path is None or not self.added:
            return
        try:
            with atomic_path(self.path) as tmp, open(tmp, "w", newline="") as handle:
                writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
                writer.writerow(["# " + IDENTITY_DEFINITION])
                writer.writerows((a, b, f"{v:.6f}") for (a, b), v in sorted(self.values.items()))
        except OSError:
            pass
        self.added = 0


def find_homologues(train: Sequence[Sequence[ChainSequence]], val: Sequence[ChainSequence], cut: float,
                    cache: IdentityCache | None = None) -> list[Homologue]:
    """For each training entry (its chains, one list per entry) with a chain more than ``cut`` identical to a
    validation chain, its most identical pair, in the order of ``train``."""
    cache = cache if cache is not None else IdentityCache(None)
    hits = []
    for chains in train:
        pairs = [(cache.identity(t.sequence, v.sequence), t, v) for t in chains for v in val]
        best = max(pairs, key=lambda p: p[0], default=None)
        if best is not None and best[0] > cut:
            hits.append(Homologue(train=best[1], val=best[2], identity=best[0]))
    cache.save()
    return hits
