"""``load_mmcif(path) -> Structure``: read a PDBx/mmCIF file (plain or gzipped) with gemmi and clean it.

Bad input never escapes as a traceback or a hang: the file is checked cheaply first (exists, readable, not empty,
gzip when it says so, text, starts with ``data_``), so a 50 MB file of junk fails after reading 64 KiB; then gemmi's
own errors, a missing ``_atom_site``, broken coordinates, duplicated atoms and "no protein chain" all become
:class:`MmcifError` naming the file and the reason. The cleanup rules themselves are in :mod:`.cleanup`.
"""
from __future__ import annotations

import gzip
import re
import warnings
import zlib
from pathlib import Path

import gemmi
import numpy as np

from . import cleanup
from .structure import MmcifError, Structure

SNIFF_BYTES = 64 * 1024
MAX_TEXT_BYTES = 4 * 1024**3         # 4 GiB of mmCIF text: far beyond any PDB entry
GZIP_MAGIC = b"\x1f\x8b"
_WWPDB_SEPARATOR = re.compile(r"\n#[ \t]*\n_")   # a '#' line between two categories, as wwPDB writes them
PDB_RECORDS = ("HEADER", "TITLE ", "COMPND", "SOURCE", "REMARK", "ATOM  ", "HETATM", "CRYST1", "MODEL ", "EXPDTA",
               "SEQRES", "KEYWDS", "AUTHOR")


# ----------------------------------------------------------------------------------------------------------------
# reading


def _open_checked(path: Path):
    """Open ``path`` for binary reading or raise MmcifError saying why not."""
    try:
        if not path.exists():
            raise MmcifError(f"{path}: file not found")
        if not path.is_file():
            raise MmcifError(f"{path}: not a regular file")
        if path.stat().st_size == 0:
            raise MmcifError(f"{path}: empty file")
        return open(path, "rb")
    except PermissionError:
        raise MmcifError(f"{path}: cannot read the file (permission denied)") from None
    except OSError as err:
        raise MmcifError(f"{path}: cannot read the file ({err.strerror or err})") from None


def _sniff_text(head: bytes, path: Path) -> None:
    """Check that the first bytes of the (decompressed) file look like mmCIF text, else say what they look like."""
    if not head.strip():
        raise MmcifError(f"{path}: empty file (only whitespace)")
    if b"\0" in head:
        raise MmcifError(f"{path}: binary data, not an mmCIF text file")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        if err.start < len(head) - 4:          # a multi-byte character cut at the end of the sniff is fine
            raise MmcifError(f"{path}: binary data, not an mmCIF text file") from None
        text = head[:err.start].decode("utf-8")
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.lower().startswith("data_"):
            return
        if line.startswith(PDB_RECORDS):
            raise MmcifError(f"{path}: PDB-format file, not mmCIF (first record {line[:6].strip()!r})")
        raise MmcifError(f"{path}: not an mmCIF file (expected 'data_' first, found {stripped[:40]!r})")
    raise MmcifError(f"{path}: no 'data_' block in the first {len(head)} bytes: not an mmCIF file")


def read_mmcif_text(path: str | Path) -> str:
    """Return the text of an mmCIF file, gunzipped when it is gzip; MmcifError for anything that is not mmCIF text."""
    path = Path(path)
    with _open_checked(path) as raw:
        try:
            magic = raw.read(2)
            raw.seek(0)
            if magic == GZIP_MAGIC:
                stream = gzip.GzipFile(fileobj=raw)
            elif path.suffix == ".gz":
                raise MmcifError(f"{path}: named .gz but not gzip-compressed")
            else:
                stream = raw
            head = stream.read(SNIFF_BYTES)
            _sniff_text(head, path)
            rest = stream.read(MAX_TEXT_BYTES)
            if stream.read(1):
                raise MmcifError(f"{path}: more than {MAX_TEXT_BYTES} bytes of text, refusing to parse")
        except (EOFError, gzip.BadGzipFile, zlib.error) as err:
            raise MmcifError(f"{path}: truncated or corrupt gzip data ({err})") from None
        except OSError as err:
            raise MmcifError(f"{path}: cannot read the file ({err})") from None
    return (head + rest).decode("utf-8", errors="replace")


