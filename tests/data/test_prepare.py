"""prepare: parallel parse into a content-hashed .npz cache, manifest.tsv and skipped.tsv, re-runs, guards."""
from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest

from mini_of3.data import Structure, load_mmcif, load_prepared, prepare_folder, read_manifest
from mini_of3.data import prepare as prepare_module
from mini_of3.data.manifest import read_skipped
from mini_of3.data.prepare import prepare_one

from .helpers import NUCLEIC_ONLY, entry_files, entry_id


def assert_same_structure(a: Structure, b: Structure) -> None:
    for name in ("restype", "residue_index", "asym_id", "entity_id", "sym_id", "resolved"):
        assert (getattr(a, name) == getattr(b, name)).all(), name
    np.testing.assert_array_equal(a.ca, b.ca)
    np.testing.assert_array_equal(a.cb, b.cb)
    assert (a.pdb_id, a.chain_ids, a.auth_chain_ids, a.entity_ids, a.resolution, a.method, a.release_date,
            a.skipped, a.notes, a.dropped_atoms) == (
            b.pdb_id, b.chain_ids, b.auth_chain_ids, b.entity_ids, b.resolution, b.method, b.release_date,
            b.skipped, b.notes, b.dropped_atoms)


def _copy(entry_path, names: list[str], folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / f"{name}.cif.gz").write_bytes(entry_path(name).read_bytes())
    return folder


def test_manifest_and_skipped_of_the_real_set(prepared, structures, parsed):
    rows = {r.id: r for r in read_manifest(prepared)}
    assert set(rows) == set(structures)
    for pdb_id, s in structures.items():
        row = rows[pdb_id]
        assert (row.tokens, row.chains, row.resolved_tokens) == (s.n_tokens, s.n_chains, int(s.resolved.sum()))
        assert row.resolved_fraction == pytest.approx(s.resolved_fraction, abs=1e-4)
        assert (row.method, row.resolution, row.release_date) == (s.method, s.resolution, s.release_date)
        assert_same_structure(load_prepared(prepared / row.npz), s)
    skipped = {entry_id(Path(r.file)): r.reason for r in read_skipped(prepared)}
    if "1YJP_invalid" in skipped:                     # the offline package's broken file
        assert "group_PDB 'WRONG'" in skipped.pop("1YJP_invalid")
    assert set(skipped) == set(parsed) - set(structures)
    for pdb_id in NUCLEIC_ONLY & set(skipped):
        assert "nucleic-acid polymer" in skipped[pdb_id]
    header = (prepared / "manifest.tsv").read_text().splitlines()[0].split("\t")
    assert header[:9] == ["id", "pdb_id", "tokens", "resolved_tokens", "chains", "resolved_fraction", "method",
                          "resolution", "release_date"]


def test_rerun_skips_unchanged_files_and_redoes_a_changed_one(entry_path, tmp_path):
    src = _copy(entry_path, ["1YJP", "7ETN", "5PTI"], tmp_path / "src")
    out = tmp_path / "out"
    first = prepare_folder(src, out, workers=2, progress=False)
    assert (first.parsed, first.cached, len(first.entries)) == (3, 0, 3)
    npz = {r.id: out / r.npz for r in first.entries}
    mtimes = {k: p.stat().st_mtime_ns for k, p in npz.items()}

    again = prepare_folder(src, out, workers=2, progress=False)
    assert (again.parsed, again.cached) == (0, 3)
    assert {k: p.stat().st_mtime_ns for k, p in npz.items()} == mtimes

    (src / "7ETN.cif.gz").write_bytes(entry_path("1YJP").read_bytes())       # same name, new content
    changed = prepare_folder(src, out, workers=2, progress=False)
    assert (changed.parsed, changed.cached) == (1, 2)
    row = next(r for r in read_manifest(out) if r.id == "7ETN")
    assert row.pdb_id == "1YJP" and not npz["7ETN"].exists() and (out / row.npz).is_file()
    assert sorted(p.name for p in (out / "structures").iterdir()) == sorted(Path(r.npz).name
                                                                           for r in read_manifest(out))


def test_bad_files_are_remembered_by_hash(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "junk.cif").write_text("junk\n")
    (src / "junk.cif.gz").write_text("junk\n")       # same id twice
    summary = prepare_folder(src, tmp_path / "out", workers=1, progress=False)
    reasons = sorted(r.reason for r in summary.skipped)
    assert any("duplicate id 'junk'" in r for r in reasons) and any("not an mmCIF file" in r for r in reasons)
    again = prepare_folder(src, tmp_path / "out", workers=1, progress=False)
    assert again.parsed == 0 and len(again.skipped) == 2


