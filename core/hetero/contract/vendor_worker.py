"""Vendor toolkits in a virtual environment of their own, run in a worker process.

NPU toolkits (Rockchip's ``rknn-toolkit2``, Qualcomm's QNN) pin old numpy / onnx / torch and some of their
converters abort the process on inputs they dislike. A backend for them therefore never imports the toolkit into the
user's process; it uses two pieces of this module:

``VendorEnv`` — where the toolkit lives: a venv located by an environment variable (``HETERO_RKNN_VENV``) or, by
default, ``$HETERO_CACHE_DIR/venvs/<name>`` (``~/.cache/hetero/venvs/<name>``). ``create()`` builds it with pip,
step by step, reporting progress; ``check()`` asks the venv's Python (in a subprocess, with a timeout) whether the
toolkit is installed and raises ``BackendUnavailable`` with the reason and the setup command when it is not::

    env = VendorEnv("rknn", env_var="HETERO_RKNN_VENV", setup_command="python -m hetero_rknn setup",
                    install_steps=[["numpy<=1.26.4", ...], ["--no-deps", "rknn-toolkit2==2.5.0"]],
                    check_code="import importlib.metadata as m; print(m.version('rknn-toolkit2'))")
    version = env.check()

``VendorWorker`` — a long-lived worker process running a handler file with the venv's Python. The handler file
defines plain functions (``HANDLERS = {"build": build, ...}`` or every public function); ``call`` sends keyword
arguments — JSON values and numpy arrays, arrays travel in the ``.npy`` format, which every numpy reads — and
returns the handler's result the same way. The worker keeps its state between calls (a simulator that only runs
models built in its own process keeps them alive there). A worker that dies (SIGABRT, SIGSEGV, ``os._exit``) or
does not answer within the call's timeout becomes a ``WorkerCrashed`` / ``WorkerTimeout`` (``BackendError``s) whose
message names what was being done (``context``: "building segment 2 for rk3588") and the tail of the worker's
stderr; the next call starts a fresh worker. An exception inside a handler becomes a ``BackendError`` with the
handler's message; the worker lives on::

    worker = VendorWorker(env.python, Path(__file__).with_name("_worker_handlers.py"), name="rknn")
    outputs = worker.call("run", context="running segment 2 on the rk3588 simulator", timeout=60,
                          key=key, inputs={"x": x})

This file is also the worker's main program (``python vendor_worker.py HANDLER_FILE``): it imports only the
standard library and numpy at its top, so it runs in a venv that has no hetero installed. stdout carries only the
protocol's frames (the worker points file descriptor 1 at stderr, so what a toolkit prints cannot corrupt them).
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

try:
    from .errors import BackendError, BackendUnavailable
except ImportError:  # run as the worker's main program, in a venv without hetero: the user's side is not used there
    BackendError = BackendUnavailable = Exception  # type: ignore[misc,assignment]  # placeholders, never raised

LEN = struct.Struct("<Q")  # every frame: its length, then its bytes
STDERR_TAIL_LINES = 30
DEFAULT_START_TIMEOUT = 120.0  # seconds for the worker to import its handlers (toolkits import slowly)


# -- framing (both sides) -----------------------------------------------------------------------------------------

def read_exact(fd: int, n: int, deadline: float) -> bytes | None:
    """n bytes from fd, or None at the deadline; EOFError when the writer is gone."""
    out = bytearray()
    while len(out) < n:
        left = None if deadline == float("inf") else deadline - time.monotonic()
        if (left is not None and left <= 0) or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return bytes(out)


def read_frame(fd: int, deadline: float) -> bytes | None:
    """One frame from fd, or None at the deadline; EOFError when the writer is gone."""
    head = read_exact(fd, LEN.size, deadline)
    if head is None:
        return None
    return read_exact(fd, LEN.unpack(head)[0], deadline)


def encode(message: Any) -> bytes:
    """A message of JSON values and numpy arrays as one frame: a count, the JSON, then each array as .npy."""
    arrays: list[np.ndarray] = []

    def lift(value: Any) -> Any:
        if isinstance(value, np.ndarray | np.generic):
            arrays.append(np.asarray(value))
            return {"__ndarray__": len(arrays) - 1}
        if isinstance(value, dict):
            return {str(k): lift(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [lift(v) for v in value]
        return value

    parts = [json.dumps(lift(message)).encode()]
    for array in arrays:
        buffer = io.BytesIO()
        np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
        parts.append(buffer.getvalue())
    body = LEN.pack(len(parts)) + b"".join(LEN.pack(len(p)) + p for p in parts)
    return LEN.pack(len(body)) + body


def decode(frame: bytes) -> Any:
    view = memoryview(frame)
    count, offset, parts = LEN.unpack_from(view)[0], LEN.size, []
    for _ in range(count):
        size = LEN.unpack_from(view, offset)[0]
        parts.append(view[offset + LEN.size: offset + LEN.size + size])
        offset += LEN.size + size
    arrays = [np.load(io.BytesIO(bytes(p)), allow_pickle=False) for p in parts[1:]]

    def lower(value: Any) -> Any:
        if isinstance(value, dict):
            if set(value) == {"__ndarray__"}:
                return arrays[value["__ndarray__"]]
            return {k: lower(v) for k, v in value.items()}
        if isinstance(value, list):
            return [lower(v) for v in value]
        return value

    return lower(json.loads(bytes(parts[0])))


# -- the user's side ----------------------------------------------------------------------------------------------

class WorkerCrashed(BackendError):
    """The vendor worker process died (a signal, an exit) during a call; the user's process lives on."""


