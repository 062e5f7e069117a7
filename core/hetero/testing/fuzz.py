"""Running fuzz cases in a child process, so that a crash (a native fault, an abort) or a hang is a finding, not the
end of the test run.

``ChildRunner("package.module:function")`` starts one worker process that imports the target and calls it with each
case's bytes; the target returns normally for a case handled well (a result, or a ``HeteroError``: a clear refusal)
and raises anything else. The worker outlives many cases (importing numpy, onnx and the backends once); when a case
kills it or runs past ``timeout`` it is restarted for the next one. Each case ends as an ``Outcome``:

- ``ok`` / ``refused``: the target returned, or raised a ``HeteroError`` (its message is kept);
- ``raised``: any other exception (type, message and traceback) — a bug;
- ``crashed``: the worker died (the signal or exit status, and the tail of its stderr);
- ``hung``: no answer within ``timeout`` seconds.

The worker's address space can be bounded (``memory_bytes``, RLIMIT_DATA) so that a memory bomb becomes a
``MemoryError`` (a ``raised`` finding) instead of a machine-wide swap storm.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

BAD_KINDS = ("raised", "crashed", "hung")
STARTUP_TIMEOUT = 300.0  # seconds for a worker to import its target


@dataclass(frozen=True)
class Outcome:
    kind: str  # ok | refused | raised | crashed | hung
    detail: str = ""
    seconds: float = 0.0

    @property
    def bad(self) -> bool:
        return self.kind in BAD_KINDS

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


def _write_frame(stream: IO[bytes], payload: bytes) -> None:
    stream.write(struct.pack("<Q", len(payload)))
    stream.write(payload)
    stream.flush()


def _read_exact(stream: IO[bytes], n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = stream.read(n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_frame(stream: IO[bytes]) -> bytes | None:
    header = _read_exact(stream, 8)
    if header is None:
        return None
    return _read_exact(stream, struct.unpack("<Q", header)[0])


def _pipes(proc: subprocess.Popen[bytes]) -> tuple[IO[bytes], IO[bytes]]:
    """The worker's stdin and stdout (both PIPE, so never None)."""
    if proc.stdin is None or proc.stdout is None:
        raise RuntimeError("the fuzz worker was started without its pipes")
    return proc.stdin, proc.stdout


class ChildRunner:
    """A worker process calling ``target`` (``"module:function"``, taking bytes) on each case."""

    def __init__(self, target: str, timeout: float = 30.0, memory_bytes: int | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.target = target
        self.timeout = timeout
        self.memory_bytes = memory_bytes
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None
        self.restarts = 0

    def __enter__(self) -> ChildRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> subprocess.Popen[bytes]:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - kept open for the worker, closed with it
        args = [sys.executable, "-c", "from hetero.testing.fuzz import _worker; _worker()", self.target,
                str(self.memory_bytes or 0)]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     env=self.env, start_new_session=True)
        # The worker says when the target is imported: its start-up (seconds on a busy machine) is not a case's time.
        _, stdout = _pipes(self.proc)
        ready, _, _ = select.select([stdout], [], [], STARTUP_TIMEOUT)
        if not ready or _read_frame(stdout) != b"ready":
            tail = self._stderr_tail()
            self._kill()
            raise RuntimeError(f"the fuzz worker for {self.target} did not start: {tail}")
        return self.proc

    def _stderr_tail(self, limit: int = 2000) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        size = self._stderr.tell()
        self._stderr.seek(max(size - limit, 0))
        return self._stderr.read().decode("utf-8", errors="replace").strip()

    def _kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # the worker and anything it started
            self.proc.wait()
            self.proc = None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(BrokenPipeError, OSError):
                _pipes(self.proc)[0].close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._kill()
        self.proc = None

    def run(self, case: bytes) -> Outcome:
        proc = self.proc if self.proc is not None and self.proc.poll() is None else self._start()
        start = time.monotonic()
        stdin, stdout = _pipes(proc)
        try:
            _write_frame(stdin, case)
        except (BrokenPipeError, OSError):
            return self._died(start)
        ready, _, _ = select.select([stdout], [], [], self.timeout)
        if not ready:
            self._kill()
            self.restarts += 1
            return Outcome("hung", f"no answer within {self.timeout:.0f} s", time.monotonic() - start)
        reply = _read_frame(stdout)
        if reply is None:
            return self._died(start)
        kind, detail = pickle.loads(reply)
        return Outcome(kind, detail, time.monotonic() - start)

    def _died(self, start: float) -> Outcome:
        assert self.proc is not None
        code = self.proc.wait()
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        detail = f"the worker died ({how}): {self._stderr_tail()}"
        self.proc = None
        self.restarts += 1
        return Outcome("crashed", detail, time.monotonic() - start)


def selftest_target(case: bytes) -> None:
    """A target for testing runners: b"crash" faults natively, b"hang" never returns, b"raise" raises KeyError,
    anything else returns."""
    if case == b"crash":
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    elif case == b"hang":
        while True:
            time.sleep(1)
    elif case == b"raise":
        raise KeyError("selftest")


def _classify(target: Callable[[bytes], Any], case: bytes) -> tuple[str, str]:
    from hetero.contract.errors import HeteroError

    try:
        target(case)
    except HeteroError as exc:
        return "refused", str(exc).splitlines()[0][:300]
    except BaseException as exc:  # every other exception is the finding
        if isinstance(exc, KeyboardInterrupt):
            raise
        return "raised", f"{type(exc).__name__}: {exc}"[:500] + "\n" + traceback.format_exc(limit=-8)
    return "ok", ""


def _worker() -> None:
    """The child's loop: read a case, run the target, answer (kind, detail); stdout carries only frames."""
    module_name, _, function = sys.argv[1].partition(":")
    memory = int(sys.argv[2])
    if memory:
        import resource

        resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
    channel_in, channel_out = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the target prints goes to stderr, not into the frames
    target = getattr(importlib.import_module(module_name), function)
    _write_frame(channel_out, b"ready")
    while True:
        case = _read_frame(channel_in)
        if case is None:
            return
        _write_frame(channel_out, pickle.dumps(_classify(target, case)))
