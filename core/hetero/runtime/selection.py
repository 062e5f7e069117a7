"""Choosing backends for a session: the user's list (or the environment's, or every working one), then the fallbacks.

A single backend the user named that cannot start is an error listing the reason; in a list of several (a
preference order, as onnxruntime's providers) an unavailable one is skipped with one warning per process, and an
error only when none of them can start. One picked automatically is skipped with a single warning per process.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import plugins
from ..contract.backend import Backend
from ..contract.errors import BackendUnavailable, HeteroError, HeteroWarning

FALLBACK_CHAIN = ("cpu", "reference")
_warned_skips: set[str] = set()


@dataclass
class Selection:
    backends: list[Backend]  # preference order, fallbacks included
    preferred: set[str]  # what the user asked for: a node placed on any other backend fell back


def select(requested: Sequence[str] | str | None, options: dict[str, Any] | None = None) -> Selection:
    if isinstance(requested, str):
        requested = split_names(requested)  # "cpu,opencl", as the CLI's -b and HETERO_BACKENDS
    explicit = requested is not None
    if requested is None:
        env = os.environ.get("HETERO_BACKENDS", "").strip()
        if env:
            requested, explicit = split_names(env), True
    rows: dict[str, plugins.PluginStatus] = {}
    row: plugins.PluginStatus | None
    for row in plugins.statuses():
        rows.setdefault(row.name, row)  # the first registration of a name owns it (see plugins._load_one)
    if requested is None:
        ok = sorted((r for r in rows.values() if r.ok), key=lambda r: (r.priority, r.name))
        requested = [r.name for r in ok]
        for row in rows.values():
            if not row.ok and row.name not in _warned_skips and row.status != plugins.DISABLED:
                _warned_skips.add(row.name)
                warnings.warn(
                    f"hetero: backend {row.name} skipped ({row.status}: {row.reason})", HeteroWarning, stacklevel=3
                )
    if not requested:
        raise HeteroError("no backend requested")

    names: list[tuple[str, int]] = [_split_device(spec) for spec in requested]
    problems = {}
    for name, _ in names:
        row = rows.get(name)
        if row is None:
            problems[name] = f"{name}: not installed (installed: {', '.join(sorted(rows)) or 'none'})"
        elif not row.ok:
            problems[name] = f"{name}: {row.status}: {row.reason}" + (f" (hint: {row.hint})" if row.hint else "")
    if problems and explicit:
        if len(problems) == len(names):  # nothing the user asked for can start
            raise BackendUnavailable("requested backends cannot start:\n  " + "\n  ".join(problems.values()))
        for name, problem in problems.items():  # a preference list: use the next one, as onnxruntime does
            if name not in _warned_skips:
                _warned_skips.add(name)
                warnings.warn(f"hetero: backend skipped ({problem})", HeteroWarning, stacklevel=3)

    chosen: list[Backend] = []
    seen: set[str] = set()
    for name, device_index in [*names, *((n, 0) for n in FALLBACK_CHAIN)]:
        row = rows.get(name)
        if name in seen or row is None or not row.ok or row.factory is None:
            continue
        if device_index >= len(row.devices):
            raise HeteroError(f"backend {name} has {len(row.devices)} device(s); device {device_index} does not exist")
        seen.add(name)
        try:
            backend = row.factory.create(row.devices[device_index], options)
        except HeteroError:
            raise  # a clear refusal (bad option values): the user must see it
        except Exception as exc:  # a plugin bug: an explicitly named backend fails loudly, others are skipped
            reason = f"{name}: create() failed: {type(exc).__name__}: {exc}"
            if explicit and name in {n for n, _ in names}:
                raise BackendUnavailable(f"requested backend cannot start: {reason}",
                                         hint=f"reinstall or report {row.distribution}") from exc
            if name not in _warned_skips:
                _warned_skips.add(name)
                warnings.warn(f"hetero: backend skipped ({reason})", HeteroWarning, stacklevel=3)
            continue
        chosen.append(backend)
        if name == "reference":  # it runs every op: nothing after it would ever be asked
            break
    if not chosen:
        raise BackendUnavailable("no backend could start, not even the numpy reference")
    # Named backends (the argument or HETERO_BACKENDS) are what the user asked for. Naming none asks for every
    # working backend, in priority order, but the core's numpy reference: a node that lands there still fell back.
    preferred = {n for n, _ in names} if explicit else {n for n, _ in names if n != plugins.CORE_PLUGIN}
    return Selection(chosen, preferred)


def split_names(text: str) -> list[str]:
    return [b.strip() for b in text.split(",") if b.strip()]


def _split_device(spec: str) -> tuple[str, int]:
    name, _, index = spec.partition(":")
    if index and not index.isdigit():
        raise HeteroError(f"backend {spec!r}: the device index after ':' must be a number")
    return name.strip(), int(index or 0)
