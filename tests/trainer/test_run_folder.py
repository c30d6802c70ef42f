"""A run folder belongs to one run; a damaged checkpoint falls back to an older one; no checkpoint during a
non-finite streak; every failure a user can cause is one line: mixed run folders, damaged files, divergence,
running out of host memory, unwritable folders, predict's inputs and outputs."""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import mini_of3.trainer as trainer_module
from mini_of3.data import prepare_folder
from mini_of3.predict import main as predict_main
from mini_of3.trainer import TrainingError, train
from mini_of3.training.checkpoint import candidate_checkpoints, list_checkpoints
from mini_of3.training.guards import SpikeWatch
from mini_of3.training.run_folder import check_writable, differences
from mini_of3.training.signals import StopRequest

from .helpers import REPO, describe, log_rows, run_train, tiny_config, tiny_overrides

CHECKPOINT_PARTS = ("model.safetensors", "ema.safetensors", "optimizer.pt", "scheduler.pt", "rng_0.pt",
                    "trainer_state.json")


def copy_run(reference_run: Path, to: Path) -> Path:
    shutil.copytree(reference_run, to)
    return to


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def read_only_folder(tmp_path: Path) -> Path:
    """A folder no file can be created in, for this user (root writes through a chmod: then /sys, if it refuses)."""
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        check_writable(folder, "probe")
    except ValueError:
        return folder
    try:
        check_writable(Path("/sys/mini_of3_probe"), "probe")
    except ValueError:
        return Path("/sys/mini_of3_probe")
    pytest.skip("no folder that refuses writes to this user")


# ---- one run per folder ---------------------------------------------------------------------------------------


def test_a_folder_of_another_run_stops_with_the_keys_that_differ(reference_run, small_data, tmp_path):
    prepared, val_id = small_data
    out = copy_run(reference_run, tmp_path / "run")
    done = run_train(tiny_overrides(prepared, out, val_id, seed=1, optim__lr="2e-3", data__crop_size=24,
                                    trainer__max_steps=7))
    assert done.returncode == 1, describe(done)
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"train.py: {out} holds checkpoints of another run (") and "Traceback" not in done.stderr
    for change in ("seed: 0 -> 1", "data.crop_size: 32 -> 24", "optim.lr: 0.001 -> 0.002"):
        assert change in line, line
    assert "trainer.resume=force" in line
    assert [c.step for c in list_checkpoints(out)] == [3, 6]                 # nothing written


def test_resume_force_goes_on_with_the_new_values(reference_run, small_data, tmp_path, capsys):
    """The saved optimiser and schedule would keep the old learning rate: under force the new one is used."""
    out = copy_run(reference_run, tmp_path / "run")
    train(tiny_config(small_data, out, optim__lr="2e-3", trainer__resume="force", trainer__max_steps=7))
    assert "with the new values optim.lr: 0.001 -> 0.002" in capsys.readouterr().out
    assert log_rows(out)[-1]["step"] == 7 and log_rows(out)[-1]["lr"] == pytest.approx(2e-3, rel=1e-12)


def test_what_defines_a_run():
    base = {"seed": 0, "model": {"c_z": 16, "tri_attn_backend": "torch"}, "data": {"crop_size": 32, "root": "a"},
            "optim": {"lr": 1e-3}, "loss": {"plddt": 0.01}, "trainer": {"max_steps": 6, "grad_accum": 1}}
    how = {**base, "model": {**base["model"], "tri_attn_backend": "mini_of3"}, "data": {"crop_size": 32, "root": "b"},
           "trainer": {"max_steps": 60, "grad_accum": 1}}
    assert differences(base, how) == []                    # backends, folders and budgets do not define a run
    assert differences(base, {**base, "trainer": {"max_steps": 6, "grad_accum": 2}}, 2, 1) == []  # same global batch
    what = {**base, "loss": {"plddt": 0.1}, "trainer": {"max_steps": 6, "grad_accum": 2}}
    assert differences(base, what) == [
        "global batch (processes x data.batch_size x trainer.grad_accum): 1 -> 2", "loss.plddt: 0.01 -> 0.1"]


