"""Progress of a replay on stderr: a bar on a terminal, or lines with ``--progress``."""

from __future__ import annotations

import time
from typing import TextIO


class ProgressLines:
    """One line per `step` (fraction) of a run on any stream: ``binpack: 30 % (4.1 s)``."""

    def __init__(self, stream: TextIO, label: str, step: float = 0.1) -> None:
        self.stream, self.label, self.step = stream, label, step
        self.next = step
        self.started = time.monotonic()

    def __call__(self, done: float) -> None:
        if done + 1e-9 < self.next:
            return
        while self.next <= done + 1e-9:
            self.next += self.step
        self.stream.write(
            f"{self.label}: {min(done, 1.0) * 100:.0f} % ({time.monotonic() - self.started:.1f} s)\n"
        )
        self.stream.flush()

    def close(self) -> None:
        pass


class ProgressBar:
    """A one-line bar on a terminal (`stream` must be a TTY; callers check)."""

    def __init__(self, stream: TextIO, label: str, width: int = 30) -> None:
        self.stream, self.label, self.width = stream, label, width
        self.last = -1.0
        self.started = time.monotonic()

    def __call__(self, done: float) -> None:
        if done - self.last < 0.005 and done < 1.0:
            return
        self.last = done
        fill = int(done * self.width)
        bar = "#" * fill + "-" * (self.width - fill)
        self.stream.write(
            f"\r{self.label:<18} [{bar}] {done * 100:5.1f}%  {time.monotonic() - self.started:5.1f}s"
        )
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\r" + " " * (self.width + 48) + "\r")
        self.stream.flush()


__all__ = ("ProgressBar", "ProgressLines")