def parse_block(text: str, path: str | Path) -> gemmi.cif.Block:
    """Parse mmCIF text with gemmi and return its first data block; syntax errors become MmcifError."""
    try:
        doc = gemmi.cif.read_string(text)
    except (ValueError, RuntimeError, IndexError) as err:
        raise MmcifError(f"{path}: mmCIF syntax error ({err})") from None
    if len(doc) == 0:
        raise MmcifError(f"{path}: no data block")
    if _WWPDB_SEPARATOR.search(text, 0, SNIFF_BYTES) and not text.rstrip().endswith("#"):
        # wwPDB archive files close every category with a '#' line: one that stops without it was cut short
        raise MmcifError(f"{path}: truncated file (written with '#' after each category, but not after its last)")
    return doc[0]


# ----------------------------------------------------------------------------------------------------------------
# metadata


def _values(block: gemmi.cif.Block, tag: str) -> list[str]:
    return [gemmi.cif.as_string(v) for v in block.find_values(tag) if not gemmi.cif.is_null(v)]


def read_method(block: gemmi.cif.Block) -> str:
    """Experimental methods (``_exptl.method``), several joined by ';' (e.g. X-ray and neutron for 5PTI)."""
    return ";".join(dict.fromkeys(m.upper() for m in _values(block, "_exptl.method")))


def read_resolution(block: gemmi.cif.Block) -> float | None:
    """Resolution in Angstrom from refinement, EM reconstruction or data collection; None (e.g. NMR) when absent."""
    for tag in ("_refine.ls_d_res_high", "_em_3d_reconstruction.resolution", "_reflns.d_resolution_high"):
        numbers = []
        for value in _values(block, tag):
            try:
                numbers.append(float(value))
            except ValueError:
                continue
        numbers = [x for x in numbers if 0 < x < 100]
        if numbers:
            return min(numbers)
    return None


def read_release_date(block: gemmi.cif.Block) -> str | None:
    """Date of first release (YYYY-MM-DD) from ``_pdbx_audit_revision_history`` (or ``_database_PDB_rev`` in files
    of the older format); None when the file has neither."""
    for tag in ("_pdbx_audit_revision_history.revision_date", "_database_PDB_rev.date"):
        dates = sorted(d for d in _values(block, tag) if len(d) == 10 and d[4] == "-")
        if dates:
            return dates[0]
    return None


def read_modified_parents(block: gemmi.cif.Block) -> dict[str, str]:
    """Parent of each modified residue declared in the file (``_pdbx_struct_mod_residue``)."""
    table = block.find("_pdbx_struct_mod_residue.", ["label_comp_id", "parent_comp_id"])
    return {gemmi.cif.as_string(row[0]): gemmi.cif.as_string(row[1]) for row in table
            if not gemmi.cif.is_null(row[1])}


def read_pdb_id(block: gemmi.cif.Block, path: Path) -> str:
    ids = _values(block, "_entry.id")
    return (ids[0] if ids else block.name or path.name.split(".")[0]).upper()


# ----------------------------------------------------------------------------------------------------------------
# the whole load


