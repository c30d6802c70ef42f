"""``python -m mini_of3.data.bench_loader``: time ``prepare`` (cold and warm) and one ``__getitem__``.

``__getitem__`` is the whole per-example path of a loader worker: read the cached ``.npz``, crop, build the
features. It is timed for one entry (default the one with most resolved tokens) over many (epoch, index) seeds, so every
cropper is drawn; the first call (which also computes the interface mask that later calls reuse) is reported apart.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ..config import DataConfig
from .prepare import prepare_folder, read_manifest


def time_prepare(src: Path, out: Path, workers: int) -> tuple[float, float, int]:
    """Seconds for a cold and a warm ``prepare_folder`` run, and the number of usable entries."""
    t0 = time.perf_counter()
    summary = prepare_folder(src, out, workers=workers, progress=False)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    prepare_folder(src, out, workers=workers, progress=False)
    return cold, time.perf_counter() - t0, len(summary.entries)


def time_getitem(prepared: Path, entry: str | None, crop_size: int, n: int) -> dict:
    """Median, 90th percentile and first-call milliseconds of ``ProteinDataset.__getitem__`` for one entry."""
    from .dataset import ProteinDataset          # torch only here

    rows = read_manifest(prepared)
    row = max(rows, key=lambda r: r.resolved_tokens) if entry is None else next(
        (r for r in rows if r.id.upper() == entry.upper()), None)
    if row is None:
        raise SystemExit(f"bench_loader: entry {entry!r} is not in {prepared}/manifest.tsv")
    cfg = DataConfig(crop_size=crop_size, min_tokens=1, max_resolution=None)
    dataset = ProteinDataset(prepared, cfg, "all", seed=0, rows=[row])
    times, methods = [], {}
    for epoch in range(n):
        t0 = time.perf_counter()
        item = dataset[(0, epoch)]
        dt = (time.perf_counter() - t0) * 1e3
        times.append(dt)
        methods.setdefault(item["crop_method"], []).append(dt)
    steady = times[1:] or times
    return {"entry": row.id, "tokens": row.tokens, "crop": crop_size, "n": n, "first_ms": times[0],
            "median_ms": statistics.median(steady), "p90_ms": sorted(steady)[int(0.9 * (len(steady) - 1))],
            "by_method": {k: statistics.median(v) for k, v in sorted(methods.items())}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mini_of3.data.bench_loader", description=__doc__.splitlines()[0])
    parser.add_argument("src", nargs="?", default="data/mmcif", help="folder of mmCIF files")
    parser.add_argument("--prepared", help="use this prepared folder and skip the prepare timing")
    parser.add_argument("--entry", help="entry id to time (default: the one with most resolved tokens)")
    parser.add_argument("--crop", type=int, default=768)
    parser.add_argument("--n", type=int, default=200, help="__getitem__ calls")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    tmp = None
    if args.prepared:
        prepared = Path(args.prepared)
    else:
        tmp = tempfile.mkdtemp(prefix="mini_of3_bench_")
        prepared = Path(tmp)
        cold, warm, n_entries = time_prepare(Path(args.src), prepared, args.workers)
        print(f"prepare {args.src} ({n_entries} usable entries, {args.workers} workers): "
              f"cold {cold:.2f} s, warm {warm:.2f} s")
    try:
        r = time_getitem(prepared, args.entry, args.crop, args.n)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    methods = ", ".join(f"{k} {v:.2f}" for k, v in r["by_method"].items())
    print(f"__getitem__ {r['entry']} ({r['tokens']} tokens, crop {r['crop']}, {r['n']} calls): "
          f"median {r['median_ms']:.2f} ms, p90 {r['p90_ms']:.2f} ms, first {r['first_ms']:.1f} ms "
          f"(median by cropper, ms: {methods})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
