"""How the ``hetero`` command reports trouble: one ``hetero: error: ...`` line and exit status 2 for every failure,
one ``hetero: warning: ...`` line per distinct warning, and the library's Python spellings (``context=...``) turned
into the command line's flags (``-c``). ``HETERO_DEBUG=1`` adds the traceback (and each warning's origin).
"""

from __future__ import annotations

import os
import re
import sys
import traceback
import warnings
from typing import TextIO

from .contract.errors import HeteroError, HeteroWarning
from .progress import clear_line

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

# Library keyword arguments -> the flags that set them (the library's messages name the keywords).
_FLAGS = {"context": "-c", "threads": "-t", "kv_cache": "--kv-cache", "on_fallback": "--on-fallback",
          "quant": "-q", "backends": "-b", "max_new_tokens": "-n", "temperature": "--temp", "top_k": "--top-k",
          "top_p": "--top-p", "min_p": "--min-p", "seed": "--seed"}
_PHRASES = (
    (re.compile(r"a larger context=\.\.\."), "a larger context (-c N)"),
    (re.compile(r"reset\(\) / shorten the conversation"), "/reset the chat or shorten the conversation"),
    (re.compile(r"pass on_fallback=\"warn\""), "pass --on-fallback warn"),
)
_SAMPLING = re.compile(r"\bsampling: (" + "|".join(_FLAGS) + r") ")
_KEYWORD = re.compile(r"\b(" + "|".join(_FLAGS) + r")=(?=[^=\s])")


def debug_enabled() -> bool:
    return os.environ.get("HETERO_DEBUG", "") not in ("", "0")


def cli_text(text: str) -> str:
    """The library's ``keyword=value`` spellings as the command line's ``-flag value``."""
    for pattern, replacement in _PHRASES:
        text = pattern.sub(replacement, text)
    text = _SAMPLING.sub(lambda m: _FLAGS[m.group(1)] + " ", text)
    return _KEYWORD.sub(lambda m: _FLAGS[m.group(1)] + " ", text)


def one_line(text: str) -> str:
    """Several lines (a list of reasons) as one: "requested backends cannot start:\\n  a\\n  b" -> "...: a; b"."""
    text = re.sub(r":\s*\n\s*", ": ", text.strip())
    return re.sub(r"\s*\n\s*", "; ", text)


def error_message(exc: BaseException, subject: str = "") -> str:
    """The text after ``hetero: error: `` for any exception; ``subject`` names what the user gave (a file)."""
    if isinstance(exc, HeteroError):
        text = one_line(cli_text(exc.message))
        if exc.hint:
            text += f" (hint: {one_line(cli_text(exc.hint))})"
        return text
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    where = f"{subject}: " if subject else ""
    detail = str(exc) or "(no message)"
    return (f"{where}{type(exc).__name__}: {one_line(detail)} (an internal error: HETERO_DEBUG=1 shows where; "
            "please report it)")


def report_error(exc: BaseException, subject: str = "", stream: TextIO | None = None) -> int:
    stream = stream or sys.stderr
    clear_line()
    if debug_enabled():
        traceback.print_exception(exc, file=stream)
    print(f"hetero: error: {error_message(exc, subject)}", file=stream)
    return EXIT_ERROR


class WarningPrinter:
    """``warnings.showwarning`` for the command line: each distinct message once, as one line; a backend skipped
    while choosing backends automatically is only mentioned with ``-v`` (the user did not ask for it)."""

    def __init__(self, verbose: bool = False, stream: TextIO | None = None) -> None:
        self.verbose = verbose
        self.stream = stream
        self.seen: set[str] = set()

    def __call__(self, message, category, filename, lineno, file=None, line=None) -> None:
        text = one_line(cli_text(str(message))).removeprefix("hetero: ")
        if text.startswith("backend ") and " skipped " in text and not self.verbose:
            return
        if text in self.seen:
            return
        self.seen.add(text)
        stream = self.stream or sys.stderr
        clear_line()
        origin = f" [{category.__name__} at {filename}:{lineno}]" if debug_enabled() else ""
        print(f"hetero: warning: {text}{origin}", file=stream)

    def install(self) -> None:
        """Call inside ``warnings.catch_warnings()``, which puts the previous printer and filters back."""
        warnings.showwarning = self
        warnings.filterwarnings("always", category=HeteroWarning)  # duplicates are dropped above, by text
