"""``python -m mini_of3.bench fit`` on the CPU: the plumbing with a tiny model (fast), and a real fit of four small
entries (slow)."""
import json
import shutil
import time

import pytest
import yaml

from mini_of3.bench import fit
from mini_of3.data import prepare_folder, read_manifest

from .helpers import TINY_MODEL

FIELDS = {"impl", "entry", "split", "step", "lddt_ca", "lddt_ca_untrained", "tm_score", "tm_score_untrained",
          "plddt", "tm_score_mirror"}
SLOW_ENTRIES = ("1L2Y", "5I55", "1PSM", "1CRN")      # 20, 22, 38, 46 residues (shared set)


def model_overrides(values: dict) -> list[str]:
    return [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()]


def test_fit_bench_writes_a_row_per_entry_and_validation_and_a_plot(small_data, tmp_path, capsys):
    prepared, _ = small_data
    ids = [r.id for r in read_manifest(prepared)][:2]
    run = tmp_path / "run"
    fit.main(["configs/default.yaml", "--ids", ",".join(i.lower() for i in ids), "--steps", "3", "--every", "2",
              "--data", str(prepared), "--out", str(tmp_path), "--tag", "t", "--name", "fit2", "wandb=false",
              f"trainer.out_dir={run}", "data.num_workers=0", "data.crop_size=32", "trainer.val_samples=1",
              *model_overrides(TINY_MODEL)])
    result = json.loads((tmp_path / "fit_t.json").read_text())
    assert result["bench"] == "fit" and (tmp_path / "fit_t.png").read_bytes()[:4] == b"\x89PNG"
    rows = result["rows"]
    assert [(r["step"], r["entry"]) for r in rows] == [(s, i) for s in (0, 2, 3) for i in sorted(ids)]
    assert all(FIELDS <= set(r) and r["impl"] == "fit2" and r["split"] == "train" for r in rows)
    for row in rows:
        first = next(r for r in rows if r["entry"] == row["entry"] and r["step"] == 0)
        assert row["lddt_ca_untrained"] == first["lddt_ca"] and row["tm_score_untrained"] == first["tm_score"]
        assert 0 <= row["lddt_ca"] <= 1 and 0 <= row["tm_score"] <= 1 and 0 <= row["plddt"] <= 100
    saved = yaml.safe_load((run / "config.yaml").read_text())["data"]
    assert saved["train_ids"] == saved["val_ids"] == [i.upper() for i in ids]
    assert saved["val_identity_cut"] is None and saved["val_after"] is None
    assert f"{ids[0]}" in capsys.readouterr().out
    fit.main(["--report", str(run), "--out", str(tmp_path), "--tag", "again", "--name", "fit2"])   # a stopped run's
    assert json.loads((tmp_path / "fit_again.json").read_text())["rows"] == rows                  # result, from its log


def test_report_of_a_folder_that_is_not_a_run_is_one_clear_line(tmp_path):
    with pytest.raises(SystemExit, match="not a run folder"):
        fit.main(["--report", str(tmp_path)])


@pytest.mark.parametrize("argv,message", [
    (["--ids", ","], "--ids: expected comma-separated entry ids"),
    (["--ids", "1CRN,1crn"], "--ids: '1CRN,1crn' names an entry twice"),
    (["--steps", "0"], "--steps and --every must be >= 1"),
    (["--every", "0"], "--steps and --every must be >= 1"),
    (["configs/nope.yaml"], "config 'configs/nope.yaml' not found"),
    (["--data", "/nonexistent"], "no manifest.tsv"),
    (["model.nope=1"], "config: unknown config key 'model.nope'"),
    (["data.val_identity_cut=0.4"], "data.val_identity_cut: set by the fit command itself"),
    (["configs/default.yaml", "stray"], "unexpected argument 'stray'"),
])
def test_bad_arguments_give_one_clear_line(argv, message):
    with pytest.raises(SystemExit) as exit_info:
        fit.main(argv)
    assert message in str(exit_info.value) and "\n" not in str(exit_info.value)


def test_an_entry_missing_from_the_data_is_one_clear_line(small_data, tmp_path):
    prepared, _ = small_data
    with pytest.raises(SystemExit) as exit_info:
        fit.main(["--ids", "9ZZZ", "--steps", "1", "--data", str(prepared), "wandb=false",
                  f"trainer.out_dir={tmp_path}"])
    assert "--ids: 9ZZZ is not in" in str(exit_info.value) and "\n" not in str(exit_info.value)


@pytest.fixture(scope="module")
def fit_data(shared_mmcif, tmp_path_factory):
    if not all((shared_mmcif / f"{i}.cif.gz").is_file() for i in SLOW_ENTRIES):
        pytest.skip(f"needs {', '.join(SLOW_ENTRIES)} from the shared set (../shared/data/mmcif)")
    src = tmp_path_factory.mktemp("fit_mmcif")
    for pdb_id in SLOW_ENTRIES:
        shutil.copy(shared_mmcif / f"{pdb_id}.cif.gz", src)
    out = tmp_path_factory.mktemp("fit_prepared")
    prepare_folder(src, out, workers=1, progress=False)
    return out


@pytest.mark.slow
def test_a_small_model_fits_four_small_entries_far_above_the_untrained_model(fit_data, tmp_path):
    """python -m pytest -m slow -s tests/trainer/test_bench_fit.py (about 3 min on one CPU thread).

    A small model (c_s 64, c_z 32, 2 blocks, no pair dropout, 48 noise levels per step, lr 3e-3, EMA 0.99) trains
    600 steps on 1L2Y, 5I55, 1PSM and 1CRN (whole entries); the mean training-set lDDT-Calpha of sampled structures
    must reach 0.5 and beat the untrained model's by 0.3.
    """
    small = dict(n_blocks=2, c_s=64, c_z=32, n_heads_tri=2, c_hidden_tri=16, n_heads_single=4, c_hidden_mul=32,
                 transition_factor=2, c_token=64, diffusion_blocks=2, diffusion_heads=4, diffusion_samples=48,
                 sampling_steps=20, plddt_rollout_steps=20, tri_attn_backend="torch", checkpointing=False,
                 n_recycles=0, pair_dropout=0.0)
    started = time.time()
    fit.main(["configs/default.yaml", "--ids", ",".join(SLOW_ENTRIES), "--steps", "600", "--every", "200",
              "--data", str(fit_data), "--out", str(tmp_path), "wandb=false", f"trainer.out_dir={tmp_path / 'run'}",
              "data.num_workers=0", "data.crop_size=64", "optim.lr=3e-3", "optim.warmup_steps=50",
              "optim.ema_decay=0.99", "trainer.val_samples=1", *model_overrides(small)])
    rows = json.loads((tmp_path / "fit.json").read_text())["rows"]
    last = [r for r in rows if r["step"] == 600]
    trained = sum(r["lddt_ca"] for r in last) / len(last)
    untrained = sum(r["lddt_ca_untrained"] for r in last) / len(last)
    print(f"\nfit of {len(last)} entries in {time.time() - started:.0f} s: mean lDDT-Ca {untrained:.3f} -> "
          f"{trained:.3f}; per entry", [(r["entry"], round(r["lddt_ca"], 3), round(r["tm_score"], 3)) for r in last])
    assert len(last) == len(SLOW_ENTRIES)
    assert trained >= 0.5 and trained >= untrained + 0.3, (untrained, trained)
