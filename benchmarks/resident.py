"""Resident worker processes that take turns, for paired measurements on a shared machine: both arms stay loaded
and run one short turn each, in an order that alternates round by round, so both meet the same neighbours and the
same memory phase of the VM within seconds of each other. Used by ``benchmarks/decode_ab.py`` (two builds of hetero)
and ``benchmarks/llm.py --pairs`` (hetero and llama.cpp).

The protocol: a worker prints one line starting with ``ready`` once it is loaded (the rest of the line is its
payload), then answers each line of its stdin with one line on its stdout, and exits when its stdin closes. A worker
that exits, or does not answer within the timeout, raises ``WorkerError`` naming it, with its exit status and the
tail of its stderr; the parent never waits on it without a limit.
"""

from __future__ import annotations

import contextlib
import queue
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from types import TracebackType


class WorkerError(RuntimeError):
    """A resident worker died, did not get ready, or did not answer in time."""


def turn_order(round_index: int) -> tuple[int, int]:
    """Which of the two arms goes first in a round: arm 0 in even rounds, arm 1 in odd ones (a drift during a round
    then favours each arm equally often)."""
    return (0, 1) if round_index % 2 == 0 else (1, 0)


class Resident:
    """One worker process, loaded and waiting for requests (see the module doc for the protocol)."""

    def __init__(self, name: str, cmd: Sequence[str], env: Mapping[str, str] | None = None,
                 ready_timeout: float | None = None) -> None:
        self.name = name
        # a file, not a pipe: a chatty worker cannot block on it; closed by close()
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self.proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     text=True, env=None if env is None else dict(env))
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        try:
            self.ready = self._wait_ready(ready_timeout)
        except WorkerError:
            self.close()
            raise

    def _read_stdout(self) -> None:
        """Stdout lines into a queue (a blocking readline would hang the parent on a silent worker); None at EOF."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _stderr_tail(self, lines: int = 3) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        tail = [ln for ln in self._stderr.read().strip().splitlines() if ln.strip()][-lines:]
        return (": " + " | ".join(tail)) if tail else ""

    def _next_line(self, timeout: float | None, waiting_for: str) -> str:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self.proc.kill()
            self.proc.wait()
            raise WorkerError(f"{self.name} worker: no answer to {waiting_for} within {timeout:.0f} s (killed)"
                              f"{self._stderr_tail()}") from None
        if line is None:
            code = self.proc.wait()
            raise WorkerError(f"{self.name} worker exited (status {code}) waiting for {waiting_for}"
                              f"{self._stderr_tail()}")
        return line

    def _wait_ready(self, timeout: float | None) -> str:
        """The payload of the ready line (other lines before it, e.g. a library's banner, are skipped)."""
        while True:
            line = self._next_line(timeout, "its ready line")
            if line.startswith("ready"):
                return line[len("ready"):].strip()

    def ask(self, request: str, timeout: float | None = None) -> str:
        """Send one request line; its one-line answer."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(request + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            code = self.proc.wait()
            raise WorkerError(f"{self.name} worker exited (status {code}) before {request!r}"
                              f"{self._stderr_tail()}") from None
        return self._next_line(timeout, repr(request))

    def close(self, timeout: float = 30) -> int:
        """Close its stdin (it exits), kill it if it has not after ``timeout`` s; its exit status."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):  # it died: nothing left to tell it
                self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._stderr.close()
        return code

    def __enter__(self) -> Resident:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
