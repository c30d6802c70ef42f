"""``python -m mini_of3.bench trimul`` on the CPU: tiny sizes, the eager implementation (times are not checked)."""
import json

import pytest

from mini_of3.bench import trimul


def test_trimul_bench_writes_rows_errors_and_a_plot(tmp_path, capsys):
    trimul.main(["--ns", "6,9", "--impls", "torch", "--check-ns", "9", "--c", "16", "--hidden", "16", "--reps", "1",
                 "--rounds", "2", "--out", str(tmp_path), "--tag", "t"])
    result = json.loads((tmp_path / "trimul_t.json").read_text())
    assert result["bench"] == "tri_mul" and (tmp_path / "trimul_t.png").stat().st_size > 0
    assert sorted((r["layer"], r["N"]) for r in result["rows"]) == sorted(
        (layer, n) for layer in ("tri_mul_out", "tri_mul_in") for n in (6, 9))
    for row in result["rows"]:
        assert row["impl"] == "torch" and row["fwd_ms"] > 0 and row["fwdbwd_ms"] > 0 and row["dtype"] == "bf16"
        assert row["fwdbwd_stream_ms"] > 0 and row["fwdbwd_graph_ms"] is None   # CUDA graphs: on a GPU only
        assert ("err" in row) == (row["N"] == 9)
        if row["N"] == 9:   # the eager path under bf16 autocast against float64: every tensor, all below 5e-2
            assert set(row["err"]) == {"out", "dz", *trimul.WEIGHT_NAMES}
            assert max(row["err"].values()) < 5e-2 and row["bitwise"] is True
    printed = capsys.readouterr().out
    assert "fwd+bwd ms" in printed and "CUDA graph" in printed


@pytest.mark.parametrize("argv,message", [
    (["--impls", "torch,nope"], "--impls: expected some of"),
    (["--ns", "8,x"], "--ns: expected"),
    (["--directions", "sideways"], "--directions: expected"),
    (["--reps", "0"], "--reps, --rounds"),
])
def test_bad_arguments_give_one_clear_line(argv, message):
    with pytest.raises(SystemExit) as exit_info:
        trimul.main(argv)
    assert message in str(exit_info.value) and "\n" not in str(exit_info.value)
