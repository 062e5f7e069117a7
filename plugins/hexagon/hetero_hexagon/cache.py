"""Where hetero-hexagon keeps what it builds: ``$HETERO_CACHE_DIR/hexagon`` (default ``~/.cache/hetero/hexagon``)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    base = os.environ.get("HETERO_CACHE_DIR")
    if base:
        return Path(base) / "hexagon"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hetero" / "hexagon"


def content_key(*parts: bytes | str) -> str:
    """A short hash of everything an artifact depends on (sources, flags, options), to name its cache entry."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:24]
