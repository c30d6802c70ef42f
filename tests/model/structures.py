"""Test helper: Calpha/Cbeta per residue of real PDB entries, read straight with gemmi (no mini_of3.data).

Entries come from the shared set, ``../shared/data/mmcif`` next to the repository; a test that needs one skips with
the reason when it is missing. Only observed protein residues with a CA become tokens here.
"""
from __future__ import annotations

from pathlib import Path

import gemmi
import pytest
import torch

SHARED_MMCIF = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "mmcif"
AMINO_ACIDS = ["ALA", "ARG", "ASN", "ASP", "CYS", "GLN", "GLU", "GLY", "HIS", "ILE",
               "LEU", "LYS", "MET", "PHE", "PRO", "SER", "THR", "TRP", "TYR", "VAL"]
RESTYPE = {name: i for i, name in enumerate(AMINO_ACIDS)} | {"MSE": AMINO_ACIDS.index("MET")}


def entry_path(pdb_id: str) -> Path:
    path = SHARED_MMCIF / f"{pdb_id}.cif.gz"
    if not path.is_file():
        pytest.skip(f"{pdb_id} is only in the shared data set ({SHARED_MMCIF} not found)")
    return path


def read_tokens(pdb_id: str, model: int = 0, chains: list[str] | None = None) -> dict[str, torch.Tensor]:
    """One token per observed protein residue with a CA, in chain order.

    Returns restype, residue_index, asym_id, entity_id, sym_id [N] long; ca, cb [N, 3] float32 (CB, or CA for
    glycine and residues without CB); resolved, token_mask [N] bool (all True).
    """
    st = gemmi.read_structure(str(entry_path(pdb_id)))
    st.setup_entities()
    entity_of = {sub: i + 1 for i, ent in enumerate(st.entities) for sub in ent.subchains}
    copies: dict[int, int] = {}
    cols = {k: [] for k in ("restype", "residue_index", "asym_id", "entity_id", "sym_id", "ca", "cb")}
    asym = 0
    for chain in st[model]:
        if chains is not None and chain.name not in chains:
            continue
        polymer = chain.get_polymer()
        if len(polymer) == 0 or polymer.check_polymer_type() not in (gemmi.PolymerType.PeptideL,):
            continue
        asym += 1
        entity = entity_of[polymer.subchain_id()]
        copies[entity] = copies.get(entity, 0) + 1
        for res in polymer:
            ca = res.find_atom("CA", "*")
            if ca is None:
                continue
            cb = res.find_atom("CB", "*") if res.name != "GLY" else None
            cols["restype"].append(RESTYPE.get(res.name, 20))
            cols["residue_index"].append(res.seqid.num)
            cols["asym_id"].append(asym)
            cols["entity_id"].append(entity)
            cols["sym_id"].append(copies[entity])
            cols["ca"].append(list(ca.pos.tolist()))
            cols["cb"].append(list((cb or ca).pos.tolist()))
    out = {k: torch.tensor(v, dtype=torch.float32 if k in ("ca", "cb") else torch.long) for k, v in cols.items()}
    n = out["restype"].shape[0]
    out["resolved"] = torch.ones(n, dtype=torch.bool)
    out["token_mask"] = torch.ones(n, dtype=torch.bool)
    return out


def as_batch(tokens: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Add a batch dimension of 1 to every feature."""
    return {k: v[None] for k, v in tokens.items()}
