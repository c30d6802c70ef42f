"""SIGINT and SIGTERM end a run at a safe point, with a checkpoint, instead of killing it mid-write.

The first signal sets :attr:`StopRequest.signal`; the loop checks it between steps (all ranks agree through the
step's reduction). Inside a stretch marked :meth:`abortable` (a single process's forward and backward, before the
weights change) the handler also raises :class:`Interrupted`, so a long step need not finish: the trainer then
saves the state from before the step. A second Ctrl-C quits at once (KeyboardInterrupt).
"""
from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from typing import Iterator


class Interrupted(Exception):
    """Raised inside an abortable stretch when a stop signal arrives."""


class StopRequest:
    """Installs the handlers while active (``with StopRequest(...):``) and restores the previous ones after."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, announce: bool = True) -> None:
        self.announce = announce
        self.signal: str | None = None
        self._abortable = False
        self._previous: dict = {}

    def __enter__(self) -> "StopRequest":
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def request(self, reason: str) -> None:
        """A stop asked for by other means (e.g. another rank's signal)."""
        self.signal = self.signal or reason

    @contextmanager
    def abortable(self, allowed: bool = True) -> Iterator[None]:
        """A stretch that a signal may cut short with :class:`Interrupted` (when ``allowed``)."""
        self._abortable = allowed
        try:
            yield
        finally:
            self._abortable = False

    def _handle(self, signum: int, frame) -> None:
        first = self.signal is None
        self.signal = signal.Signals(signum).name
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)     # a second Ctrl-C quits at once
        if first and self.announce:
            again = " (Ctrl-C again to quit without one)" if signum == signal.SIGINT else ""
            print(f"\n{self.signal}: stopping at a safe point and saving a checkpoint{again}", file=sys.stderr,
                  flush=True)
        if self._abortable:
            self._abortable = False
            raise Interrupted()
