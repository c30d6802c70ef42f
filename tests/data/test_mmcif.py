"""load_mmcif on the real entries: every protein entry parses, and each cleanup rule does what it says."""
from __future__ import annotations

import gemmi
import numpy as np
import pytest

from mini_of3.data import MmcifError, Structure, load_mmcif
from mini_of3.data.residue_constants import RESTYPES, UNK, restype_of

from .helpers import NUCLEIC_ONLY, atom_site, column, entry_files, read_doc, shared_manifest, write_doc


def gemmi_model1(path):
    """An independent read of the file (gemmi's own reader), model 1."""
    return gemmi.read_structure(str(path))[0]


def residues(model):
    return [residue for chain in model for residue in chain]


def test_every_protein_entry_parses(parsed, shared_mmcif):
    files = entry_files(shared_mmcif)
    assert len(parsed) == len(files) and len(files) >= 6
    for pdb_id, result in parsed.items():
        if pdb_id in NUCLEIC_ONLY:
            assert isinstance(result, MmcifError), f"{pdb_id} has no protein chain and must be skipped"
        else:
            assert isinstance(result, Structure), f"{pdb_id}: {result}"
            assert result.n_tokens > 0 and result.resolved.sum() >= 4
            assert result.restype.max() <= UNK


def test_nucleic_acid_only_entries_are_skipped_with_a_reason(parsed):
    present = NUCLEIC_ONLY & set(parsed)
    if not present:
        pytest.skip("the nucleic-acid-only entries are only in ../shared/data/mmcif")
    for pdb_id in present:
        message = str(parsed[pdb_id])
        assert f"{pdb_id}.cif.gz" in message and "no protein chain" in message
        assert "nucleic-acid polymer" in message


def test_token_counts_match_entity_sequences(structures, shared_mmcif):
    manifest = shared_manifest(shared_mmcif)
    for pdb_id, s in structures.items():
        st = gemmi.read_structure(str(shared_mmcif / f"{pdb_id}.cif.gz"))
        entity_of = {sub: ent for ent in st.entities for sub in ent.subchains}
        for asym, chain in enumerate(s.chain_ids):
            expected = len(entity_of[chain].full_sequence)
            assert (s.asym_id == asym).sum() == expected, f"{pdb_id} chain {chain}"
            index = s.residue_index[s.asym_id == asym]
            assert (index == np.arange(1, expected + 1)).all()
        if pdb_id in manifest:   # the shared manifest counts the modelled protein residues of model 1
            assert int(s.resolved.sum()) == int(manifest[pdb_id]["protein_res"]), pdb_id


def test_resolved_ca_equal_gemmi_for_sampled_residues(structures, shared_mmcif):
    rng = np.random.default_rng(0)
    checked = 0
    for pdb_id, s in structures.items():
        model = gemmi_model1(shared_mmcif / f"{pdb_id}.cif.gz")
        for asym, chain in enumerate(s.chain_ids):
            tokens = np.flatnonzero(s.asym_id == asym)
            residues = list(model.get_subchain(chain))
            counts = np.bincount([r.label_seq for r in residues], minlength=len(tokens) + 1)
            for k in rng.choice(len(residues), size=min(8, len(residues)), replace=False):
                res = residues[k]
                cas = [a for a in res if a.name == "CA" and a.occ > 0]
                if not cas or counts[res.label_seq] > 1:   # unobserved, or two residue types at one position
                    continue
                best = min(cas, key=lambda a: (-a.occ, a.altloc))
                token = tokens[res.label_seq - 1]
                assert s.resolved[token]
                np.testing.assert_allclose(s.ca[token], [best.pos.x, best.pos.y, best.pos.z], atol=1e-3)
                cbs = [a for a in res if a.name == "CB" and a.occ > 0]
                if res.name == "GLY":
                    np.testing.assert_allclose(s.cb[token], s.ca[token])
                elif len(cbs) == 1:
                    np.testing.assert_allclose(s.cb[token], [cbs[0].pos.x, cbs[0].pos.y, cbs[0].pos.z], atol=1e-3)
                assert s.restype[token] == restype_of(res.name)
                checked += 1
    assert checked > 100
    for s in structures.values():   # unresolved tokens have no coordinates, resolved ones all have a CA
        assert np.isnan(s.ca[~s.resolved]).all() and not np.isnan(s.ca[s.resolved]).any()


