"""``python -m mini_of3.ablate crops`` on the CPU with the tiny model: two crops, two steps each; the same
validation tokens for every arm; an interrupted ablation resumes (the finished arm skipped, the other continued from
its checkpoint); bad arguments are one clear line."""
from __future__ import annotations

import json
import os
import signal

import pytest

import mini_of3.trainer as trainer_module
from mini_of3 import ablate
from mini_of3.data import read_manifest

from .helpers import TINY_MODEL

ROW_KEYS = {"impl", "N", "activation", "step_s", "peak_mib", "steps", "val_lddt_ca", "val_contact_precision",
            "val_distogram_loss", "val_entries", "val_tokens", "train_minutes"}
UNTRAINED_KEYS = ("val_lddt_ca", "val_contact_precision", "val_distogram_loss", "val_tm_score", "val_loss")


def tiny_args(prepared, val_id: str, folder) -> list[str]:
    values = {"wandb": "false", "data.root": prepared, "data.cache_dir": prepared, "data.val_ids": f"[{val_id}]",
              "data.num_workers": 0, "optim.warmup_steps": 2, "trainer.checkpoint_every": 1, "trainer.val_every": 10,
              "trainer.val_samples": 1, "trainer.out_dir": folder,
              **{f"model.{k}": str(v).lower() if isinstance(v, bool) else v for k, v in TINY_MODEL.items()}}
    return [f"{k}={v}" for k, v in values.items()]


