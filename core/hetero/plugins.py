"""Plugin discovery: entry points of the group ``hetero.backends``, loaded lazily, each inside its own guard.

Nothing here runs during ``import hetero``; the first query (``hetero.backends()``, ``hetero.load``, a Session)
loads every plugin once. Each outcome lands in the status table: ok / unavailable / incompatible / broken (or
disabled by ``HETERO_PLUGINS``), with the reason and a hint — a plugin can never take hetero down with it.

Discovery fills the contract's tables (op schemas in ``hetero.contract.registry``, added kernels in
``hetero.contract.backend``); they never start it, so the contract does not depend on this module.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from .contract import hookspecs
from .contract import registry as op_registry
from .contract.backend import API_VERSION, Device, Factory, add_kernel, forget_added_kernels
from .contract.errors import BackendUnavailable, HeteroError

if sys.version_info >= (3, 12):
    from importlib import metadata
else:  # the backport has the same API and the selectable entry_points() on old Pythons
    import importlib_metadata as metadata

ENTRY_POINT_GROUP = "hetero.backends"
CORE_PLUGIN = "reference"  # the numpy reference is part of the core and always loaded: it ends every fallback chain

OK, UNAVAILABLE, INCOMPATIBLE, BROKEN, DISABLED = "ok", "unavailable", "incompatible", "broken", "disabled"


@dataclass
class PluginStatus:
    """One row of ``hetero backends``."""

    name: str  # the backend's name (or the entry point's, when the plugin never got as far as registering)
    plugin: str  # entry point name
    distribution: str
    version: str
    status: str
    devices: list[Device] = field(default_factory=list)
    reason: str = ""
    hint: str = ""
    factory: Factory | None = None
    priority: int = 50

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass
class Registry:
    statuses: list[PluginStatus] = field(default_factory=list)
    loaders: dict[str, Callable[..., Any]] = field(default_factory=dict)
    manager: pluggy.PluginManager | None = None


_registry: Registry | None = None
_lock = threading.RLock()


def load_plugins() -> Registry:
    """Discover and load every plugin once; later calls return the same registry."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = Registry()  # set first: a plugin that queries hetero while loading must not recurse
            _discover(_registry)
        return _registry


def reload() -> Registry:
    """Forget what was loaded and discover again (after installing a plugin, or in tests)."""
    global _registry
    with _lock:
        _registry = None
        forget_added_kernels()
        return load_plugins()


def statuses() -> list[PluginStatus]:
    return list(load_plugins().statuses)


def status(name: str) -> PluginStatus | None:
    return next((s for s in load_plugins().statuses if s.name == name), None)


def loaders() -> dict[str, Callable[..., Any]]:
    return dict(load_plugins().loaders)


def _allowlist() -> set[str] | None:
    raw = os.environ.get("HETERO_PLUGINS", "").strip()
    return {p.strip() for p in raw.split(",") if p.strip()} if raw else None


def _discover(registry: Registry) -> None:
    manager = pluggy.PluginManager("hetero")
    manager.add_hookspecs(hookspecs)
    registry.manager = manager
    allow = _allowlist()
    seen: set[str] = set()
    # The core's own reference loads first, so that no plugin can take its name.
    entry_points = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.name != CORE_PLUGIN, e.name))
    for ep in entry_points:
        if ep.name in seen:  # the same distribution visible twice on sys.path
            continue
        seen.add(ep.name)
        dist = getattr(ep, "dist", None)
        dist_name = dist.name if dist is not None else "?"
        version = dist.version if dist is not None else "?"
        row = PluginStatus(ep.name, ep.name, dist_name, version, BROKEN)
        if allow is not None and ep.name not in allow and ep.name != CORE_PLUGIN:
            row.status, row.reason = DISABLED, "not listed in HETERO_PLUGINS"
            registry.statuses.append(row)
            continue
        registry.statuses.extend(_load_one(registry, manager, ep, row))


