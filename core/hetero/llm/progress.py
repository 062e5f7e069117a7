"""A small progress bar on stderr (no dependency): redraws in place on a terminal, prints sparse lines elsewhere."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, label: str, total: int, *, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.label, self.total, self.done = label, max(int(total), 1), 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.perf_counter()
        self._last_pct = -1

    def update(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.done + n, self.total)
        if not self.enabled:
            return
        pct = 100 * self.done // self.total
        if not self.tty and pct // 25 == self._last_pct // 25 and self.done < self.total:
            return  # on a pipe or a log, one line per quarter is plenty
        self._last_pct = pct
        width = 30
        filled = width * self.done // self.total
        bar = "#" * filled + "." * (width - filled)
        line = f"{self.label} [{bar}] {pct:3d}% {time.perf_counter() - self.started:5.1f}s {note}".rstrip()
        self.stream.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
