"""Throwaway distributions for tests: a ``<name>-<version>.dist-info`` folder plus modules, ready for sys.path.

Discovery reads entry points from installed distributions' metadata, so a test that wants a plugin (good or
broken) writes the smallest installed distribution there is — METADATA, ``entry_points.txt`` and the modules —
into a temporary folder and puts that folder on ``sys.path`` (or ``PYTHONPATH`` for a subprocess)::

    site = make_distribution(tmp_path, "hetero-mybackend", {"hetero_mybackend.py": SOURCE},
                             {"mybackend": "hetero_mybackend"})
    monkeypatch.syspath_prepend(str(site))
    hetero.plugins.reload()
"""

from __future__ import annotations

import importlib
import os
import re
import textwrap
from pathlib import Path

from ..plugins import ENTRY_POINT_GROUP


def make_distribution(
    tmp_path: Path,
    name: str,
    modules: dict[str, str],
    entry_points: dict[str, str],
    *,
    version: str = "0.1",
    group: str = ENTRY_POINT_GROUP,
) -> Path:
    """Write distribution ``name`` into ``tmp_path`` and return the folder to put on ``sys.path``.

    modules: file path relative to that folder ("mypkg/__init__.py", "mymod.py") -> source (dedented here).
    entry_points: entry point name -> object reference ("mymod" or "mymod:attr"), in ``group``.
    Several distributions may share one ``tmp_path``.
    """
    root = Path(tmp_path)
    for relative, source in modules.items():
        path = root / relative
        if path.suffix != ".py" or path.is_absolute() or ".." in path.parts:
            raise ValueError(f"module path {relative!r} must be a relative .py path")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source).lstrip("\n"), encoding="utf-8")

    info = root / f"{_normalize(name)}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    lines = [f"[{group}]", *(f"{ep} = {target}" for ep, target in entry_points.items())]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (info / "top_level.txt").write_text("\n".join(sorted(_top_level(modules))) + "\n", encoding="utf-8")

    # Metadata lookups cache a folder's listing by its mtime, and the clock may not have ticked since the last
    # distribution was written here: move the mtime on so the new one is seen.
    stat = root.stat()
    os.utime(root, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    importlib.invalidate_caches()  # the import system caches folder listings too
    return root


def _normalize(name: str) -> str:
    # The dist-info folder name uses the escaped project name (PEP 427 / the binary distribution format).
    return re.sub(r"[-_.]+", "_", name).lower()


def _top_level(modules: dict[str, str]) -> set[str]:
    return {Path(relative).parts[0].removesuffix(".py") for relative in modules}
