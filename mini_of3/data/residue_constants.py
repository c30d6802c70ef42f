"""Residue types of the protein-only, one-token-per-residue scheme.

The 20 standard amino acids in the AlphaFold order (``ARNDCQEGHILKMFPSTWYV``), then UNK (index 20) for every residue
whose parent is not one of them (AF3 SI 2.6 maps unknown protein residues to the UNK token).
"""
from __future__ import annotations

import gemmi

RESTYPES = "ARNDCQEGHILKMFPSTWYV"
UNK = 20
NUM_RESTYPES = 21                               # 20 standard + UNK
RESTYPES_WITH_X = RESTYPES + "X"

THREE_TO_ONE = {
    "ALA": "A", "ARG": "R", "ASN": "N", "ASP": "D", "CYS": "C", "GLN": "Q", "GLU": "E", "GLY": "G", "HIS": "H",
    "ILE": "I", "LEU": "L", "LYS": "K", "MET": "M", "PHE": "F", "PRO": "P", "SER": "S", "THR": "T", "TRP": "W",
    "TYR": "Y", "VAL": "V",
}
ONE_TO_INDEX = {letter: i for i, letter in enumerate(RESTYPES)}
THREE_TO_INDEX = {three: ONE_TO_INDEX[one] for three, one in THREE_TO_ONE.items()}
GLY = ONE_TO_INDEX["G"]

WATER_NAMES = frozenset({"HOH", "DOD", "WAT", "H2O"})
HYDROGEN_ELEMENTS = frozenset({"H", "D"})      # gemmi reads deuterium as its own element "D"


def restype_of(name: str, parents: dict[str, str] | None = None) -> int:
    """Index (0..20) of a residue named ``name`` (a CCD code) in :data:`RESTYPES`, UNK = 20.

    Standard amino acids map to themselves; a modified residue maps to its parent (MSE -> MET, SEP -> SER, ...;
    AF3 SI 2.1 converts MSE to MET, and the one-token-per-residue scheme here extends that to every modified amino
    acid with a standard parent). The parent comes first from ``parents`` (the file's own
    ``_pdbx_struct_mod_residue`` table), then from gemmi's table of residues, whose one-letter code for a modified
    amino acid is its parent's letter in lower case. Anything else is UNK.
    """
    if name in THREE_TO_INDEX:
        return THREE_TO_INDEX[name]
    if parents and parents.get(name) in THREE_TO_INDEX:
        return THREE_TO_INDEX[parents[name]]
    info = gemmi.find_tabulated_residue(name)
    if info is not None and info.is_amino_acid():
        letter = info.one_letter_code.upper()
        if letter in ONE_TO_INDEX:
            return ONE_TO_INDEX[letter]
    return UNK


def sequence_string(restype) -> str:
    """One-letter sequence of an array of restype indices (UNK as ``X``)."""
    return "".join(RESTYPES_WITH_X[int(i)] for i in restype)
