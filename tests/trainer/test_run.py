"""What a run leaves behind and how it ends: log, plots, config, checkpoints, wandb; non-finite losses; signals;
resume=never and resume=PATH; the torch.compile fallback."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

import mini_of3.trainer as trainer_module
from mini_of3.losses import SIGMA_BIN_NAMES
from mini_of3.config import config_to_dict
from mini_of3.data import read_manifest
from mini_of3.trainer import MODULES, TrainingError, train
from mini_of3.training.checkpoint import list_checkpoints, read_state

from .helpers import CHECKPOINT_FILES, REPO, describe, log_rows, run_train, tiny_config, tiny_overrides

TRAIN_KEYS = {"step", "split", "loss", "distogram", "diffusion", "smooth_lddt", "plddt", "lr", "grad_norm", "recycles",
              "epoch", "step_s", "data_s", "skipped"}
VAL_KEYS = {"step", "split", "lddt_ca", "rmsd", "tm_score", "contact_precision", "distogram_accuracy", "mean_plddt",
            "loss", "distogram", "diffusion", "smooth_lddt", "plddt", "val_s"}


def test_a_run_leaves_log_plots_config_and_checkpoints(reference_run, small_data):
    train_rows, val_rows = log_rows(reference_run), log_rows(reference_run, "val")
    assert [r["step"] for r in train_rows] == [1, 2, 3, 4, 5, 6]
    assert all(TRAIN_KEYS <= set(r) for r in train_rows), set(train_rows[0])
    assert [r["step"] for r in val_rows] == [0, 3, 6]                  # step 0: the untrained model
    assert all(VAL_KEYS <= set(r) for r in val_rows), set(val_rows[0])
    assert all(0 <= r["lddt_ca"] <= 1 and r["rmsd"] > 0 for r in val_rows)
    assert [r["lr"] for r in train_rows[:3]] == pytest.approx([5e-4, 1e-3, 1e-3])   # 2 warm-up steps
    assert all(r["skipped"] is False and r["step_s"] > 0 for r in train_rows)
    saved = yaml.safe_load((reference_run / "config.yaml").read_text())
    assert saved == config_to_dict(tiny_config(small_data, reference_run))
    for name in ("losses.png", "validation.png", "gradients.png"):
        assert (reference_run / name).read_bytes()[:4] == b"\x89PNG"
    for info in list_checkpoints(reference_run):
        assert {p.name for p in info.path.iterdir()} == CHECKPOINT_FILES
    state = read_state(reference_run / "checkpoints" / "step_6")
    assert state["step"] == 6 and state["ema_updates"] == 6 and state["world_size"] == 1
    assert state["val"]["lddt_ca"] == val_rows[-1]["lddt_ca"] and state["first_val"]["step"] == 0
    per_epoch = len(read_manifest(small_data[0])) - 1                  # every entry but the validation one
    assert state["epoch"] * per_epoch + state["consumed"] == 6          # 6 examples used, one per step
    assert not (reference_run / "wandb").exists()                      # wandb=false


def test_log_rows_hold_gradient_norms_per_module_and_the_diffusion_loss_per_noise_bin(reference_run, small_data):
    """Every training row: the gradient norm of each module before clipping (together they make up the total), and
    the diffusion loss per bin of sigma / sigma_data (None for a bin no sample fell in). Every validation row: each
    entry's scores."""
    modules = [f"grad_norm/{name}" for name in MODULES]
    bins = [f"diffusion/sigma{name}" for name in SIGMA_BIN_NAMES]
    for row in log_rows(reference_run):
        assert set(modules) | set(bins) <= set(row), set(row)
        norms = torch.tensor([row[k] for k in modules], dtype=torch.float64)
        assert (norms >= 0).all() and float(norms.square().sum().sqrt()) == pytest.approx(row["grad_norm"], rel=1e-4)
        by_bin = [row[k] for k in bins if row[k] is not None]
        assert by_bin and all(v >= 0 for v in by_bin)
        assert 0 <= row["rollout_lddt"] <= 1 and 0 < row["rollout_plddt"] < 1    # the pLDDT head's target, prediction
    assert any(row["grad_norm/pairformer"] > 0 for row in log_rows(reference_run))
    for row in log_rows(reference_run, "val"):
        assert [e["id"] for e in row["entries"]] == [small_data[1]]
        assert row["entries"][0]["lddt_ca"] == pytest.approx(row["lddt_ca"])    # one entry: its score is the mean


def test_resume_from_a_checkpoint_path_into_a_new_run_is_exact(reference_run, small_data, tmp_path):
    out = tmp_path / "branch"
    cfg = tiny_config(small_data, out, trainer__resume=reference_run / "checkpoints" / "step_3",
                      trainer__max_steps=4)
    result = train(cfg)
    assert result.step == 4 and result.first_val["step"] == 0          # carried over from the source run
    assert log_rows(out)[-1]["loss"] == log_rows(reference_run)[3]["loss"]


