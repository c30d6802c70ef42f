"""Get mmCIF entries into a folder as ``<ID>.cif.gz``: from RCSB over HTTPS (default), a local mirror folder or any
HTTP(S) base URL. The offline source (a PyPI package's entries) builds on this module in offline.py; the command
line is ``python -m mini_of3.data.fetch`` (fetch.py).

Every file is verified (complete gzip, parses as mmCIF) and written atomically (temporary file + rename); a complete
file already there is kept, so a run can be repeated to resume. Downloads are retried with back-off; one line per
failed id.
"""
from __future__ import annotations

import gzip
import re
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from .atomic import atomic_path
from .mmcif import parse_block, read_mmcif_text
from .structure import MmcifError

RCSB_URL = "https://files.rcsb.org/download/{ID}.cif.gz"
PDB_ID = re.compile(r"^(?:[0-9][A-Z0-9]{3}|PDB_[0-9A-Z]{8})$")


class FetchError(RuntimeError):
    """A source that cannot give an entry; the message names the id (or the package) and the reason."""


@dataclass
class FetchResult:
    out: Path
    fetched: list[Path] = field(default_factory=list)      # written in this run
    present: list[Path] = field(default_factory=list)      # complete files already there
    failed: list[tuple[str, str]] = field(default_factory=list)   # (id, reason)

    @property
    def ok(self) -> list[Path]:
        return sorted(self.fetched + self.present)

    def summary(self) -> str:
        return (f"fetched {len(self.fetched)}, already present {len(self.present)}, failed {len(self.failed)} "
                f"-> {self.out}")


# ----------------------------------------------------------------------------------------------------------------
# ids, verification, atomic writes


def normalize_id(raw: str) -> str:
    """``1abc`` -> ``1ABC``; FetchError for something that is not a PDB id (4 characters, or ``pdb_`` + 8)."""
    pdb_id = raw.strip().upper()
    if not PDB_ID.match(pdb_id):
        raise FetchError(f"{raw!r}: not a PDB id (expected 4 characters like 1ABC, or PDB_0000 + 4)")
    return pdb_id


def read_id_file(path: str | Path) -> list[str]:
    """PDB ids from a text file: whitespace- or comma-separated, ``#`` starts a comment."""
    ids = []
    for line in Path(path).read_text().splitlines():
        ids += [token for token in re.split(r"[\s,]+", line.split("#", 1)[0]) if token]
    return ids


def verify_entry(path: str | Path) -> None:
    """Raise MmcifError unless ``path`` is complete (gzip stream intact) and parses as mmCIF."""
    parse_block(read_mmcif_text(path), path)


def is_complete(path: Path) -> bool:
    try:
        verify_entry(path)
        return True
    except MmcifError:
        return False


def install(data: bytes, dest: Path) -> None:
    """Write ``data`` (gzip bytes) to ``dest`` atomically, after verifying it; MmcifError when it is broken."""
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)
        verify_entry(tmp)


def _as_gzip(data: bytes) -> bytes:
    return data if data[:2] == b"\x1f\x8b" else gzip.compress(data, mtime=0)


# ----------------------------------------------------------------------------------------------------------------
# sources


def _url_for(template: str, pdb_id: str) -> str:
    """``template`` with ``{ID}``/``{id}``/``{mid}`` filled (wwPDB's divided layout uses ``{mid}/{id}.cif.gz``), or a
    base URL to which ``/<ID>.cif.gz`` is added."""
    if "{" in template:
        return template.format(ID=pdb_id, id=pdb_id.lower(), mid=pdb_id.lower()[1:3])
    return f"{template.rstrip('/')}/{pdb_id}.cif.gz"


def _http_get(url: str, timeout_s: float) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "mini_of3-fetch"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return response.read()


