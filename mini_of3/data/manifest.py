"""The files of a prepared folder: ``manifest.tsv`` (usable entries), ``skipped.tsv`` (files left out and why), and
the cached structures they point to (``structures/<id>.<hash>.npz``)."""
from __future__ import annotations

import csv
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .atomic import atomic_path
from .structure import Structure


@dataclass
class ManifestRow:
    """One usable entry of a prepared folder (a row of ``manifest.tsv``)."""

    id: str                        # file name without its suffix: the key of the entry
    pdb_id: str
    tokens: int
    resolved_tokens: int
    chains: int
    resolved_fraction: float
    method: str
    resolution: float | None
    release_date: str | None
    npz: str                       # path relative to the prepared folder
    source: str                    # source file name
    sha256: str                    # content hash of the source file


@dataclass
class SkippedRow:
    file: str
    reason: str
    sha256: str = ""


def write_tsv(path: Path, rows: list, cls: type) -> None:
    """Write dataclass rows as a TSV with a header, atomically (temporary file + rename)."""
    names = [f.name for f in fields(cls)]
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(names)
        for row in rows:
            values = asdict(row)
            writer.writerow(["" if values[n] is None else values[n] for n in names])


def read_manifest(prepared: str | Path) -> list[ManifestRow]:
    """The rows of ``<prepared>/manifest.tsv``; FileNotFoundError naming the folder when it has none."""
    path = Path(prepared) / "manifest.tsv"
    if not path.is_file():
        raise FileNotFoundError(f"{prepared}: no manifest.tsv; run `python -m mini_of3.data.prepare SRC {prepared}`")
    rows = []
    with open(path, newline="") as handle:
        for raw in csv.DictReader(handle, delimiter="\t"):
            rows.append(ManifestRow(
                id=raw["id"], pdb_id=raw["pdb_id"], tokens=int(raw["tokens"]),
                resolved_tokens=int(raw["resolved_tokens"]), chains=int(raw["chains"]),
                resolved_fraction=float(raw["resolved_fraction"]), method=raw["method"],
                resolution=float(raw["resolution"]) if raw["resolution"] else None,
                release_date=raw["release_date"] or None, npz=raw["npz"], source=raw["source"],
                sha256=raw["sha256"]))
    return rows


def read_skipped(prepared: str | Path) -> list[SkippedRow]:
    """The rows of ``<prepared>/skipped.tsv`` (none when there is no such file)."""
    path = Path(prepared) / "skipped.tsv"
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        rows = csv.DictReader(handle, delimiter="\t")
        return [SkippedRow(r["file"], r["reason"], r.get("sha256") or "") for r in rows]


def load_prepared(path: str | Path) -> Structure:
    """Read one cached structure (``.npz`` written by ``prepare``)."""
    return Structure.load(path)
