"""Where hetero-hexagon keeps what it builds: ``$HETERO_CACHE_DIR/hexagon`` (default ``~/.cache/hetero/hexagon``),
named by content."""

from __future__ import annotations

import hashlib
from pathlib import Path

from hetero.contract import vendor_worker


def cache_root() -> Path:
    return vendor_worker.cache_root() / "hexagon"


def content_key(*parts: bytes | str) -> str:
    """A short hash of everything an artifact depends on (sources, flags, options), to name its cache entry."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()[:24]
