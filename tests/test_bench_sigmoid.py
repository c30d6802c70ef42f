"""``python -m mini_of3.bench sigmoid`` on the CPU: tiny shapes (times are not checked), and its float64 truth."""
import json

import pytest
import torch

from mini_of3.bench import sigmoid
from mini_of3.kernels import sigmoid_attention_ref


@pytest.mark.parametrize("causal", [False, True])
def test_chunked_float64_reference_matches_autograd_of_the_reference(causal):
    shape = sigmoid.parse_shape("varlen3d16" + ("c" if causal else ""), heads=3, varlen_range=(1, 23))
    inputs = sigmoid.make_packed(shape, torch.device("cpu"), seed=0)
    got = sigmoid.float64_reference(inputs, shape, heads=2, chunk=5)      # chunks split every sequence but one
    leaves = [inputs[n][:, :2].double().requires_grad_(True) for n in ("q", "k", "v")]
    o = sigmoid_attention_ref(*leaves, cu_seqlens_q=inputs["cu"], cu_seqlens_k=inputs["cu"], causal=causal)
    o.backward(inputs["do"][:, :2].double())
    for name, g, r in zip(sigmoid.NAMES, got, [o.detach()] + [t.grad for t in leaves]):
        torch.testing.assert_close(g, r, rtol=1e-12, atol=1e-12, msg=name)


def test_flops_count_real_tokens_only():
    dense = sigmoid.parse_shape("b2t8d16", heads=4, varlen_range=(1, 1))
    assert dense.flops_fwd() == 4 * 4 * 16 * 2 * 8 * 8
    causal = sigmoid.parse_shape("b1t8d16c", heads=1, varlen_range=(1, 1))
    assert causal.flops_fwd() == 4 * 16 * 8 * 9 / 2
    varlen = sigmoid.parse_shape("varlen5d16", heads=1, varlen_range=(3, 9))
    assert varlen.B == 5 and all(3 <= L <= 9 for L in varlen.lengths)
    assert varlen.flops_fwd() == 4 * 16 * sum(L * L for L in varlen.lengths)


def test_sigmoid_bench_writes_rows_and_a_plot(tmp_path, capsys):
    sigmoid.main(["--shapes", "b2t24d32,varlen3d32c", "--varlen-range", "4,30", "--impls",
                  "mini_of3,mini_of3_tanh,mini_of3+scores_budget=0,triton_sigmoid,cudnn", "--heads", "2", "--err-heads", "1", "--reps", "1", "--warmup", "0",
                  "--out", str(tmp_path), "--tag", "t"])
    result = json.loads((tmp_path / "sigmoid_t.json").read_text())
    assert result["bench"] == "sigmoid" and (tmp_path / "sigmoid_t.png").stat().st_size > 0
    assert {"device", "torch", "triton", "commit", "command", "versions"} <= set(result)
    rows = {(r["impl"], r["shape"]): r for r in result["rows"]}
    assert len(rows) == 10
    for shape in ("b2t24d32", "varlen3d32c"):
        for name in ("mini_of3", "mini_of3_tanh", "mini_of3+scores_budget=0"):
            ours = rows[name, shape]
            assert ours["fwd_ms"] > 0 and ours["fwdbwd_ms"] > 0 and ours["tflops_fwd"] > 0 and ours["dtype"] == "bf16"
            assert set(ours["err"]) == {"o", "dq", "dk", "dv"} and max(ours["err"].values()) < 1e-2
            assert ours["bitwise"] is True and ours["err_heads"] == 1
            assert ours["kernels"] == "triton"          # D = 32 (and the CPU): never the Gluon kernels
        if not torch.cuda.is_available():   # on a CPU the others cannot run: their rows say why
            assert "error" in rows["cudnn", shape]
    assert rows["mini_of3", "varlen3d32c"]["layout"] == "varlen" and rows["mini_of3", "varlen3d32c"]["causal"]
    printed = capsys.readouterr().out
    assert "fwd+bwd ms" in printed and "err dq" in printed


