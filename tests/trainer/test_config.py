"""Bad configs give one clear line on stderr and exit status 2, never a traceback; good ones load, save and reload."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from mini_of3.config import (ConfigError, config_from_dict, config_to_dict, load_config, save_config,
                             section_from_dict)

from .helpers import REPO, TINY_MODEL


def train_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "train.py", *args], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, expected", [
    (["trainer.max_step=3"], "unknown config key 'trainer.max_step' (did you mean 'trainer.max_steps'?"),
    (["model.n_blocks=two"], "model.n_blocks: got 'two', expected an integer"),
    (["optim.lr=-1"], "optim.lr: got -1.0, expected > 0"),
    (["trainer.mixed_precision=fp8"], "trainer.mixed_precision: got 'fp8', expected one of no, bf16, fp16"),
    (["trainer.resume=/no/such/run"], "trainer.resume: got '/no/such/run', expected auto, never, force, or an existing"),
    (["configs/missing.yaml"], "config file 'configs/missing.yaml' does not exist"),
    (["configs/default.yaml", "configs/crop384.yaml"], "argument 'configs/crop384.yaml': expected key=value"),
    (["wandb=maybe"], "wandb: got 'maybe', expected true or false"),
    (["data.crop_weights=[1, 2]"], "data.crop_weights: got [1.0, 2.0], expected three non-negative numbers"),
    (["optim.lr=inf"], "optim.lr: got 'inf', expected a finite number"),
    (["optim.lr=.nan"], "optim.lr: got nan, expected a finite number"),
    (["data.val_ids=5"], "data.val_ids: got 5, expected a list of entry ids, or auto"),
])
def test_bad_config_is_one_clear_line_and_exit_2(args, expected):
    done = train_py(*args)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("train.py: config error: ") and expected in lines[0], lines[0]


def test_bad_yaml_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_steps: [1,\n")
    done = train_py(str(bad))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "is not valid YAML" in done.stderr
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("trainer:\n  checkpoint_evry: 5\n")
    done = train_py(str(unknown))
    assert done.returncode == 2 and "'trainer.checkpoint_evry' (did you mean 'trainer.checkpoint_every'?" \
        in done.stderr, done.stderr


def test_model_values_that_clash_are_a_config_error_from_the_trainer(tmp_path):
    """model.c_s must split into model.n_heads_single heads: build_model's check reaches the user as one line,
    before any data is read."""
    done = train_py(f"trainer.out_dir={tmp_path / 'run'}", "wandb=false", "model.c_s=30", "model.n_heads_single=4",
                    "data.root=/nonexistent/folder", "data.offline_package=false")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "config error: model.c_s=30 must be a multiple of model.n_heads_single=4" in done.stderr, done.stderr


def test_missing_data_is_one_line_and_exit_1(tmp_path):
    done = train_py(f"trainer.out_dir={tmp_path / 'run'}", "wandb=false", f"data.root={tmp_path / 'empty'}",
                    "data.offline_package=false")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "no mmCIF files" in done.stderr and "Traceback" not in done.stderr


def test_help_exits_0():
    done = train_py("--help")
    assert done.returncode == 0 and "accelerate launch train.py" in done.stdout


@pytest.mark.parametrize("name", ["default", "crop256", "crop384", "crop512", "crop640", "crop768", "of3_trunk"])
def test_shipped_configs_load_and_round_trip(name, tmp_path):
    cfg = load_config(REPO / "configs" / f"{name}.yaml")
    save_config(cfg, tmp_path / "config.yaml")
    again = config_from_dict(yaml.safe_load((tmp_path / "config.yaml").read_text()))
    assert config_to_dict(again) == config_to_dict(cfg)
    if name.startswith("crop"):
        assert cfg.data.crop_size == int(name[4:]) and cfg.trainer.mixed_precision == "bf16"
        assert cfg.data.root != "data/mmcif" or cfg.data.val_ids
    if cfg.trainer.compile_mode == "reduce-overhead":   # CUDA graphs: one shape, and no activation checkpointing
        assert cfg.data.pad_to_crop and not cfg.model.checkpointing and cfg.trainer.compile
    if name == "of3_trunk":
        m = cfg.model
        assert (m.n_blocks, m.c_s, m.c_z, m.n_heads_tri, m.c_hidden_tri) == (48, 384, 128, 4, 32)
    if name == "default":
        assert cfg.data.val_ids and cfg.trainer.mixed_precision == "no" and cfg.data.crop_size <= 96


def test_overrides_apply_after_the_file_and_are_typed():
    cfg = load_config(REPO / "configs" / "default.yaml",
                      ["trainer.max_steps=7", "data.val_ids=1CRN,1L2Y", "model.n_recycles=0", "wandb=false",
                       "trainer.val_sampling_steps=null", "optim.betas=[0.8, 0.9]"])
    assert cfg.trainer.max_steps == 7 and cfg.data.val_ids == ["1CRN", "1L2Y"] and cfg.model.n_recycles == 0
    assert cfg.wandb is False and cfg.trainer.val_sampling_steps is None and cfg.optim.betas == [0.8, 0.9]
    with pytest.raises(ConfigError, match="override 'trainer.max_steps' is not of the form key=value"):
        load_config(None, ["trainer.max_steps"])


def test_a_saved_section_reads_alone():
    """predict reads the model section of a checkpoint's config without the rest (whose paths may be gone)."""
    model = section_from_dict("model", TINY_MODEL)
    assert model.n_blocks == 1 and model.pair_dropout == 0.25
    with pytest.raises(ConfigError, match="unknown config key 'model.n_block'"):
        section_from_dict("model", {"n_block": 1})


def test_unquoted_no_is_the_word_not_a_boolean(tmp_path):
    """YAML 1.1 reads `no` as false; trainer.mixed_precision's documented value is the word "no" (accelerate's), on
    the command line and in a file alike (a session-2 smoke run stopped on `trainer.mixed_precision=no`)."""
    assert load_config(REPO / "configs" / "crop384.yaml", ["trainer.mixed_precision=no"]).trainer.mixed_precision == "no"
    config = tmp_path / "fp32.yaml"
    config.write_text("trainer:\n  mixed_precision: no\nwandb: off\n")
    cfg = load_config(config)
    assert cfg.trainer.mixed_precision == "no" and cfg.wandb is False


def test_training_on_the_validation_entries_needs_the_homology_filter_off():
    """Every training entry would be removed as a homologue of itself: say so instead."""
    with pytest.raises(ConfigError, match=r"data.val_identity_cut: got 0.4, expected null when data.train_ids and "
                                          r"data.val_ids share entries \(1CRN\)"):
        load_config(None, ["data.train_ids=[1crn,1L2Y]", "data.val_ids=[1CRN]"])
    cfg = load_config(None, ["data.train_ids=[1crn,1L2Y]", "data.val_ids=[1CRN]", "data.val_identity_cut=null"])
    assert cfg.data.train_ids == ["1crn", "1L2Y"] and cfg.data.val_identity_cut is None


@pytest.mark.parametrize("override, expected", [
    ("trainer.max_minutes=0", "trainer.max_minutes: got 0.0, expected > 0 or null"),
    ("data.val_crop_size=0", "data.val_crop_size: got 0, expected >= 1 or null"),
    ("model.noise_p_std=0", "model.noise_p_std: got 0.0, expected > 0"),
])
def test_time_budget_and_validation_crop_are_checked(override, expected):
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
        load_config(REPO / "configs" / "default.yaml", [override])
    assert load_config(REPO / "configs" / "default.yaml", []).trainer.max_minutes is None
