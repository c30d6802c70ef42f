"""``python -m mini_of3.data.prepare SRC OUT [--workers N]``: parse a folder of mmCIF files into a cache of ``.npz``.

Each file is parsed in a worker process (``load_mmcif``, guarded by a timeout), its :class:`Structure` written to
``OUT/structures/<id>.<hash>.npz`` (keyed by the file's content hash, written atomically); ``OUT/manifest.tsv`` lists
the usable entries and ``OUT/skipped.tsv`` every file left out with the reason. A re-run reuses every entry whose
source is unchanged and redoes a changed one. Exit status 0 when at least one entry is usable.
"""
from __future__ import annotations

import argparse
import faulthandler
import hashlib
import os
import signal
import sys
import threading
import warnings
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from pathlib import Path

from tqdm import tqdm

from ..config import DEFAULT_DATA_ROOT, DataConfig
from .manifest import ManifestRow, SkippedRow, read_manifest, read_skipped, write_tsv
from .mmcif import load_mmcif
from .offline import ensure_offline_entries
from .structure import MmcifError

MMCIF_SUFFIXES = (".cif", ".cif.gz", ".mmcif", ".mmcif.gz")
DEFAULT_TIMEOUT_S = 120.0
STRUCTURES = "structures"


@dataclass
class PrepareSummary:
    out: Path
    entries: list[ManifestRow] = field(default_factory=list)
    skipped: list[SkippedRow] = field(default_factory=list)
    parsed: int = 0                # parsed in this run
    cached: int = 0                # reused from an earlier run

    @property
    def manifest(self) -> Path:
        return self.out / "manifest.tsv"

    @property
    def skipped_file(self) -> Path:
        return self.out / "skipped.tsv"


def entry_id(path: Path) -> str:
    """The id of a source file: its name without the mmCIF suffix (``3WIP.cif.gz`` -> ``3WIP``)."""
    name = path.name
    for suffix in sorted(MMCIF_SUFFIXES, key=len, reverse=True):
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return path.stem


def find_sources(src: Path) -> list[Path]:
    """mmCIF files under ``src`` (any depth, hidden files ignored), sorted."""
    return sorted(p for p in src.rglob("*") if p.is_file() and not p.name.startswith(".")
                  and p.name.lower().endswith(MMCIF_SUFFIXES))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------------------------
# the worker


class _Timeout(Exception):
    pass


_DEVNULL = None


def _devnull():
    """A real file for faulthandler (a worker's sys.stderr may have no file descriptor, e.g. under pytest)."""
    global _DEVNULL
    if _DEVNULL is None:
        _DEVNULL = open(os.devnull, "w")
    return _DEVNULL


def _raise_timeout(signum, frame):
    raise _Timeout()


def prepare_one(src: str, npz: str, timeout_s: float | None) -> tuple[str, dict | str]:
    """Parse ``src`` and write its structure to ``npz``: ``("ok", manifest fields)``, ``("bad", reason)`` for bad
    input (remembered by content hash) or ``("error", reason)`` for a timeout or a surprise (retried next run).

    Runs in a worker process. A soft timer interrupts Python code after ``timeout_s``; a hard one (faulthandler)
    ends the process 10 s later if native code does not return, which the parent sees as a dead worker.
    """
    soft = timeout_s is not None and threading.current_thread() is threading.main_thread()
    if soft:
        signal.signal(signal.SIGALRM, _raise_timeout)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        faulthandler.dump_traceback_later(timeout_s + 10.0, exit=True, file=_devnull())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")            # notes are kept in Structure.notes
            structure = load_mmcif(src)
        structure.save(npz)
    except _Timeout:
        return "error", f"{src}: parsing took longer than {timeout_s:g} s"
    except MmcifError as err:
        message = str(err)                             # skipped.tsv names the file in its own column
        return "bad", message[len(src) + 2:] if message.startswith(f"{src}: ") else message
    except Exception as err:                           # a bug or a gemmi surprise must not end the folder run
        return "error", f"{src}: unexpected {type(err).__name__}: {err}"
    finally:
        if soft:
            signal.setitimer(signal.ITIMER_REAL, 0)
            faulthandler.cancel_dump_traceback_later()
    return "ok", {"pdb_id": structure.pdb_id, "tokens": structure.n_tokens,
                  "resolved_tokens": int(structure.resolved.sum()), "chains": structure.n_chains,
                  "resolved_fraction": round(structure.resolved_fraction, 4), "method": structure.method,
                  "resolution": structure.resolution, "release_date": structure.release_date}