def test_two_crops_validate_on_the_same_tokens_and_an_interrupted_ablation_resumes(small_data, tmp_path,
                                                                                  monkeypatch, capsys):
    prepared, val_id = small_data
    val_tokens = next(r.tokens for r in read_manifest(prepared) if r.id == val_id)
    folder, out = tmp_path / "ablation", tmp_path / "results"
    argv = ["crops", "configs/default.yaml", "--crops", "16,24", "--steps", "2", "--val-crop", "64", "--out",
            str(out), "--tag", "t", *tiny_args(prepared, val_id, folder)]
    assert val_tokens > 16                        # so that a validation crop following the training crop would differ

    # the first run: SIGTERM in the second arm's second step stops it at a checkpoint of step 1
    trained, real_run, real_losses = [], ablate.run_trainer, trainer_module.compute_losses

    def spy(cfg):
        trained.append(cfg.data.crop_size)
        return real_run(cfg)

    def stop_second_arm(outputs, batch, cfg):
        if trained[-1] == 24:
            stop_second_arm.steps += 1
            if stop_second_arm.steps == 2:
                os.kill(os.getpid(), signal.SIGTERM)
        return real_losses(outputs, batch, cfg)
    stop_second_arm.steps = 0

    monkeypatch.setattr(ablate, "run_trainer", spy)
    monkeypatch.setattr(trainer_module, "compute_losses", stop_second_arm)
    with pytest.raises(SystemExit, match="crop24: stopped by SIGTERM at step 1; run the same command again"):
        ablate.main(argv)
    assert trained == [16, 24] and (folder / "crop16" / "arm.json").is_file()
    assert not (folder / "crop24" / "arm.json").exists() and (folder / "crop24" / "checkpoints" / "step_1").is_dir()

    # the second run skips crop16 and resumes crop24 from step 1
    monkeypatch.setattr(trainer_module, "compute_losses", real_losses)
    capsys.readouterr()
    ablate.main(argv)
    captured = capsys.readouterr()
    assert trained == [16, 24, 24]
    assert "arm 1/2 crop16: finished before" in captured.err and "resuming from" in captured.out

    result = json.loads((out / "ablation_crops_t.json").read_text())
    assert result["bench"] == "ablation" and result["command"].startswith("python -m mini_of3.ablate")
    assert {"device", "torch", "triton", "commit", "versions"} <= set(result)
    assert (out / "ablation_crops_t.png").read_bytes()[:4] == b"\x89PNG"
    rows = result["rows"]
    assert [(r["impl"], r["N"]) for r in rows] == [("untrained", None), ("crop", 16), ("crop", 24)]
    assert all(ROW_KEYS <= set(r) for r in rows)
    for row in rows[1:]:
        assert row["steps"] == 2 and row["peak_mib"] is None and row["step_s"] > 0 and row["activation"] == "softmax"
        assert 0 <= row["val_lddt_ca"] <= 1 and row["val_distogram_loss"] > 0
    # every arm (and the untrained model) validated the same entry, whole, whatever its training crop
    assert all(r["val_entries"] == [val_id] and r["val_tokens"] == [val_tokens] for r in rows)
    arms = [json.loads((folder / name / "arm.json").read_text()) for name in ("crop16", "crop24")]
    assert [a["untrained"][k] for a in arms for k in UNTRAINED_KEYS] == 2 * [rows[0][k] for k in UNTRAINED_KEYS]
    steps = [json.loads(line)["step"] for line in (folder / "crop24" / "log.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 2]                  # step-0 validation, steps 1 and 2 (resumed), the last validation
    assert "untrained" in captured.out and "crop" in captured.out          # the table, printed last

    # a finished ablation runs nothing; another budget in the same folder is refused
    ablate.main(argv)
    assert trained == [16, 24, 24]
    with pytest.raises(SystemExit, match="holds an ablation with another budget"):
        ablate.main([a if a != "2" else "3" for a in argv])


@pytest.mark.parametrize("argv,message", [
    (["crops", "--crops", "256,abc"], "--crops: expected comma-separated crop sizes (integers >= 1), got '256,abc'"),
    (["crops", "--crops", ","], "--crops: expected comma-separated crop sizes"),
    (["crops", "--crops", "0,256"], "--crops: expected comma-separated crop sizes"),
    (["crops", "--crops", "256,256"], "--crops: '256,256' names one value twice"),
    (["crops", "--minutes", "5", "--steps", "10"], "--minutes and --steps: give one training budget, not both"),
    (["crops", "--minutes", "0"], "--minutes must be > 0"),
    (["crops", "--steps", "0"], "--steps must be >= 1"),
    (["crops", "--activation", "relu"], "--activation: expected comma-separated activations (softmax, sigmoid)"),
    (["crops", "--val-crop", "0"], "--val-crop must be >= 1"),
    (["crops", "configs/nope.yaml"], "config 'configs/nope.yaml' not found"),
    (["crops", "configs/default.yaml", "stray"], "unexpected argument 'stray'"),
    (["crops", "data.crop_size=64"], "data.crop_size: set by the ablation itself"),
    (["crops", "--steps", "5", "trainer.max_steps=9"], "trainer.max_steps: set by the ablation itself"),
    (["crops", "model.nope=1"], "config: unknown config key 'model.nope'"),
])
def test_bad_arguments_give_one_clear_line(argv, message):
    with pytest.raises(SystemExit) as exit_info:
        ablate.main(argv)
    assert message in str(exit_info.value) and "\n" not in str(exit_info.value)


def test_no_data_and_no_validation_entries_are_one_clear_line(small_data, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SystemExit) as exit_info:
        ablate.main(["crops", "--steps", "1", f"data.root={empty}", f"data.cache_dir={tmp_path / 'cache'}",
                     "data.offline_package=false", f"trainer.out_dir={tmp_path / 'a'}"])
    assert str(exit_info.value).startswith(f"data.root={empty}: ") and "\n" not in str(exit_info.value)
    prepared, _ = small_data
    with pytest.raises(SystemExit, match="no validation entries"):
        ablate.main(["crops", "--steps", "1", f"data.root={prepared}", f"data.cache_dir={prepared}",
                     "data.val_ids=[]", "data.val_after=null", f"trainer.out_dir={tmp_path / 'b'}"])
