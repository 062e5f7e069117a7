"""The hooks a plugin may implement. Each hands the plugin a ``register`` callback; call it once per thing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("hetero")
hookimpl = pluggy.HookimplMarker("hetero")


@hookspec
def hetero_register_backends(register: Callable[[Any], None]) -> None:
    """Register backend factories: ``register(factory)`` with a ``hetero.contract.Factory``."""


@hookspec
def hetero_register_ops(register: Callable[[Any], None]) -> None:
    """Register new op schemas: ``register(hetero.contract.registry.OpSchema(...))`` (custom domains)."""


@hookspec
def hetero_register_kernels(register: Callable[[str, str, str, Any], None]) -> None:
    """Add kernels to a table backend: ``register(backend_name, domain, op_type, kernel_factory)``."""


@hookspec
def hetero_register_loaders(register: Callable[[str, Any], None]) -> None:
    """Add model loaders: ``register(suffix, loader)``; ``loader(path) -> hetero.contract.graph.Graph``."""