def test_nmr_files_give_model_1_only(structures, shared_mmcif):
    nmr = [k for k, s in structures.items() if "NMR" in s.method]
    if not nmr:
        pytest.skip("no NMR entry in this run's folder")
    for pdb_id in nmr:
        st = gemmi.read_structure(str(shared_mmcif / f"{pdb_id}.cif.gz"))
        s = structures[pdb_id]
        assert len(st) > 1 and s.dropped_atoms["models"] == len(st) - 1
        for model, same in ((st[0], True), (st[1], False)):
            ca = {(r.subchain, r.label_seq): r.get_ca().pos for r in residues(model) if r.get_ca()}
            first = next(i for i in range(s.n_tokens) if s.resolved[i])
            pos = ca[(s.chain_ids[s.asym_id[first]], int(s.residue_index[first]))]
            assert np.allclose(s.ca[first], [pos.x, pos.y, pos.z], atol=1e-3) == same, pdb_id


def test_5pti_deuterium_dropped(entry_path):
    path = entry_path("5PTI")
    model = gemmi_model1(path)
    n_d = sum(a.element.name == "D" for r in residues(model) for a in r)
    n_h = sum(a.element.name == "H" for r in residues(model) for a in r)
    s = load_mmcif(path)
    assert n_d > 0 and s.dropped_atoms == {"hydrogen": n_h, "deuterium": n_d}
    assert s.n_tokens == 58 and s.resolved.all() and "NEUTRON DIFFRACTION" in s.method.split(";")


def test_modified_residues_map_to_parent(entry_path):
    s = load_mmcif(entry_path("1A8O"))                     # selenomethionine
    model = gemmi_model1(entry_path("1A8O"))
    mse = [r.label_seq for r in residues(model) if r.name == "MSE"]
    assert mse and all(s.restype[p - 1] == RESTYPES.index("M") for p in mse)
    assert restype_of("SEP") == RESTYPES.index("S") and restype_of("HYP") == RESTYPES.index("P")
    assert restype_of("NAG") == UNK and restype_of("XYZ") == UNK
    assert restype_of("ABC", parents={"ABC": "LYS"}) == RESTYPES.index("K")


def test_waters_and_ligands_are_reported(structures):
    s = structures.get("3WIP") or structures["3PWP"]
    reasons = [why for _, why in s.skipped]
    assert any(r.startswith("water") for r in reasons) and any(r.startswith("ligand") for r in reasons)
    assert not set(s.chain_ids) & {name for name, _ in s.skipped}


def test_ids_of_chains_and_entities(structures):
    s = structures.get("3KPR") or structures["1BD2"]
    assert s.n_chains == len(set(s.chain_ids)) and s.asym_id.max() == s.n_chains - 1
    for asym in range(s.n_chains):
        entity = s.entity_id[s.asym_id == asym]
        assert (entity == entity[0]).all()
    for entity in np.unique(s.entity_id):   # sym_id counts the chains of one entity 0, 1, ...
        chains = np.unique(s.asym_id[s.entity_id == entity])
        assert [int(s.sym_id[s.asym_id == c][0]) for c in chains] == list(range(len(chains)))


def test_microheterogeneity_keeps_the_higher_occupancy_residue(entry_path):
    path = entry_path("3JQH")
    s = load_mmcif(path)
    by_position: dict[int, list] = {}
    for r in gemmi_model1(path).get_subchain("A"):
        by_position.setdefault(r.label_seq, []).append(r)
    multi = {p: rs for p, rs in by_position.items() if len(rs) > 1}
    assert multi
    for p, residues in multi.items():
        occ = [np.mean([a.occ for a in r]) for r in residues]
        assert s.restype[p - 1] == restype_of(residues[int(np.argmax(occ))].name)


