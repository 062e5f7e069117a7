"""Entry point of the hetero-rknn plugin: pure Python and light (no toolkit import, ever, in this process)."""

from __future__ import annotations

from hetero.contract import hookimpl

from .factory import RknnFactory

api_version = "2.0"  # the hetero.contract version this plugin was written for


@hookimpl
def hetero_register_backends(register) -> None:
    register(RknnFactory())