class WorkerTimeout(BackendError):
    """The vendor worker did not answer within the call's timeout; it was stopped."""


def cache_root() -> Path:
    """``$HETERO_CACHE_DIR`` or ``~/.cache/hetero``: where hetero keeps what it builds."""
    base = os.environ.get("HETERO_CACHE_DIR")
    return Path(base) if base else Path.home() / ".cache" / "hetero"


def _report_to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class VendorEnv:
    """A vendor toolkit's virtual environment: where it is, how to build it, how to tell that it works."""

    name: str  # short: "rknn" (the default folder's name, and messages)
    env_var: str  # points to an existing venv (its folder) instead of the default one
    setup_command: str  # what a user runs to create it: named in every "unavailable" hint
    install_steps: Sequence[Sequence[str]]  # pip install arguments, one list per step, run in order
    check_code: str  # Python run in the venv: prints the toolkit's version, fails when it is not usable
    base_pythons: Sequence[str] = ()  # interpreters to build the venv with (first found); () = this one
    python_tag: str = ""  # e.g. "3.11": the venv's Python must be this version (the vendor's wheels are)

    @property
    def path(self) -> Path:
        given = os.environ.get(self.env_var)
        return Path(given).expanduser() if given else cache_root() / "venvs" / self.name

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def check(self, timeout: float = 60.0) -> str:
        """The toolkit's version, asked of the venv's own Python; ``BackendUnavailable`` saying what is wrong."""
        where = f"{self.path} ({self.env_var})" if os.environ.get(self.env_var) else str(self.path)
        if not self.python.exists():
            raise BackendUnavailable(f"no {self.name} toolkit environment at {where}",
                                     hint=f"create it: {self.setup_command} (or point {self.env_var} to one)")
        try:
            done = subprocess.run([str(self.python), "-c", self.check_code], capture_output=True, text=True,
                                  timeout=timeout, env=_clean_env())
        except subprocess.TimeoutExpired:
            raise BackendUnavailable(f"the {self.name} toolkit environment at {where} did not answer within "
                                     f"{timeout:g} s", hint=f"recreate it: {self.setup_command} --force") from None
        except OSError as exc:
            raise BackendUnavailable(f"the Python of {where} cannot start: {exc}",
                                     hint=f"recreate it: {self.setup_command} --force") from exc
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or [exit_text(done.returncode)])[-1]
            raise BackendUnavailable(f"the {self.name} toolkit in {where} is not usable: {last}",
                                     hint=f"recreate it: {self.setup_command} --force")
        return done.stdout.strip()

    def create(self, *, force: bool = False, report: Callable[[str], None] = _report_to_stderr) -> Path:
        """Build the venv (``python -m venv`` + each pip step), reporting each step and pip's progress lines."""
        if force and self.path.exists():
            import shutil

            report(f"removing {self.path}")
            shutil.rmtree(self.path)
        steps = len(self.install_steps) + 1
        if not self.python.exists():
            base = self._base_python()
            report(f"[1/{steps}] creating the {self.name} toolkit environment {self.path} with {base}")
            self._run([base, "-m", "venv", str(self.path)], report)
        else:
            report(f"[1/{steps}] using the existing environment {self.path}")
        for i, args in enumerate(self.install_steps, start=2):
            report(f"[{i}/{steps}] pip install {' '.join(args)}")
            # --no-compile: bytecode is written on first import instead (torch's thousands of files take minutes)
            self._run([str(self.python), "-m", "pip", "install", "--progress-bar", "off", "--no-compile", *args],
                      report)
        try:
            version = self.check(timeout=300.0)
        except Exception as exc:
            raise BackendError(f"the {self.name} toolkit environment was built but does not work: {exc}") from exc
        report(f"{self.name} toolkit {version} ready in {self.path}")
        return self.path

    def _base_python(self) -> str:
        import shutil

        for candidate in self.base_pythons:
            found = shutil.which(candidate)
            if found:
                return found
        current = f"{sys.version_info.major}.{sys.version_info.minor}"
        if self.python_tag and current != self.python_tag:
            raise BackendError(f"the {self.name} toolkit needs Python {self.python_tag}; found none on PATH "
                                f"(tried {', '.join(self.base_pythons) or 'none'}) and this one is {current}",
                                hint=f"install python{self.python_tag}, or point {self.env_var} to a venv of it")
        return sys.executable

    def _run(self, args: list[str], report: Callable[[str], None]) -> None:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_clean_env())
        assert proc.stdout is not None
        tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        for line in proc.stdout:
            line = line.rstrip()
            tail.append(line)
            noise = "resolver does not" in line  # pip's note on --no-deps installs, not a failure
            if line.startswith(("Collecting", "Installing", "Successfully", "ERROR")) and not noise:
                report(f"    {line}")
        if proc.wait() != 0:
            raise BackendError(f"{' '.join(args[:4])} ... failed ({exit_text(proc.returncode)}):\n"
                                + "\n".join(tail), hint=f"fix the cause, then run {self.setup_command} again")


