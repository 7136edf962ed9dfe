"""No silent waits: a step that runs past about a second (a plan search, a hub lookup, `--lengths` over a large
dataset, a trace) says what it is doing on stderr, with the seconds spent, and wipes the line when it ends.

Only when stderr is a terminal and the output is not --json: a pipe, a log file and a JSON reader get nothing but
the result."""
from __future__ import annotations

import sys
import threading
import time

DELAY_S = 1.0  # waits shorter than this print nothing
EVERY_S = 0.5  # how often the seconds are redrawn


class Progress:
    """`with Progress("searching ..."):` around a step that may be slow. `stream` (default sys.stderr at entry) is
    injectable for tests; `quiet` (the command's --json) turns it off."""

    def __init__(self, message: str, stream=None, quiet: bool = False, delay: float | None = None):
        self.message, self.stream, self.quiet = message, stream, quiet
        self.delay = DELAY_S if delay is None else delay
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False

    def __enter__(self) -> Progress:
        self.stream = self.stream or sys.stderr
        if not self.quiet and _is_terminal(self.stream):
            self._start = time.monotonic()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        if self._done.wait(self.delay):
            return
        while True:
            self._shown = True
            self.stream.write(f"\r{self.message} ... {time.monotonic() - self._start:.0f} s\x1b[K")
            self.stream.flush()
            if self._done.wait(EVERY_S):
                return

    def __exit__(self, *exc) -> None:
        if self._thread is None:
            return
        self._done.set()
        self._thread.join()
        if self._shown:  # wipe the line: what follows on stderr (an error, a "wrote" line) starts clean
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or foreign stream
        return False


def progress(message: str, args=None) -> Progress:
    """A Progress for a command: quiet under its --json."""
    return Progress(message, quiet=bool(getattr(args, "json", False)))
