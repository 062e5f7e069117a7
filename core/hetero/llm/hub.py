"""Model names as users type them: a path, or a Hugging Face repo id found in the local Hugging Face cache.

``hetero.llm.load("Qwen/Qwen3-0.6B")`` looks in huggingface_hub's cache layout (``$HF_HUB_CACHE``, else
``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``) for ``models--Qwen--Qwen3-0.6B/snapshots/<rev>``, the revision
``refs/main`` names (or ``Qwen/Qwen3-0.6B@<rev>`` for another ref or a commit). Offline: nothing is downloaded. A
snapshot without ``config.json`` but with exactly one ``.gguf`` file (a GGUF repository) resolves to that file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..contract.errors import ModelFormatError

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}(@[\w./-]{1,128})?$")


def hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def resolve_model(name: str | os.PathLike) -> Path:
    """``name`` as an existing path, else as a repo id in the local Hugging Face cache; a HeteroError that says
    where it looked otherwise."""
    path = Path(name)
    if path.exists() or not isinstance(name, str) or not _REPO_ID.match(name) or name.startswith((".", "/")):
        return path
    repo, _, rev = name.partition("@")
    root = hub_cache()
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    snapshots = repo_dir / "snapshots"
    ref = repo_dir / "refs" / (rev or "main")
    where = f"{name!r} is neither a path nor in the Hugging Face cache (looked for {snapshots})"
    if not snapshots.is_dir():
        raise ModelFormatError(where, hint="download it first (huggingface-cli download " f"{repo}), or set "
                               "HF_HUB_CACHE / HF_HOME; hetero never downloads")
    commit = rev
    if ref.is_file() and ref.stat().st_size < 256:
        commit = ref.read_text(encoding="ascii", errors="replace").strip()
    snapshot = snapshots / commit if commit else None
    if snapshot is None or not snapshot.is_dir() or "/" in commit or commit.startswith("."):
        found = sorted(p.name for p in snapshots.iterdir() if p.is_dir()) if snapshots.is_dir() else []
        if rev or len(found) != 1:
            raise ModelFormatError(f"{where}: no snapshot for revision {rev or 'main'!r} (found {found})")
        snapshot = snapshots / found[0]
    if (snapshot / "config.json").exists():
        return snapshot
    ggufs = sorted(snapshot.glob("*.gguf"))
    if len(ggufs) == 1:
        return ggufs[0]
    if ggufs:
        raise ModelFormatError(f"{snapshot} holds several GGUF files; name one of them",
                               hint=" | ".join(str(p) for p in ggufs[:8]))
    return snapshot