def load_mmcif(path: str | Path) -> Structure:
    """Parse and clean one mmCIF file into a :class:`Structure` (one token per protein residue).

    Rules, in order (see :mod:`.cleanup`): model 1 only, hydrogens and deuterium removed, waters, ligands and
    non-protein polymers dropped (each reported in ``Structure.skipped``), one conformer per residue by occupancy,
    modified residues to their parent (else UNK), every residue of ``_entity_poly_seq`` a token (unobserved ones
    ``resolved=False``), chains with fewer than 4 resolved residues dropped.

    Raises:
        MmcifError: the file is missing, unreadable, empty, not gzip though named .gz, truncated, binary, PDB format,
            has no ``_atom_site``, NaN or absurd coordinates, duplicated atoms, or no usable protein chain.
    """
    path = Path(path)
    block = parse_block(read_mmcif_text(path), path)
    cleanup.check_atom_records(block, str(path))
    try:
        st = gemmi.make_structure_from_block(block)
    except (ValueError, RuntimeError) as err:
        raise MmcifError(f"{path}: gemmi cannot build a structure ({err})") from None
    if len(st) == 0 or st[0].count_atom_sites() == 0:
        raise MmcifError(f"{path}: no atoms in the first model")
    st.setup_entities()

    dropped_models = cleanup.keep_first_model(st)
    cleanup.check_coordinates(st[0], str(path))
    cleanup.check_duplicate_atoms(st[0], str(path))
    dropped_atoms = cleanup.remove_hydrogens(st)
    if dropped_models:
        dropped_atoms["models"] = dropped_models

    subchains = cleanup.subchains_of(st)
    skipped: list[tuple[str, str]] = []
    for rule in (cleanup.drop_waters, cleanup.drop_ligands, cleanup.drop_non_protein_polymers):
        subchains, dropped = rule(subchains)
        skipped += dropped

    parents = read_modified_parents(block)
    notes: list[str] = []
    chains = []
    for sc in subchains:
        observed = cleanup.resolve_microheterogeneity([cleanup.choose_conformer(r) for r in sc.residues])
        chains.append(cleanup.chain_tokens(sc, observed, parents, notes))
    chains, dropped = cleanup.drop_small_chains(chains)
    skipped += dropped

    if not chains:
        polymers = [f"{name}: {why}" for name, why in skipped if not why.startswith(("water", "ligand"))]
        others = len(skipped) - len(polymers)
        raise MmcifError(f"{path}: no protein chain to keep ({'; '.join(polymers) or 'no polymer chain'}"
                         f"{f'; and {others} water or ligand groups' if others else ''})")
    for note in notes:
        warnings.warn(f"{path}: {note}", stacklevel=2)
    return _assemble(chains, block, path, skipped, notes, dropped_atoms)


def _assemble(chains: list[cleanup.ChainTokens], block: gemmi.cif.Block, path: Path,
              skipped: list[tuple[str, str]], notes: list[str], dropped_atoms: dict[str, int]) -> Structure:
    """Concatenate the chains' tokens and give each chain its asym_id, entity_id and sym_id (AF3 SI 2.8)."""
    entity_names: list[str] = []
    copies: dict[str, int] = {}
    asym, entity, sym = [], [], []
    for i, chain in enumerate(chains):
        name = chain.subchain.entity.name if chain.subchain.entity is not None else chain.subchain.name
        if name not in entity_names:
            entity_names.append(name)
        n = len(chain.restype)
        asym.append(np.full(n, i))
        entity.append(np.full(n, entity_names.index(name)))
        sym.append(np.full(n, copies.get(name, 0)))
        copies[name] = copies.get(name, 0) + 1
    return Structure(
        pdb_id=read_pdb_id(block, path),
        restype=np.concatenate([c.restype for c in chains]),
        residue_index=np.concatenate([c.residue_index for c in chains]),
        asym_id=np.concatenate(asym), entity_id=np.concatenate(entity), sym_id=np.concatenate(sym),
        ca=np.concatenate([c.ca for c in chains]), cb=np.concatenate([c.cb for c in chains]),
        resolved=np.concatenate([c.resolved for c in chains]),
        chain_ids=tuple(c.subchain.name for c in chains), auth_chain_ids=tuple(c.subchain.auth_name for c in chains),
        entity_ids=tuple(entity_names), resolution=read_resolution(block), method=read_method(block),
        release_date=read_release_date(block), skipped=tuple(skipped), notes=tuple(notes),
        source=path.name, dropped_atoms=dropped_atoms,
    )
