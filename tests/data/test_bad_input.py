"""Bad input gives MmcifError naming the file and the reason, fast; a folder run with bad files goes on."""
from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

import numpy as np
import pytest

from mini_of3.data import MmcifError, load_mmcif, prepare_folder, read_manifest
from mini_of3.data.prepare import main as prepare_main
from mini_of3.data.manifest import read_skipped

from .helpers import atom_site, column, plain_text, read_doc, write_doc

PDB_TEXT = """HEADER    PLANT PROTEIN                           30-APR-81   1CRN
ATOM      1  N   THR A   1      17.047  14.099   3.625  1.00 13.79           N
ATOM      2  CA  THR A   1      16.967  12.784   4.338  1.00 10.80           C
END
"""


def _edit_coordinate(src: Path, dest: Path, value: str) -> Path:
    doc = read_doc(src)
    column(atom_site(doc), "Cartn_x")[3] = value
    return write_doc(doc, dest)


def _duplicate_atom(src: Path, dest: Path) -> Path:
    doc = read_doc(src)
    table = atom_site(doc)
    row = [table[5][j] for j in range(table.width())]
    row[list(table.tags).index("_atom_site.id")] = "99999"
    table.append_row(row)
    return write_doc(doc, dest)


def _without_atom_site(src: Path, dest: Path) -> Path:
    doc = read_doc(src)
    atom_site(doc).erase()
    return write_doc(doc, dest)


def _truncated_text(src: Path, dest: Path) -> Path:
    text = plain_text(src)
    cut = text.index("\nATOM") + len(text[text.index("\nATOM"):]) // 2    # in the middle of the atom records
    dest.write_text(text[: text.index("\n", cut) - 7])                 # mid-line
    return dest


def _truncated_at_line_end(src: Path, dest: Path) -> Path:
    text = plain_text(src)
    dest.write_text(text[: text.index("\n", text.index("\nATOM") + 5000) + 1])   # whole lines, wwPDB style file
    return dest


