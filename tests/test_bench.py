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
])
def test_kernel_bench_bad_arguments_give_one_clear_line(argv, message):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(argv)
    assert message in str(exit_info.value) and "\n" not in str(exit_info.value)