def _run_pool(jobs: list[tuple[Path, str, str, Path]], workers: int, timeout_s: float | None, on_done,
              mp_context: BaseContext | None) -> list[tuple[Path, str, str, Path]]:
    """Run ``prepare_one`` over ``jobs`` in a process pool; returns the jobs lost to a dead worker."""
    lost = []
    with ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=mp_context) as pool:
        futures: dict[Future, tuple] = {pool.submit(prepare_one, str(j[0]), str(j[3]), timeout_s): j for j in jobs}
        for future in as_completed(futures):
            try:
                on_done(futures[future], *future.result())
            except BrokenProcessPool:
                lost.append(futures[future])
    return lost


def prepare_folder(src: str | Path, out: str | Path, workers: int = 2, timeout_s: float | None = DEFAULT_TIMEOUT_S,
                   progress: bool = True, mp_context: BaseContext | None = None) -> PrepareSummary:
    """Prepare every mmCIF file under ``src`` into ``out`` (see the module docstring) and return a summary.

    ``workers`` processes (started by ``mp_context``, default the platform's) parse the files that are new or
    changed; a file that kills its worker (a crash in native code, or the hard timeout) is retried alone and then
    listed as skipped.

    Raises:
        FileNotFoundError: ``src`` is not a folder or holds no mmCIF file.
    """
    src, out = Path(src), Path(out)
    if not src.is_dir():
        raise FileNotFoundError(f"{src}: not a folder of mmCIF files")
    sources = find_sources(src)
    if not sources:
        raise FileNotFoundError(f"{src}: no mmCIF files ({', '.join('*' + s for s in MMCIF_SUFFIXES)})")
    (out / STRUCTURES).mkdir(parents=True, exist_ok=True)
    summary = PrepareSummary(out=out)
    previous = {(r.source, r.sha256): r for r in _previous_entries(out)}
    previous_skips = {(Path(r.file).name, r.sha256): r for r in read_skipped(out) if r.sha256}

    jobs, seen = [], {}
    for path in sources:
        key = entry_id(path)
        if key in seen:
            summary.skipped.append(SkippedRow(str(path), f"duplicate id {key!r} (also {seen[key]})"))
            continue
        seen[key] = path
        sha = file_sha256(path)
        npz_rel = f"{STRUCTURES}/{key}.{sha[:16]}.npz"
        old = previous.get((path.name, sha))
        if old is not None and old.id == key and (out / old.npz).is_file():
            summary.entries.append(old)
            summary.cached += 1
        elif (path.name, sha) in previous_skips:
            summary.skipped.append(SkippedRow(str(path), previous_skips[(path.name, sha)].reason, sha))
            summary.cached += 1
        else:
            jobs.append((path, key, sha, out / npz_rel))

    bar = tqdm(total=len(sources), initial=len(sources) - len(jobs), desc=f"prepare {src}", unit="file",
               disable=not progress, file=sys.stderr)

    def on_done(job, status, payload):
        path, key, sha, npz = job
        summary.parsed += 1
        if status == "ok":
            summary.entries.append(ManifestRow(id=key, npz=str(npz.relative_to(out)), source=path.name, sha256=sha,
                                               **payload))
        else:
            summary.skipped.append(SkippedRow(str(path), payload, sha if status == "bad" else ""))
        bar.update(1)

    if jobs:
        lost = _run_pool(jobs, max(1, workers), timeout_s, on_done, mp_context)
        for job in lost:                  # one of these killed its worker: retry each alone to find which
            if _run_pool([job], 1, timeout_s, on_done, mp_context):
                bar.update(1)
                summary.skipped.append(SkippedRow(str(job[0]), "worker process died while parsing (a crash in "
                                                               "native code, or the hard timeout)"))
    bar.close()

    summary.entries.sort(key=lambda r: r.id)
    summary.skipped.sort(key=lambda r: r.file)
    write_tsv(summary.manifest, summary.entries, ManifestRow)
    write_tsv(summary.skipped_file, summary.skipped, SkippedRow)
    _remove_stale(out, {r.npz for r in summary.entries})
    return summary


