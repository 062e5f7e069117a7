"""Run a parser on untrusted inputs in a child process: a crash, hang or memory bomb becomes a result.

For fuzzing front ends. ``ChildRunner("pkg.module:function")`` starts one worker process that imports the target
once and then calls ``function(data: bytes)`` for every input it is sent, so an input costs a pipe round trip, not a
process start. Each call ends as one ``Outcome``:

* ``ok``: the function returned; ``refused``: it raised a ``HeteroError`` (a clean, expected refusal);
* ``raised``: any other exception, ``BaseException`` included (``MemoryError``, tokenizers' ``PanicException``);
* ``crashed``: the worker died (a signal such as SIGSEGV / SIGBUS / SIGABRT, or an exit) — it is restarted;
* ``timeout``: no answer within ``timeout`` seconds (a hang or a runaway loop) — the worker is killed and restarted.

The worker runs under an address-space limit (``memory_mb``), so a memory bomb ends as ``raised: MemoryError`` or
a crash instead of taking the machine. The child sees the parent's ``sys.path``, so targets may live in a test
folder. Used by tests/llm/test_fuzz_llm.py; reusable for any front end (ONNX included)::

    with ChildRunner("tests_helpers:parse_onnx", timeout=5) as runner:
        outcome = runner.run(data)
        assert outcome.kind in ("ok", "refused"), outcome
"""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

_LEN = struct.Struct("<Q")
STARTUP_SECONDS = 120.0


@dataclass(frozen=True)
class Outcome:
    kind: str  # ok | refused | raised | crashed | timeout
    detail: str = ""

    @property
    def clean(self) -> bool:
        """Returned or refused with a HeteroError: what every input must end as."""
        return self.kind in ("ok", "refused")


class ChildRunner:
    def __init__(self, target: str, *, timeout: float = 10.0, memory_mb: int = 4096) -> None:
        self.target, self.timeout, self.memory_mb = target, timeout, memory_mb
        self._proc: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
            proc = subprocess.Popen(
                [sys.executable, "-m", "hetero.testing.child", self.target, str(self.memory_mb)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
            assert proc.stdout is not None
            try:  # the worker says it is ready once imports are done: they do not count in an input's time
                ready = _read_frame(proc.stdout.fileno(), time.monotonic() + STARTUP_SECONDS)
            except EOFError:
                ready = None
            if ready != b"ready":
                proc.kill()
                proc.wait()
                raise RuntimeError(f"the fuzz worker for {self.target} did not start (status {proc.returncode})")
            self._proc = proc
        return self._proc

    def run(self, data: bytes) -> Outcome:
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(_LEN.pack(len(data)) + data)
            proc.stdin.flush()
        except BrokenPipeError:
            return self._died(proc)
        try:
            reply = _read_frame(proc.stdout.fileno(), time.monotonic() + self.timeout)
        except EOFError:  # the worker died
            return self._died(proc)
        if reply is None:
            self._kill()
            return Outcome("timeout", f"no answer in {self.timeout:g} s")
        answer = json.loads(reply)
        return Outcome(answer["kind"], answer["detail"])

    def _died(self, proc: subprocess.Popen[bytes]) -> Outcome:
        code = proc.wait()
        self._proc = None
        if code < 0:
            return Outcome("crashed", f"killed by {signal.Signals(-code).name}")
        return Outcome("crashed", f"exited with status {code}")

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._kill()
        self._proc = None

    def __enter__(self) -> ChildRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_exact(fd: int, n: int, deadline: float) -> bytes | None:
    out = bytearray()
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return bytes(out)


def _read_frame(fd: int, deadline: float) -> bytes | None:
    head = _read_exact(fd, _LEN.size, deadline)
    if head is None:
        return None
    return _read_exact(fd, _LEN.unpack(head)[0], deadline)


def _serve(target: str, memory_mb: int) -> None:
    """The worker's loop: read a frame, call the target, answer with its outcome."""
    import importlib
    import resource

    limit = memory_mb << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from hetero.contract.errors import HeteroError

    module, _, name = target.partition(":")
    function = getattr(importlib.import_module(module), name)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(_LEN.pack(5) + b"ready")
    stdout.flush()
    while True:
        head = stdin.read(_LEN.size)
        if len(head) < _LEN.size:
            return
        data = stdin.read(_LEN.unpack(head)[0])
        answer: dict[str, Any]
        try:
            function(data)
            answer = {"kind": "ok", "detail": ""}
        except HeteroError as exc:
            answer = {"kind": "refused", "detail": str(exc)[:500]}
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            answer = {"kind": "raised", "detail": f"{type(exc).__name__}: {str(exc)[:500]}"}
        body = json.dumps(answer).encode()
        stdout.write(_LEN.pack(len(body)) + body)
        stdout.flush()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
