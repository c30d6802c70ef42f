"""``python -m mini_of3.bench block`` on the CPU: a tiny block, eager PyTorch, two N (times are not checked here)."""
import json

import pytest

from mini_of3.bench import block

TINY = ["model.c_s=32", "model.c_z=16", "model.n_heads_tri=2", "model.c_hidden_tri=16", "model.n_heads_single=2",
        "model.c_hidden_mul=16", "model.transition_factor=2"]


def test_block_bench_writes_a_row_per_layer_and_n_and_a_plot(tmp_path, capsys):
    block.main(["configs/default.yaml", "--ns", "6,9", "--impls", "torch", "--reps", "1", "--rounds", "1",
                "--out", str(tmp_path), "--tag", "t", *TINY])
    result = json.loads((tmp_path / "block_t.json").read_text())
    assert result["bench"] == "block" and (tmp_path / "block_t.png").stat().st_size > 0
    assert sorted((r["layer"], r["N"]) for r in result["rows"]) == sorted(
        (layer, n) for layer in block.LAYERS for n in (6, 9))
    for row in result["rows"]:
        assert row["impl"] == "torch" and row["fwd_ms"] > 0 and row["fwdbwd_ms"] > 0 and "peak_mib" in row
        assert row["tri_mul_backend"] == "torch" and row["compiled"] is False
    assert "tri_attn_start" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--impls", "torch,nope"], "--impls: ['nope'] not known"),
    (["--ns", "8,x"], "--ns: expected"),
    (["--ns", "1"], "expected N >= 2"),
    (["configs/nope.yaml"], "config 'configs/nope.yaml' not found"),
    (["model.nope=1"], "config:"),
])
def test_bad_arguments_give_one_clear_line(argv, message):
    with pytest.raises(SystemExit) as exit_info:
        block.main(argv)
    assert message in str(exit_info.value) and "\n" not in str(exit_info.value)
