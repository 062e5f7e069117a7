"""A per-step log of decoding: one JSON line per step, for finding out where a speculative run's time went.

Set ``HETERO_SPEC_LOG=PATH`` (or ``hetero bench --spec ... --spec-log PATH``) and every decode step appends a line
to PATH: plain decoding's steps (``{"kind": "plain", "seconds": ...}``) and the speculative loop's (``"kind":
"spec"``, with the draft's length before and after the policy's cut, its class, how many drafts were accepted, the
tokens committed, the step's seconds and the policy's state after it: the measured plain step, the speculative
seconds per token it judges drafting by, the rate λ, until when drafting is off). A ``{"kind": "start", ...}`` line
opens each generation. ``set_probe(fn)`` adds ``fn()``'s dict to every step's line (``benchmarks/spec_steps.py``
adds the cpu thread pool's statistics of the step that way). Off (no file, no cost beyond one check) when unset.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from typing import Any

ENV = "HETERO_SPEC_LOG"

_lock = threading.Lock()  # generations on several threads (a server's slots) append to one file
_probe: Callable[[], dict[str, Any]] | None = None


def set_probe(fn: Callable[[], dict[str, Any]] | None) -> None:
    """``fn()`` is called after each logged step and its keys join the step's line (None: no probe)."""
    global _probe
    _probe = fn


def active() -> bool:
    return bool(os.environ.get(ENV))


def write(kind: str, **fields: Any) -> None:
    """Append one line to the log (nothing when ``HETERO_SPEC_LOG`` is unset)."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = {"kind": kind, **fields}
    if _probe is not None and kind != "start":
        line.update(_probe())
    text = json.dumps(line) + "\n"
    # Opened per line (microseconds against a step's milliseconds): no file held open for the process, and a path
    # changed between generations is honoured.
    with _lock, open(path, "a", encoding="utf-8") as out:
        out.write(text)
