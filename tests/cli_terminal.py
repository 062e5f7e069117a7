"""The ``hetero`` command as a user runs it: a subprocess with pipes (``run_cli``), or on a pseudo-terminal
(``Terminal``: stdin, stdout and stderr on one pty, as in a shell; stdlib ``pty`` only)."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from collections.abc import Sequence

TIMEOUT = 120.0


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("HETERO_DEBUG", None)
    env.update(extra)
    return env


def run_cli(args: Sequence[str], *, stdin: str | None = None, timeout: float = TIMEOUT,
            **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetero", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, env=cli_env(**env))


class Terminal:
    """``hetero ARGS`` on a pseudo-terminal: ``expect`` reads until a pattern shows, ``send`` types."""

    def __init__(self, args: Sequence[str], *, columns: int = 200, **env: str) -> None:
        import fcntl
        import pty
        import struct
        import termios

        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
        self.master = master
        def controlling_terminal() -> None:  # a session of its own whose terminal is the pty: Ctrl-C is SIGINT
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen([sys.executable, "-m", "hetero", *args], stdin=slave, stdout=slave,
                                     stderr=slave, env=cli_env(TERM="xterm", **env), preexec_fn=controlling_terminal,
                                     close_fds=True)
        os.close(slave)
        self.output = ""  # everything read so far
        self.seen = 0  # where the next expect starts looking

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:  # the child closed the terminal
            return False
        if not data:
            return False
        self.output += data.decode("utf-8", "replace")
        return True

    def expect(self, pattern: str, timeout: float = TIMEOUT) -> re.Match:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while True:
            match = regex.search(self.output, self.seen)
            if match:
                self.seen = match.end()
                return match
            left = deadline - time.monotonic()
            if left <= 0 or (not self._read(min(left, 0.5)) and self.proc.poll() is not None
                             and not self._read(0.1)):
                raise AssertionError(f"{pattern!r} did not show; the terminal read:\n{self.output[self.seen:]!r}")

    def send(self, text: str) -> None:
        os.write(self.master, text.encode())

    def exited(self, timeout: float) -> bool:
        """Whether the command ends within ``timeout`` seconds (reading its output meanwhile)."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._read(0.2)
        return self.proc.poll() is not None

    def wait(self, timeout: float = TIMEOUT) -> int:
        """The exit status, after reading what is left."""
        deadline = time.monotonic() + timeout
        self.exited(timeout)
        while self._read(0.1):
            pass
        code = self.proc.wait(max(0.1, deadline - time.monotonic()))
        os.close(self.master)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
