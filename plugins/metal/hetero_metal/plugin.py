"""Entry point of the hetero-metal plugin. Pure Python and light: native code loads in ``probe``/``create``."""

from __future__ import annotations

from hetero.contract import hookimpl

from .factory import MetalFactory

api_version = "2.0"  # the hetero.contract version this plugin was written for


@hookimpl
def hetero_register_backends(register) -> None:
    register(MetalFactory())
