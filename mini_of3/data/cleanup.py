"""Cleanup rules applied to a parsed mmCIF file, one small function per rule, each citing the AF3 SI section.

They work on gemmi objects (``gemmi.Structure``, ``gemmi.Residue``) and on :class:`.align.Observed` residues, and
every chain or atom they drop is counted or reported with a reason. ``mmcif.load_mmcif`` applies them in order; the
placing of observed residues on the entity sequence is in :mod:`.align`.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import gemmi
import numpy as np

from .align import Observed, align_by_author_numbering, align_by_numbering, align_by_sequence, first_alternative
from .residue_constants import HYDROGEN_ELEMENTS, ONE_TO_INDEX, WATER_NAMES, restype_of
from .structure import MmcifError

MAX_ABS_COORD = 1e4        # Angstrom; anything larger is a broken file, not a molecule
MIN_RESOLVED_RESIDUES = 4  # AF3 SI 2.5.4


@dataclass
class Subchain:
    """One label_asym_id chain of model 1 with its entity (gemmi objects)."""

    name: str                  # label_asym_id
    auth_name: str             # auth_asym_id
    entity: gemmi.Entity | None
    residues: list[gemmi.Residue]


@dataclass
class ChainTokens:
    """The tokens of one protein chain, aligned to its entity sequence."""

    subchain: Subchain
    restype: np.ndarray        # [L] int
    residue_index: np.ndarray  # [L] int, 1-based
    ca: np.ndarray             # [L, 3] float32, NaN where unresolved
    cb: np.ndarray             # [L, 3] float32
    resolved: np.ndarray       # [L] bool


# ----------------------------------------------------------------------------------------------------------------
# checks of the input itself: a file that fails one is bad input (MmcifError), not a structure to clean


def check_atom_records(block: gemmi.cif.Block, path: str) -> None:
    """Reject a file without ``_atom_site`` rows or with atom records other than ATOM/HETATM."""
    table = block.find_mmcif_category("_atom_site.")
    if not table or len(table) == 0:
        raise MmcifError(f"{path}: no _atom_site (coordinate) records")
    groups = set(block.find_values("_atom_site.group_PDB"))
    bad = sorted(groups - {"ATOM", "HETATM"})
    if bad:
        raise MmcifError(f"{path}: malformed _atom_site: group_PDB {bad[0]!r} (expected ATOM or HETATM)")


def check_coordinates(model: gemmi.Model, path: str) -> None:
    """Reject NaN or absurd (|x| > 1e4 A) coordinates anywhere in the model: they mean a broken file."""
    for chain in model:
        for residue in chain:
            for atom in residue:
                p = atom.pos
                if not (abs(p.x) <= MAX_ABS_COORD and abs(p.y) <= MAX_ABS_COORD and abs(p.z) <= MAX_ABS_COORD):
                    what = "missing or NaN" if math.isnan(p.x + p.y + p.z) else "absurd"
                    raise MmcifError(
                        f"{path}: {what} coordinates ({p.x}, {p.y}, {p.z}) for atom {atom.name} of "
                        f"{residue.name} {chain.name}{residue.seqid.num} (limit |x| <= {MAX_ABS_COORD:g} A)")


def check_duplicate_atoms(model: gemmi.Model, path: str) -> None:
    """Reject a model in which one atom (chain, residue, insertion code, name, altloc) appears twice."""
    seen: set[tuple] = set()
    for chain in model:
        for residue in chain:
            for atom in residue:
                key = (residue.subchain, chain.name, residue.seqid.num, residue.seqid.icode, residue.name,
                       atom.name, atom.altloc)
                if key in seen:
                    raise MmcifError(f"{path}: duplicated atom {atom.name} in {residue.name} "
                                     f"{chain.name}{residue.seqid.num}{residue.seqid.icode.strip()}")
                seen.add(key)


# ----------------------------------------------------------------------------------------------------------------
# structure-level rules


def keep_first_model(st: gemmi.Structure) -> int:
    """Keep model 1 only (AF3 SI 2.1: one model per entry; NMR ensembles give their first model). Returns how many
    models were dropped."""
    dropped = len(st) - 1
    if dropped > 0:
        del st[1:]
    return dropped


def remove_hydrogens(st: gemmi.Structure) -> dict[str, int]:
    """Remove hydrogen and deuterium atoms (AF3 SI 2.5.4: hydrogens are removed). Returns the counts removed."""
    counts = Counter(atom.element.name for chain in st[0] for residue in chain for atom in residue
                     if atom.element.name in HYDROGEN_ELEMENTS)
    if counts:
        st.remove_hydrogens()
    return {"hydrogen": counts.get("H", 0), "deuterium": counts.get("D", 0)}


def subchains_of(st: gemmi.Structure) -> list[Subchain]:
    """The label_asym_id chains of model 1, in file order, each with its entity."""
    entity_of = {name: entity for entity in st.entities for name in entity.subchains}
    by_name: dict[str, Subchain] = {}
    for chain in st[0]:
        for span in chain.subchains():
            name = span.subchain_id()
            if name not in by_name:       # a subchain split in the file is joined again
                by_name[name] = Subchain(name=name, auth_name=chain.name, entity=entity_of.get(name), residues=[])
            by_name[name].residues.extend(span)
    return list(by_name.values())


def drop_waters(chains: list[Subchain]) -> tuple[list[Subchain], list[tuple[str, str]]]:
    """Drop water (AF3 SI 2.5.4: waters are removed)."""
    keep, skipped = [], []
    for sc in chains:
        is_water = (sc.entity is not None and sc.entity.entity_type == gemmi.EntityType.Water) or all(
            r.name in WATER_NAMES for r in sc.residues)
        if is_water:
            skipped.append((sc.name, f"water ({len(sc.residues)} molecules)"))
        else:
            keep.append(sc)
    return keep, skipped


def drop_ligands(chains: list[Subchain]) -> tuple[list[Subchain], list[tuple[str, str]]]:
    """Drop non-polymer and branched entities (ligands, ions, glycans): out of this package's protein-only scope
    (docs/design.md, Scope); AF3 SI 2.5.4 also removes crystallization aids among them."""
    keep, skipped = [], []
    for sc in chains:
        kind = sc.entity.entity_type if sc.entity is not None else gemmi.EntityType.Unknown
        if kind in (gemmi.EntityType.NonPolymer, gemmi.EntityType.Branched):
            names = ",".join(sorted({r.name for r in sc.residues}))
            skipped.append((sc.name, f"ligand ({names})"))
        else:
            keep.append(sc)
    return keep, skipped


def drop_non_protein_polymers(chains: list[Subchain]) -> tuple[list[Subchain], list[tuple[str, str]]]:
    """Drop polymers that are not L-polypeptides: nucleic acids and others are out of scope (docs/design.md, Scope;
    AF3 SI 2.5.4 keeps them, this package is protein only)."""
    keep, skipped = [], []
    for sc in chains:
        ptype = sc.entity.polymer_type if sc.entity is not None else gemmi.PolymerType.Unknown
        if ptype == gemmi.PolymerType.PeptideL:
            keep.append(sc)
            continue
        kind = str(ptype).split(".")[-1]
        nucleic = ptype in (gemmi.PolymerType.Dna, gemmi.PolymerType.Rna, gemmi.PolymerType.DnaRnaHybrid)
        what = "nucleic-acid polymer" if nucleic else "non-protein polymer"
        skipped.append((sc.name, f"{what} ({kind}, {len(sc.residues)} residues)"))
    return keep, skipped


# ----------------------------------------------------------------------------------------------------------------
# residue-level rules


def choose_conformer(residue: gemmi.Residue) -> Observed:
    """Keep the alternative location with the highest mean occupancy (AF3 SI 2.1: for residues with alternative
    locations the one with the largest occupancy is taken; ties go to the first altloc letter).

    An atom with occupancy 0 counts as not observed.
    """
    altlocs = sorted({atom.altloc for atom in residue if atom.altloc != "\0"})
    chosen = "\0"
    occupancies = [atom.occ for atom in residue]
    if altlocs:
        def mean_occ(alt: str) -> float:
            occ = [atom.occ for atom in residue if atom.altloc == alt]
            return sum(occ) / len(occ)
        chosen = max(altlocs, key=mean_occ)            # max keeps the first of equal values
        occupancies = [atom.occ for atom in residue if atom.altloc in ("\0", chosen)]

    def position(name: str) -> tuple[float, float, float] | None:
        candidates = [atom for atom in residue if atom.name == name and atom.occ > 0]
        if not candidates:
            return None
        preferred = [atom for atom in candidates if atom.altloc in ("\0", chosen)]
        atom = preferred[0] if preferred else max(candidates, key=lambda a: a.occ)
        return (atom.pos.x, atom.pos.y, atom.pos.z)

    return Observed(name=residue.name, label_seq=residue.label_seq, seqnum=residue.seqid.num,
                    icode=residue.seqid.icode.strip(), ca=position("CA"), cb=position("CB"),
                    occupancy=sum(occupancies) / max(len(occupancies), 1))


def resolve_microheterogeneity(observed: list[Observed]) -> list[Observed]:
    """Keep one residue per sequence position where the file models two residue types at one position (altlocs at
    the residue level, AF3 SI 2.1): the one with the higher occupancy, the first one on ties. The position is
    ``label_seq_id``, or the author number and insertion code where the file lacks it."""
    best: dict[object, Observed] = {}
    out: list[Observed] = []
    for res in observed:
        key = res.label_seq if res.label_seq is not None else (res.seqnum, res.icode)
        current = best.get(key)
        if current is None:
            best[key] = res
            out.append(res)
        elif res.occupancy > current.occupancy:
            out[out.index(current)] = res
            best[key] = res
    return out


# ----------------------------------------------------------------------------------------------------------------
# tokens of a chain


def chain_tokens(sc: Subchain, observed: list[Observed], parents: dict[str, str],
                 notes: list[str]) -> ChainTokens:
    """Tokens of one protein chain: every residue of its ``_entity_poly_seq`` sequence, observed residues placed by
    their numbering, else by alignment, unobserved ones kept with ``resolved=False`` (AF3 SI 2.1 and 2.6 tokenize the
    full sequence). Without ``_entity_poly_seq`` the observed residues alone make the chain, with a note."""
    sequence = list(sc.entity.full_sequence) if sc.entity is not None else []
    if not sequence:
        notes.append(f"chain {sc.name}: no _entity_poly_seq, tokens are the {len(observed)} observed residues")
        names = [res.name for res in observed]
        index = [res.label_seq if res.label_seq is not None else res.seqnum for res in observed]
        positions: list[int | None] = list(range(len(observed)))
    else:
        names = [first_alternative(s) for s in sequence]
        index = list(range(1, len(sequence) + 1))
        positions = align_by_numbering(observed, sequence)
        if positions is None:
            positions = align_by_sequence(observed, sequence, parents)
            by_author = align_by_author_numbering(observed, sequence, positions)
            how = "author numbering" if by_author is not None else "sequence alignment"
            positions = by_author if by_author is not None else positions
            notes.append(f"chain {sc.name}: label_seq_id does not place the residues on _entity_poly_seq, "
                         f"placed by {how}")
            unplaced = sum(p is None for p in positions)
            if unplaced:
                notes.append(f"chain {sc.name}: {unplaced} observed residues not in the sequence were dropped")

    n = len(names)
    restype = np.array([restype_of(name, parents) for name in names], dtype=np.int64)  # [L]
    ca = np.full((n, 3), np.nan, dtype=np.float32)   # [L, 3]
    cb = np.full((n, 3), np.nan, dtype=np.float32)   # [L, 3]
    for res, p in zip(observed, positions):
        if p is None:
            continue
        restype[p] = restype_of(res.name, parents)  # the observed residue decides microheterogeneous positions
        if res.ca is not None:
            ca[p] = res.ca
            cb_pos = res.ca if restype[p] == ONE_TO_INDEX["G"] else res.cb
            if cb_pos is not None:
                cb[p] = cb_pos
    resolved = ~np.isnan(ca).any(axis=1)
    return ChainTokens(subchain=sc, restype=restype, residue_index=np.array(index, dtype=np.int64), ca=ca, cb=cb,
                       resolved=resolved)


def drop_small_chains(chains: list[ChainTokens], min_resolved: int = MIN_RESOLVED_RESIDUES
                      ) -> tuple[list[ChainTokens], list[tuple[str, str]]]:
    """Drop protein chains with fewer than ``min_resolved`` resolved residues (AF3 SI 2.5.4)."""
    keep, skipped = [], []
    for chain in chains:
        n = int(chain.resolved.sum())
        if n < min_resolved:
            skipped.append((chain.subchain.name, f"fewer than {min_resolved} resolved residues ({n})"))
        else:
            keep.append(chain)
    return keep, skipped
