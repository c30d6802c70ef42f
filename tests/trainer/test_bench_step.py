"""``python -m mini_of3.bench step`` on the CPU: a tiny model, two crops, one arm (times are not checked here)."""
import json

import pytest
import torch

from mini_of3.bench import step
from mini_of3.config import ModelConfig, load_config
from mini_of3.data import read_manifest

from .helpers import TINY_MODEL


def tiny_model_overrides() -> list[str]:
    values = {**TINY_MODEL, "pair_dropout": 0.0}
    return [f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()]


def test_step_bench_writes_rows_with_every_field_and_a_plot(small_data, tmp_path, capsys):
    prepared, _ = small_data
    step.main(["configs/default.yaml", "--crops", "16,24", "--arms", "torch+torch", "--rounds", "2",
               "--warmup", "1", "--data", str(prepared), "--out", str(tmp_path), "--tag", "t",
               "--profile-crops", "16,24", *tiny_model_overrides()])
    result = json.loads((tmp_path / "step_t.json").read_text())
    assert result["bench"] == "step" and (tmp_path / "step_t.png").stat().st_size > 0
    assert [(r["impl"], r["N"]) for r in result["rows"]] == [("torch+torch", 16), ("torch+torch", 24)]
    for row in result["rows"]:
        assert row["step_s"] > 0 and row["loss0"] == pytest.approx(row["loss0"]) and row["loss0"] > 0
        assert len(row["step_rounds_s"]) == 2 and sorted(row["step_rounds_s"]) == row["step_spread_s"]
        assert "crop_reserved_mib" in row
        assert set(row["breakdown_ms"]) == set(step.CATEGORIES) and row["breakdown_ms"]["GEMMs"] > 0
        assert "peak_mib" in row and row["top_kernels"]
        host = row["host"]          # no CUDA runtime calls on the CPU: no launches, no waits
        assert host["wall_ms"] > 0 and host["launches"] == 0 and host["waits"] == []
    assert "torch+torch" in capsys.readouterr().out


def test_two_arms_with_the_same_weights_start_from_the_same_loss(small_data, tmp_path):
    prepared, _ = small_data
    step.main(["configs/default.yaml", "--crops", "16", "--arms", "torch+torch,auto+auto", "--rounds", "1",
               "--warmup", "1", "--data", str(prepared), "--out", str(tmp_path), *tiny_model_overrides()])
    first, second = json.loads((tmp_path / "step.json").read_text())["rows"]
    assert first["loss0"] == second["loss0"]          # auto is torch on the CPU: the same arm, bitwise
    assert "breakdown_ms" in first                    # the largest crop is profiled by default


def test_only_the_named_crops_are_profiled(small_data, tmp_path):
    prepared, _ = small_data
    step.main(["configs/default.yaml", "--crops", "16,24", "--arms", "torch+torch", "--rounds", "1", "--warmup", "1",
               "--profile-crops", "16", "--data", str(prepared), "--out", str(tmp_path), *tiny_model_overrides()])
    rows = json.loads((tmp_path / "step.json").read_text())["rows"]
    assert ["breakdown_ms" in r for r in rows] == [True, False]


def test_a_named_entry_padded_to_the_crop_measures_what_padding_costs(small_data, tmp_path):
    prepared, _ = small_data
    smallest = min(read_manifest(prepared), key=lambda r: r.tokens)
    step.main(["configs/default.yaml", "--crops", "8,64", "--entry", smallest.id.lower(), "--pad", "--arms",
               "torch+torch", "--rounds", "1", "--warmup", "1", "--profile-crops", "8", "--data", str(prepared),
               "--out", str(tmp_path), *tiny_model_overrides()])
    rows = json.loads((tmp_path / "step.json").read_text())["rows"]
    assert [(r["entry"], r["N"], r["real_tokens"]) for r in rows] == [
        (smallest.id, 8, 8), (smallest.id, 64, min(smallest.tokens, 64))]
    assert smallest.tokens < 64                              # the second crop holds the whole entry, padded
    with pytest.raises(SystemExit, match="--entry NOPE: not in "):
        step.main(["configs/default.yaml", "--entry", "NOPE", "--data", str(prepared), *tiny_model_overrides()])


