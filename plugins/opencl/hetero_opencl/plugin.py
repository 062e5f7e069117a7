"""Entry point of the hetero-opencl plugin. Pure Python and light: the native module loads in ``probe``/``create``."""

from __future__ import annotations

from hetero.contract import hookimpl

from .factory import OpenCLFactory

api_version = "2.0"  # the hetero.contract version this plugin was written for


@hookimpl
def hetero_register_backends(register) -> None:
    register(OpenCLFactory())