# ---- damaged checkpoints --------------------------------------------------------------------------------------


@pytest.mark.parametrize("part", CHECKPOINT_PARTS)
def test_a_damaged_checkpoint_falls_back_to_the_one_before(reference_run, small_data, tmp_path, capsys, part):
    out = copy_run(reference_run, tmp_path / "run")
    truncate(out / "checkpoints" / "step_6" / part)
    result = train(tiny_config(small_data, out, trainer__max_steps=3))
    said = capsys.readouterr().out
    assert f"skipped checkpoint step_6: {out / 'checkpoints' / 'step_6' / part} is unreadable" in said, said
    assert f"resuming from {out / 'checkpoints' / 'step_3'} (step 3" in said and result.step == 3


def test_a_damaged_checkpoint_named_alone_is_one_line(reference_run, small_data, tmp_path):
    out = copy_run(reference_run, tmp_path / "run")
    truncate(out / "checkpoints" / "step_6" / "optimizer.pt")
    with pytest.raises(TrainingError, match=r"no readable checkpoint to resume from \(step_6 skipped"):
        train(tiny_config(small_data, tmp_path / "other", trainer__resume=str(out / "checkpoints" / "step_6")))


@pytest.mark.parametrize("part", ["model.safetensors", "config.yaml"])
def test_predict_falls_back_from_a_damaged_checkpoint(reference_run, tmp_path, capsys, part):
    out = copy_run(reference_run, tmp_path / "run")
    best = candidate_checkpoints(out, prefer="best")[0].step                # what predict loads first
    other = 3 if best == 6 else 6
    truncate(out / "checkpoints" / f"step_{best}" / part)
    fasta = tmp_path / "q.fasta"
    fasta.write_text(">q\nMKTAYIAKQR\n")
    assert predict_main([str(out), str(fasta), "--out", str(tmp_path / "p"), "--samples", "1", "--steps", "2",
                         "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    damaged = out / "checkpoints" / f"step_{best}" / part                # unreadable, or (a config cut short that
    assert f"skipped checkpoint step_{best}: {damaged} " in captured.err       # still parses) not the weights' config
    assert f"checkpoint {out / 'checkpoints' / f'step_{other}'}" in captured.out
    assert predict_main([str(out / "checkpoints" / f"step_{best}"), str(fasta), "--out", str(tmp_path / "p2")]) == 1
    assert f"{part} is unreadable" in (err := capsys.readouterr().err) or "does not describe the weights" in err


# ---- divergence -----------------------------------------------------------------------------------------------


def test_no_checkpoint_is_written_while_losses_are_non_finite(small_data, tmp_path, monkeypatch, capsys):
    real, calls = trainer_module.compute_losses, {"n": 0}

    def diverges(outputs, batch, cfg):
        calls["n"] += 1
        total, parts = real(outputs, batch, cfg)
        return (total * float("inf") if calls["n"] >= 3 else total), parts

    monkeypatch.setattr(trainer_module, "compute_losses", diverges)
    out = tmp_path / "diverged"
    with pytest.raises(TrainingError, match=r"stopped at step 5: 3 non-finite losses in a row .*last checkpoint, "
                                            r"from before them: .*step_2;"):
        train(tiny_config(small_data, out, trainer__max_nonfinite=3, trainer__checkpoint_every=1))
    assert [c.step for c in list_checkpoints(out)] == [1, 2]
    assert "no checkpoint at step 3: the last 1 losses were non-finite" in capsys.readouterr().out


def test_a_loss_far_above_its_median_warns_once_per_episode():
    watch = SpikeWatch(factor=10.0, min_steps=3)
    said = [watch.observe(step, loss) for step, loss in enumerate([2.0, 2.1, 1.9, 2.0, 50.0, 60.0, 2.0, 40.0], 1)]
    assert [s is not None for s in said] == [False, False, False, False, True, False, False, True]
    assert said[4].startswith("step 5: loss 50 is 25x the median of the last 4 steps (2)")
    assert all(w is None for w in (SpikeWatch(None).observe(1, 1e9), SpikeWatch(10.0).observe(1, float("nan"))))


def test_the_trainer_warns_of_a_loss_spike(small_data, tmp_path, monkeypatch, capsys):
    real, calls = trainer_module.compute_losses, {"n": 0}

    def spikes(outputs, batch, cfg):
        calls["n"] += 1
        total, parts = real(outputs, batch, cfg)
        return (total * 1000 if calls["n"] >= 12 else total), parts

    monkeypatch.setattr(trainer_module, "compute_losses", spikes)
    train(tiny_config(small_data, tmp_path / "spike", trainer__max_steps=13, trainer__val_every=100,
                      trainer__checkpoint_every=100))
    warnings = [line for line in capsys.readouterr().out.splitlines() if "the run may be diverging" in line]
    assert len(warnings) == 1 and warnings[0].startswith("step 12: loss "), warnings


# ---- one line where a traceback was ---------------------------------------------------------------------------


def test_running_out_of_host_memory_by_crop_size_is_one_line(shared_mmcif, tmp_path):
    """A whole 2,290-token entry on the CPU: the reference triangle attention asks for N^3 scores. The address space
    is capped so that the allocation fails at once on any machine."""
    if not (shared_mmcif / "3WIP.cif.gz").is_file():
        pytest.skip("3WIP is only in the shared entries")
    src = tmp_path / "src"
    src.mkdir()
    for pdb_id in ("3WIP", "1L2Y"):
        shutil.copy(shared_mmcif / f"{pdb_id}.cif.gz", src)
    prepared = tmp_path / "prepared"
    prepare_folder(src, prepared, workers=1, progress=False)
    args = tiny_overrides(prepared, tmp_path / "run", "1L2Y", data__crop_size=4000, trainer__max_steps=1)
    limit = 6 * 2 ** 30
    done = subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"},
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert done.returncode == 1 and "Traceback" not in done.stderr, describe(done)
    line = done.stderr.strip().splitlines()[-1]                      # after the progress bars
    assert line.startswith("train.py: out of memory on cpu at step 1 (data.crop_size=4000, model.checkpointing=false"), \
        line
    assert "a smaller data.crop_size" in line


def test_an_output_folder_that_cannot_be_written_is_one_line_before_any_work(small_data, tmp_path):
    prepared, val_id = small_data
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    nowhere = dict(data__root=tmp_path / "no_data_here", data__cache_dir=tmp_path / "no_cache",
                   data__offline_package=False)                          # data would fail next: it must not be reached
    for out, expected in ((blocker / "run", f"trainer.out_dir={blocker / 'run'}: {blocker} is a file, not a folder"),
                          (read_only_folder(tmp_path) / "run", "cannot write there")):
        done = run_train(tiny_overrides(prepared, out, val_id, **nowhere))
        assert done.returncode == 1, describe(done)
        (line,) = done.stderr.strip().splitlines()
        assert expected in line and "Traceback" not in done.stderr, line


def test_the_stop_line_names_the_first_signal():
    """A launcher that forwards a SIGTERM after the user's Ctrl-C does not rename the stop."""
    import signal
    stop = StopRequest(announce=False)
    with stop:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGTERM)
    assert stop.signal == "SIGINT"


# ---- predict --------------------------------------------------------------------------------------------------


def run_predict(reference_run, fasta, *extra):
    return predict_main([str(reference_run), str(fasta), "--samples", "1", "--steps", "2", "--device", "cpu", *extra])


def test_predict_keeps_earlier_outputs_and_names_inputs_apart(reference_run, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d2").mkdir()
    for fasta in (tmp_path / "mid.fasta", tmp_path / "d2" / "mid.fasta"):
        fasta.write_text(">m\nMKTAYIAKQRQ\n")
    out = tmp_path / "pred"
    assert run_predict(reference_run, "mid.fasta", "--out", str(out)) == 0
    assert run_predict(reference_run, "d2/mid.fasta", "--out", str(out)) == 0
    assert {p.name for p in out.iterdir()} == {"mid_rank1.cif", "mid.json", "d2_mid_rank1.cif", "d2_mid.json"}
    assert json.loads((out / "d2_mid.json").read_text())["input"] == str(tmp_path / "d2" / "mid.fasta")
    capsys.readouterr()
    assert run_predict(reference_run, "mid.fasta", "--out", str(out)) == 1
    assert f"{out / 'mid.json'} exists (an earlier prediction of this input); --overwrite" in capsys.readouterr().err
    assert run_predict(reference_run, "mid.fasta", "--out", str(out), "--overwrite") == 0


def test_predict_refuses_before_sampling(reference_run, tmp_path, capsys):
    fasta = tmp_path / "q.fasta"
    fasta.write_text(">q\nMKTAYIAKQR\n")
    target = tmp_path / "a_file"
    target.write_text("")
    assert run_predict(reference_run, fasta, "--out", str(target / "sub")) == 1
    assert f"--out={target / 'sub'}: {target} is a file, not a folder" in capsys.readouterr().err
    assert run_predict(reference_run, fasta, "--out", str(tmp_path / "o"), "--recycles", "3") == 1
    assert "--recycles 3: this model was trained with at most 2 recycles" in capsys.readouterr().err
    fasta.write_text(">q\nMKTBZ\u00e9AKQR\n")
    assert run_predict(reference_run, fasta, "--out", str(tmp_path / "o")) == 1
    assert "has characters 'BZ\u00c9' that are not residues" in capsys.readouterr().err      # read upper-case
    fasta.write_text(">q\n" + "ACDEFGHIKLMNPQRSTVWY" * 250 + "\n")          # 5,000 residues
    assert run_predict(reference_run, fasta, "--out", str(tmp_path / "o")) == 1
    err = capsys.readouterr().err
    assert "5000 residues need at least" in err and "GiB on cpu" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


# ---- entry points ---------------------------------------------------------------------------------------------

ENTRY_POINTS = [["train.py"], ["-m", "mini_of3.predict"], ["-m", "mini_of3.ablate"], ["-m", "mini_of3.bench"],
                *(["-m", "mini_of3.bench", name] for name in ("kernels", "step", "block", "fit", "runs", "trimul",
                                                               "score", "sigmoid", "conditioning")),
                ["-m", "mini_of3.data.fetch"], ["-m", "mini_of3.data.prepare"], ["-m", "mini_of3.data.bench_loader"],
                ["-m", "mini_of3.model.flops"]]


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda e: " ".join(e))
def test_every_entry_point_answers_help_with_exit_0(entry):
    done = subprocess.run([sys.executable, *entry, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0 and "Traceback" not in done.stderr, describe(done)
    assert "usage" in (done.stdout + done.stderr).lower() or "accelerate launch train.py" in done.stdout


def test_bench_score_skips_unusable_files_with_one_line_each(reference_run, shared_mmcif, tmp_path, capsys):
    from mini_of3.bench import score
    folder = tmp_path / "mmcif"
    folder.mkdir()
    for pdb_id in ("1L2Y", "1FIX"):                 # 1FIX: nucleic acids only, no protein chain to keep
        if not (shared_mmcif / f"{pdb_id}.cif.gz").is_file():
            pytest.skip(f"{pdb_id} is only in the shared entries")
        shutil.copy(shared_mmcif / f"{pdb_id}.cif.gz", folder)
    (folder / "9BAD.cif").write_text("data_9BAD\n_this is not mmCIF\n")
    run = copy_run(reference_run, tmp_path / "run")
    score.main([str(run), "--mmcif", str(folder), "--samples", "1", "--steps", "2", "--device", "cpu"])
    out = capsys.readouterr().out
    assert f"skipped {folder / '1FIX.cif.gz'}: " in out and f"skipped {folder / '9BAD.cif'}: " in out
    result = json.loads((run / "score.json").read_text())                        # in the run folder by default
    assert [r["entry"] for r in result["rows"]] == ["1L2Y"]
