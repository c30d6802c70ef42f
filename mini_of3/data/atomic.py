"""Atomic file writes: a half-written file is never left where a reader may find it."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_path(dest: str | Path) -> Iterator[Path]:
    """A temporary path beside ``dest``, renamed onto ``dest`` when the block ends normally and removed otherwise."""
    dest = Path(dest)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
