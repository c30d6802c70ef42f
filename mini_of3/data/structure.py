"""The ``Structure`` record (numpy only, no torch) and ``MmcifError``.

One token per protein residue (AF3 SI 2.6 for standard amino acids), in chain order, every residue of each chain's
``_entity_poly_seq`` sequence included; residues without coordinates have ``resolved=False`` and NaN coordinates.
"""
from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .atomic import atomic_path
from .residue_constants import sequence_string


class MmcifError(ValueError):
    """A file that cannot give a usable protein structure; the message names the file and the reason."""


_TOKEN_ARRAYS = {            # name -> (dtype, trailing shape)
    "restype": (np.uint8, ()),
    "residue_index": (np.int32, ()),
    "asym_id": (np.int32, ()),
    "entity_id": (np.int32, ()),
    "sym_id": (np.int32, ()),
    "ca": (np.float32, (3,)),
    "cb": (np.float32, (3,)),
    "resolved": (np.bool_, ()),
}


@dataclass
class Structure:
    """A cleaned protein structure, one token per residue.

    Per token (``N`` tokens): ``restype [N]`` (0..20, UNK = 20, order ``ARNDCQEGHILKMFPSTWYV``), ``residue_index [N]``
    (1-based position in the entity sequence), ``asym_id [N]`` (index into ``chain_ids``), ``entity_id [N]`` (index
    into ``entity_ids``), ``sym_id [N]`` (index of the chain among the chains of its entity), ``ca [N, 3]`` and
    ``cb [N, 3]`` (CB, CA for glycine; float32, NaN where unresolved) and ``resolved [N]`` (the CA is observed).
    """

    pdb_id: str
    restype: np.ndarray          # [N] uint8
    residue_index: np.ndarray    # [N] int32
    asym_id: np.ndarray          # [N] int32, 0..C-1
    entity_id: np.ndarray        # [N] int32, 0..E-1
    sym_id: np.ndarray           # [N] int32
    ca: np.ndarray               # [N, 3] float32, NaN where unresolved
    cb: np.ndarray               # [N, 3] float32, NaN where unresolved (CA for GLY)
    resolved: np.ndarray         # [N] bool
    chain_ids: tuple[str, ...]   # [C] label_asym_id of each asym_id
    auth_chain_ids: tuple[str, ...]  # [C] auth_asym_id of each asym_id
    entity_ids: tuple[str, ...]  # [E] mmCIF entity id of each entity_id
    resolution: float | None = None
    method: str = ""             # _exptl.method, several joined by ";"
    release_date: str | None = None  # YYYY-MM-DD of the first release
    skipped: tuple[tuple[str, str], ...] = ()   # (what, reason) for every chain or group left out
    notes: tuple[str, ...] = ()  # warnings met while parsing (e.g. no _entity_poly_seq)
    source: str = ""             # file the structure came from
    dropped_atoms: dict[str, int] = field(default_factory=dict)  # atoms removed by each cleanup rule

    def __post_init__(self) -> None:
        n = len(self.restype)
        for name, (dtype, tail) in _TOKEN_ARRAYS.items():
            value = np.ascontiguousarray(getattr(self, name), dtype=dtype)
            if value.shape != (n, *tail):
                raise ValueError(f"Structure {self.pdb_id}: {name} has shape {value.shape}, expected {(n, *tail)}")
            setattr(self, name, value)
        self.chain_ids = tuple(self.chain_ids)
        self.auth_chain_ids = tuple(self.auth_chain_ids)
        self.entity_ids = tuple(self.entity_ids)
        self.skipped = tuple((str(a), str(b)) for a, b in self.skipped)
        self.notes = tuple(self.notes)

    @property
    def n_tokens(self) -> int:
        return len(self.restype)

    @property
    def n_chains(self) -> int:
        return len(self.chain_ids)

    @property
    def resolved_fraction(self) -> float:
        return float(self.resolved.mean()) if self.n_tokens else 0.0

    def chain_sequence(self, asym: int) -> str:
        """One-letter sequence of chain ``asym`` (UNK as X)."""
        return sequence_string(self.restype[self.asym_id == asym])

    # ------------------------------------------------------------------------------------------------------------
    # .npz cache

    def save(self, path: str | Path) -> None:
        """Write the structure to ``path`` (.npz) atomically: a temporary file in the same folder, then a rename."""
        path = Path(path)
        arrays = {name: getattr(self, name) for name in _TOKEN_ARRAYS}
        skipped = np.array(self.skipped, dtype=str).reshape(-1, 2)
        dropped = np.array(sorted(self.dropped_atoms.items()), dtype=str).reshape(-1, 2)
        arrays.update(
            pdb_id=np.array(self.pdb_id), chain_ids=np.array(self.chain_ids, dtype=str),
            auth_chain_ids=np.array(self.auth_chain_ids, dtype=str), entity_ids=np.array(self.entity_ids, dtype=str),
            resolution=np.array(math.nan if self.resolution is None else self.resolution, dtype=np.float64),
            method=np.array(self.method), release_date=np.array(self.release_date or ""),
            skipped=skipped, notes=np.array(self.notes, dtype=str), source=np.array(self.source), dropped=dropped,
        )
        with atomic_path(path) as tmp, open(tmp, "wb") as handle:
            np.savez(handle, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> "Structure":
        """Read a structure written by :meth:`save`; a damaged file raises ``MmcifError`` naming it."""
        try:
            with np.load(path, allow_pickle=False) as data:
                d = {key: data[key] for key in data.files}
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            raise MmcifError(f"{path}: cannot read prepared structure ({err})") from None
        try:
            resolution = float(d["resolution"])
            return cls(
                pdb_id=str(d["pdb_id"]), **{name: d[name] for name in _TOKEN_ARRAYS},
                chain_ids=tuple(d["chain_ids"].tolist()), auth_chain_ids=tuple(d["auth_chain_ids"].tolist()),
                entity_ids=tuple(d["entity_ids"].tolist()),
                resolution=None if math.isnan(resolution) else resolution, method=str(d["method"]),
                release_date=str(d["release_date"]) or None, skipped=tuple(map(tuple, d["skipped"].tolist())),
                notes=tuple(d["notes"].tolist()), source=str(d["source"]),
                dropped_atoms={k: int(v) for k, v in d["dropped"].tolist()},
            )
        except (KeyError, ValueError) as err:
            raise MmcifError(f"{path}: prepared structure is incomplete or malformed ({err})") from None
