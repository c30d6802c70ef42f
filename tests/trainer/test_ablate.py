"""``python -m mini_of3.ablate crops`` on the CPU with the tiny model: two crops and the schedule from one to the
other, two seeds, four steps each; whole-entry scoring per split beside the untrained model and a random chain;
paired comparisons with intervals; equal GPU time from each kind of step timed alone first; an interrupted ablation
resumes (finished arms skipped); bad arguments are one clear line."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import mini_of3.trainer as trainer_module
from mini_of3 import ablate
from mini_of3.ablation import cost, plan
from mini_of3.baselines import random_compact_chain
from mini_of3.ablation.stats import bootstrap_interval, compare, paired_differences
from mini_of3.data import read_manifest

from .helpers import REPO, TINY_MODEL

ENTRY_KEYS = {"impl", "seed", "entry", "split", "tokens", "budget", "lddt_ca", "tm_score", "contact_precision",
              "interchain_contact_precision", "interface_lddt"}


def tiny_args(prepared, val_id: str, folder) -> list[str]:
    values = {"wandb": "false", "data.root": prepared, "data.cache_dir": prepared, "data.val_ids": f"[{val_id}]",
              "data.train_eval_ids": "[]",
              "data.num_workers": 0, "optim.warmup_steps": 2, "trainer.val_every": 10, "trainer.val_samples": 1,
              "trainer.val_sampling_steps": 2, "trainer.out_dir": folder,
              **{f"model.{k}": str(v).lower() if isinstance(v, bool) else v for k, v in TINY_MODEL.items()}}
    return [f"{k}={v}" for k, v in values.items()]


def test_arms_train_from_each_seed_and_are_scored_whole_with_paired_intervals(small_data, tmp_path, monkeypatch,
                                                                               capsys):
    prepared, val_id = small_data
    tokens = {r.id: r.tokens for r in read_manifest(prepared)}
    folder, out = tmp_path / "ablation", tmp_path / "results"
    argv = ["crops", "configs/default.yaml", "--crops", "16,24", "--schedule", "16:24", "--seeds", "0,1", "--steps",
            "4", "--score-steps", "2", "--large-tokens", "60", "--small-tokens", "50", "--calibration-steps", "2",
            "--out", str(out), "--tag", "t", *tiny_args(prepared, val_id, folder)]

    # the first run: SIGTERM in seed 1's crop24 arm stops the ablation at a checkpoint
    real_losses, calls = trainer_module.compute_losses, {"n": 0}

    def stop_in_seed_1(outputs, batch, cfg):
        calls["n"] += 1
        if calls["n"] == 4 + 12 + 4 + 2:   # calibration: 2 steps of each crop; seed 0: crop16 and crop24 4 steps
            os.kill(os.getpid(), signal.SIGTERM)   # each, the schedule's crop16 3 and crop24 1; seed 1: crop16, then
                                                   # crop24's second step stops
        return real_losses(outputs, batch, cfg)

    monkeypatch.setattr(trainer_module, "compute_losses", stop_in_seed_1)
    with pytest.raises(SystemExit, match="seed 1 crop24: stopped by SIGTERM at step 1; run the same command again"):
        ablate.main(argv)
    assert (folder / "seed0" / "finetune16to24" / "arm.json").is_file()
    costs = json.loads((folder / "step_costs.json").read_text())
    assert set(costs["step_s"]) == {"crop16_softmax", "crop24_softmax"} and costs["device"] == "cpu"
    assert all(c > 0 for c in costs["step_s"].values()) and not (folder / "calibration").exists()
    assert {k: len(v) for k, v in costs["step_times"].items()} == {"crop16_softmax": 2, "crop24_softmax": 2}
    for scored in ("crop16", "finetune16to24", "finetune16to24/start"):                # checkpoints removed
        assert (folder / "seed0" / scored / "log.jsonl").is_file()
        assert not (folder / "seed0" / scored / "checkpoints").exists()

    # the second run trains only the crop arms: seed 1's crop24 resumes, its schedule arm is left
    monkeypatch.setattr(trainer_module, "compute_losses", real_losses)
    capsys.readouterr()
    ablate.main([*argv, "--only", "crop16,crop24"])
    captured = capsys.readouterr()
    assert "seed 0 crop16: finished before, skipped" in captured.err and "resuming from" in captured.out
    assert "1 of 6 arms not trained yet (seed 1 finetune16to24): the result is written once" in captured.err
    assert not (out / "ablation_crops_t.json").exists()
    ablate.main(argv)
    captured = capsys.readouterr()

    result = json.loads((out / "ablation_crops_t.json").read_text())
    assert result["bench"] == "ablation" and result["command"].startswith("python -m mini_of3.ablate")
    assert (out / "ablation_crops_t.png").read_bytes()[:4] == b"\x89PNG"
    assert [a["name"] for a in result["arms"]] == ["crop16", "crop24", "finetune16to24"]
    rows = result["rows"]
    summaries = [r for r in rows if not r.get("entry")]
    assert sorted((r["arm"], r["seed"]) for r in summaries) == sorted(
        (a, s) for a in ("crop16", "crop24", "finetune16to24") for s in (0, 1))
    assert all(r["step"] == 4 and r["step_s"] > 0 and 0 < r["gpu_minutes"] < r["wall_minutes"]
               and 0 < r["score_minutes"] < r["wall_minutes"] and r["score_peak_mib"] is None and r["device"] == "cpu"
               for r in summaries)
    for r in summaries:                             # GPU time at each kind of step's cost alone
        arm = next(plan.Arm(**{k: a[k] for k in ("impl", "crop", "activation", "start_crop")})
                   for a in result["arms"] if a["name"] == r["arm"])
        assert r["gpu_minutes_alone"] == pytest.approx(cost.arm_seconds(arm, 4, 4, costs["step_s"]) / 60)
    entries = [r for r in rows if r.get("entry")]
    assert all(ENTRY_KEYS <= set(r) for r in entries)
    splits = {r["entry"]: r["split"] for r in entries}
    assert splits[val_id] == "val" and all(tokens[e] > 60 for e, s in splits.items() if s == "train_large")
    assert {"train_large", "train_small", "val"} <= set(splits.values())
    assert all(r["tokens"] == tokens[r["entry"]] for r in entries)             # whole entries, never cropped
    for impl in ("untrained", "random_chain"):
        assert {(r["seed"], r["entry"]) for r in entries if r["impl"] == impl} == {
            (s, e) for s in (0, 1) for e in splits}
    for arm in ("crop16", "crop24", "finetune16to24"):
        for budget in ("steps", "time"):
            scored = [r for r in entries if r.get("arm") == arm and r["budget"] == budget]
            assert len(scored) == 2 * len(splits) and all(0 <= r["lddt_ca"] <= 1 for r in scored)
    # the schedule arm trains crop16's first three steps in its start run, then goes on at crop 24
    def train_steps(run):
        log = (folder / "seed0" / run / "log.jsonl").read_text().splitlines()
        return [json.loads(line)["step"] for line in log if json.loads(line)["split"] == "train"]
    assert train_steps("finetune16to24/start") == [1, 2, 3] and train_steps("finetune16to24") == [4]
    pairs = {(c["a"], c["b"], c["split"], c["metric"], c["budget"]) for c in result["comparisons"]}
    assert ("crop24", "crop16", "train_large", "lddt_ca", "steps") in pairs
    assert ("finetune16to24", "crop24", "val", "tm_score", "time") in pairs
    assert ("crop16", "random_chain", "train_small", "lddt_ca", "steps") in pairs
    main = next(c for c in result["comparisons"] if c["a"] == "crop24" and c["b"] == "crop16"
                and c["split"] == "train_large" and c["metric"] == "lddt_ca" and c["budget"] == "steps")
    assert main["lo"] <= main["mean"] <= main["hi"] and main["seeds"] == 2
    assert "a - b" in captured.out                                          # the comparison table, printed last

    # a finished ablation trains nothing; another step budget in the same folder is refused
    ablate.main(argv)
    assert "finished before" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="holds an ablation with another steps"):
        ablate.main([a if a != "4" else "6" for a in argv])


def test_the_schedule_arm_starts_from_its_first_crop_at_three_quarters():
    arms = plan.plan_arms([256, 384, 768], (384, 768), None, "softmax")
    assert [a.name for a in arms] == ["crop256", "crop384", "crop768", "finetune384to768"]
    assert plan.finetune_start(1000) == 750 and plan.finetune_start(1000) % plan.checkpoint_every(1000) == 0
    keys = dict(k.split("=", 1) for k in plan.arm_overrides(arms[-1], plan.Path("f"), 2, 1000, started=False))
    assert keys["trainer.resume"] == "f/seed2/finetune384to768/start/checkpoints/step_750"
    assert keys["data.crop_size"] == "768" and keys["trainer.out_dir"] == "f/seed2/finetune384to768"
    first = dict(k.split("=", 1) for k in plan.arm_overrides(arms[-1], plan.Path("f"), 2, 1000, started=False,
                                                             first_part=True))
    assert first["data.crop_size"] == "384" and first["trainer.out_dir"] == "f/seed2/finetune384to768/start"
    assert "trainer.resume" not in first
    assert "trainer.resume" not in dict(k.split("=", 1) for k in plan.arm_overrides(arms[-1], plan.Path("f"), 2,
                                                                                      1000, started=True))
    with pytest.raises(ValueError, match="--schedule 512:768: 512 must be one of --crops"):
        plan.plan_arms([256, 384], (512, 768), None, "softmax")


def test_hours_stops_before_an_arm_that_took_longer_in_another_seed(tmp_path):
    arm = plan.Arm("crop", 768, "softmax")
    timed = plan.arm_folder(tmp_path, 0, arm) / "arm.json"
    timed.parent.mkdir(parents=True)
    timed.write_text(json.dumps({"summary": {"wall_minutes": 10.0}, "rows": []}))
    now = time.monotonic()
    with pytest.raises(SystemExit, match=r"--hours 0.1: seed 1 crop768 took 10.0 min in another seed and 6.0 min "
                                         r"are left; run the same command again"):
        ablate.check_time_left(0.1, now, tmp_path, 1, arm)
    ablate.check_time_left(0.2, now, tmp_path, 1, arm)                 # 12 minutes left: it starts
    ablate.check_time_left(0.1, now, tmp_path, 1, plan.Arm("crop", 256, "softmax"))      # never timed: it starts
    ablate.check_time_left(None, now - 1e6, tmp_path, 1, arm)                            # no limit


def test_two_processes_train_the_arms_of_one_seed_side_by_side(small_data, tmp_path, capsys):
    """What tools/lab/device_ablation.sh does on the GPU: every kind of step timed alone first, then one process per
    arm and one for the baselines; without the calibration, --only is one clear line."""
    prepared, val_id = small_data
    folder = tmp_path / "ablation"
    argv = ["crops", "configs/default.yaml", "--crops", "16,24", "--schedule", "none", "--seeds", "0", "--steps", "2",
            "--score-steps", "2", "--large-tokens", "60", "--small-tokens", "50", "--calibration-steps", "1",
            *tiny_args(prepared, val_id, folder)]
    with pytest.raises(SystemExit, match="no step costs yet, and --only trains beside other processes: run the same "
                                         "command with --calibrate instead of --only first"):
        ablate.main([*argv, "--only", "crop24"])
    ablate.main([*argv, "--calibrate"])
    assert not list(folder.glob("seed0/*/arm.json"))                          # calibrated, nothing trained
    beside = subprocess.Popen([sys.executable, "-m", "mini_of3.ablate", *argv, "--only", "crop24"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ablate.main([*argv, "--only", "crop16"])
    assert not (folder / "seed0" / "baselines.json").exists()                # left to their own process
    output, _ = beside.communicate(timeout=300)
    assert beside.returncode == 0, output
    assert all((folder / "seed0" / arm / "arm.json").is_file() for arm in ("crop16", "crop24"))
    ablate.main([*argv, "--only", "baselines"])
    baselines = json.loads((folder / "seed0" / "baselines.json").read_text())["rows"]
    assert {r["impl"] for r in baselines} == {"untrained", "random_chain"}
    capsys.readouterr()
    ablate.main(argv)                                                         # both finished: the result
    assert "finished before, skipped" in capsys.readouterr().err
    assert json.loads((folder / "ablation_crops.json").read_text())["comparisons"]


def test_equal_gpu_time_counts_each_kind_of_step_at_its_cost_alone():
    costs = {"crop256_softmax": 0.1, "crop384_softmax": 0.1, "crop768_softmax": 0.2}
    crop256, crop768 = plan.Arm("crop", 256, "softmax"), plan.Arm("crop", 768, "softmax")
    schedule = plan.Arm("finetune", 768, "softmax", start_crop=384)
    assert cost.step_kinds([crop256, crop768, schedule]) == [(256, "softmax"), (768, "softmax"), (384, "softmax")]
    assert cost.arm_seconds(crop768, 1000, 1000, costs) == pytest.approx(200.0)
    assert cost.arm_seconds(schedule, 1000, 1000, costs) == pytest.approx(750 * 0.1 + 250 * 0.2)
    assert cost.arm_seconds(schedule, 500, 1000, costs) == pytest.approx(50.0)        # still in its first part
    checkpoints = list(range(50, 1001, 50))
    budget = cost.arm_seconds(crop256, 1000, 1000, costs)                             # 100 s
    assert cost.equal_time_step(crop256, checkpoints, 1000, costs, budget) == 1000
    assert cost.equal_time_step(crop768, checkpoints, 1000, costs, budget) == 500
    assert cost.equal_time_step(schedule, checkpoints, 1000, costs, budget) == 750 + 100
    assert cost.equal_time_step(crop768, [600, 700], 1000, costs, budget) == 600     # none within: the first
    assert cost.mean_step_seconds([9.0] * cost.WARMUP + [1.0, 2.0]) == 1.5           # compiling steps left out
    assert cost.mean_step_seconds([3.0]) == 3.0
    spiked = [0.2] * 9 + [12.0]                        # a kernel autotuned for a size first met at the tenth step
    assert cost.mean_step_seconds([9.0] * cost.WARMUP + spiked) == pytest.approx(0.2)


def test_paired_differences_and_their_bootstrap_interval():
    rng = np.random.default_rng(0)
    a = {(s, e): rng.normal(0.5, 0.1) for s in range(3) for e in range(12)}
    b = {k: v - 0.05 + rng.normal(0, 0.01) for k, v in a.items()}
    b[(0, 0)] = float("nan")
    d, seeds, entries = paired_differences(a, b)
    assert d.shape == (3, 12) and np.isnan(d[0, 0]) and seeds == [0, 1, 2]
    out = compare(a, b)
    assert out["pairs"] == 35 and out["lo"] < 0.05 < out["hi"] and out["hi"] - out["lo"] < 0.03
    same = bootstrap_interval(np.zeros((3, 5)))
    assert same == (0.0, 0.0, 0.0)
    assert all(np.isnan(v) for v in bootstrap_interval(np.full((2, 2), np.nan)))


def test_a_random_compact_chain_has_chain_geometry_and_a_protein_s_size():
    x = random_compact_chain(150, np.random.default_rng(1))
    bonds = np.linalg.norm(np.diff(x, axis=0), axis=1)
    assert np.allclose(bonds, 3.8, atol=1e-4)
    radius_of_gyration = np.sqrt(((x - x.mean(0)) ** 2).sum(-1).mean())
    assert 0.5 * 2.2 * 150 ** 0.38 < radius_of_gyration < 1.3 * 2.2 * 150 ** 0.38


@pytest.mark.parametrize("argv,message", [
    (["crops", "--crops", "256,abc"], "--crops: expected comma-separated crop sizes (integers >= 1), got '256,abc'"),
    (["crops", "--crops", "0,256"], "--crops: expected comma-separated crop sizes"),
    (["crops", "--crops", "256,256"], "--crops: '256,256' names one value twice"),
    (["crops", "--seeds", "a"], "--seeds: expected comma-separated seeds (integers >= 0)"),
    (["crops", "--schedule", "768"], "--schedule: expected START:END crops (e.g. 384:768) or none"),
    (["crops", "--activation", "relu"], "--activation: expected comma-separated activations (softmax, sigmoid)"),
    (["crops", "--score-samples", "0"], "--score-samples and --score-steps must be >= 1"),
    (["crops", "--hours", "0"], "--hours must be > 0, got 0.0"),
    (["crops", "--only", "crop999"], "--only: crop999 is not an arm of this ablation (crop256, crop384, crop512, "
                                     "crop768, finetune384to768) nor baselines"),
    (["crops", "configs/nope.yaml"], "config 'configs/nope.yaml' not found"),
    (["crops", "configs/default.yaml", "stray"], "unexpected argument 'stray'"),
    (["crops", "seed=3"], "seed: set by the ablation"),
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
        ablate.main(["crops", "configs/default.yaml", "--steps", "1", f"data.root={empty}",
                     f"data.cache_dir={tmp_path / 'cache'}", "data.offline_package=false",
                     f"trainer.out_dir={tmp_path / 'a'}"])
    assert str(exit_info.value).startswith(f"data.root={empty}: ") and "\n" not in str(exit_info.value)
    prepared, _ = small_data
    with pytest.raises(SystemExit, match="no validation entries"):
        ablate.main(["crops", "configs/default.yaml", "--steps", "1", f"data.root={prepared}",
                     f"data.cache_dir={prepared}", "data.val_ids=[]", "data.val_after=null",
                     f"trainer.out_dir={tmp_path / 'b'}"])