def _truncated_gzip(src: Path, dest: Path) -> Path:
    data = src.read_bytes()
    dest.write_bytes(data[: len(data) // 2])
    return dest


def _bad_inputs(src: Path, folder: Path) -> dict[str, tuple[Path, str]]:
    """{kind: (file, words the message must contain)} for every kind of bad input, built from a real entry."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "empty.cif").write_text("")
    (folder / "blank.cif").write_text("\n  \n")
    (folder / "garbage.cif").write_bytes(rng.bytes(4096))
    (folder / "notgzip.cif.gz").write_text(plain_text(src))
    (folder / "pdbformat.cif").write_text(PDB_TEXT)
    (folder / "nodata.cif").write_text("loop_\n_a.b\n1\n")
    return {
        "empty": (folder / "empty.cif", "empty file"),
        "whitespace": (folder / "blank.cif", "empty file"),
        "binary": (folder / "garbage.cif", "binary data"),
        "not gzip": (folder / "notgzip.cif.gz", "not gzip"),
        "pdb format": (folder / "pdbformat.cif", "PDB-format"),
        "no data_": (folder / "nodata.cif", "not an mmCIF file"),
        "truncated mid-line": (_truncated_text(src, folder / "truncated.cif"), "syntax error"),
        "truncated at a line end": (_truncated_at_line_end(src, folder / "truncated_lines.cif"), "truncated"),
        "truncated gzip": (_truncated_gzip(src, folder / "truncated_gz.cif.gz"), "gzip"),
        "no _atom_site": (_without_atom_site(src, folder / "noatoms.cif"), "_atom_site"),
        "NaN coordinate": (_edit_coordinate(src, folder / "nan.cif", "nan"), "NaN coordinates"),
        "missing coordinate": (_edit_coordinate(src, folder / "missing.cif", "?"), "NaN coordinates"),
        "absurd coordinate": (_edit_coordinate(src, folder / "absurd.cif", "2e4"), "absurd coordinates"),
        "duplicated atom": (_duplicate_atom(src, folder / "duplicate.cif"), "duplicated atom"),
    }


@pytest.fixture(scope="module")
def bad_inputs(entry_path, tmp_path_factory) -> dict[str, tuple[Path, str]]:
    return _bad_inputs(entry_path("1YJP"), tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize("kind", ["empty", "whitespace", "binary", "not gzip", "pdb format", "no data_",
                                  "truncated mid-line", "truncated at a line end", "truncated gzip", "no _atom_site",
                                  "NaN coordinate", "missing coordinate", "absurd coordinate", "duplicated atom"])
def test_bad_input_raises_mmcif_error(bad_inputs, kind):
    path, reason = bad_inputs[kind]
    with pytest.raises(MmcifError) as info:
        load_mmcif(path)
    assert isinstance(info.value, ValueError)
    assert str(path) in str(info.value) and reason in str(info.value), str(info.value)


def test_missing_path_and_folder(tmp_path):
    with pytest.raises(MmcifError, match="file not found"):
        load_mmcif(tmp_path / "1ABC.cif.gz")
    with pytest.raises(MmcifError, match="not a regular file"):
        load_mmcif(tmp_path)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0,
                    reason="running as root: chmod 000 does not stop root from reading the file")
def test_unreadable_file(entry_path, tmp_path):
    path = tmp_path / "unreadable.cif.gz"
    path.write_bytes(entry_path("1YJP").read_bytes())
    path.chmod(0)
    try:
        with pytest.raises(MmcifError, match="permission denied"):
            load_mmcif(path)
    finally:
        path.chmod(0o644)


def test_unreadable_file_even_as_root(entry_path, monkeypatch):
    """The same path as chmod 000, for runs as root: opening the file raises PermissionError."""
    from mini_of3.data import mmcif

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(mmcif, "open", denied, raising=False)
    with pytest.raises(MmcifError, match="permission denied"):
        load_mmcif(entry_path("1YJP"))


def test_no_protein_chain(entry_path, tmp_path):
    doc = read_doc(entry_path("1YJP"))
    table = atom_site(doc)
    group = column(table, "group_PDB")
    for i in reversed(range(len(group))):
        if group[i] == "ATOM":
            table.remove_row(i)                    # only the waters stay
    path = write_doc(doc, tmp_path / "waters.cif")
    with pytest.raises(MmcifError, match="no protein chain"):
        load_mmcif(path)


def test_the_packages_invalid_file(shared_mmcif, tmp_path, entry_path):
    """MDAnalysisTests ships 1YJP_invalid.cif.gz (an atom record 'WRONG', an element 'X'); the shared set does not,
    so it is rebuilt here from 1YJP the same way when absent."""
    path = shared_mmcif / "1YJP_invalid.cif.gz"
    if not path.is_file():
        text = plain_text(entry_path("1YJP")).replace("ATOM   47 ", "WRONG  47 ")
        path = tmp_path / "1YJP_invalid.cif.gz"
        path.write_bytes(gzip.compress(text.encode()))
    with pytest.raises(MmcifError, match="group_PDB 'WRONG'"):
        load_mmcif(path)


@pytest.mark.parametrize("text", [False, True])
def test_50_mb_of_junk_fails_fast(tmp_path, text):
    path = tmp_path / "junk.cif"
    rng = np.random.default_rng(1)
    data = (b"lorem ipsum dolor sit amet\n" * 2_000_000)[: 50 * 2**20] if text else rng.bytes(50 * 2**20)
    path.write_bytes(data)
    start = time.perf_counter()
    with pytest.raises(MmcifError, match="not an mmCIF file|binary data"):
        load_mmcif(path)
    assert time.perf_counter() - start < 1.0


def test_folder_run_goes_on_and_lists_every_bad_file(entry_path, tmp_path, capsys):
    src = tmp_path / "src"
    bad = _bad_inputs(entry_path("1YJP"), src)
    good = ["1YJP", "5PTI", "7ETN"]                  # in the shared set and in the offline package
    for pdb_id in good:
        (src / f"{pdb_id}.cif.gz").write_bytes(entry_path(pdb_id).read_bytes())
    out = tmp_path / "out"
    assert prepare_main([str(src), str(out), "--workers", "2", "--quiet"]) == 0
    assert sorted(r.id for r in read_manifest(out)) == sorted(good)
    skipped = {Path(r.file).name: r.reason for r in read_skipped(out)}
    assert set(skipped) == {path.name for path, _ in bad.values()}
    for path, reason in bad.values():
        assert reason in skipped[path.name]
    assert f"skipped {len(bad)}" in capsys.readouterr().out


def test_folder_of_only_bad_files_exits_nonzero(entry_path, tmp_path, capsys):
    src = tmp_path / "src"
    _bad_inputs(entry_path("1YJP"), src)
    assert prepare_main([str(src), str(tmp_path / "out"), "--workers", "1", "--quiet"]) == 1
    assert "no usable entry" in capsys.readouterr().err
    assert prepare_main([str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2
    summary = prepare_folder(src, tmp_path / "out2", workers=1, progress=False)
    assert not summary.entries and len(summary.skipped) == 14
