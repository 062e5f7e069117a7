"""Entry point of the hetero-hexagon plugin. Light: the QNN toolkit is only ever touched in its own worker process."""

from __future__ import annotations

from hetero.contract import hookimpl

from .factory import HexagonFactory

api_version = "2.0"  # the hetero.contract version this plugin was written for


@hookimpl
def hetero_register_backends(register) -> None:
    register(HexagonFactory())