def test_a_time_budget_ends_the_run_with_a_validation_and_a_checkpoint_and_holds_on_resume(small_data, tmp_path,
                                                                                           capsys):
    """trainer.max_minutes counts the training steps only; 6 ms is less than any step, so the run stops after one,
    validates and writes its final checkpoint; resumed, the budget is already spent (train_s is in the checkpoint)."""
    out = tmp_path / "budget"
    result = train(tiny_config(small_data, out, trainer__max_steps=1000, trainer__max_minutes=1e-4))
    assert result.step == 1 and result.stopped_by is None and result.train_s >= 6e-3
    assert [r["step"] for r in log_rows(out, "val")] == [0, 1]                   # the last validation at the end
    assert [c.path.name for c in list_checkpoints(out)] == ["step_1"]
    assert read_state(out / "checkpoints" / "step_1")["train_s"] == result.train_s == log_rows(out)[0]["train_s"]
    assert "trainer.max_minutes=0.0001 reached" in capsys.readouterr().out
    again = train(tiny_config(small_data, out, trainer__max_steps=1000, trainer__max_minutes=1e-4))
    assert again.step == 1 and len(log_rows(out)) == 1 and again.train_s == result.train_s
    more = train(tiny_config(small_data, out, trainer__max_steps=2))               # no budget: on to max_steps
    assert more.step == 2 and log_rows(out)[-1]["train_s"] > result.train_s


def test_the_time_budget_leaves_out_compiling(small_data, tmp_path, monkeypatch):
    """A step whose time went to torch.compile (here the clock says the first step compiled for an hour) adds only
    its time outside compiling to train_s; the 6-ms budget then ends the run after the second step, not the first."""
    hours = iter([0.0, 3600.0])
    monkeypatch.setattr(trainer_module, "compile_seconds", lambda: next(hours, 3600.0))
    out = tmp_path / "compiled"
    result = train(tiny_config(small_data, out, trainer__max_steps=1000, trainer__max_minutes=1e-4))
    first, second = log_rows(out)
    assert first["compile_s"] == first["step_s"] and first["train_s"] == 0.0
    assert second["compile_s"] == 0.0 and second["train_s"] == second["step_s"] == result.train_s
    assert result.step == 2


def test_resume_never_refuses_a_folder_with_checkpoints(reference_run, small_data):
    with pytest.raises(TrainingError, match="trainer.resume=never but .* already holds checkpoints"):
        train(tiny_config(small_data, reference_run, trainer__resume="never"))


def test_non_finite_losses_are_skipped_counted_and_stop_the_run(small_data, tmp_path, monkeypatch):
    real = trainer_module.compute_losses
    calls = {"n": 0, "bad": {2, 3}}

    def flaky(outputs, batch, cfg):
        calls["n"] += 1
        total, parts = real(outputs, batch, cfg)
        return (total * float("nan") if calls["n"] in calls["bad"] else total), parts

    monkeypatch.setattr(trainer_module, "compute_losses", flaky)
    out = tmp_path / "flaky"
    result = train(tiny_config(small_data, out, trainer__max_nonfinite=3))
    assert result.step == 6
    assert [r["skipped"] for r in log_rows(out)] == [False, True, True, False, False, False]
    assert log_rows(out)[1]["loss"] is None                             # NaN is written as null
    state = read_state(out / "checkpoints" / "step_6")
    assert state["nonfinite_total"] == 2 and state["nonfinite_in_row"] == 0 and state["ema_updates"] == 4

    calls.update(n=0, bad=set(range(4, 100)))              # diverges after the checkpoint of step 3
    out = tmp_path / "diverged"
    with pytest.raises(TrainingError, match=r"stopped at step 6: 3 non-finite losses in a row \(trainer.max_nonfinite"
                                            r"=3\); last checkpoint, from before them: .*step_3; try a lower optim.lr"):
        train(tiny_config(small_data, out, trainer__max_nonfinite=3))
    assert [c.step for c in list_checkpoints(out)] == [3]


def test_running_out_of_device_memory_ends_the_run_with_the_settings_that_decide_it(small_data, tmp_path,
                                                                                     monkeypatch):
    real, calls = trainer_module.compute_losses, {"n": 0}

    def runs_out(outputs, batch, cfg):
        calls["n"] += 1
        if calls["n"] == 4:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")
        return real(outputs, batch, cfg)

    monkeypatch.setattr(trainer_module, "compute_losses", runs_out)
    out = tmp_path / "oom"
    with pytest.raises(TrainingError, match=r"out of memory on cpu at step 4 \(data.crop_size=32, "
                                            r"model.checkpointing=false, trainer.compile_mode=off\): try "
                                            r"model.checkpointing=true .*; checkpoints so far are in .*checkpoints "
                                            r"\(CUDA out of memory. Tried to allocate 20.00 GiB \(simulated\)\)"):
        train(tiny_config(small_data, out))
    assert [c.step for c in list_checkpoints(out)] == [3]       # what was saved before stays

    class RunsOut(torch.nn.Module):
        def forward(self, *args, **kwargs):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: RunsOut())
    with pytest.raises(TrainingError, match=r"out of memory on cpu at step 1 .*trainer.compile_mode=default"):
        train(tiny_config(small_data, tmp_path / "oom_compiled", trainer__compile=True))