def test_cache_writes_are_atomic(entry_path, tmp_path, monkeypatch):
    s = load_mmcif(entry_path("1YJP"))
    target = tmp_path / "x.npz"

    def broken_savez(handle, **arrays):
        handle.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(OSError):
        s.save(target)
    assert list(tmp_path.iterdir()) == []            # neither the target nor a temporary file is left
    monkeypatch.undo()
    s.save(target)
    assert_same_structure(Structure.load(target), s)


def test_a_damaged_cache_file_is_an_mmcif_error(tmp_path):
    path = tmp_path / "bad.npz"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ValueError, match="bad.npz"):
        load_prepared(path)


def test_a_slow_parse_times_out(entry_path, tmp_path, monkeypatch):
    monkeypatch.setattr(prepare_module, "load_mmcif", lambda path: time.sleep(5))
    start = time.perf_counter()
    status, reason = prepare_one(str(entry_path("1YJP")), str(tmp_path / "x.npz"), timeout_s=0.2)
    assert status == "error" and "longer than 0.2 s" in reason
    assert time.perf_counter() - start < 2


def test_a_worker_that_dies_is_reported_and_the_run_goes_on(entry_path, tmp_path, monkeypatch):
    src = _copy(entry_path, ["1YJP", "7ETN", "5PTI"], tmp_path / "src")
    real = prepare_module.load_mmcif

    def crash_on_7etn(path):
        if "7ETN" in str(path):
            os._exit(3)                              # what a segfault in native code looks like to the pool
        return real(path)

    monkeypatch.setattr(prepare_module, "load_mmcif", crash_on_7etn)   # forked workers inherit the patch
    summary = prepare_folder(src, tmp_path / "out", workers=2, progress=False,
                             mp_context=multiprocessing.get_context("fork"))
    assert sorted(r.id for r in summary.entries) == ["1YJP", "5PTI"]
    assert len(summary.skipped) == 1 and "worker process died" in summary.skipped[0].reason


def test_prepare_cli_prints_a_summary(entry_path, tmp_path, capsys):
    src = _copy(entry_path, ["1YJP", "7ETN"], tmp_path / "src")
    assert prepare_module.main([str(src), str(tmp_path / "out"), "--workers", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "prepared 2 entries" in out and "manifest.tsv" in out
    assert prepare_module.main([str(tmp_path / "src" / "nothing"), str(tmp_path / "out")]) == 2


def test_prepare_data_uses_the_offline_entries(entry_path, tmp_path, monkeypatch):
    """The empty default data.root with offline_package=true is filled by ensure_offline_entries, then prepared;
    another empty folder (a mistyped path) is an error naming it, and nothing is downloaded."""
    from mini_of3.config import DataConfig

    fetched = []

    def fake_offline(root, progress=True):
        fetched.append(root)
        return [_copy(entry_path, ["1YJP", "7ETN"], Path(root))]

    monkeypatch.setattr(prepare_module, "ensure_offline_entries", fake_offline)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"data.root .*data/mmcf: no mmCIF files there \(a mistyped path\?\); "
                                                r"the demonstration entries are downloaded only into the default"):
        prepare_module.prepare_data(DataConfig(root=str(tmp_path / "data" / "mmcf"), num_workers=1), progress=False)
    assert not fetched and not (tmp_path / "data" / "mmcf").exists()
    cfg = DataConfig(cache_dir=str(tmp_path / "cache"), num_workers=1)                # root: the default data/mmcif
    assert prepare_module.prepare_data(cfg, progress=False) == tmp_path / "cache"
    assert len(fetched) == 1 and len(read_manifest(tmp_path / "cache")) == 2
    assert prepare_module.prepare_data(cfg, progress=False) == tmp_path / "cache" and len(fetched) == 1
    prepared_root = DataConfig(root=str(tmp_path / "cache"), cache_dir=str(tmp_path / "other"))
    assert prepare_module.prepare_data(prepared_root, progress=False) == tmp_path / "cache"
    with pytest.raises(FileNotFoundError, match="no mmCIF files"):
        prepare_module.prepare_data(DataConfig(root=str(tmp_path / "none"), offline_package=False))


def test_every_real_entry_is_in_the_prepared_folder(prepared, shared_mmcif):
    listed = {r.source for r in read_manifest(prepared)} | {Path(r.file).name for r in read_skipped(prepared)}
    assert {p.name for p in entry_files(shared_mmcif)} <= listed
