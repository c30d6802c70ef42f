"""Fixtures of the data tests: every real entry parsed once per session, and one prepared folder."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from mini_of3.data import MmcifError, Structure, load_mmcif, prepare_folder

from .helpers import entry_files, entry_id


@pytest.fixture(scope="session")
def parsed(shared_mmcif) -> dict[str, Structure | MmcifError]:
    """``load_mmcif`` of every real entry, once per session (a Structure, or the MmcifError it raised)."""
    out: dict[str, Structure | MmcifError] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path in entry_files(shared_mmcif):
            try:
                out[entry_id(path)] = load_mmcif(path)
            except MmcifError as err:
                out[entry_id(path)] = err
    return out


@pytest.fixture(scope="session")
def structures(parsed) -> dict[str, Structure]:
    return {k: v for k, v in parsed.items() if isinstance(v, Structure)}


@pytest.fixture(scope="session")
def prepared(shared_mmcif, tmp_path_factory) -> Path:
    """All real entries prepared once (2 workers) into a session folder."""
    out = tmp_path_factory.mktemp("prepared")
    prepare_folder(shared_mmcif, out, workers=2, progress=False)
    return out