def _clean_env() -> dict[str, str]:
    """The environment for the vendor's Python: without the user's venv and PYTHONPATH (their numpy would win), and
    writing bytecode (the venv is hetero's own, installed with --no-compile: the first import compiles it once)."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def exit_text(code: int) -> str:
    """A process's end in words: "killed by SIGABRT", "exit status 3"."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def kill_process_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a worker started with ``start_new_session=True`` and everything it started, and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def stop_worker(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """End a worker whose loop stops at the end of its input; kill it if it has not within ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_process_group(proc)


class VendorWorker:
    """A worker process running ``handlers`` (a .py file) with ``python``; started on the first call."""

    def __init__(self, python: Path | str, handlers: Path, *, name: str,
                 start_timeout: float = DEFAULT_START_TIMEOUT, env: dict[str, str] | None = None) -> None:
        self.python = str(python)
        self.handlers = Path(handlers)
        self.name = name
        self.start_timeout = start_timeout
        self.env = {**_clean_env(), **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0  # processes started: a new one after each crash or timeout
        self._tail: collections.deque[tuple[int, str]] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._lines = 0  # stderr lines read so far: a call's own lines are those after its start
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.alive and self.proc is not None else None

    def call(self, method: str, *, context: str, timeout: float | None = None, **args: Any) -> Any:
        """Run ``handlers.method(**args)`` in the worker; ``context`` says what for, in every error."""
        with self._lock:
            proc = self.proc if self.proc is not None and self.proc.poll() is None else self._start(context)
            first_line = self._lines
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(encode({"call": method, "args": args}))
                proc.stdin.flush()
            except OSError:  # BrokenPipeError: it died between calls
                raise self._died(context) from None
            deadline = time.monotonic() + timeout if timeout is not None else float("inf")
            try:
                frame = read_frame(proc.stdout.fileno(), deadline)
            except EOFError:
                raise self._died(context) from None
            if frame is None:
                self._kill()
                raise WorkerTimeout(f"the {self.name} worker did not finish {context} within {timeout:g} s; it was "
                                    f"stopped{self._tail_text()}",
                                    hint="raise the timeout, or simplify the model") from None
            reply = decode(frame)
            if "error" in reply:
                time.sleep(0.05)  # let the stderr reader take what the toolkit printed before it failed
                raise BackendError(f"{self.name} worker, {context}: {reply['error']}{self._tail_text(first_line)}",
                                   hint=reply.get("hint"))
        return reply["ok"]

    def close(self) -> None:
        with self._lock:
            if self.proc is not None:
                stop_worker(self.proc, timeout=10)
            self.proc = None

    def _start(self, context: str) -> subprocess.Popen[bytes]:
        self._tail.clear()
        self._lines = 0
        try:
            proc = subprocess.Popen([self.python, "-u", __file__, str(self.handlers)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env,
                                    start_new_session=True)  # a Ctrl-C in the terminal is the parent's to handle
        except OSError as exc:
            raise BackendError(f"cannot start the {self.name} worker ({self.python}) for {context}: {exc}") from exc
        self.proc, self.starts = proc, self.starts + 1
        threading.Thread(target=self._drain, args=(proc.stderr,), daemon=True).start()
        assert proc.stdout is not None
        try:
            ready = read_frame(proc.stdout.fileno(), time.monotonic() + self.start_timeout)
        except EOFError:
            raise self._died(f"starting for {context}") from None
        if ready is None:
            self._kill()
            raise WorkerTimeout(f"the {self.name} worker did not start within {self.start_timeout:g} s "
                                f"(for {context}){self._tail_text()}")
        return proc

    def _drain(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip().rsplit("\r", 1)[-1]  # a progress bar's last state
            self._tail.append((self._lines, line))
            self._lines += 1

    def _died(self, context: str) -> Exception:
        assert self.proc is not None
        code = self.proc.wait()
        self.proc = None
        time.sleep(0.05)  # let the stderr reader take the last lines
        return WorkerCrashed(
            f"the {self.name} worker died ({exit_text(code)}) while {context}; the process using hetero is "
            f"unharmed, the next call starts a new worker{self._tail_text()}",
            hint="this is the vendor toolkit failing on this input: try another target or dtype, or leave this "
                 "segment to the next backend",
        )

    def _kill(self) -> None:
        if self.proc is not None:
            kill_process_group(self.proc)
            self.proc = None

    def _tail_text(self, since: int = 0) -> str:
        """The worker's last stderr lines (from line ``since`` on), indented under a message."""
        lines = [line for n, line in list(self._tail) if n >= since and line.strip()]
        return (":\n    " + "\n    ".join(lines[-12:])) if lines else ""

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._kill()


# -- the worker's side --------------------------------------------------------------------------------------------

def _serve(handler_file: str) -> None:
    """Load the handlers, say ready, then answer calls until the input ends."""
    import runpy

    channel_in, channel_out = sys.stdin.fileno(), os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what the toolkit prints goes to stderr, never into the frames
    sys.stdout = sys.stderr
    namespace = runpy.run_path(handler_file)
    handlers = namespace.get("HANDLERS") or {k: v for k, v in namespace.items()
                                             if callable(v) and not k.startswith("_")}

    def send(message: Any) -> None:
        channel_out.write(encode(message))
        channel_out.flush()

    send({"ready": True})
    while True:
        try:
            frame = read_frame(channel_in, float("inf"))
        except EOFError:
            return
        request = decode(frame) if frame is not None else None
        if request is None:
            return
        try:
            handler = handlers[request["call"]]
        except KeyError:
            send({"error": f"no handler {request['call']!r} in {handler_file}"})
            continue
        try:
            send({"ok": handler(**request["args"])})
        except Exception as exc:
            send({"error": f"{type(exc).__name__}: {exc}", "hint": getattr(exc, "hint", None)})


if __name__ == "__main__":
    _serve(sys.argv[1])