def fetch_url(pdb_id: str, url: str, dest: Path, retries: int = 3, backoff_s: float = 1.0,
              timeout_s: float = 60.0) -> None:
    """Download ``url`` to ``dest``, retrying network errors, server errors and broken transfers with exponential
    back-off; FetchError naming the id after the last attempt (at once for HTTP 4xx: the entry is not there)."""
    reason = "no attempt"
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        try:
            install(_as_gzip(_http_get(url, timeout_s)), dest)
            return
        except urllib.error.HTTPError as err:
            reason = f"HTTP {err.code} {err.reason} for {url}"
            if 400 <= err.code < 500 and err.code not in (408, 429):
                break
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as err:
            reason = f"{getattr(err, 'reason', err)} for {url}"
        except MmcifError as err:
            reason = f"downloaded file is broken: {str(err).split(': ', 1)[-1]}"
    raise FetchError(f"{pdb_id}: {reason}")


def mirror_candidates(folder: Path, pdb_id: str) -> list[Path]:
    """Where a mirror folder may hold an entry: flat (``1ABC.cif.gz``, ``1abc.cif``...) or wwPDB's divided layout
    (``ab/1abc.cif.gz``)."""
    names = [f"{i}{s}" for i in (pdb_id, pdb_id.lower()) for s in (".cif.gz", ".cif", ".mmcif.gz", ".mmcif")]
    mid = pdb_id.lower()[1:3]
    return [folder / n for n in names] + [folder / mid / n for n in names]


def fetch_folder(pdb_id: str, folder: Path, dest: Path) -> None:
    """Copy an entry from a mirror folder (gzipping a plain ``.cif``); FetchError when it is absent or broken."""
    for candidate in mirror_candidates(folder, pdb_id):
        if candidate.is_file():
            try:
                install(_as_gzip(candidate.read_bytes()), dest)
                return
            except MmcifError as err:
                raise FetchError(f"{pdb_id}: mirror file {candidate} is broken: {str(err).split(': ', 1)[-1]}") \
                    from None
    raise FetchError(f"{pdb_id}: not in mirror folder {folder}")


def fetch_ids(ids: list[str], out: str | Path, mirror: str | None = None, *, retries: int = 3,
              backoff_s: float = 1.0, timeout_s: float = 60.0, jobs: int = 4, progress: bool = True) -> FetchResult:
    """Fetch PDB entries into ``out`` as ``<ID>.cif.gz``: from RCSB, or ``mirror`` (a folder, an HTTP(S) base URL,
    or a URL template with ``{ID}``, ``{id}``, ``{mid}``). Complete files already in ``out`` are kept."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = FetchResult(out=out)
    wanted: list[str] = []
    for raw in ids:
        try:
            pdb_id = normalize_id(raw)
        except FetchError as err:
            result.failed.append((raw, str(err)))
            print(f"failed {err}", file=sys.stderr)
            continue
        if pdb_id not in wanted:
            wanted.append(pdb_id)
    is_url = mirror is not None and re.match(r"^https?://", mirror) is not None
    if mirror is not None and not is_url and not Path(mirror).is_dir():
        raise FetchError(f"--mirror {mirror}: neither a folder nor an http(s) URL")

    def one(pdb_id: str) -> tuple[str, str | None, bool]:
        dest = out / f"{pdb_id}.cif.gz"
        if dest.is_file() and is_complete(dest):
            return pdb_id, None, False
        try:
            if mirror is None or is_url:
                fetch_url(pdb_id, _url_for(mirror or RCSB_URL, pdb_id), dest, retries, backoff_s, timeout_s)
            else:
                fetch_folder(pdb_id, Path(mirror), dest)
        except FetchError as err:
            return pdb_id, str(err), False
        return pdb_id, None, True

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool, \
            tqdm(total=len(wanted), desc="fetch", unit="entry", disable=not progress, file=sys.stderr) as bar:
        for pdb_id, error, new in pool.map(one, wanted):
            dest = out / f"{pdb_id}.cif.gz"
            if error is not None:
                result.failed.append((pdb_id, error))
                tqdm.write(f"failed {error}", file=sys.stderr)
            else:
                (result.fetched if new else result.present).append(dest)
            bar.update(1)
    return result
