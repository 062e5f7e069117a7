"""Running fuzz cases in a child process, so that a crash (a native fault, an abort), a hang or a memory bomb is a
finding, not the end of the test run.

``ChildRunner("package.module:function")`` starts one worker process that imports the target once and calls it
with each case's bytes, so a case costs a pipe round trip, not a process start. The target returns normally for a
case handled well (a result, or a ``HeteroError``: a clear refusal) and raises anything else. When a case kills the
worker or runs past ``timeout`` the worker is restarted for the next one. Each case ends as an ``Outcome``:

- ``ok`` / ``refused``: the target returned, or raised a ``HeteroError`` (its message is kept);
- ``raised``: any other exception, ``BaseException`` included (``MemoryError``, tokenizers' ``PanicException``):
  type, message and the traceback's tail;
- ``crashed``: the worker died (the signal or exit status, and the tail of its stderr);
- ``hung``: no answer within ``timeout`` seconds (a hang or a runaway loop).

The worker runs under an address-space limit (``memory_mb``, RLIMIT_AS; not under AddressSanitizer, whose shadow
memory needs the address space), so a memory bomb ends as ``raised:
MemoryError`` (or a crash) instead of a machine-wide swap storm. Its start-up (imports: seconds on a busy machine)
does not count in a case's time. The child sees the parent's ``sys.path``, so targets may live in a test folder::

    with ChildRunner("hetero.testing.onnx_fuzz:run_case", timeout=60) as runner:
        outcome = runner.run(data)
        assert not outcome.bad, outcome
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from hetero.contract.vendor_worker import LEN as _LEN
from hetero.contract.vendor_worker import exit_text, kill_process_group, stop_worker
from hetero.contract.vendor_worker import read_frame as _read_frame

BAD_KINDS = ("raised", "crashed", "hung")
STARTUP_TIMEOUT = 300.0  # seconds for a worker to import its target


@dataclass(frozen=True)
class Outcome:
    kind: str  # ok | refused | raised | crashed | hung
    detail: str = ""
    seconds: float = 0.0

    @property
    def bad(self) -> bool:
        """Anything but a return or a HeteroError: a finding."""
        return self.kind in BAD_KINDS

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.detail else self.kind


class ChildRunner:
    """A worker process calling ``target`` (``"module:function"``, taking bytes) on each case."""

    def __init__(self, target: str, *, timeout: float = 30.0, memory_mb: int | None = 4096,
                 env: dict[str, str] | None = None) -> None:
        self.target = target
        self.timeout = timeout
        self.memory_mb = memory_mb  # None: no limit
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0  # workers lost to a crash or a hang
        self._stderr: IO[bytes] | None = None

    def __enter__(self) -> ChildRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, case: bytes) -> Outcome:
        proc = self.proc if self.proc is not None and self.proc.poll() is None else self._start()
        assert proc.stdin is not None and proc.stdout is not None
        start = time.monotonic()
        try:
            proc.stdin.write(_LEN.pack(len(case)) + case)
            proc.stdin.flush()
        except OSError:  # BrokenPipeError: it died between cases
            return self._died(start)
        try:
            reply = _read_frame(proc.stdout.fileno(), start + self.timeout)
        except EOFError:
            return self._died(start)
        if reply is None:
            self._kill()
            self.restarts += 1
            return Outcome("hung", f"no answer within {self.timeout:g} s", time.monotonic() - start)
        kind, detail = json.loads(reply)
        return Outcome(kind, detail, time.monotonic() - start)

    def close(self) -> None:
        if self.proc is not None:
            stop_worker(self.proc, timeout=5)
        self.proc = None
        self._close_stderr()

    def _start(self) -> subprocess.Popen[bytes]:
        self._close_stderr()
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - kept open for the worker, closed with it
        args = [sys.executable, "-c", "from hetero.testing.fuzz import _worker; _worker()", self.target,
                str(self.memory_mb or 0)]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     env=self.env, start_new_session=True)
        assert self.proc.stdout is not None
        try:  # the worker says when the target is imported: its start-up is not a case's time
            ready = _read_frame(self.proc.stdout.fileno(), time.monotonic() + STARTUP_TIMEOUT)
        except EOFError:
            ready = None
        if ready != b"ready":
            tail = self._stderr_tail()
            self._kill()
            raise RuntimeError(f"the fuzz worker for {self.target} did not start: {tail}")
        return self.proc

    def _died(self, start: float) -> Outcome:
        assert self.proc is not None
        code = self.proc.wait()
        detail = f"the worker died ({exit_text(code)}): {self._stderr_tail()}"
        self.proc = None
        self.restarts += 1
        return Outcome("crashed", detail, time.monotonic() - start)

    def _kill(self) -> None:
        if self.proc is not None:
            kill_process_group(self.proc)
            self.proc = None

    def _stderr_tail(self, limit: int = 2000) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(self._stderr.tell() - limit, 0))
        return self._stderr.read().decode("utf-8", errors="replace").strip()

    def _close_stderr(self) -> None:
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def selftest_target(case: bytes) -> None:
    """A target for testing runners: b"crash" faults natively, b"hang" never returns, b"raise" raises KeyError,
    b"bomb" asks for 1 TiB; anything else returns."""
    if case == b"crash":
        import ctypes

        ctypes.string_at(0)  # reads address 0: SIGSEGV
    elif case == b"hang":
        while True:
            time.sleep(1)
    elif case == b"raise":
        raise KeyError("selftest")
    elif case == b"bomb":
        bytearray(1 << 40)


def _classify(target: Callable[[bytes], Any], case: bytes) -> tuple[str, str]:
    from hetero.contract.errors import HeteroError

    try:
        target(case)
    except HeteroError as exc:
        return "refused", str(exc)[:500]
    except BaseException as exc:  # every other exception is the finding
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return "raised", f"{type(exc).__name__}: {str(exc)[:500]}\n{traceback.format_exc(limit=-8)}"
    return "ok", ""


def _worker() -> None:
    """The child's loop: read a case, run the target, answer [kind, detail]; stdout carries only frames."""
    module_name, _, function = sys.argv[1].partition(":")
    memory_mb = int(sys.argv[2])
    # Under AddressSanitizer (.ci/sanitizers preloads libasan) the process reserves terabytes of shadow address
    # space at start: an address-space limit would stop it from starting, so the sanitizer's own checks stand in.
    if memory_mb and "libasan" not in os.environ.get("LD_PRELOAD", ""):
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    channel_in, channel_out = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever the target prints goes to stderr, not into the frames
    target = getattr(importlib.import_module(module_name), function)
    channel_out.write(_LEN.pack(5) + b"ready")
    channel_out.flush()
    while True:
        head = channel_in.read(_LEN.size)
        if len(head) < _LEN.size:
            return
        case = channel_in.read(_LEN.unpack(head)[0])
        reply = json.dumps(_classify(target, case)).encode()
        channel_out.write(_LEN.pack(len(reply)) + reply)
        channel_out.flush()
