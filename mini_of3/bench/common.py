"""Shared benchmark plumbing: CUDA-event timing, peak memory, float64 error, and the result file (docs/design.md).

Every result file is one JSON object: bench, device, torch, triton, commit, command, versions, rows.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

import torch


def median_ms(fn: Callable[[int], object], *, warmup: int = 5, reps: int = 30, rotate: int = 1) -> float:
    """Median time of ``fn(r)`` in milliseconds by CUDA events, after warm-up; ``r`` cycles through the input sets
    (so repeated calls do not time an L2 that already holds the inputs)."""
    for r in range(warmup):
        fn(r % rotate)
    torch.cuda.synchronize()
    times = []
    for r in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(r % rotate)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def device_ms_by_kernel(fn: Callable[[int], object], *, iters: int = 10, warmup: int = 3
                        ) -> tuple[dict[str, tuple[float, int]], float]:
    """Where the device time of ``fn(r)`` goes (CUDA): {kernel name: (ms per call, launches per call)} from
    torch.profiler over ``iters`` calls after ``warmup``, and the wall ms per call of ``iters`` calls back to back
    (unprofiled; above the summed device time when the host holds the calls up). ``r`` counts the calls."""
    for r in range(warmup):
        fn(r)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for r in range(iters):
            fn(r)
        torch.cuda.synchronize()
    start = time.perf_counter()
    for r in range(iters):
        fn(r)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) * 1e3 / iters
    times: dict[str, tuple[float, int]] = {}
    for event in prof.key_averages():
        if event.device_time_total > 0:
            ms, count = times.get(event.key, (0.0, 0))
            times[event.key] = (ms + event.device_time_total / 1e3 / iters, count + event.count // iters)
    return times, wall


def elapsed_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Milliseconds of one call of ``fn``: CUDA events on a GPU, wall-clock on a CPU (tests only)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def time_in_rounds(rows: Sequence[dict], timers: Sequence[dict[str, Callable[[int], float]]], rounds: int) -> None:
    """Interleaved timing of several implementations: in round r every live row's timers run once, as
    ``timer(r)`` returning milliseconds, the rows' order rotated by one per round, so that the card's drift over the
    run (clocks, temperature) falls on all alike and no row always goes first. A timer that raises puts the error in
    its row, which leaves the rounds. Every other row gets, per timer key, the median over the rounds and the spread
    of the rounds, ``[min, max]`` under the key with ``_ms`` replaced by ``_spread_ms``."""
    samples = [{key: [] for key in row_timers} for row_timers in timers]
    live = list(range(len(rows)))
    for r in range(rounds):
        shift = r % max(len(live), 1)
        for i in live[shift:] + live[:shift]:
            try:
                for key, timer in timers[i].items():
                    samples[i][key].append(timer(r))
            except Exception as err:   # an implementation that fails (out of memory, a missing kernel) is reported
                rows[i]["error"] = f"{type(err).__name__}: {str(err)[:300]}"
                traceback.print_exc(limit=3)
                live.remove(i)
    for i in live:
        for key, values in samples[i].items():
            values = sorted(values)
            rows[i][key] = values[len(values) // 2]
            rows[i][key.replace("_ms", "_spread_ms")] = [values[0], values[-1]]


def graph_replay_ms(fn: Callable[[], object], *, reps: int = 10, warmup: int = 3) -> float:
    """Median milliseconds of one replay of ``fn`` recorded as a CUDA graph (CUDA only): the GPU time of the work
    without the host's launches, as a model compiled with ``mode="reduce-overhead"`` runs it (the crop 256-512
    configs). ``fn`` is warmed up on a side stream first (cuBLAS workspaces, lazy initialisation), then recorded once;
    what it allocates while recording stays in the graph's private pool until the graph is freed on return."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    times = sorted(elapsed_ms(graph.replay, torch.device("cuda")) for _ in range(reps))
    del graph
    torch.cuda.empty_cache()
    return times[len(times) // 2]


def peak_mib(fn: Callable[[], object]) -> float:
    """Peak device memory (MiB) that ``fn`` allocates above what was allocated before it. The allocator's cache is
    emptied first: a cached free block that a request fits with up to 1 MiB to spare is handed out whole and counted
    whole, so what earlier calls (of any implementation) left cached would otherwise move the figure by up to 1 MiB
    per tensor (603.75 MiB against the 603.0 MiB the call's own allocations add up to, triangle attention at
    N = 768, D = 32, H200)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error of x against a float64 reference."""
    return ((x.double() - ref).norm() / ref.norm()).item()


def git_commit() -> str:
    """The commit measured: MINI_OF3_COMMIT when set (the GPU machine gets a copy of the tree without .git)."""
    if os.environ.get("MINI_OF3_COMMIT"):
        return os.environ["MINI_OF3_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_versions(names: Sequence[str]) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def result_header(bench: str, versions: dict[str, str] | None = None, prog: str = "python -m mini_of3.bench") -> dict:
    """The fields every result file starts with; ``command`` is ``prog`` and this process's arguments."""
    import triton
    return {
        "bench": bench,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": git_commit(),
        "command": " ".join([prog, *(shlex.quote(a) for a in sys.argv[1:])]),
        "versions": versions or {},
        "rows": [],
    }


def write_json(result: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f"{path.suffix}.{os.getpid()}.tmp")         # processes writing one path do not collide
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)


def print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """Print rows as a fixed-width table; columns are (key, header, format)."""
    widths = [max(len(header), 8) for _, header, _ in columns]
    print("  ".join(h.rjust(w) for (_, h, _), w in zip(columns, widths)))
    for row in rows:
        cells = []
        for (key, _, fmt), w in zip(columns, widths):
            value = row.get(key)
            cells.append(("-" if value is None else format(value, fmt)).rjust(w))
        print("  ".join(cells))


def load_bench_config(config: str, overrides: list[str], default: str, extra: tuple[str, ...] = ()):
    """(path, Config) for a benchmark's optional CONFIG argument and its ``key=value`` overrides (as train.py
    takes them), or one clear error line. A CONFIG argument holding ``=`` is an override: the default is used."""
    from mini_of3.config import ConfigError, load_config
    if "=" in config:
        config, overrides = default, [config, *overrides]
    if not Path(config).is_file():
        raise SystemExit(f"config {config!r} not found")
    try:
        return config, load_config(config, [*overrides, *extra])
    except ConfigError as err:
        raise SystemExit(f"config: {err}") from None