def test_an_arm_may_name_its_compile_mode():
    assert step.split_arm("mini_of3+cueq:reduce-overhead") == ("mini_of3", "cueq", "reduce-overhead")
    assert step.split_arm("mini_of3+cueq") == ("mini_of3", "cueq", None)
    assert step.parse_arms("torch+torch,torch+torch:default") == ["torch+torch", "torch+torch:default"]
    arm = "mini_of3+cueq:default@tri_attn_fused_gate=false@n_blocks=2"
    assert step.split_arm(arm) == ("mini_of3", "cueq", "default")
    model = step.arm_model(ModelConfig(), arm)
    assert (model.tri_attn_backend, model.tri_mul_backend, model.tri_attn_fused_gate, model.n_blocks) == \
        ("mini_of3", "cueq", False, 2)
    assert step.arm_model(ModelConfig(n_blocks=3), "torch+torch").n_blocks == 3       # no override: the config's
    with pytest.raises(SystemExit, match="n_blokcs"):
        step.parse_arms("torch+torch@n_blokcs=2", load_config())


@pytest.mark.parametrize("argv,message", [
    (["--arms", "mini_of3+nope"], "--arms: 'mini_of3+nope'"),
    (["--arms", "torch+torch:fast"], "--arms: 'torch+torch:fast'"),
    (["--crops", "256,x"], "--crops: expected"),
    (["--crops", "4"], "--crops: expected crop sizes"),
    (["configs/nope.yaml"], "config 'configs/nope.yaml' not found"),
    (["--data", "/nonexistent"], "no manifest.tsv"),
    (["model.nope=1"], "config:"),
])
def test_bad_arguments_give_one_clear_line(argv, message):
    with pytest.raises(SystemExit) as exit_info:
        step.main(argv)
    assert message in str(exit_info.value) and "\n" not in str(exit_info.value)


def test_gpu_idle_time_goes_to_the_phase_that_launched_the_work_after_each_gap():
    ms = 1_000_000
    phases = [(0, 100 * ms, "bench::forward"), (40 * ms, 70 * ms, "bench::plddt_rollout"),
              (100 * ms, 160 * ms, "bench::backward")]
    kernels = [(2 * ms, 30 * ms, 1 * ms),            # 2 ms idle before the first kernel: forward
               (10 * ms, 35 * ms, 5 * ms),           # overlaps the first: no gap
               (50 * ms, 52 * ms, 49 * ms),          # 15 ms gap, launched in the rollout (innermost range)
               (55 * ms, 56 * ms, 54 * ms),          # 3 ms gap, rollout
               (120 * ms, 150 * ms, 101 * ms),       # 64 ms gap, backward
               (150 * ms, 151 * ms, 200 * ms)]       # back to back, launched outside every phase: no gap
    idle = step.gpu_idle_by_phase(kernels, phases)
    assert idle == {"bench::backward": 64.0, "bench::plddt_rollout": 18.0, "bench::forward": 2.0}
    assert step.gpu_idle_by_phase([], phases) == {}
    assert step.gpu_idle_by_phase([(5 * ms, 6 * ms, 300 * ms), (9 * ms, 10 * ms, 300 * ms)], []) == {"-": 3.0}
    assert step.launches_by_phase(kernels, phases) == {"bench::forward": 2, "bench::plddt_rollout": 2,
                                                       "bench::backward": 1, "-": 1}


class _FakeArm:
    """An arm whose step returns a fixed loss, or raises (an anchor that fails at this crop)."""

    def __init__(self, name: str, fails: bool = False) -> None:
        self.name, self.fails, self.slow_from, self.steps = name, fails, None, 0
        self.device = torch.device("cpu")
        self.optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)

    def step(self, batch) -> float:
        self.steps += 1
        if self.fails:
            raise RuntimeError("unsupported shape")
        return 1.5

    def release(self) -> None:
        pass


def test_an_arm_that_fails_is_dropped_and_the_others_are_timed_after_an_interleaved_warm_up():
    arms = [_FakeArm("a"), _FakeArm("b", fails=True), _FakeArm("c")]
    batch = {"token_mask": torch.ones(1, 8, dtype=torch.bool)}
    rows = {r["impl"]: r for r in step.bench_crop(arms, batch, crop=8, rounds=3, warmup=2, profile=False)}
    assert rows["b"]["skipped"].startswith("RuntimeError") and "step_s" not in rows["b"] and arms[1].slow_from == 8
    assert arms[1].steps == 1                      # dropped at its first warm-up step, not tried again
    for name in "ac":
        assert rows[name]["loss0"] == 1.5 and len(rows[name]["step_rounds_s"]) == 3
    assert arms[0].steps == arms[2].steps == 2 + 3
