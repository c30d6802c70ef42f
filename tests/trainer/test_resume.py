"""Exact resume: a run killed with SIGKILL (between steps, or while writing a checkpoint) and continued with
trainer.resume=auto repeats the uninterrupted run bitwise: the same losses, the same weights."""
from __future__ import annotations


import pytest

from mini_of3.training.checkpoint import list_checkpoints, resolve_checkpoint

from .helpers import assert_same_run, describe, log_rows, run_train, tiny_overrides


def test_reference_run_varies_what_resume_must_replay(reference_run):
    """The straight run is a fair test: recycle counts change between steps, and the loss moves."""
    rows = log_rows(reference_run)
    assert len({r["recycles"] for r in rows}) > 1
    assert len({r["loss"] for r in rows}) == 6
    assert [c.step for c in list_checkpoints(reference_run)] == [3, 6]


def test_sigkill_between_steps_then_resume_is_bitwise_identical(small_data, reference_run, tmp_path):
    prepared, val_id = small_data
    out = tmp_path / "killed"
    args = tiny_overrides(prepared, out, val_id)
    killed = run_train(args, fault="step@5")                  # SIGKILL at the start of step 5: step 4 is lost
    assert killed.returncode == -9, describe(killed)
    assert [c.step for c in list_checkpoints(out)] == [3]
    assert [r["step"] for r in log_rows(out)] == [1, 2, 3, 4]
    resumed = run_train(args)
    assert resumed.returncode == 0, describe(resumed)
    assert "resuming from" in resumed.stdout and "step_3" in resumed.stdout, resumed.stdout
    assert_same_run(out, reference_run)


def test_sigkill_while_writing_a_checkpoint_leaves_the_last_good_one(small_data, reference_run, tmp_path):
    prepared, val_id = small_data
    out = tmp_path / "killed_in_save"
    args = tiny_overrides(prepared, out, val_id)
    killed = run_train(args, fault="checkpoint_write@6")      # dies with step_6 half written
    assert killed.returncode == -9, describe(killed)
    partial = out / "checkpoints" / ".tmp_step_6"
    assert (partial / "model.safetensors").is_file() and not (out / "checkpoints" / "step_6").exists()
    assert resolve_checkpoint(out) == out / "checkpoints" / "step_3"
    with pytest.raises(FileNotFoundError, match="incomplete"):
        resolve_checkpoint(partial)
    resumed = run_train(args)
    assert resumed.returncode == 0, describe(resumed)
    assert "removed" in resumed.stdout and ".tmp_step_6" in resumed.stdout, resumed.stdout
    assert not partial.exists()
    assert_same_run(out, reference_run)
