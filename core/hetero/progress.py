"""Progress on stderr for the phases that can take seconds (reading a model, repacking weights, building device
programs, the first planned run): a bar when the amount of work is known, else a status line with the time spent.

Library code reports; the command line decides what is shown (``configure``). Drawing happens on a terminal only:
piped or redirected output stays clean. ``configure(quiet=True)`` (``--quiet``) silences everything;
``configure(verbose=True)`` (``-v``) also prints one line per finished phase with its time, terminal or not.
Phases are silent until the command line turns them on, so a script that uses the library sees nothing new.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO

TICK_SECONDS = 0.1
SHOW_AFTER_SECONDS = 0.3  # a phase quicker than this never draws (no flicker on fast loads)


@dataclass
class _Settings:
    phases: bool = False  # status lines for phases (the command line turns them on)
    quiet: bool = False
    verbose: bool = False
    stream: TextIO | None = None  # None: sys.stderr at the time of writing


_settings = _Settings()
_lock = threading.RLock()
_phases: list[_Phase] = []  # innermost last
_bar_active = 0  # while a bar draws, the phase line waits
_line_drawn = False  # something is on the current terminal line that the next drawing replaces


def configure(*, phases: bool | None = None, quiet: bool | None = None, verbose: bool | None = None,
              stream: TextIO | None = None) -> None:
    """Set what is shown (only the arguments given change)."""
    if phases is not None:
        _settings.phases = phases
    if quiet is not None:
        _settings.quiet = quiet
    if verbose is not None:
        _settings.verbose = verbose
    if stream is not None:
        _settings.stream = stream


def _stream() -> TextIO:
    return _settings.stream if _settings.stream is not None else sys.stderr


def _is_tty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _draw(text: str) -> None:
    """Replace the current terminal line with ``text``."""
    global _line_drawn
    stream = _stream()
    stream.write("\r" + text + "\x1b[K")
    stream.flush()
    _line_drawn = True


def _clear() -> None:
    global _line_drawn
    if _line_drawn:
        stream = _stream()
        stream.write("\r\x1b[K")
        stream.flush()
        _line_drawn = False


def clear_line() -> None:
    """Erase a drawn status line (before printing something else to stderr, e.g. a warning)."""
    with _lock:
        _clear()


class _Phase:
    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.perf_counter()

    def text(self) -> str:
        return f"{self.label} ... {time.perf_counter() - self.started:.1f}s"


def _ticker(stop: threading.Event) -> None:
    while not stop.wait(TICK_SECONDS):
        with _lock:
            if not _phases or _bar_active:
                continue
            phase = _phases[-1]
            if time.perf_counter() - phase.started >= SHOW_AFTER_SECONDS:
                _draw(phase.text())


@contextmanager
def phase(label: str) -> Iterator[None]:
    """A named phase of work: on a terminal (when the command line turned phases on) a status line with the time
    spent, replaced by the next phase and erased at the end; with verbose, a line with its time once done."""
    if not _settings.phases or _settings.quiet:
        yield
        return
    tty = _is_tty(_stream())
    current = _Phase(label)
    stop = threading.Event()
    with _lock:
        outermost = not _phases
        _phases.append(current)
        if tty and not _bar_active:
            _draw(f"{label} ...")
    thread = threading.Thread(target=_ticker, args=(stop,), daemon=True) if tty and outermost else None
    if thread is not None:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        if thread is not None:
            thread.join()
        with _lock:
            _phases.remove(current)
            if tty:
                _clear()
                if _phases and not _bar_active:
                    _draw(_phases[-1].text())
            if _settings.verbose:
                _stream().write(f"{label}: {time.perf_counter() - current.started:.2f} s\n")
                _stream().flush()


class Progress:
    """A bar for work of known size (``update`` after each unit). Drawn in place on a terminal only, and only when
    ``enabled`` and the command line did not ask for quiet."""

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None, enabled: bool = True) -> None:
        global _bar_active
        self.label, self.total, self.done = label, max(int(total), 1), 0
        self.stream = stream
        self.started = time.perf_counter()
        out = self.stream if self.stream is not None else _stream()
        self.enabled = enabled and not _settings.quiet and _is_tty(out)
        if self.enabled:
            with _lock:
                _bar_active += 1

    def update(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.done + n, self.total)
        if not self.enabled:
            return
        width = 30
        filled = width * self.done // self.total
        bar = "#" * filled + "." * (width - filled)
        pct = 100 * self.done // self.total
        line = f"{self.label} [{bar}] {pct:3d}% {time.perf_counter() - self.started:5.1f}s {note}".rstrip()
        with _lock:
            if self.stream is None:
                _draw(line)
            else:
                self.stream.write("\r" + line + "\x1b[K")
                self.stream.flush()

    def close(self) -> None:
        global _bar_active
        if not self.enabled:
            return
        self.enabled = False
        with _lock:
            _bar_active -= 1
            if self.stream is None:
                _clear()  # the enclosing phase's line (if any) takes the place back
                if _phases and not _bar_active:
                    _draw(_phases[-1].text())
            else:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
        if _settings.verbose:
            (self.stream or _stream()).write(f"{self.label}: {time.perf_counter() - self.started:.2f} s\n")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
