"""Helpers of the data tests: which real entries there are, and editing real files into unusual or broken ones."""
from __future__ import annotations

import csv
import gzip
from pathlib import Path

import gemmi

NUCLEIC_ONLY = {"1FIX", "1QXB", "4GXY", "4ZKK"}          # the shared set's entries without a protein chain
LARGE = ("3WIP", "3KPR", "4ZXB", "3O21", "3SN6")           # complexes for 768-token crops


def entry_files(folder: Path) -> list[Path]:
    """The real entries of ``folder``, without the package's deliberately broken ``*_invalid`` files."""
    return sorted(p for p in folder.glob("*.cif.gz") if "_invalid" not in p.name)


def entry_id(path: Path) -> str:
    return path.name.split(".")[0]


def shared_manifest(folder: Path) -> dict[str, dict]:
    """The shared set's manifest.tsv rows by PDB id (empty when this run uses the offline entries)."""
    path = folder.parent / "manifest.tsv"
    if not path.is_file():
        return {}
    with open(path, newline="") as handle:
        return {row["pdb_id"]: row for row in csv.DictReader(handle, delimiter="\t")}


# ----------------------------------------------------------------------------------------------------------------
# editing real files into broken or unusual ones


def read_doc(path: Path) -> gemmi.cif.Document:
    return gemmi.cif.read(str(path))


def write_doc(doc: gemmi.cif.Document, path: Path) -> Path:
    """Write a gemmi document as plain mmCIF text (gemmi's style: no '#' separators)."""
    doc.write_file(str(path))
    return path


def atom_site(doc: gemmi.cif.Document) -> gemmi.cif.Table:
    return doc.sole_block().find_mmcif_category("_atom_site.")


def column(table: gemmi.cif.Table, tag: str) -> gemmi.cif.Column:
    return table.column(list(table.tags).index(f"_atom_site.{tag}"))


def plain_text(path: Path) -> str:
    return gzip.open(path, "rt").read()
