"""predict: a checkpoint and a real mmCIF entry (or a FASTA file) give ranked mmCIF files that gemmi reads back with
one Calpha per residue and pLDDT in the B-factors, and, for an mmCIF input, lDDT, RMSD and TM-score per sample."""
from __future__ import annotations

import os
import subprocess
import sys

import gemmi
import numpy as np
import pytest

from mini_of3.data import load_mmcif
from mini_of3.predict import main, predict, read_fasta

from .helpers import REPO


@pytest.fixture(scope="module")
def real_entry(shared_mmcif):
    for pdb_id in ("1CRN", "5PTI"):
        if (shared_mmcif / f"{pdb_id}.cif.gz").is_file():
            return shared_mmcif / f"{pdb_id}.cif.gz"
    pytest.skip(f"neither 1CRN nor 5PTI in {shared_mmcif}")


def read_back(path):
    """[(chain, residue name, seqid, CA count, B-factor)] of a written file."""
    structure = gemmi.read_structure(str(path))
    assert len(structure) == 1
    return [(chain.name, res.name, res.seqid.num, sum(a.name == "CA" for a in res), res[0].b_iso)
            for chain in structure[0] for res in chain]


def test_predict_cli_on_a_real_entry_writes_ranked_mmcif_and_prints_metrics(reference_run, real_entry, tmp_path):
    out = tmp_path / "pred"
    done = subprocess.run([sys.executable, "-m", "mini_of3.predict", str(reference_run), str(real_entry), "--out",
                           str(out), "--samples", "3", "--steps", "4", "--recycles", "1", "--seed", "7",
                           "--device", "cpu"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert "EMA weights" in lines[0] and ("step_3" in lines[0] or "step_6" in lines[0])
    header, *rows = lines[1:]
    assert header.split()[:6] == ["rank", "sample", "pLDDT", "lDDT-Ca", "RMSD(A)", "TM-score"]
    assert len(rows) == 3 and [int(r.split()[0]) for r in rows] == [1, 2, 3]
    plddts = [float(r.split()[2]) for r in rows]
    assert plddts == sorted(plddts, reverse=True)                          # ranked by mean pLDDT
    for r in rows:
        lddt, rmsd, tm = map(float, r.split()[3:6])
        assert 0 <= lddt <= 1 and rmsd > 0 and 0 <= tm <= 1
    truth = load_mmcif(real_entry)
    for rank in (1, 2, 3):
        residues = read_back(out / f"{truth.pdb_id}_rank{rank}.cif")
        assert len(residues) == truth.n_tokens                            # every residue, resolved or not
        assert all(n_ca == 1 for *_, n_ca, _ in residues)
        assert [r[2] for r in residues] == truth.residue_index.tolist()
        b = np.array([r[4] for r in residues])
        assert 0 <= b.min() and b.max() <= 100
        assert b.mean() == pytest.approx(plddts[rank - 1], abs=0.051)   # the B-factors are the ranked pLDDT


def test_predict_from_fasta_builds_chains_and_entities(reference_run, tmp_path, capsys):
    fasta = tmp_path / "dimer.fasta"
    fasta.write_text(">first chain\nMKTAYIAKQR\nQISFVKSHFS\n>copy\nMKTAYIAKQRQISFVKSHFS\n>other\nGSHMLEDPVX*\n")
    rows = predict(reference_run / "checkpoints" / "step_3", fasta, tmp_path / "out", samples=2, steps=3, seed=1,
                   device="cpu")
    assert [r["rank"] for r in rows] == [1, 2] and "lddt_ca" not in rows[0]   # no truth, no metrics
    structure = gemmi.read_structure(str(tmp_path / "out" / "dimer_rank1.cif"))
    assert [ch.name for ch in structure[0]] == ["A", "B", "C"]
    assert [len(ch) for ch in structure[0]] == [20, 20, 10]
    assert gemmi.one_letter_code([r.name for r in structure[0]["C"]]) == "GSHMLEDPVX"
    assert [len(e.subchains) for e in structure.entities] == [2, 1]        # A and B are one entity
    assert "step 3" in capsys.readouterr().out


def test_predict_errors_are_one_line(reference_run, tmp_path, capsys):
    bad = tmp_path / "bad.fasta"
    bad.write_text("MKTAYIAKQR\n")
    assert main([str(reference_run), str(bad), "--out", str(tmp_path / "o")]) == 1
    assert "comes before the first '>' header" in capsys.readouterr().err
    bad.write_text(">x\nMKTAYIAKQR\n")
    assert main([str(tmp_path / "nowhere"), str(bad)]) == 1
    assert "no such run or checkpoint folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(reference_run), str(bad), "--samples", "0"])
    with pytest.raises(ValueError, match="characters '1' that are not residues"):
        bad.write_text(">x\nMKT1\n")
        read_fasta(bad)


def test_bench_score_rates_whole_entries_with_the_top_sample_and_the_mirrored_share(reference_run, shared_mmcif,
                                                                                   tmp_path, capsys):
    """bench score: one row per entry of at most --max-tokens tokens, less --exclude; the top-pLDDT sample's scores
    match predict's rank 1 for the same seed; mirrored_fraction is a share of the samples."""
    from mini_of3.bench import score

    ids = [i for i in ("1CRN", "5PTI", "1L2Y") if (shared_mmcif / f"{i}.cif.gz").is_file()]
    if len(ids) < 2:
        pytest.skip(f"fewer than two of 1CRN, 5PTI, 1L2Y in {shared_mmcif}")
    score.main([str(reference_run), "--mmcif", str(shared_mmcif), "--ids", ",".join(ids), "--exclude", ids[-1],
                "--samples", "3", "--steps", "3", "--device", "cpu", "--out", str(tmp_path), "--tag", "t"])
    result = __import__("json").loads((tmp_path / "score_t.json").read_text())
    assert result["bench"] == "score" and result["samples"] == 3 and result["steps"] == 3
    assert [r["entry"] for r in result["rows"]] == ids[:-1]
    for row in result["rows"]:
        assert 0 <= row["lddt_ca"] <= 1 and 0 <= row["tm_score"] <= 1 and 0 <= row["tm_score_mirror"] <= 1
        assert row["mirrored_fraction"] in (0, 1 / 3, 2 / 3, 1)
    first = predict(reference_run, shared_mmcif / f"{ids[0]}.cif.gz", tmp_path / "pred", samples=3, steps=3,
                    device="cpu")[0]
    assert result["rows"][0]["lddt_ca"] == pytest.approx(first["lddt_ca"])
    assert result["means"]["lddt_ca"] == pytest.approx(sum(r["lddt_ca"] for r in result["rows"]) / len(ids[:-1]))
    assert "mean" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no entry to score"):
        score.main([str(reference_run), "--mmcif", str(shared_mmcif), "--ids", ids[0], "--max-tokens", "1",
                    "--device", "cpu", "--out", str(tmp_path)])