def test_altloc_with_highest_occupancy_wins(entry_path, tmp_path):
    doc = read_doc(entry_path("1YJP"))
    table = atom_site(doc)
    names, alts, occ, xs = (column(table, t) for t in ("label_atom_id", "label_alt_id", "occupancy", "Cartn_x"))
    row = next(i for i in range(len(names)) if names[i] == "CA")
    values = [table[row][j] for j in range(table.width())]
    x0 = float(xs[row])
    alts[row], occ[row] = "A", "0.30"
    values[list(table.tags).index("_atom_site.label_alt_id")] = "B"
    values[list(table.tags).index("_atom_site.occupancy")] = "0.70"
    values[list(table.tags).index("_atom_site.Cartn_x")] = f"{x0 + 1.5:.3f}"
    values[list(table.tags).index("_atom_site.id")] = "99999"
    table.append_row(values)
    s = load_mmcif(write_doc(doc, tmp_path / "altloc.cif"))
    assert s.ca[0, 0] == pytest.approx(x0 + 1.5, abs=1e-3)


def test_missing_entity_poly_seq_falls_back_to_observed_residues(entry_path, tmp_path):
    path = entry_path("1BD2")
    original = load_mmcif(path)
    doc = read_doc(path)
    doc.sole_block().find_mmcif_category("_entity_poly_seq.").erase()
    with pytest.warns(UserWarning, match="no _entity_poly_seq"):
        s = load_mmcif(write_doc(doc, tmp_path / "noseq.cif"))
    assert s.n_tokens == int(original.resolved.sum()) and s.resolved.all()
    np.testing.assert_allclose(s.ca, original.ca[original.resolved])


@pytest.mark.parametrize("pdb_id", ["3PWP", "1EMA", "5ZNG", "3SN6", "2XHE"])
def test_residues_are_placed_without_label_seq_id(entry_path, tmp_path, pdb_id):
    """Without label_seq_id the observed residues are placed by author numbering or PairwiseAligner; on these
    entries (gaps, several chains) that gives exactly the tokens the numbering gives."""
    path = entry_path(pdb_id)
    original = load_mmcif(path)
    doc = read_doc(path)
    seq = column(atom_site(doc), "label_seq_id")
    for i in range(len(seq)):
        seq[i] = "."
    with pytest.warns(UserWarning, match="placed by"):
        s = load_mmcif(write_doc(doc, tmp_path / f"{pdb_id}.cif"))
    assert s.n_tokens == original.n_tokens
    assert (s.restype == original.restype).all() and (s.resolved == original.resolved).all()
    np.testing.assert_allclose(np.nan_to_num(s.ca), np.nan_to_num(original.ca))


def test_sequence_alignment_places_residues_when_numbering_is_scrambled(entry_path, tmp_path):
    """Author numbers with insertion codes and no label_seq_id: only PairwiseAligner can place the residues."""
    path = entry_path("5PTI")
    original = load_mmcif(path)
    doc = read_doc(path)
    table = atom_site(doc)
    seq, icode = column(table, "label_seq_id"), column(table, "pdbx_PDB_ins_code")
    for i in range(len(seq)):
        seq[i], icode[i] = ".", "A"
    with pytest.warns(UserWarning, match="sequence alignment"):
        s = load_mmcif(write_doc(doc, tmp_path / "scrambled.cif"))
    assert (s.restype == original.restype).all() and (s.resolved == original.resolved).all()
    np.testing.assert_allclose(s.ca, original.ca)


def test_chains_with_fewer_than_4_resolved_residues_are_dropped(entry_path, tmp_path):
    path = entry_path("1BD2")                        # TCR, HLA-A2, beta2m and a 9-residue peptide (chain C)
    original = load_mmcif(path)
    peptide = original.chain_ids[int(np.argmin(np.bincount(original.asym_id)))]
    doc = read_doc(path)
    table = atom_site(doc)
    chain, seq = column(table, "label_asym_id"), column(table, "label_seq_id")
    for i in reversed(range(len(chain))):
        if chain[i] == peptide and seq[i] not in ("1", "2", "3"):
            table.remove_row(i)
    s = load_mmcif(write_doc(doc, tmp_path / "small.cif"))
    assert s.chain_ids == tuple(c for c in original.chain_ids if c != peptide)
    assert (peptide, "fewer than 4 resolved residues (3)") in s.skipped


def test_entry_metadata(structures):
    s = structures.get("3KPR") or next(iter(structures.values()))
    assert s.resolution is not None and 0 < s.resolution < 10
    assert s.release_date is not None and len(s.release_date) == 10 and s.method
    nmr = [x for x in structures.values() if "NMR" in x.method]
    assert all(x.resolution is None for x in nmr)