def test_compile_failure_falls_back_to_eager_with_a_warning(small_data, tmp_path, monkeypatch):
    class Broken(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, *args, **kwargs):
            raise RuntimeError("backend compiler failed (simulated)")

    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: Broken(model))
    out = tmp_path / "compiled"
    with pytest.warns(UserWarning, match="torch.compile failed .*simulated.*training without compiling"):
        result = train(tiny_config(small_data, out, trainer__compile=True, trainer__max_steps=2))
    assert result.step == 2 and len(log_rows(out)) == 2


def test_sigterm_saves_a_checkpoint_and_resume_continues(small_data, tmp_path):
    """SIGTERM mid-run: the step in flight is abandoned, its state saved, exit 143; resume=auto goes on. wandb runs
    offline in the run folder and keeps its id across the resume."""
    prepared, val_id = small_data
    out = tmp_path / "terminated"
    args = tiny_overrides(prepared, out, val_id, trainer__max_steps=1000, trainer__val_every=1000,
                          trainer__checkpoint_every=1000, wandb="true")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true",
           "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen([sys.executable, "train.py", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not ((out / "log.jsonl").is_file() and len(log_rows(out)) >= 3):
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, (process.returncode, stdout[-2000:], stderr[-2000:])
    assert "SIGTERM: stopping at a safe point" in stderr
    done = log_rows(out)[-1]["step"]
    (last,) = list_checkpoints(out)
    assert last.step == done and read_state(last.path)["stopped_by"] == "SIGTERM"
    first_id = read_state(last.path)["wandb_id"]
    assert first_id and list((out / "wandb").glob(f"offline-run-*-{first_id}"))

    resumed = run_train(tiny_overrides(prepared, out, val_id, trainer__max_steps=done + 2, wandb="true"))
    assert resumed.returncode == 0, describe(resumed)
    assert [r["step"] for r in log_rows(out)] == list(range(1, done + 3))
    assert read_state(out / "checkpoints" / f"step_{done + 2}")["wandb_id"] == first_id
    assert json.loads((out / "log.jsonl").read_text().splitlines()[-1])["split"] == "val"


@pytest.mark.slow
def test_compile_on_the_cpu_trains_like_eager(reference_run, small_data, tmp_path):
    """trainer.compile=true with inductor on the CPU (about a minute of compiling): same losses as eager, to float
    rounding. python -m pytest -m slow tests/trainer"""
    out = tmp_path / "compiled"
    result = train(tiny_config(small_data, out, trainer__compile=True))
    assert result.step == 6
    got, want = [r["loss"] for r in log_rows(out)], [r["loss"] for r in log_rows(reference_run)]
    assert got == pytest.approx(want, rel=1e-4)


def test_training_entries_named_in_train_eval_ids_are_scored_at_every_validation(small_data, tmp_path, capsys):
    """data.train_eval_ids: the named training entry is sampled and scored at each validation like a validation
    entry, logged as split train_eval; a validation entry or an unknown one there is a clear error."""
    from mini_of3.config import ConfigError
    from mini_of3.data.dataset import build_dataloaders

    prepared, val_id = small_data
    train_id = next(r.split("\t")[0] for r in (prepared / "manifest.tsv").read_text().splitlines()[1:]
                    if r.split("\t")[0].upper() != val_id.upper())
    out = tmp_path / "train_eval"
    result = train(tiny_config(small_data, out, trainer__max_steps=3, data__train_eval_ids=f"[{train_id}]"))
    assert result.step == 3
    rows = log_rows(out, "train_eval")
    assert [r["step"] for r in rows] == [r["step"] for r in log_rows(out, "val")] == [0, 3]
    for row in rows:
        assert [e["id"] for e in row["entries"]] == [train_id] and 0 <= row["lddt_ca"] <= 1
    assert "step 3 training entries: lDDT-Ca" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="train_eval_ids"):
        tiny_config(small_data, out, data__train_eval_ids=f"[{val_id}]")
    cfg = tiny_config(small_data, out, data__train_eval_ids="[9ZZZ]")
    with pytest.raises(ValueError, match="train_eval_ids: 9ZZZ is not a training entry"):
        build_dataloaders(cfg.data, prepared, cfg.seed)
