"""Fixtures of the trainer tests: a small prepared data set and one uninterrupted reference run, once per session."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from mini_of3.data import prepare_folder

from .helpers import OFFLINE_ENTRIES, SMALL_ENTRIES, describe, run_train, tiny_overrides


@pytest.fixture(autouse=True)
def one_thread():
    """In-process training on one thread (two OpenMP threads crawl when another job holds one of the 2 cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def small_data(shared_mmcif, tmp_path_factory) -> tuple[Path, str]:
    """(prepared folder, validation id): five small shared entries (1L2Y validates), else the offline ones
    (5PTI validates), prepared once."""
    wanted = SMALL_ENTRIES if all((shared_mmcif / f"{i}.cif.gz").is_file() for i in SMALL_ENTRIES) \
        else OFFLINE_ENTRIES
    src = tmp_path_factory.mktemp("mmcif")
    for pdb_id in wanted:
        shutil.copy(shared_mmcif / f"{pdb_id}.cif.gz", src)
    out = tmp_path_factory.mktemp("prepared")
    summary = prepare_folder(src, out, workers=1, progress=False)
    assert len(summary.entries) == len(wanted), summary.skipped
    return out, wanted[1] if wanted == SMALL_ENTRIES else wanted[0]


@pytest.fixture(scope="session")
def reference_run(small_data, tmp_path_factory) -> Path:
    """The uninterrupted 6-step run that the resume tests must repeat bitwise."""
    prepared, val_id = small_data
    out = tmp_path_factory.mktemp("runs") / "straight"
    done = run_train(tiny_overrides(prepared, out, val_id))
    assert done.returncode == 0, describe(done)
    return out