def _load_one(registry: Registry, manager: pluggy.PluginManager, ep: Any, row: PluginStatus) -> list[PluginStatus]:
    try:
        module = ep.load()
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        row.reason = f"import of {ep.value} failed: {_describe(exc)}"
        row.hint = f"reinstall it: pip install --force-reinstall {row.distribution}"
        return [row]

    declared = getattr(module, "api_version", None)
    if declared is None or _major(str(declared)) != _major(API_VERSION):
        row.status = INCOMPATIBLE
        row.reason = (
            f"plugin API {declared} does not match hetero's {API_VERSION}"
            if declared is not None
            else "plugin does not state api_version"
        )
        row.hint = _upgrade_hint(None if declared is None else str(declared), row.distribution)
        return [row]

    try:
        manager.register(module, name=ep.name)
        factories: list[Factory] = []
        _call_hook(manager, module, "hetero_register_backends", factories.append)
        _call_hook(manager, module, "hetero_register_ops", _register_op)
        _call_hook(manager, module, "hetero_register_kernels", add_kernel)
        _call_hook(manager, module, "hetero_register_loaders", registry.loaders.__setitem__)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        _unregister(manager, module)
        row.reason = f"registration failed: {_describe(exc)}"
        row.hint = f"report it to the authors of {row.distribution}"
        return [row]

    if not factories:  # a plugin that only adds ops, kernels or loaders
        row.status, row.reason = OK, "adds ops/kernels/loaders only"
        return [row]
    rows: list[PluginStatus] = []
    for factory in factories:
        owner = next((r for r in [*registry.statuses, *rows] if r.name == factory.name and r.factory), None)
        if owner is not None:  # backend names are unique: a second one would shadow the first in every session
            rows.append(PluginStatus(
                factory.name, row.plugin, row.distribution, row.version, BROKEN,
                reason=f"backend name {factory.name!r} is already registered by {owner.distribution}",
                hint=f"report it to the authors of {row.distribution}",
            ))
            continue
        rows.append(_probe(row, factory, str(declared)))
    return rows


def _probe(template: PluginStatus, factory: Factory, plugin_api: str) -> PluginStatus:
    row = PluginStatus(
        factory.name, template.plugin, template.distribution, template.version, BROKEN,
        factory=factory, priority=getattr(factory, "priority", 50),
    )
    declared = str(getattr(factory, "api_version", None) or plugin_api)
    if _major(declared) != _major(API_VERSION):
        row.status = INCOMPATIBLE
        row.reason = f"factory {factory.name} targets plugin API {declared}, hetero has {API_VERSION}"
        row.hint = _upgrade_hint(declared, row.distribution)
        return row
    try:
        devices = list(factory.probe())
    except BackendUnavailable as exc:
        row.status, row.reason, row.hint = UNAVAILABLE, exc.message, exc.hint or ""
        return row
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        row.reason = f"probe failed: {_describe(exc)}"
        row.hint = f"report it to the authors of {row.distribution}"
        return row
    if not devices:
        row.status, row.reason = UNAVAILABLE, "probe found no device"
        return row
    row.status, row.devices = OK, devices
    row.priority = getattr(factory, "priority", row.priority)  # a probe may rank itself by what it found
    return row


def _call_hook(manager: pluggy.PluginManager, module: Any, hook_name: str, register: Callable[..., Any]) -> None:
    # Call this plugin's implementation alone, so that one plugin's failure is charged to it and no other.
    if not hasattr(module, hook_name):
        return
    others = [p for p in manager.get_plugins() if p is not module]
    caller = manager.subset_hook_caller(hook_name, remove_plugins=others)
    caller(register=register)


def _upgrade_hint(declared: str | None, distribution: str) -> str:
    """Which side to upgrade: the plugin when it targets an older API, hetero when it targets a newer one."""
    if declared is not None and _major(declared) < _major(API_VERSION):
        return f"pip install -U {distribution}  (it targets an older hetero)"
    return f"pip install -U hetero, or a {distribution} release for hetero API {API_VERSION}"


def _register_op(schema: Any) -> None:
    # No replacing: built-in references are the oracle every backend is tested against.
    op_registry.register(schema, replace=False)


def _unregister(manager: pluggy.PluginManager, module: Any) -> None:
    if manager.is_registered(module):
        manager.unregister(module)


def _major(version: str) -> int:
    try:
        return int(version.split(".")[0])
    except ValueError:
        return -1


def _describe(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno})" if frames else ""
    text = str(exc) if not isinstance(exc, HeteroError) else exc.message
    return f"{type(exc).__name__}: {text}{where}"