def _previous_entries(out: Path) -> list[ManifestRow]:
    """The manifest of an earlier run, or nothing when there is none (or it cannot be read)."""
    try:
        return read_manifest(out)
    except (FileNotFoundError, KeyError, ValueError):
        return []


def _remove_stale(out: Path, keep: set[str]) -> None:
    """Remove cached structures no entry points to any more (a changed or removed source)."""
    for path in (out / STRUCTURES).glob("*.npz"):
        if f"{STRUCTURES}/{path.name}" not in keep:
            path.unlink(missing_ok=True)


def prepare_data(cfg: DataConfig, workers: int | None = None, progress: bool = True) -> Path:
    """The prepared folder of a run (docs/design.md, Data): ``cfg.root`` prepared into ``cfg.cache_dir``, after
    fetching the offline package's entries into an empty ``cfg.root`` when ``cfg.offline_package`` is set and
    ``cfg.root`` is the default folder (any other empty folder is more likely a mistyped path than a wish); a
    ``cfg.root`` that is itself a prepared folder (``manifest.tsv``, no mmCIF files) is used as it is. Under DDP call
    it on one process and let the others wait (a barrier) before they build their loaders.

    Raises:
        FileNotFoundError: ``cfg.root`` has no mmCIF files, and ``cfg.offline_package`` is off or ``cfg.root`` is
            not the default folder.
        ValueError: no file in ``cfg.root`` gives a usable entry.
    """
    root, cache = Path(cfg.root), Path(cfg.cache_dir)
    has_sources = root.is_dir() and bool(find_sources(root))
    if not has_sources and (root / "manifest.tsv").is_file():
        return root
    if not has_sources:
        if not cfg.offline_package:
            raise FileNotFoundError(f"data.root {root}: no mmCIF files; fetch some (python -m mini_of3.data.fetch "
                                    f"--ids data/pdb_ids.txt --out {root}) or set data.offline_package=true")
        if root != Path(DEFAULT_DATA_ROOT):
            raise FileNotFoundError(f"data.root {root}: no mmCIF files there (a mistyped path?); the demonstration "
                                    f"entries are downloaded only into the default data.root {DEFAULT_DATA_ROOT}; "
                                    f"fetch entries into {root} with python -m mini_of3.data.fetch --out {root}")
        ensure_offline_entries(root, progress=progress)
    summary = prepare_folder(root, cache, workers=max(1, cfg.num_workers if workers is None else workers),
                             timeout_s=cfg.parse_timeout_s, progress=progress)
    if not summary.entries:
        raise ValueError(f"data.root {root}: no usable entry (reasons in {summary.skipped_file})")
    return cache


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mini_of3.data.prepare", description=__doc__.splitlines()[0])
    parser.add_argument("src", help="folder of mmCIF files (.cif, .cif.gz), searched at any depth")
    parser.add_argument("out", help="prepared folder: structures/*.npz, manifest.tsv, skipped.tsv")
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds allowed per file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    try:
        summary = prepare_folder(args.src, args.out, workers=args.workers, timeout_s=args.timeout,
                                 progress=not args.quiet)
    except OSError as err:             # no such folder, no mmCIF files in it, OUT not writable
        print(f"prepare: {err}", file=sys.stderr)
        return 2
    for row in summary.skipped:
        print(f"skipped {row.file}: {row.reason.removeprefix(row.file + ': ')}", file=sys.stderr)
    tokens = sum(r.tokens for r in summary.entries)
    print(f"prepared {len(summary.entries)} entries ({tokens} tokens; {summary.parsed} parsed, {summary.cached} "
          f"cached), skipped {len(summary.skipped)} -> {summary.manifest}, {summary.skipped_file}")
    if not summary.entries:
        print(f"prepare: no usable entry in {args.src} (reasons in {summary.skipped_file})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
