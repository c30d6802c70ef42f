"""The kernel benchmark's timing plan (CPU: the CUDA timing itself is replaced by a counter)."""
import pytest

import mini_of3.bench.kernels as bench


def test_rounds_interleave_the_implementations_and_report_the_median_round(monkeypatch):
    timed = []

    def fake_median_ms(fn, reps, rotate):
        timed.append(fn(0))
        return float(len(timed))          # a clock that drifts upward over the run

    monkeypatch.setattr(bench, "median_ms", fake_median_ms)
    prepared = [bench.Prepared(None, {"impl": name}, [], [], lambda r, n=name: f"{n} fwd",
                               lambda r, n=name: f"{n} fwdbwd") for name in "abc"]
    bench.time_rounds(prepared, rounds=3, reps=5)
    order = [t.split()[0] for t in timed[::2]]
    assert order == list("abc" "bca" "cab")                     # every round times each once, the order rotated
    assert all(t.endswith("fwdbwd") for t in timed[1::2])
    first_positions = {name: [i for i, n in enumerate(order) if n == name] for name in "abc"}
    assert sorted(sum(first_positions.values(), [])) == list(range(9))
    for p in prepared:                                           # the middle of three rounds, and the spread
        fwd_times = sorted(2.0 * i + 1 for i in first_positions[p.row["impl"]])
        assert p.row["fwd_ms"] == fwd_times[1] and p.row["fwd_spread_ms"] == [fwd_times[0], fwd_times[-1]]
    # drift is shared: with rotation no implementation is always timed first (or last)
    assert {positions[0] % 3 for positions in first_positions.values()} == {0, 1, 2}


@pytest.mark.parametrize("argv,message", [
    (["--layouts", "start,sideways"], "--layouts: ['sideways'] not allowed"),
    (["--ns", "256,x"], "--ns: expected"),
    (["--layouts", "end", "--impls", "mini_of3_split"], "the model layouts run"),
    (["--padded", "768:300"], "--padded: expected REAL:CROP[:BASE]"),
    (["--padded", "300:x"], "--padded: expected REAL:CROP[:BASE]"),
])
def test_kernel_bench_bad_arguments_give_one_clear_line(argv, message):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert message in str(exit_info.value) and "\n" not in str(exit_info.value)


def test_padded_entry_rows_compare_masked_queries_with_an_unpadded_entry(monkeypatch):
    """``--padded`` (issue 42) on tiny sizes, our kernel under the interpreter (CPU; the timing replaced by a
    counter): three rows (padded with mask_queries on and off, unpadded), each checked against float64 with its
    mask_queries; the padded rows carry their time ratios to the unpadded one."""
    import argparse
    clock = iter(range(1, 100))
    monkeypatch.setattr(bench, "median_ms", lambda fn, reps, rotate: fn(0) or float(next(clock)))
    monkeypatch.setattr(bench, "peak_mib", lambda fn: 0.0)
    assert bench.parse_padded("300:768,5:12:8") == [(300, 768, 320), (5, 12, 8)]
    result = {"rows": []}
    args = argparse.Namespace(heads=1, rounds=1, reps=1)
    bench.bench_padded(result, (3, 6, 4), "start", 16, args, check=True, device="cpu")
    rows = result["rows"]
    assert [(r["N"], r["real_tokens"], r["mask_queries"]) for r in rows] == [(6, 3, True), (6, 3, False),
                                                                            (4, 4, True)]
    for row in rows:
        assert max(row["err"].values()) < 2e-2 and row["bitwise"] and row["padding_rows_zero"], row
    assert rows[0]["masked_queries_zero"] and "masked_queries_zero" not in rows[1]
    for row in rows[:2]:
        assert row["ratio_to_N"] == 4 and row["ratio_fwdbwd"] == row["fwdbwd_ms"] / rows[2]["fwdbwd_ms"]
    assert "ratio_fwd" not in rows[2]