@pytest.mark.parametrize("argv,message", [
    (["--impls", "mini_of3,nope"], "--impls: expected some of"),
    (["--shapes", "b4t4096"], "--shapes: expected"),
    (["--varlen-range", "9,3"], "--varlen-range: expected 1 <= low <= high"),
    (["--err-heads", "17"], "--err-heads <= --heads"),
    (["--sigmoid", "tanh"], "--sigmoid: only with --sweep"),
    (["--impls", "cudnn+dq_warps=4"], "only ours (mini_of3...) take tile fields"),
    (["--impls", "mini_of3+dq_wraps=4"], "unknown fields ['dq_wraps']"),
    (["--impls", "mini_of3+dq_warps"], "expected field=value, got 'dq_warps'"),
    (["--tiles", "nope=1"], "unknown fields ['nope']"),
    (["--sweep", "--sweep-kernels", "dkdv,bwd"], "--sweep-kernels: expected some of fwd,dkdv,dq"),
])
def test_bad_arguments_give_one_clear_line(argv, message):
    with pytest.raises(SystemExit) as exit_info:
        sigmoid.main(argv)
    assert message in str(exit_info.value) and "\n" not in str(exit_info.value)


def test_sweep_tunes_tiles_for_a_named_sigmoid(tmp_path, capsys):
    """``--sweep --sigmoid tanh``: every candidate row and the combined best run with tanh, whatever is fastest."""
    sigmoid.main(["--sweep", "--sigmoid", "tanh", "--shapes", "b1t40d32", "--heads", "1", "--err-heads", "1",
                  "--reps", "1", "--warmup", "0", "--out", str(tmp_path), "--tag", "t"])
    rows = json.loads((tmp_path / "sigmoid_sweep_t.json").read_text())["rows"]
    variants = [r for r in rows if list(r["fields"]) == ["sigmoid"]]
    assert [r["fields"]["sigmoid"] for r in variants] == list(sigmoid.SIGMOID_VARIANTS)
    tuned = [r for r in rows if r not in variants]
    assert tuned and all(r["fields"]["sigmoid"] == "tanh" for r in tuned)
    assert all(r["best"]["sigmoid"] == "tanh" for r in rows)
    assert "best for b1t40d32" in capsys.readouterr().out


def test_sweep_from_tile_fields_tunes_the_scores_reader(tmp_path):
    """``--tiles scores_budget=...``: every row runs with the stored scores, and the dq kernel swept is
    _bwd_dq_scores (dqs_* fields), its best reported with the budget."""
    sigmoid.main(["--sweep", "--sigmoid", "exact", "--tiles", "scores_budget=1048576", "--sweep-kernels", "dq",
                  "--shapes", "b1t40d32",
                  "--heads", "1", "--err-heads", "0", "--reps", "1", "--warmup", "0", "--out", str(tmp_path)])
    rows = json.loads((tmp_path / "sigmoid_sweep.json").read_text())["rows"]
    swept = {key for r in rows for key in r["fields"]}
    assert {"dqs_block_m", "dqs_warps"} <= swept and not {"dq_block_m", "fwd_block_m", "dkdv_block_m"} & swept
    assert all("error" not in r for r in rows)
    assert rows[-1]["best"]["scores_budget"] == 1048576


def test_timing_interleaves_the_arms_and_drops_one_that_fails():
    """Each round times every arm in turn (drift falls on all alike); an arm that raises mid-run keeps its error and
    leaves the rounds, the others still get medians."""
    calls = []

    class FakeArm:
        timers = sigmoid.Arm.timers

        def __init__(self, name, fail_at=None):
            self.row, self.name, self.fail_at = {"impl": name}, name, fail_at

        def fwd(self, r):
            if r == self.fail_at:
                raise RuntimeError("out of memory")
            calls.append((r, self.name, "fwd"))

        def fwdbwd(self, r):
            calls.append((r, self.name, "fwdbwd"))

    a, b, c = FakeArm("a"), FakeArm("b", fail_at=1), FakeArm("c")
    sigmoid.time_interleaved([a, b, c], torch.device("cpu"), reps=3)
    assert calls[:6] == [(0, n, k) for n in "abc" for k in ("fwd", "fwdbwd")]
    assert [(r, n) for r, n, k in calls if k == "fwd"] == [(0, "a"), (0, "b"), (0, "c"), (1, "c"), (1, "a"),
                                                             (2, "a"), (2, "c")]   # the order rotated per round
    assert "fwd_ms" in a.row and "fwd_ms" in c.row and "fwd_ms" not in b.row
    assert b.row["error"] == "RuntimeError: out of memory"
