"""SIGINT and SIGTERM end a run at a safe point, with a checkpoint, instead of killing it mid-write.

The first signal sets :attr:`StopRequest.signal`; the loop checks it between steps (all ranks agree through the
step's reduction). Inside a stretch marked :meth:`abortable` (a single process's forward and backward, before the
weights change) the handler also raises :class:`Interrupted`, so a long step need not finish: the trainer then
saves the state from before the step. A second Ctrl-C quits at once (KeyboardInterrupt).

A scheduler (SLURM, Kubernetes, ``timeout``) and Ctrl-C signal every process of the job, the data loader's workers
included. The workers ignore both signals (``mini_of3.data.dataset._worker_init``); one that dies all the same (the
signal came before its set-up ran, or something else killed it) is part of the stop: torch's SIGCHLD handler raises
its RuntimeError wherever the main thread is, so once a stop is requested that error is dropped at the handler
(:meth:`StopRequest._tolerate_worker_deaths`), and the trainer treats the loader's own report of a dead worker
(:func:`is_worker_death`) like :class:`Interrupted`.
"""
from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from typing import Iterator


class Interrupted(Exception):
    """Raised inside an abortable stretch when a stop signal arrives."""


def is_worker_death(err: BaseException) -> bool:
    """Whether ``err`` is torch's report that a DataLoader worker process died (killed by a signal, or exited with
    an error): ``DataLoader worker (pid 802) is killed by signal: Terminated.`` from its SIGCHLD handler, or
    ``DataLoader worker (pid(s) 802) exited unexpectedly`` from the loader."""
    return isinstance(err, RuntimeError) and str(err).startswith("DataLoader worker (pid")


class StopRequest:
    """Installs the handlers while active (``with StopRequest(...):``) and restores the previous ones after."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, announce: bool = True) -> None:
        self.announce = announce
        self.signal: str | None = None
        self.worker_deaths: list[str] = []          # loader workers that died during the stop (torch's messages)
        self._abortable = False
        self._previous: dict = {}
        self._pid: int | None = None                # the process that installed the handlers

    def __enter__(self) -> "StopRequest":
        self._pid = os.getpid()
        self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def request(self, reason: str) -> None:
        """A stop asked for by other means (e.g. another rank's signal)."""
        if self.signal is None:
            self._tolerate_worker_deaths()
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
        if os.getpid() != self._pid:     # a forked loader worker before its set-up ignores the signal: not its call
            return
        first = self.signal is None
        self.signal = self.signal or signal.Signals(signum).name     # the first: a launcher may add a SIGTERM
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)     # a second Ctrl-C quits at once
        if first:
            self._tolerate_worker_deaths()
        if first and self.announce:
            again = " (Ctrl-C again to quit without one)" if signum == signal.SIGINT else ""
            print(f"\n{self.signal}: stopping at a safe point and saving a checkpoint{again}", file=sys.stderr,
                  flush=True)
        if self._abortable:
            self._abortable = False
            raise Interrupted()

    def _tolerate_worker_deaths(self) -> None:
        """Wrap the SIGCHLD handler (torch installs one when a loader starts workers) so that the RuntimeError it
        raises for a dead worker is recorded in :attr:`worker_deaths` instead of cutting the stop short, e.g. in the
        optimizer step or the checkpoint write; other errors pass. Restored by ``__exit__``."""
        previous = signal.getsignal(signal.SIGCHLD)
        if not callable(previous):       # no loader workers were started: no handler raises
            return

        def handler(signum: int, frame) -> None:
            try:
                previous(signum, frame)
            except RuntimeError as err:
                if not is_worker_death(err):
                    raise
                self.worker_deaths.append(str(err).strip())

        self._previous.setdefault(signal.SIGCHLD, previous)
        signal.signal(signal.SIGCHLD, handler)
