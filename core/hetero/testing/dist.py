"""Throwaway distributions for tests: a ``<name>-<version>.dist-info`` folder plus modules, ready for sys.path.

Discovery reads entry points from installed distributions' metadata, so a test that wants a plugin (good or
broken) writes the smallest installed distribution there is — METADATA, ``entry_points.txt`` and the modules —
into a temporary folder and puts that folder on ``sys.path`` (or ``PYTHONPATH`` for a subprocess)::

    site = make_distribution(tmp_path, "hetero-mybackend", {"hetero_mybackend.py": SOURCE},
                             {"mybackend": "hetero_mybackend"})
    monkeypatch.syspath_prepend(str(site))
    hetero.plugins.reload()

``plugin_site`` does the bookkeeping around that (sys.path, the ``HETERO_*`` variables, forgetting the modules and
rediscovering on exit), so that no test leaves its plugins behind for the next one.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from .. import plugins
from ..plugins import ENTRY_POINT_GROUP

if TYPE_CHECKING:
    import pytest

HETERO_VARIABLES = ("HETERO_PLUGINS", "HETERO_BACKENDS")


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
        rel = Path(relative)
        if rel.suffix != ".py" or rel.is_absolute() or ".." in rel.parts:
            raise ValueError(f"module path {relative!r} must be a relative .py path")
        path = root / rel
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


class Site:
    """A folder of throwaway distributions on sys.path; made by ``plugin_site``."""

    def __init__(self, root: Path, patch: pytest.MonkeyPatch) -> None:
        self.root = root
        self._patch = patch

    def add(self, name: str, modules: dict[str, str], entry_points: dict[str, str], **kwargs: str) -> Path:
        return make_distribution(self.root, name, modules, entry_points, **kwargs)

    def setenv(self, name: str, value: str) -> None:
        """Set a variable for this site's lifetime (HETERO_PLUGINS, HETERO_BACKENDS, a plugin's own)."""
        self._patch.setenv(name, value)

    def reload(self) -> plugins.Registry:
        return plugins.reload()

    def subprocess_env(self) -> dict[str, str]:
        """The environment for a child Python that should see this site's distributions."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.root), env.get("PYTHONPATH", "")) if p)
        return env


@contextmanager
def plugin_site(tmp_path: Path) -> Iterator[Site]:
    """A ``Site`` under ``tmp_path``; on exit sys.path and the variables are restored, its modules forgotten and
    plugins rediscovered, so the next test sees the installed plugins only."""
    import pytest  # only this helper needs it: make_distribution works without pytest

    root = Path(tmp_path) / "site"
    root.mkdir(parents=True, exist_ok=True)
    try:
        with pytest.MonkeyPatch.context() as patch:
            for name in HETERO_VARIABLES:
                patch.delenv(name, raising=False)
            patch.syspath_prepend(str(root))
            yield Site(root, patch)
    finally:
        _forget_modules(root)
        importlib.invalidate_caches()
        plugins.reload()


def _forget_modules(root: Path) -> None:
    for name, module in list(sys.modules.items()):
        origin = getattr(module, "__file__", None)
        if origin and Path(origin).is_relative_to(root):
            del sys.modules[name]
