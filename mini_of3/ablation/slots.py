"""At most ``k`` processes at once in a section (the whole-entry scoring of arms training side by side on one GPU,
where each reserves up to ~19 GiB at the largest entry and they all finish training together): ``k`` lock files,
one held per process inside the section (``fcntl.flock``, released by the kernel even when a process dies)."""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

SLOTS_ENV = "MINI_OF3_SCORING_SLOTS"       # k; unset or 0: no limit
SLOT_DIR_ENV = "MINI_OF3_SLOT_DIR"
DEFAULT_SLOT_DIR = "/tmp/mini_of3_scoring_slots"


@contextlib.contextmanager
def slot(slots: int | None = None, folder: str | Path | None = None, poll_s: float = 0.5):
    """Hold one of ``slots`` (default: ``$MINI_OF3_SCORING_SLOTS``) lock files in ``folder`` (default
    ``$MINI_OF3_SLOT_DIR`` or /tmp/mini_of3_scoring_slots) for the ``with`` block; waits while all are held.
    Yields the slot's index, or None without a limit."""
    slots = int(os.environ.get(SLOTS_ENV, "0") or 0) if slots is None else slots
    if slots <= 0:
        yield None
        return
    folder = Path(folder or os.environ.get(SLOT_DIR_ENV, DEFAULT_SLOT_DIR))
    folder.mkdir(parents=True, exist_ok=True)
    while True:
        for index in range(slots):
            handle = open(folder / f"slot{index}.lock", "w")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            try:
                yield index
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
                handle.close()
            return
        time.sleep(poll_s)
